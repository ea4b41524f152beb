//! Every kernel path (scalar, AVX2, AVX-512) must compute the same products on real weights with
//! realistic activations (large outliers, as hidden states have), so that the choice of path does
//! not change model outputs beyond float-summation order.

use std::sync::Arc;
use vela_compute::cpu::matmul::{matmul_with, Kernel, QMatrix};
use vela_compute::cpu::pool::ThreadPool;
use vela_formats::gguf::GgufFile;
use vela_formats::testdata;

fn activations(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|i| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let u = ((s >> 33) as f32 / (1u64 << 31) as f32) - 0.5;
            if i % 97 == 0 {
                u * 200.0
            } else {
                u * 2.0
            }
        })
        .collect()
}

#[test]
fn kernel_paths_agree_on_real_tensors() {
    let pool = ThreadPool::new(2);
    let kernels: Vec<Kernel> = Kernel::all_available();
    for name in [testdata::SMOLLM2, testdata::GEMMA3, testdata::QWEN25] {
        let Some(p) = testdata::model(name) else {
            return;
        };
        let g = Arc::new(GgufFile::open(&p).unwrap());
        let mut seen = std::collections::HashSet::new();
        for t in g.tensors.iter().filter(|t| t.dims.len() == 2) {
            if !seen.insert(t.ty) {
                continue;
            }
            let rows = t.n_rows().min(64);
            let cols = t.ne0();
            let row_bytes = t.ty.row_bytes(cols as u64).unwrap() as usize;
            let data = &g.tensor_data(t)[..rows * row_bytes];
            let w = QMatrix {
                ty: t.ty,
                rows,
                cols,
                data,
            };
            let mut wf = vec![0f32; rows * cols];
            vela_formats::quant::dequantize(t.ty, data, &mut wf).unwrap();
            for n_tok in [1usize, 5] {
                let x = activations(n_tok * cols, 7 + n_tok as u64);
                let outs: Vec<Vec<f32>> = kernels
                    .iter()
                    .map(|&k| {
                        let mut y = vec![0f32; n_tok * rows];
                        matmul_with(k, &pool, &w, &x, n_tok, &mut y);
                        y
                    })
                    .collect();
                for (ki, o) in outs.iter().enumerate().skip(1) {
                    for i in 0..o.len() {
                        let (a, b) = (outs[0][i], o[i]);
                        let (tok, r) = (i / rows, i % rows);
                        // Summation-order bound: a few f32 ulps of Σ|w·x|.
                        let mag: f32 = (0..cols)
                            .map(|c| (wf[r * cols + c] * x[tok * cols + c]).abs())
                            .sum();
                        let tol = 2e-6 * mag + 1e-6;
                        assert!(
                            (a - b).abs() <= tol,
                            "{name} {} ({}) n={n_tok} row {}: {} = {a} vs {} = {b}",
                            t.name,
                            t.ty,
                            i % rows,
                            kernels[0].name(),
                            kernels[ki].name()
                        );
                    }
                }
            }
        }
    }
}
