//! DeepSeek V4's ops against the CPU backend (mHC weights / collapse / expansion, trailing
//! rotation, compressor pooling, the Lightning indexer, attention with sinks, SwiGLU with a
//! limit), the model on the GPU against transformers' logits on the `flash_mini` fixture
//! (`scripts/gen-deepseekv4-fixtures.py`), its MTP block against the reference of
//! `scripts/gen-deepseekv4-mtp.py` and DSpark against `scripts/gen-deepseekv4-with-dspark.py`'s
//! (skipped when absent).

use super::*;
use vela_compute::LightningParams;
use vela_models::deepseekv4::DeepseekV4Model;
use vela_models::LanguageModel;

/// Relative error of the largest difference against the largest |value| (outputs that cancel).
fn rel(a: &[f32], b: &[f32]) -> f32 {
    let scale = b
        .iter()
        .fold(0f32, |x, y| x.max(y.abs()))
        .max(f32::MIN_POSITIVE);
    a.iter().zip(b).fold(0f32, |w, (x, y)| w.max((x - y).abs())) / scale
}

#[test]
fn dsv4_ops_match_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(1);
    let mut rng = Rng(0x0d54);
    let (n, s, h) = (5usize, 4usize, 96usize);
    // mHC weights, collapse, expansion.
    let mix = rng.vec(n * (2 + s) * s);
    let base = rng.vec((2 + s) * s);
    let (bg, bc) = (
        g.upload_vector(&base).unwrap(),
        cpu.upload_vector(&base).unwrap(),
    );
    let (mut mg, mut mc) = (up(&g, &mix), up(&cpu, &mix));
    g.mhc_weights(&mut mg, &bg, [0.7, 1.3, 2.0], n, s, 20, 1e-6, false);
    cpu.mhc_weights(&mut mc, &bc, [0.7, 1.3, 2.0], n, s, 20, 1e-6, false);
    let w = n * (2 + s) * s;
    let e = rel(&down(&g, &mg, w), &down(&cpu, &mc, w));
    eprintln!("RESULT | mhc_weights | rel {e:.2e} |");
    assert!(e < 1e-5, "mhc_weights: {e}");
    let x = rng.vec(n * s * h);
    let y = rng.vec(n * h);
    let (mut og, mut oc) = (g.alloc(n * h), cpu.alloc(n * h));
    g.mhc_collapse(&up(&g, &x), &mg, (2 + s) * s, n, s, h, &mut og);
    cpu.mhc_collapse(&up(&cpu, &x), &mc, (2 + s) * s, n, s, h, &mut oc);
    let e = rel(&down(&g, &og, n * h), &down(&cpu, &oc, n * h));
    assert!(e < 1e-5, "mhc_collapse: {e}");
    let (mut xg, mut xc) = (up(&g, &x), up(&cpu, &x));
    g.mhc_expand(&mut xg, &mg, &up(&g, &y), n, s, h);
    cpu.mhc_expand(&mut xc, &mc, &up(&cpu, &y), n, s, h);
    let e = rel(&down(&g, &xg, n * s * h), &down(&cpu, &xc, n * s * h));
    eprintln!("RESULT | mhc_collapse/expand | rel {e:.2e} |");
    assert!(e < 1e-5, "mhc_expand: {e}");
    // Trailing rotation, forward and inverse.
    let inv = [1.0f32, 0.3, 0.01, 1e-4];
    let pos = [0u32, 7, 300, 65_000, 9];
    let xr = rng.vec(n * 3 * 32);
    for inverse in [false, true] {
        let (mut rg, mut rc) = (up(&g, &xr), up(&cpu, &xr));
        g.rope_trailing(&mut rg, 3, 32, &pos, &inv, inverse);
        cpu.rope_trailing(&mut rc, 3, 32, &pos, &inv, inverse);
        let e = rel(&down(&g, &rg, xr.len()), &down(&cpu, &rc, xr.len()));
        assert!(e < 1e-5, "rope_trailing inverse {inverse}: {e}");
    }
    // Pooling, with and without overlap, over a ring that wraps.
    for (overlap, m) in [(true, 4usize), (false, 8)] {
        let d = 16;
        let half = if overlap { 2 * d } else { d };
        let slots = 2 * m + 5;
        let raw = rng.vec(slots * 2 * half);
        let ape = rng.vec(m * half);
        let (ag, ac) = (
            g.upload_vector(&ape).unwrap(),
            cpu.upload_vector(&ape).unwrap(),
        );
        let (first, k) = (3usize, 2usize);
        let (mut pg, mut pc) = (g.alloc(k * d), cpu.alloc(k * d));
        g.compress_pool(
            &up(&g, &raw),
            slots,
            2 * half,
            d,
            &ag,
            m,
            overlap,
            first,
            k,
            &mut pg,
        );
        cpu.compress_pool(
            &up(&cpu, &raw),
            slots,
            2 * half,
            d,
            &ac,
            m,
            overlap,
            first,
            k,
            &mut pc,
        );
        let e = rel(&down(&g, &pg, k * d), &down(&cpu, &pc, k * d));
        eprintln!("RESULT | compress_pool overlap {overlap} | rel {e:.2e} |");
        assert!(e < 1e-5, "compress_pool overlap {overlap}: {e}");
        // By position: the windows that rows 3m−3 .. 5m complete, straight into their rows;
        // the other rows stay as they were.
        let positions: Vec<u32> = (3 * m as u32 - 3..5 * m as u32).collect();
        let nr = 6;
        let zeros = vec![0f32; nr * d];
        let (mut rg, mut rc) = (up(&g, &zeros), up(&cpu, &zeros));
        let (mut tg, mut tc) = (g.alloc(3 * d), cpu.alloc(3 * d));
        let (rawg, rawc) = (up(&g, &raw), up(&cpu, &raw));
        g.compress_pool_at(
            &rawg,
            (slots, 2 * half),
            d,
            &ag,
            (m, overlap),
            &positions,
            &mut tg,
            &mut rg,
        );
        cpu.compress_pool_at(
            &rawc,
            (slots, 2 * half),
            d,
            &ac,
            (m, overlap),
            &positions,
            &mut tc,
            &mut rc,
        );
        let (a, b) = (down(&g, &rg, nr * d), down(&cpu, &rc, nr * d));
        let e = rel(&a, &b);
        eprintln!("RESULT | compress_pool_at overlap {overlap} | rel {e:.2e} |");
        assert!(e < 1e-5, "compress_pool_at overlap {overlap}: {e}");
        assert!(b[2 * d..5 * d].iter().all(|&x| x != 0.0) && b[..2 * d].iter().all(|&x| x == 0.0));
    }
    // The indexer: more entries than it keeps, ties at zero; the same selections.
    let p = LightningParams {
        n_head: 4,
        head_dim: 32,
        ratio: 4,
        top_k: 8,
        scale: 32f32.powf(-0.5),
        expand: false,
    };
    let positions: Vec<u32> = (90..97).collect();
    let nq = positions.len();
    let q = rng.vec(nq * p.n_head * p.head_dim);
    let wts = rng.vec(nq * p.n_head);
    let mut keys = rng.vec(25 * p.head_dim);
    keys[..2 * p.head_dim].fill(0.0);
    let (mut sg, mut cg) = (g.alloc_ids(nq * p.top_k), g.alloc_ids(nq));
    let (mut sc, mut cc) = (cpu.alloc_ids(nq * p.top_k), cpu.alloc_ids(nq));
    let kg = up(&g, &keys);
    g.lightning_select(
        &up(&g, &q),
        &up(&g, &wts),
        &kg,
        &positions,
        &p,
        &mut sg,
        &mut cg,
    );
    let kc = up(&cpu, &keys);
    cpu.lightning_select(
        &up(&cpu, &q),
        &up(&cpu, &wts),
        &kc,
        &positions,
        &p,
        &mut sc,
        &mut cc,
    );
    let (mut a, mut b) = (vec![0u32; nq * p.top_k], vec![0u32; nq * p.top_k]);
    g.read_ids(&sg, &mut a);
    cpu.read_ids(&sc, &mut b);
    assert_eq!(a, b, "lightning_select");
    // Expanded to positions (GLM 5.3's pools), queries before and after the budget.
    {
        let p = LightningParams { expand: true, ..p };
        let positions: Vec<u32> = positions.iter().copied().chain([5, 33, 34]).collect();
        let (nq, w) = (positions.len(), p.width());
        let q = rng.vec(nq * p.n_head * p.head_dim);
        let wts = rng.vec(nq * p.n_head);
        let (mut sg, mut cg) = (g.alloc_ids(nq * w), g.alloc_ids(nq));
        let (mut sc, mut cc) = (cpu.alloc_ids(nq * w), cpu.alloc_ids(nq));
        g.lightning_select(
            &up(&g, &q),
            &up(&g, &wts),
            &kg,
            &positions,
            &p,
            &mut sg,
            &mut cg,
        );
        cpu.lightning_select(
            &up(&cpu, &q),
            &up(&cpu, &wts),
            &kc,
            &positions,
            &p,
            &mut sc,
            &mut cc,
        );
        let (mut ca, mut cb) = (vec![0u32; nq], vec![0u32; nq]);
        g.read_ids(&cg, &mut ca);
        cpu.read_ids(&cc, &mut cb);
        assert_eq!(ca, cb, "lightning_select expanded: counts");
        let (mut a, mut b) = (vec![0u32; nq * w], vec![0u32; nq * w]);
        g.read_ids(&sg, &mut a);
        cpu.read_ids(&sc, &mut b);
        for t in 0..nq {
            let k = cb[t] as usize;
            assert_eq!(
                a[t * w..t * w + k],
                b[t * w..t * w + k],
                "lightning_select expanded"
            );
        }
    }
    // Attention with sinks over both sets (the window and the selected entries).
    let (nh, hd, win) = (4usize, 64usize, 6usize);
    let qa = rng.vec(nq * nh * hd);
    let rows = rng.vec(20 * hd);
    let ents = rng.vec(25 * hd);
    let sinks = rng.vec(nh);
    let wsel: Vec<u32> = (0..nq * win).map(|i| (i * 7 % 20) as u32).collect();
    let wcnt: Vec<u32> = (0..nq).map(|t| (t % win + 1) as u32).collect();
    let (mut wsg, mut wcg) = (g.alloc_ids(wsel.len()), g.alloc_ids(nq));
    g.write_ids(&mut wsg, &wsel);
    g.write_ids(&mut wcg, &wcnt);
    let (mut wsc, mut wcc) = (cpu.alloc_ids(wsel.len()), cpu.alloc_ids(nq));
    cpu.write_ids(&mut wsc, &wsel);
    cpu.write_ids(&mut wcc, &wcnt);
    let (skg, skc) = (
        g.upload_vector(&sinks).unwrap(),
        cpu.upload_vector(&sinks).unwrap(),
    );
    let (mut og, mut oc) = (g.alloc(nq * nh * hd), cpu.alloc(nq * nh * hd));
    let (rg, rc, eg, ec) = (
        up(&g, &rows),
        up(&cpu, &rows),
        up(&g, &ents),
        up(&cpu, &ents),
    );
    let scale = (hd as f32).powf(-0.5);
    g.attention_sink(
        &up(&g, &qa),
        (&rg, &wsg, &wcg, win),
        (&eg, &sg, &cg, p.top_k),
        &skg,
        nq,
        nh,
        hd,
        scale,
        &mut og,
    );
    cpu.attention_sink(
        &up(&cpu, &qa),
        (&rc, &wsc, &wcc, win),
        (&ec, &sc, &cc, p.top_k),
        &skc,
        nq,
        nh,
        hd,
        scale,
        &mut oc,
    );
    let e = rel(&down(&g, &og, nq * nh * hd), &down(&cpu, &oc, nq * nh * hd));
    eprintln!("RESULT | attention_sink | rel {e:.2e} |");
    assert!(e < 1e-5, "attention_sink: {e}");
    // SwiGLU with a limit (values past it on both sides).
    let gate: Vec<f32> = rng.vec(300).iter().map(|v| v * 30.0).collect();
    let upv: Vec<f32> = rng.vec(300).iter().map(|v| v * 30.0).collect();
    let act = vela_compute::Activation::SiluLimit(10.0);
    let (mut gg, mut gc) = (up(&g, &gate), up(&cpu, &gate));
    g.act_mul(&mut gg, &up(&g, &upv), 300, act);
    cpu.act_mul(&mut gc, &up(&cpu, &upv), 300, act);
    let e = rel(&down(&g, &gg, 300), &down(&cpu, &gc, 300));
    assert!(e < 1e-5, "act_mul SiluLimit: {e}");
}

