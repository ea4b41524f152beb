//! The CPU reference of the model kit's generic ops (MoE and hybrid architectures): softmax,
//! sigmoid, elementwise product, row gather and scatter-add (routing: `route.rs`). Plain Rust on slices: these run on
//! a few rows per step (router logits, routed tokens), so clarity beats SIMD here. Semantics
//! are the [`crate::Backend`] methods' (`softmax_rows`, ...); the trait impl in `ops.rs` calls
//! these.

/// Softmax of one row in place: max, `exp(x - max)`, f64 sum in index order, divide by the sum
/// rounded to f32. A row whose max is -inf (or empty) becomes all 0.
pub fn softmax_row(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    if max == f32::NEG_INFINITY {
        x.fill(0.0);
        return;
    }
    let mut sum = 0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let s = sum as f32;
    x.iter_mut().for_each(|v| *v /= s);
}

/// [`softmax_row`] of `n_rows` rows of `width`.
pub fn softmax_rows(x: &mut [f32], n_rows: usize, width: usize) {
    if width == 0 {
        return;
    }
    x[..n_rows * width]
        .chunks_exact_mut(width)
        .for_each(softmax_row);
}

/// The logistic function `1 / (1 + exp(-x))`.
pub fn sigmoid1(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// [`sigmoid1`] of every element, in place.
pub fn sigmoid(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = sigmoid1(*v));
}

/// x *= y elementwise.
pub fn mul(x: &mut [f32], y: &[f32]) {
    x.iter_mut().zip(y).for_each(|(a, b)| *a *= b);
}

/// `out` row i = `src` row `idx[i]` (rows of `width`) for i < `idx.len()`; an index past `src`
/// is debug-asserted and gives a zero row.
pub fn gather_rows(src: &[f32], idx: &[u32], width: usize, out: &mut [f32]) {
    let n_src = src.len().checked_div(width).unwrap_or(0);
    for (i, &r) in idx.iter().enumerate() {
        let o = &mut out[i * width..(i + 1) * width];
        let r = r as usize;
        if r < n_src {
            o.copy_from_slice(&src[r * width..(r + 1) * width]);
        } else {
            debug_assert!(false, "gather_rows: index {r} past {n_src} rows");
            o.fill(0.0);
        }
    }
}

