//! Exact mode of the CPU matmul (`VELA_MATMUL=f32`): weights dequantized to f32, activations
//! kept in f32, products and sums in f64.
//!
//! The default path quantizes activations to Q8/Q8_K blocks (like ggml), and a model amplifies
//! the rare rounding flips of that quantization: two CPU kernel families of vela itself differ
//! end-to-end by NMSE ~1e-3 on SmolLM2. This mode removes the activation rounding altogether, so
//! two implementations (CPU and GPU) that follow it differ only by the order of f64 additions and
//! agree to ~1e-7 relative after the final rounding to f32. It is slow (every weight row is
//! dequantized per call) and meant for correctness criteria, not for serving.
//!
//! Weight values are those of [`vela_formats::quant::dequantize`] (bit-exact with llama.cpp's
//! `dequantize_row_*`); each row is dequantized on the fly into a per-thread buffer, then dotted
//! with every activation row: `y = Σ_c (w_c as f64) · (x_c as f64)` (each product is exact in
//! f64), rounded once to f32.

use super::QMatrix;
use crate::cpu::pool::ThreadPool;
use std::cell::{Cell, RefCell};
use std::sync::OnceLock;

thread_local! {
    /// Per-thread override of the `VELA_MATMUL` switch (see [`set_thread_override`]).
    static OVERRIDE: Cell<Option<bool>> = const { Cell::new(None) };
    /// One dequantized weight row.
    static ROW: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Whether `VELA_MATMUL=f32` is set (read once per process); other values select the default
/// quantized-activation path.
pub fn env_enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("VELA_MATMUL").as_deref() == Ok("f32"))
}

/// Whether matmuls started on this thread use the exact mode: the thread's override if set,
/// else [`env_enabled`].
pub fn enabled() -> bool {
    OVERRIDE.with(|o| o.get()).unwrap_or_else(env_enabled)
}

/// Force the exact mode on or off (`Some`) or follow `VELA_MATMUL` (`None`) for matmuls started
/// on the calling thread (tests compare both modes in one process without touching the
/// environment or other threads).
pub fn set_thread_override(on: Option<bool>) {
    OVERRIDE.with(|o| o.set(on));
}