/// The inputs of one `attention_sink` call, on the host: the queries, the window's rows, the
/// entries, the sinks, and per set its selection, counts and width.
struct SinkSets<'a> {
    q: &'a [f32],
    rows: &'a [f32],
    ents: &'a [f32],
    sinks: &'a [f32],
    sel: [(&'a [u32], &'a [u32], usize); 2],
}

impl SinkSets<'_> {
    /// `attention_sink` of these inputs on `be`: its output, read back.
    fn run<B: Backend>(&self, be: &B, nq: usize, nh: usize, hd: usize) -> Vec<f32> {
        let ids = |d: &[u32]| {
            let mut b = be.alloc_ids(d.len());
            be.write_ids(&mut b, d);
            b
        };
        let [(ws, wc, win), (es, ec, top)] = self.sel;
        let (ws, wc, es, ec) = (ids(ws), ids(wc), ids(es), ids(ec));
        let (r, e) = (up(be, self.rows), up(be, self.ents));
        let sk = be.upload_vector(self.sinks).unwrap();
        let mut o = be.alloc(nq * nh * hd);
        be.attention_sink(
            &up(be, self.q),
            (&r, &ws, &wc, win),
            (&e, &es, &ec, top),
            &sk,
            nq,
            nh,
            hd,
            (hd as f32).powf(-0.5),
            &mut o,
        );
        down(be, &o, nq * nh * hd)
    }
}

