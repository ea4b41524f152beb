//! The fast block-sparse kernels (kernels/sparse.cu) against the CPU reference at decode and
//! prefill shapes: the indexer's selection identical (more blocks than the budget, equal
//! scores at the cut, NaN scores, queries on both sides of the budget), in default and exact
//! mode; attention over a selection within a bound in default mode, and each query's output the
//! same bits whatever batch it is computed in.

use super::*;
use vela_compute::IndexerParams;

fn up_ids<B: Backend>(be: &B, data: &[u32]) -> B::Ids {
    let mut b = be.alloc_ids(data.len());
    be.write_ids(&mut b, data);
    b
}

fn down_ids<B: Backend>(be: &B, b: &B::Ids, n: usize) -> Vec<u32> {
    let mut out = vec![0u32; n];
    be.read_ids(b, &mut out);
    out
}

/// The CPU selection: (selections `[n, width]`, counts).
fn cpu_select(
    q: &[f32],
    keys: &[f32],
    positions: &[u32],
    p: &IndexerParams,
) -> (Vec<u32>, Vec<u32>) {
    let cpu = CpuBackend::new(1);
    let (n, w) = (positions.len(), p.max_selected());
    let (mut sel, mut cnt) = (cpu.alloc_ids(n * w), cpu.alloc_ids(n));
    cpu.indexer_select(
        &up(&cpu, q),
        &up(&cpu, keys),
        positions,
        p,
        &mut sel,
        &mut cnt,
    );
    (down_ids(&cpu, &sel, n * w), down_ids(&cpu, &cnt, n))
}

fn check_select(
    g: &CudaBackend,
    what: &str,
    q: &[f32],
    keys: &[f32],
    positions: &[u32],
    p: &IndexerParams,
) {
    let (n, w) = (positions.len(), p.max_selected());
    let (want, want_n) = cpu_select(q, keys, positions, p);
    for exact in [false, true] {
        g.set_exact_matmul(exact);
        let (mut sel, mut cnt) = (g.alloc_ids(n * w), g.alloc_ids(n));
        g.indexer_select(&up(g, q), &up(g, keys), positions, p, &mut sel, &mut cnt);
        let (got, got_n) = (down_ids(g, &sel, n * w), down_ids(g, &cnt, n));
        assert_eq!(got_n, want_n, "{what} (exact {exact}): counts");
        for t in 0..n {
            let c = want_n[t] as usize;
            assert_eq!(
                got[t * w..t * w + c],
                want[t * w..t * w + c],
                "{what} (exact {exact}): selection of query {t} at {}",
                positions[t]
            );
        }
    }
    g.set_exact_matmul(false);
    eprintln!("RESULT | sparse select {what} | identical to the CPU | ok |");
}

/// The real geometry's indexer (4 heads of 128, blocks of 4, 512 kept): a decode query deep in
/// the context, a prefill chunk across the budget, and keys that tie.
#[test]
fn sparse_select_fast_matches_cpu() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(0x5e1ec7);
    let p = IndexerParams {
        n_head: 4,
        head_dim: 128,
        block: 4,
        max_blocks: 512,
    };
    let di = p.head_dim;
    let ctx = 9000usize;
    let nb = ctx / p.block;
    let mut keys = rng.vec(nb * di);
    // Decode at 8191 (2048 blocks) and at a position in an open block.
    for pos in [8191u32, 8193, 2047, 2050, 2051] {
        let q = rng.vec(p.n_head * di);
        check_select(&g, &format!("decode at {pos}"), &q, &keys, &[pos], &p);
    }
    // A prefill chunk from below the budget (2048 positions) to above it.
    let positions: Vec<u32> = (2000..2100).collect();
    let q = rng.vec(positions.len() * p.n_head * di);
    check_select(&g, "prefill across the budget", &q, &keys, &positions, &p);
    // Ties: many all-zero blocks (score 0), repeated rows (equal scores at the cut), NaN rows.
    for b in 0..nb {
        match b % 7 {
            0 | 3 => keys[b * di..(b + 1) * di].fill(0.0),
            5 => {
                let (a, c) = keys.split_at_mut(b * di);
                c[..di].copy_from_slice(&a[..di]);
            }
            _ => {}
        }
        if b % 97 == 11 {
            keys[b * di] = f32::NAN;
        }
    }
    for pos in [8191u32, 4097, 8999] {
        let q = rng.vec(p.n_head * di);
        check_select(&g, &format!("ties at {pos}"), &q, &keys, &[pos], &p);
    }
    // Every score zero (relu of negative dots): the lowest blocks win.
    let q: Vec<f32> = rng.vec(p.n_head * di).iter().map(|x| x.abs()).collect();
    let neg: Vec<f32> = rng.vec(nb * di).iter().map(|x| -x.abs()).collect();
    check_select(&g, "all zero", &q, &neg, &[8191], &p);
    let positions: Vec<u32> = (6000..6040).collect();
    let q = rng.vec(positions.len() * p.n_head * di);
    check_select(&g, "prefill with ties", &q, &keys, &positions, &p);
    // The small geometry (4 heads of 32, blocks of 4, 4 kept), as the model tests use.
    let p = IndexerParams {
        n_head: 4,
        head_dim: 32,
        block: 4,
        max_blocks: 4,
    };
    let keys = rng.vec(100 * p.head_dim);
    let positions: Vec<u32> = (0..300).collect();
    let q = rng.vec(positions.len() * p.n_head * p.head_dim);
    check_select(&g, "small geometry", &q, &keys, &positions, &p);
}