/// `dst` row `idx[i]` += `w[i]` · `src` row i, in ascending i (each product rounded, then the
/// sum); an index past `dst` is debug-asserted and skipped.
pub fn scatter_add_rows(
    dst: &mut [f32],
    src: &[f32],
    idx: &[u32],
    w: Option<&[f32]>,
    width: usize,
) {
    let n_dst = dst.len().checked_div(width).unwrap_or(0);
    for (i, &r) in idx.iter().enumerate() {
        let r = r as usize;
        if r >= n_dst {
            debug_assert!(false, "scatter_add_rows: index {r} past {n_dst} rows");
            continue;
        }
        let d = &mut dst[r * width..(r + 1) * width];
        let s = &src[i * width..(i + 1) * width];
        match w {
            Some(w) => d.iter_mut().zip(s).for_each(|(d, s)| *d += w[i] * s),
            None => d.iter_mut().zip(s).for_each(|(d, s)| *d += s),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) struct Rng(pub u64);
    impl Rng {
        pub fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        /// Uniform in [-1, 1).
        pub fn f(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        }
    }

    /// Softmax against an f64 reference on odd widths, with -inf entries and all -inf rows.
    #[test]
    fn softmax_matches_f64_reference() {
        let mut rng = Rng(11);
        for width in [1usize, 2, 3, 7, 33, 129, 1000] {
            let n_rows = 5;
            let mut x: Vec<f32> = (0..n_rows * width).map(|_| rng.f() * 20.0).collect();
            // Row 1: some -inf; row 2: all -inf; row 3: huge values (overflow without the max).
            for (i, v) in x[width..2 * width].iter_mut().enumerate() {
                if i % 3 == 1 {
                    *v = f32::NEG_INFINITY;
                }
            }
            x[2 * width..3 * width].fill(f32::NEG_INFINITY);
            x[3 * width..4 * width]
                .iter_mut()
                .for_each(|v| *v = *v * 1e3 + 1e30);
            let orig = x.clone();
            softmax_rows(&mut x, n_rows, width);
            for r in 0..n_rows {
                let row = &orig[r * width..(r + 1) * width];
                // The reference takes the same f32 differences (their rounding is not softmax's).
                let m = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
                let z: f64 = row.iter().map(|&v| ((v - m) as f64).exp()).sum();
                for c in 0..width {
                    let got = x[r * width + c];
                    let want = if r == 2 {
                        0.0
                    } else {
                        ((row[c] - m) as f64).exp() / z
                    };
                    assert!(
                        (got as f64 - want).abs() <= 4e-7 * want + 1e-30,
                        "width {width} row {r} col {c}: {got} vs {want}"
                    );
                    if row[c] == f32::NEG_INFINITY {
                        assert_eq!(got, 0.0);
                    }
                }
            }
        }
        softmax_rows(&mut [], 0, 0);
    }

    #[test]
    fn sigmoid_and_mul() {
        let mut x = vec![0.0, 1.0, -1.0, 30.0, -30.0, -100.0, f32::INFINITY];
        let orig = x.clone();
        sigmoid(&mut x);
        for (g, o) in x.iter().zip(&orig) {
            let want = 1.0 / (1.0 + (-*o as f64).exp());
            // exp(100) overflows f32: sigmoid(-100) is 0 (the true value is subnormal).
            assert!(
                (*g as f64 - want).abs() <= 1e-7 * want + 1e-38,
                "{o}: {g} vs {want}"
            );
        }
        assert_eq!(x[0], 0.5);
        let mut a = vec![1.5, -2.0, 3.0];
        mul(&mut a, &[2.0, 0.5, -1.0]);
        assert_eq!(a, vec![3.0, -1.0, -3.0]);
    }

    /// Gather and scatter-add on odd shapes against an independent loop (rows of the
    /// destination visited in ascending source order), with repeated indices and weights.
    #[test]
    fn gather_scatter_match_reference() {
        let mut rng = Rng(5);
        for (n_src, n, width) in [
            (1usize, 1usize, 1usize),
            (5, 9, 3),
            (17, 40, 33),
            (3, 64, 7),
        ] {
            let src: Vec<f32> = (0..n_src * width).map(|_| rng.f()).collect();
            let idx: Vec<u32> = (0..n).map(|_| (rng.next() % n_src as u64) as u32).collect();
            let mut out = vec![f32::NAN; n * width];
            gather_rows(&src, &idx, width, &mut out);
            for i in 0..n {
                let r = idx[i] as usize;
                assert_eq!(
                    out[i * width..(i + 1) * width],
                    src[r * width..(r + 1) * width]
                );
            }
            let rows: Vec<f32> = (0..n * width).map(|_| rng.f()).collect();
            let w: Vec<f32> = (0..n).map(|_| rng.f()).collect();
            let base: Vec<f32> = (0..n_src * width).map(|_| rng.f()).collect();
            for weights in [None, Some(&w[..])] {
                let mut dst = base.clone();
                scatter_add_rows(&mut dst, &rows, &idx, weights, width);
                for d in 0..n_src {
                    for c in 0..width {
                        let mut acc = base[d * width + c];
                        for i in (0..n).filter(|&i| idx[i] as usize == d) {
                            let s = rows[i * width + c];
                            acc += weights.map_or(s, |w| w[i] * s);
                        }
                        assert_eq!(dst[d * width + c].to_bits(), acc.to_bits(), "{d} {c}");
                    }
                }
            }
        }
        // Two rows onto one destination: added in order, rounding after each.
        let mut dst = vec![1.0f32];
        scatter_add_rows(&mut dst, &[1e8, -1e8], &[0, 0], Some(&[1.0, 1.0]), 1);
        assert_eq!(dst, vec![0.0]); // (1 + 1e8) rounds to 1e8, minus 1e8
    }

    /// Out-of-range indices (release builds: the debug assertion is off) give zero rows in a
    /// gather and are skipped by a scatter.
    #[test]
    fn out_of_range_indices_are_harmless() {
        if cfg!(debug_assertions) {
            return;
        }
        let src = vec![1.0f32, 2.0, 3.0, 4.0];
        let mut out = vec![9.0f32; 4];
        gather_rows(&src, &[1, 2], 2, &mut out);
        assert_eq!(out, vec![3.0, 4.0, 0.0, 0.0]);
        let mut dst = vec![0.0f32; 2];
        scatter_add_rows(&mut dst, &[1.0, 1.0, 5.0, 5.0], &[7, 0], None, 2);
        assert_eq!(dst, vec![5.0, 5.0]);
    }
}