/// `attention_sink` at DeepSeek V4's width (head dim 512, up to 64 query heads on one K=V row)
/// on the parts kernels: queries with no rows, with rows in one set only, and with more than one
/// part, head groups full and partial, more queries than one launch takes; within 1e-5 (of the
/// largest output) of the CPU's.
#[test]
fn attention_sink_parts_match_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(0x51_4c);
    let hd = 512usize;
    for (nh, nq) in [(64usize, 1usize), (12, 11), (64, 3)] {
        let (win, top, n_rows, n_ents) = (128usize, 300usize, 160usize, 400usize);
        let rows = rng.vec(n_rows * hd);
        let ents = rng.vec(n_ents * hd);
        let sinks: Vec<f32> = rng.vec(nh).iter().map(|v| v * 4.0).collect();
        // (window rows, entries) of each query: one query with every row of both sets; of 11,
        // (t·37 mod 129, t·91 mod 301), query 0 with none at all; of 3, one set only, then all.
        let (wcnt, ecnt): (Vec<u32>, Vec<u32>) = (0..nq)
            .map(|t| match (nq, t) {
                (1, _) | (3, 2) => (win, top),
                (3, 0) => (5, 0),
                (3, _) => (0, 77),
                _ => ((t * 37) % (win + 1), (t * 91) % (top + 1)),
            })
            .map(|(a, b)| (a as u32, b as u32))
            .unzip();
        let wsel: Vec<u32> = (0..nq * win)
            .map(|i| ((i * 7 + 3) % n_rows) as u32)
            .collect();
        let esel: Vec<u32> = (0..nq * top)
            .map(|i| ((i * 13 + 1) % n_ents) as u32)
            .collect();
        let q: Vec<f32> = rng.vec(nq * nh * hd).iter().map(|v| v * 0.2).collect();
        let sets = SinkSets {
            q: &q,
            rows: &rows,
            ents: &ents,
            sinks: &sinks,
            sel: [(&wsel, &wcnt, win), (&esel, &ecnt, top)],
        };
        let (og, oc) = (sets.run(&g, nq, nh, hd), sets.run(&cpu, nq, nh, hd));
        let e = rel(&og, &oc);
        eprintln!("RESULT | attention_sink parts nh={nh} queries={nq} | rel {e:.2e} |");
        assert!(e < 1e-5, "attention_sink parts nh={nh} queries={nq}: {e}");
    }
}

