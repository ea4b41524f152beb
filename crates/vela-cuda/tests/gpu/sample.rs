//! Device top-k for sampling (`topk_rows`, `topk_part` + `topk_merge`, `Backend::top_k_rows`)
//! against the CPU backend's default (`vela_compute::top_k_row`, itself checked against the
//! sampler's `top_k` in `crates/vela-engine/tests/sample_top_k.rs`): ids and values
//! bit-identical, `n_valid` and `max` equal, `sum_exp` within 1e-10 relative (f64 sums of up to
//! 600,000 terms in another order), on widths 1..600,000 (one part and up to 235 parts, see
//! `vela_cuda::sample::top_k_partition`) with ties (also runs of equal values across part
//! boundaries, cut by k), NaN, ±inf, ±0, rows of -inf parts, k > width and k = 0; then the time
//! per call.

use super::*;
use vela_compute::TopK;
use vela_cuda::sample::top_k_partition;

/// Row kinds of [`special_row`].
const KINDS: usize = 12;

/// Row `kind` (< [`KINDS`]) of `width` elements.
fn special_row(rng: &mut Rng, width: usize, kind: usize) -> Vec<f32> {
    let mut v: Vec<f32> = rng.vec(width).iter().map(|x| x * 12.0).collect();
    match kind {
        0 => {}
        // Ties on a coarse grid (many equal values at the k-th place).
        1 => v.iter_mut().for_each(|x| *x = (*x * 2.0).round() / 2.0),
        // NaN, -inf, +0 and -0 sprinkled.
        2 => {
            for (i, x) in v.iter_mut().enumerate() {
                match (rng.next() % 20, i % 3) {
                    (0, _) => *x = f32::NAN,
                    (1, _) => *x = -f32::NAN,
                    (2, _) => *x = f32::NEG_INFINITY,
                    (3, 0) => *x = 0.0,
                    (3, _) => *x = -0.0,
                    _ => {}
                }
            }
        }
        // All equal.
        3 => v.fill(-3.5),
        // All -inf but a few.
        4 => {
            v.fill(f32::NEG_INFINITY);
            for _ in 0..5 {
                let i = (rng.next() % width as u64) as usize;
                v[i] = rng.f();
            }
        }
        // All NaN.
        5 => v.fill(f32::NAN),
        // A +inf and large magnitudes.
        6 => {
            v.iter_mut().for_each(|x| *x *= 1e30);
            let i = (rng.next() % width as u64) as usize;
            v[i] = f32::INFINITY;
        }
        // Logit-like: a few large values over a flat tail, ties in the tail.
        7 => {
            v.iter_mut()
                .for_each(|x| *x = (*x * 64.0).round() / 256.0 - 4.0);
            for j in 0..20 {
                let i = (rng.next() % width as u64) as usize;
                v[i] = 10.0 + j as f32 * 0.5;
            }
        }
        // Ties across part boundaries: a few larger values, then one value repeated at every
        // 97th index and in runs of 80 around every part boundary of the partitions for k = 40,
        // 64 and 1000 (k cuts inside these runs), below it random negative values.
        8 => {
            v.iter_mut().for_each(|x| *x = -x.abs() - 1.0);
            for (i, x) in v.iter_mut().enumerate() {
                if i % 97 == 0 {
                    *x = 2.5;
                }
            }
            for k in [40, 64, 1000] {
                let (part, parts) = top_k_partition(width, k);
                for b in (1..parts).map(|p| p * part) {
                    v[b.saturating_sub(40)..(b + 40).min(width)].fill(2.5);
                }
            }
            for _ in 0..3 {
                let i = (rng.next() % width as u64) as usize;
                v[i] = 7.0;
            }
        }
        // Equal maxima at every 7th index; +0, -0 and -inf between (ties of +0 and -0).
        9 => {
            for (i, x) in v.iter_mut().enumerate() {
                *x = match (i % 7, i % 5, i % 11, i % 3) {
                    (0, ..) => 1.25,
                    (_, 0, ..) => -0.0,
                    (_, _, 0, _) => f32::NEG_INFINITY,
                    (.., 0) => 0.0,
                    _ => *x - 20.0,
                };
            }
        }
        // -inf in the first half (parts of -inf only below a larger max), then NaN and -5.
        10 => {
            for (i, x) in v.iter_mut().enumerate() {
                *x = if i < width / 2 {
                    f32::NEG_INFINITY
                } else if i % 2 == 1 {
                    f32::NAN
                } else {
                    -5.0
                };
            }
        }
        // All -inf (sum_exp NaN).
        _ => v.fill(f32::NEG_INFINITY),
    }
    v
}