/// Max |a - b| over each head row in units of the row's largest |b| (the outputs cancel).
fn row_ulps(a: &[f32], b: &[f32], hd: usize) -> f32 {
    let mut worst = 0f32;
    for (ra, rb) in a.chunks(hd).zip(b.chunks(hd)) {
        let s = rb
            .iter()
            .fold(0f32, |x, y| x.max(y.abs()))
            .max(f32::MIN_POSITIVE);
        for (x, y) in ra.iter().zip(rb) {
            worst = worst.max((x - y).abs() / (f32::EPSILON * s));
        }
    }
    worst
}

/// Attention over real selections (decode deep in the context: 2051 positions; a prefill
/// chunk of 40 queries) at the real head geometries (24 heads over 2 K/V heads of 256; 64 heads
/// on one latent row of 512, as GLM 5.3's and DeepSeek V4's MLA) and small ones: within a bound of the CPU in default mode, within the reference kernel's bound in
/// exact mode, and every query's row the same bits alone as in its batch.
#[test]
fn sparse_attention_fast_matches_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(2);
    let mut rng = Rng(0xa77e);
    let p = IndexerParams {
        n_head: 4,
        head_dim: 32,
        block: 4,
        max_blocks: 512,
    };
    let w = p.max_selected();
    let ctx = 8200usize;
    let keys = rng.vec(ctx / p.block * p.head_dim);
    // The last two take several head groups per K/V head (MLA's 64 heads on one latent row of
    // 512; 20 heads of 128: a full group of 16 and one of 4).
    for (nh, nkv, hd) in [
        (24usize, 2usize, 256usize),
        (6, 2, 64),
        (64, 1, 512),
        (20, 1, 128),
    ] {
        for positions in [
            vec![8191u32],
            (8150..8190).collect::<Vec<u32>>(),
            (0..40).collect(),
        ] {
            let n = positions.len();
            let qi = rng.vec(n * p.n_head * p.head_dim);
            let (sel, cnt) = cpu_select(&qi, &keys, &positions, &p);
            let (q, k, v) = (
                rng.vec(n * nh * hd),
                rng.vec(ctx * nkv * hd),
                rng.vec(ctx * nkv * hd),
            );
            let scale = 1.0 / (hd as f32).sqrt();
            let heads = (nh, nkv, hd);
            let m = n * nh * hd;
            let mut oc = cpu.alloc(m);
            let (sc, cc) = (up_ids(&cpu, &sel), up_ids(&cpu, &cnt));
            cpu.attention_selected(
                &up(&cpu, &q),
                &up(&cpu, &k),
                &up(&cpu, &v),
                &sc,
                &cc,
                n,
                w,
                heads,
                scale,
                &mut oc,
            );
            let want = down(&cpu, &oc, m);
            let (qg, kg, vg) = (up(&g, &q), up(&g, &k), up(&g, &v));
            let (sg, cg) = (up_ids(&g, &sel), up_ids(&g, &cnt));
            for exact in [false, true] {
                g.set_exact_matmul(exact);
                let mut og = g.alloc(m);
                g.attention_selected(&qg, &kg, &vg, &sg, &cg, n, w, heads, scale, &mut og);
                let got = down(&g, &og, m);
                let ulps = row_ulps(&got, &want, hd);
                let what = format!(
                    "{n} queries from {}, heads {heads:?}, exact {exact}",
                    positions[0]
                );
                eprintln!(
                    "RESULT | sparse attention {what} | max {ulps:.1} ulps of the row scale |"
                );
                assert!(
                    ulps <= if exact { 64.0 } else { 512.0 },
                    "{what}: {ulps} ulps"
                );
                // The last query alone: the same bits as in the batch.
                let t = n - 1;
                let q1 = up(&g, &q[t * nh * hd..(t + 1) * nh * hd]);
                let (s1, c1) = (
                    up_ids(&g, &sel[t * w..(t + 1) * w]),
                    up_ids(&g, &cnt[t..t + 1]),
                );
                let mut o1 = g.alloc(nh * hd);
                g.attention_selected(&q1, &kg, &vg, &s1, &c1, 1, w, heads, scale, &mut o1);
                let alone = down(&g, &o1, nh * hd);
                assert!(
                    alone
                        .iter()
                        .zip(&got[t * nh * hd..])
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{what}: query {t} alone differs from its batch"
                );
            }
            g.set_exact_matmul(false);
        }
    }
}