/// The `flash_mini` fixture on the GPU: in exact mode within 1e-8 NMSE of HF at every position
/// of the 300-token prompt, and the same logits fed token by token; the default mode reported.
#[test]
fn deepseekv4_gpu_matches_transformers() {
    for exact in [true, false] {
        let Some(g) = gpu() else { return };
        let dir = vela_formats::testdata::golden_dir().join("deepseekv4/flash_mini");
        if vela_formats::testdata::require(dir.join("logits_long.f32")).is_none() {
            return;
        }
        g.set_exact_matmul(exact);
        let m: Arc<dyn LanguageModel> =
            Arc::new(DeepseekV4Model::load_hf(Arc::new(g), &dir, &Default::default()).unwrap());
        let toks = long_prompt(&dir);
        let want = f32s(&dir.join("logits_long.f32"));
        let nv = want.len() / toks.len();
        for chunk in [toks.len(), 1] {
            let mut st = m.clone().new_state(512, chunk, KvType::F32).unwrap();
            let mut out = Vec::new();
            for (ci, c) in toks.chunks(chunk).enumerate() {
                let pos: Vec<u32> = (0..c.len()).map(|i| (ci * chunk + i) as u32).collect();
                out.extend(st.forward(c, &pos, 0).unwrap());
            }
            let mut worst = 0f64;
            for t in 0..toks.len() {
                let (a, b) = (&out[t * nv..(t + 1) * nv], &want[t * nv..(t + 1) * nv]);
                let err: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
                let norm: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
                worst = worst.max(err / norm);
            }
            let mode = if exact { "exact" } else { "default" };
            eprintln!(
                "RESULT | deepseekv4 flash_mini GPU ({mode}, chunk {chunk}) vs HF | worst NMSE {worst:.3e} |"
            );
            if exact {
                assert!(worst <= 1e-8, "worst position NMSE {worst:.3e}");
            }
        }
    }
}