/// `ys[i][t * rows_i + r] = Σ_c W_i[r][c] · x[t * cols + c]` in exact mode; same shapes and
/// panics as [`super::matmul_multi`]. Any type [`vela_formats::quant::dequantize`] accepts works.
pub fn matmul_multi(
    pool: &ThreadPool,
    ws: &[&QMatrix],
    x: &[f32],
    n_tokens: usize,
    ys: &mut [&mut [f32]],
) {
    assert_eq!(
        ws.len(),
        ys.len(),
        "matmul_multi: {} matrices but {} outputs",
        ws.len(),
        ys.len()
    );
    for (w, y) in ws.iter().zip(ys.iter_mut()) {
        let (rows, cols) = (w.rows, w.cols);
        assert!(
            x.len() >= n_tokens * cols,
            "matmul: x shorter than {n_tokens}x{cols}"
        );
        assert!(
            y.len() >= n_tokens * rows,
            "matmul: y shorter than {n_tokens}x{rows}"
        );
        let wrow = w.ty.row_bytes(cols as u64).unwrap_or_else(|| {
            panic!(
                "matmul: cols {cols} is not a multiple of {}'s block",
                w.ty.name()
            )
        }) as usize;
        assert!(
            w.data.len() >= rows * wrow,
            "matmul: weight data shorter than {rows}x{cols}"
        );
        if rows == 0 || n_tokens == 0 {
            continue;
        }
        let yp = super::SendPtr(y.as_mut_ptr());
        let n_chunks = rows.min(8 * pool.n_threads());
        pool.run_chunks(n_chunks, |c| {
            let (r0, r1) = (rows * c / n_chunks, rows * (c + 1) / n_chunks);
            ROW.with(|cell| {
                let mut row = cell.borrow_mut();
                row.resize(cols, 0.0);
                for r in r0..r1 {
                    vela_formats::quant::dequantize(
                        w.ty,
                        &w.data[r * wrow..(r + 1) * wrow],
                        &mut row,
                    )
                    .unwrap_or_else(|e| panic!("matmul (exact): {e}"));
                    for t in 0..n_tokens {
                        let xt = &x[t * cols..(t + 1) * cols];
                        let s: f64 = row.iter().zip(xt).map(|(&a, &b)| a as f64 * b as f64).sum();
                        // SAFETY: chunks own disjoint row ranges; t * rows + r < y.len().
                        unsafe { *yp.get().add(t * rows + r) = s as f32 };
                    }
                }
            });
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vela_formats::quant::GgmlType as G;

    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn f(&mut self) -> f32 {
            (self.next() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        }
    }

    /// Random quants with sane f16 scales at the given byte offsets of every block.
    fn weights(rng: &mut Rng, ty: G, rows: usize, cols: usize, scales: &[usize]) -> Vec<u8> {
        let rb = ty.row_bytes(cols as u64).unwrap() as usize;
        let mut d: Vec<u8> = (0..rows * rb).map(|_| rng.next() as u8).collect();
        match ty {
            G::F32 => d
                .chunks_exact_mut(4)
                .for_each(|c| c.copy_from_slice(&rng.f().to_le_bytes())),
            G::F16 => d
                .chunks_exact_mut(2)
                .for_each(|c| c.copy_from_slice(&half::f16::from_f32(rng.f()).to_le_bytes())),
            _ => {
                for b in d.chunks_exact_mut(ty.type_size()) {
                    for &o in scales {
                        let s = half::f16::from_f32(0.01 + 0.02 * rng.f().abs());
                        b[o..o + 2].copy_from_slice(&s.to_le_bytes());
                    }
                }
            }
        }
        d
    }

    /// Exact mode equals an f64 reference built from the dequantized weights (to f32
    /// rounding), and stays within the activation-quantization error of the default path.
    #[test]
    fn exact_matches_f64_reference_and_default_path() {
        let pool = ThreadPool::new(2);
        let mut rng = Rng(0x1234_5678_9abc_def1);
        let cases: [(G, &[usize]); 10] = [
            (G::Q4_0, &[0]),
            (G::Q4_1, &[0, 2]),
            (G::Q5_0, &[0]),
            (G::Q5_1, &[0, 2]),
            (G::Q8_0, &[0]),
            (G::Q4_K, &[0, 2]),
            (G::Q5_K, &[0, 2]),
            (G::Q6_K, &[208]),
            (G::F16, &[]),
            (G::F32, &[]),
        ];
        for (ty, sc) in cases {
            let (rows, cols, n) = (13usize, ty.block_size() * 3, 3usize);
            let data = weights(&mut rng, ty, rows, cols, sc);
            let w = QMatrix {
                ty,
                rows,
                cols,
                data: &data,
            };
            let x: Vec<f32> = (0..n * cols).map(|_| rng.f()).collect();
            let mut ye = vec![0f32; n * rows];
            matmul_multi(&pool, &[&w], &x, n, &mut [&mut ye]);
            let mut wf = vec![0f32; rows * cols];
            vela_formats::quant::dequantize(ty, &data, &mut wf).unwrap();
            let mut yd = vec![0f32; n * rows];
            super::super::matmul_with(super::super::Kernel::Scalar, &pool, &w, &x, n, &mut yd);
            let (mut se_d, mut sb) = (0f64, 0f64);
            for t in 0..n {
                for r in 0..rows {
                    let refv: f64 = (0..cols)
                        .map(|c| wf[r * cols + c] as f64 * x[t * cols + c] as f64)
                        .sum();
                    let got = ye[t * rows + r] as f64;
                    assert!(
                        (got - refv).abs() <= 1e-6 * refv.abs().max(1e-3),
                        "{ty}: exact {got} vs f64 reference {refv}"
                    );
                    se_d += (yd[t * rows + r] as f64 - refv).powi(2);
                    sb += refv * refv;
                }
            }
            // The default path quantizes activations (8-bit): small but nonzero error.
            let nmse = se_d / sb;
            assert!(nmse < 1e-3, "{ty}: default path nmse {nmse:.2e} vs exact");
        }
    }

    #[test]
    fn thread_override_switches_the_mode() {
        set_thread_override(Some(true));
        assert!(enabled());
        set_thread_override(Some(false));
        assert!(!enabled());
        set_thread_override(None);
        assert_eq!(enabled(), env_enabled());
    }
}