fn same(a: &TopK, b: &TopK) -> Result<(), String> {
    let bits = |t: &TopK| {
        t.items
            .iter()
            .map(|&(i, l)| (i, l.to_bits()))
            .collect::<Vec<_>>()
    };
    if bits(a) != bits(b) {
        let first = bits(a)
            .iter()
            .zip(bits(b))
            .position(|(x, y)| *x != y)
            .unwrap_or(a.items.len().min(b.items.len()));
        return Err(format!(
            "items differ (lens {} vs {}, first difference at {first}: {:?} vs {:?})",
            a.items.len(),
            b.items.len(),
            a.items.get(first),
            b.items.get(first)
        ));
    }
    if a.n_valid != b.n_valid || a.max != b.max {
        return Err(format!(
            "n_valid/max {}/{} vs {}/{}",
            a.n_valid, a.max, b.n_valid, b.max
        ));
    }
    let (x, y) = (a.sum_exp, b.sum_exp);
    let ok = (x.is_nan() && y.is_nan()) || x == y || ((x - y).abs() <= 1e-10 * y.abs());
    if !ok {
        return Err(format!("sum_exp {x:e} vs {y:e}"));
    }
    Ok(())
}

#[test]
fn device_top_k_matches_cpu() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(777);
    let mut checks = 0;
    let mut worst_rel = 0f64;
    let mut parts_seen = 0;
    for &width in &[
        1usize, 2, 32, 33, 100, 1000, 1024, 1025, 2048, 2049, 4097, 10_000, 49_152, 151_936,
        262_144, 262_147, 600_000,
    ] {
        let kinds = KINDS;
        let x: Vec<f32> = (0..kinds)
            .flat_map(|kind| special_row(&mut rng, width, kind))
            .collect();
        let xg = up(&g, &x);
        let xc = up(&cpu, &x);
        // The top-k output shares argmax_rows' buffers: both must keep working in turn.
        let argmax = g.argmax_rows(&xg, kinds, width);
        for &k in &[0usize, 1, 2, 40, 64, 100, 1000, 1024, width + 3, 2000] {
            parts_seen = parts_seen.max(top_k_partition(width, k).1);
            let dev = g.top_k_rows(&xg, kinds, width, k);
            let host = cpu.top_k_rows(&xc, kinds, width, k);
            assert_eq!(dev.len(), kinds);
            for (r, (d, h)) in dev.iter().zip(&host).enumerate() {
                if let Err(e) = same(d, h) {
                    eprintln!(
                        "RESULT | device top-k width {width} k {k} row kind {r} | {e} | | FAIL |"
                    );
                    panic!("width {width} k {k} row kind {r}: {e}");
                }
                if h.sum_exp.is_finite() && h.sum_exp != 0.0 {
                    worst_rel = worst_rel.max((d.sum_exp - h.sum_exp).abs() / h.sum_exp.abs());
                }
                checks += 1;
            }
        }
        assert_eq!(
            g.argmax_rows(&xg, kinds, width),
            argmax,
            "argmax after top-k"
        );
    }
    eprintln!(
        "RESULT | device top-k vs CPU | {checks} rows (up to {parts_seen} parts), items bit-identical, worst sum_exp rel {worst_rel:.2e} | | ok |"
    );
}

/// Time per call of the device selection (one row, after a warm-up), against reading the row
/// back (what the sampler did before).
#[test]
fn device_top_k_timing() {
    let Some(g) = gpu() else { return };
    let mut rng = Rng(778);
    for &width in &[49_152usize, 151_936, 262_144] {
        let x: Vec<f32> = rng.vec(width).iter().map(|v| v * 10.0).collect();
        let xg = up(&g, &x);
        for &k in &[1usize, 40, 64, 256, 1024] {
            let parts = top_k_partition(width, k).1;
            let _ = g.top_k_rows(&xg, 1, width, k);
            let n = 200;
            let t0 = Instant::now();
            for _ in 0..n {
                std::hint::black_box(g.top_k_rows(&xg, 1, width, k));
            }
            let us = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
            let mut row = vec![0f32; width];
            let t0 = Instant::now();
            for _ in 0..n {
                g.read(&xg, &mut row);
            }
            let read_us = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
            eprintln!(
                "RESULT | device top-k timing width {width} k {k} ({parts} parts) | {us:.1} µs per call (reading the row back: {read_us:.1} µs) | | ok |"
            );
        }
    }
}