/// DSpark on the GPU (`dspark` fixture, `scripts/gen-deepseekv4-with-dspark.py`): each drafted
/// block's logits against the independent reference, exact mode within 1e-8 NMSE, the greedy
/// chains identical; the default mode reported.
#[test]
fn dspark_gpu_matches_reference() {
    for exact in [true, false] {
        let Some(g) = gpu() else { return };
        let dir = vela_formats::testdata::golden_dir().join("deepseekv4/dspark");
        if vela_formats::testdata::require(dir.join("dspark.json")).is_none() {
            return;
        }
        g.set_exact_matmul(exact);
        let model =
            Arc::new(DeepseekV4Model::load_hf(Arc::new(g), &dir, &Default::default()).unwrap());
        model.set_dspark_p_min(0.0);
        let m: Arc<dyn LanguageModel> = model;
        let mut head = m.load_mtp(&dir).unwrap();
        let json = |f: &str| -> serde_json::Value {
            serde_json::from_str(&std::fs::read_to_string(dir.join(f)).unwrap()).unwrap()
        };
        let ids = |v: &serde_json::Value| -> Vec<u32> {
            v.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        };
        let r = json("dspark.json");
        let toks = long_prompt(&dir);
        let block = r["block"].as_u64().unwrap() as usize;
        let want = f32s(&dir.join("dspark_logits.f32"));
        let nv = m.n_vocab();
        let mut worst = 0f64;
        for (i, &at) in ids(&r["points"]).iter().enumerate() {
            let at = at as usize;
            let mut st = m.clone().new_state(512, 16, KvType::F32).unwrap();
            for (ci, c) in toks[..at].chunks(16).enumerate() {
                let pos: Vec<u32> = (0..c.len()).map(|j| (ci * 16 + j) as u32).collect();
                st.forward(c, &pos, c.len()).unwrap();
            }
            let mut rows = Vec::new();
            head.draft(&mut *st, toks[at], at, block, &mut |lg| {
                let t = (0..lg.len()).fold(0, |b, j| if lg[j] > lg[b] { j } else { b });
                rows.push(lg);
                Ok(t as u32)
            })
            .unwrap();
            assert_eq!(rows.len(), block);
            let mut chain = Vec::new();
            for (j, a) in rows.iter().enumerate() {
                let b = &want[(i * block + j) * nv..][..nv];
                let err: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
                let norm: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
                worst = worst.max(err / norm);
                chain.push((0..nv).fold(0, |m, k| if a[k] > a[m] { k } else { m }) as u32);
            }
            if exact {
                assert_eq!(chain, ids(&r["drafts"][i]), "point {at}: greedy chain");
            }
        }
        let mode = if exact { "exact" } else { "default" };
        eprintln!(
            "RESULT | deepseekv4 DSpark GPU ({mode}) vs reference | worst row NMSE {worst:.3e} |"
        );
        if exact {
            assert!(worst <= 1e-8, "worst row NMSE {worst:.3e}");
        }
    }
}

/// The MTP block on the GPU in exact mode (the release's storage as loaded: FP8 as BF16, MXFP4
/// as Q8_0, their exact values): the first draft after every prefix of the 300-token prompt,
/// one token and 7 tokens per forward, vs the reference of `scripts/gen-deepseekv4-mtp.py`.
#[test]
fn deepseekv4_mtp_gpu_matches_the_reference() {
    let Some(g) = gpu() else { return };
    let dir = vela_formats::testdata::golden_dir().join("deepseekv4/mtp");
    if vela_formats::testdata::require(dir.join("mtp_rows_long.f32")).is_none() {
        return;
    }
    g.set_exact_matmul(true);
    let m: Arc<dyn LanguageModel> =
        Arc::new(DeepseekV4Model::load_hf(Arc::new(g), &dir, &Default::default()).unwrap());
    super::mtp::first_drafts(&m, &dir, "deepseekv4", 1e-8);
}

/// Every position's logits of `toks` on `m`: a prefill in chunks of 16, then single steps.
fn placed_logits(m: Arc<dyn LanguageModel>, toks: &[u32]) -> Vec<f32> {
    let mut st = m.new_state(512, 16, KvType::F32).unwrap();
    let split = toks.len() * 3 / 4;
    let mut out = Vec::new();
    for (ci, c) in toks[..split].chunks(16).enumerate() {
        let pos: Vec<u32> = (0..c.len()).map(|i| (ci * 16 + i) as u32).collect();
        out.extend(st.forward(c, &pos, 0).unwrap());
    }
    for (i, &t) in toks.iter().enumerate().skip(split) {
        out.extend(st.forward(&[t], &[i as u32], 0).unwrap());
    }
    out
}

/// Routed experts in host memory (`vela_models::placement`) on DeepSeek V4 (`deepseek-v4-tiny`
/// Q8_0, hash and top-k layers), Qwen3.8 (the `gdn_qsa` fixture, f32) and GLM 5.3 (`glm5-tiny`
/// Q8_0, KDA and MLA layers): every layer's on the
/// host, without and with a small GPU cache, against all on the GPU, in exact mode within the
/// GPU-vs-CPU bound (worst position NMSE <= 1e-4, every position's argmax equal); the default
/// mode reported.
#[test]
fn dsv4_qwen4exp_host_experts_match_gpu() {
    use vela_models::placement::HostExperts;
    use vela_models::qwen4exp::Qwen4ExpModel;
    use vela_models::LoadSpec;
    let host = |cache_bytes: u64| {
        let mut h = HostExperts::new(Arc::new(CpuBackend::new(0)), (0..64).collect(), cache_bytes);
        h.prefill = vela_models::placement::Prefill::Cpu;
        Some(h)
    };
    let q4dir = vela_formats::testdata::golden_dir().join("qwen4exp/gdn_qsa");
    let has_q4 = vela_formats::testdata::require(q4dir.join("logits_long.f32")).is_some();
    for exact in [true, false] {
        vela_compute::cpu::matmul::exact::set_thread_override(Some(exact));
        for model in ["deepseek_v4", "qwen4exp", "glm5"] {
            if model == "qwen4exp" && !has_q4 {
                continue;
            }
            let load = |h: Option<HostExperts>| -> Option<Arc<dyn LanguageModel>> {
                let g = gpu()?;
                g.set_exact_matmul(exact);
                let g = Arc::new(g);
                let ty = GgmlType::Q8_0;
                Some(if model == "deepseek_v4" {
                    Arc::new(
                        DeepseekV4Model::synth_placed(g, "deepseek-v4-tiny", ty, 1, h).unwrap(),
                    )
                } else if model == "glm5" {
                    Arc::new(
                        vela_models::glm5::Glm5Model::synth_placed(g, "glm5-tiny", ty, 1, h)
                            .unwrap(),
                    )
                } else {
                    let spec = LoadSpec {
                        quant: None,
                        host_experts: h,
                    };
                    Arc::new(Qwen4ExpModel::load_hf(g, &q4dir, &spec).unwrap())
                })
            };
            let Some(base) = load(None) else { return };
            let toks: Vec<u32> = if model == "qwen4exp" {
                long_prompt(&q4dir)[..96].to_vec()
            } else {
                (0..96).map(|i| (i * 37 + 5) % 500).collect()
            };
            // (Token ids under 512: glm5-tiny's vocabulary.)
            let want = placed_logits(base, &toks);
            let nv = want.len() / toks.len();
            for cache in [0, 1 << 16] {
                let got = placed_logits(load(host(cache)).unwrap(), &toks);
                let (mut worst, mut argmax_same) = (0f64, 0);
                for t in 0..toks.len() {
                    let (a, b) = (&got[t * nv..(t + 1) * nv], &want[t * nv..(t + 1) * nv]);
                    worst = worst.max(err(a, b).1);
                    argmax_same += (super::model::argmax(a) == super::model::argmax(b)) as usize;
                }
                let mode = if exact { "exact" } else { "default" };
                let ok = worst <= 1e-4 && argmax_same == toks.len();
                eprintln!(
                    "RESULT | {model} host experts, cache {cache} B, vs GPU ({mode}) | worst NMSE {worst:.2e}, argmax {argmax_same}/{} | {} |",
                    toks.len(),
                    if ok { "ok" } else if exact { "FAIL" } else { "reported" }
                );
                if exact {
                    assert!(
                        ok,
                        "{model} cache {cache}: worst NMSE {worst:.3e}, argmax {argmax_same}"
                    );
                }
            }
        }
        vela_compute::cpu::matmul::exact::set_thread_override(None);
    }
}
