//! Micro-benchmark of the CPU matmul kernels.
//!
//! `cargo run --release -p vela-compute --example matmul_bench [threads]`
//!
//! Prints, per kernel family available on this CPU, the decode matvec bandwidth (GB/s of weight
//! bytes streamed) for 576×1536 and 896×4864 matrices and the prefill throughput (GFLOP/s) of a
//! 512-token matmul, for the weight types of the test models. First it measures the machine's
//! streaming-read bandwidth (1 and `threads` threads over a 512 MiB buffer), which bounds decode
//! speed: tokens/s ≤ bandwidth / weight bytes read per token.
//!
//! `... matmul_bench [threads] [filter]`: `filter` restricts to kernel names / types containing it;
//! `bw` runs only the bandwidth test.

use std::time::Instant;
use vela_compute::cpu::matmul::{
    matmul_multi_packed_with, matmul_multi_with, matmul_with, Kernel, PackedMatrix, QMatrix,
};
use vela_compute::cpu::pool::ThreadPool;
use vela_formats::quant::GgmlType;

fn weights(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let rb = ty.row_bytes(cols as u64).unwrap() as usize;
    let mut s = 0x1234_5678u32;
    let mut data: Vec<u8> = (0..rows * rb)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            s as u8
        })
        .collect();
    // Sane f16 scales (0x2000 ≈ 0.0078) so no NaN/denormal arithmetic skews the timing.
    let fields: &[usize] = match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 => &[0],
        GgmlType::Q4_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        _ => &[],
    };
    for blk in data.chunks_exact_mut(ty.type_size()) {
        for &o in fields {
            blk[o..o + 2].copy_from_slice(&0x2000u16.to_le_bytes());
        }
    }
    data
}

/// Fastest single call of `f` over at least `min_secs` (the shared machine preempts us; the
/// minimum is the least disturbed estimate).
fn time(mut f: impl FnMut(), min_secs: f64) -> f64 {
    f();
    let (start, mut iters, mut best) = (Instant::now(), 0u32, f64::MAX);
    while start.elapsed().as_secs_f64() < min_secs || iters < 3 {
        let t = Instant::now();
        f();
        best = best.min(t.elapsed().as_secs_f64());
        iters += 1;
    }
    best
}

/// Sum of `buf` as u64 lanes (the compiler vectorizes this into wide loads).
fn sum_u64(buf: &[u64]) -> u64 {
    let mut acc = [0u64; 8];
    for c in buf.chunks_exact(8) {
        for i in 0..8 {
            acc[i] = acc[i].wrapping_add(c[i]);
        }
    }
    acc.iter().fold(0, |a, &b| a.wrapping_add(b))
}

/// Streaming-read bandwidth in GB/s with `n` threads each reading a disjoint slice of `buf`.
fn read_bandwidth(buf: &[u64], n: usize) -> f64 {
    let chunk = buf.len().div_ceil(n);
    let mut best = f64::MAX;
    for _ in 0..5 {
        let start = Instant::now();
        let total: u64 = std::thread::scope(|s| {
            let hs: Vec<_> = buf
                .chunks(chunk)
                .map(|c| s.spawn(move || sum_u64(c)))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).sum()
        });
        std::hint::black_box(total);
        best = best.min(start.elapsed().as_secs_f64());
    }
    (buf.len() * 8) as f64 / best / 1e9
}

fn main() {
    let threads: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2);
    let filter = std::env::args().nth(2).unwrap_or_default();
    {
        let buf: Vec<u64> = (0..(512usize << 20) / 8).map(|i| i as u64).collect();
        for n in 1..=threads {
            println!(
                "streaming read, {n} thread(s), 512 MiB: {:.1} GB/s (best of 5)",
                read_bandwidth(&buf, n)
            );
        }
        let small: Vec<u64> = (0..(16usize << 20) / 8).map(|i| i as u64).collect();
        for n in 1..=threads {
            let mut bw = 0f64;
            for _ in 0..4 {
                bw = bw.max(read_bandwidth(&small, n));
            }
            println!("streaming read, {n} thread(s), 16 MiB (L3): {bw:.1} GB/s");
        }
    }
    if filter == "bw" {
        return;
    }
    let pool = ThreadPool::new(threads);
    let types = [
        GgmlType::Q4_K,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q5_0,
        GgmlType::Q6_K,
    ];
    println!("threads: {threads}");
    for kernel in Kernel::all_available() {
        if kernel == Kernel::Scalar && filter.is_empty() {
            continue;
        }
        println!("== kernel {} ==", kernel.name());
        for ty in types {
            if !(filter.is_empty() || kernel.name().contains(&filter) || ty.name() == filter) {
                continue;
            }
            let mut line = format!("{:>5}", ty.name());
            for (rows, cols) in [(576, 1536), (896, 4864)] {
                let data = weights(ty, rows, cols);
                let w = QMatrix {
                    ty,
                    rows,
                    cols,
                    data: &data,
                };
                let x: Vec<f32> = (0..cols)
                    .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                    .collect();
                let mut y = vec![0f32; rows];
                let t = time(|| matmul_with(kernel, &pool, &w, &x, 1, &mut y), 0.2);
                line += &format!(
                    "  decode {rows}x{cols}: {:6.1} us {:6.1} GB/s",
                    t * 1e6,
                    data.len() as f64 / t / 1e9
                );
            }
            let (rows, cols, n) = (896, 4864, 512);
            let data = weights(ty, rows, cols);
            let w = QMatrix {
                ty,
                rows,
                cols,
                data: &data,
            };
            let x: Vec<f32> = (0..n * cols)
                .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                .collect();
            let mut y = vec![0f32; n * rows];
            let secs = if kernel == Kernel::Scalar { 0.5 } else { 1.0 };
            let t = time(|| matmul_with(kernel, &pool, &w, &x, n, &mut y), secs);
            line += &format!(
                "  prefill {n}x{rows}x{cols}: {:7.1} GFLOP/s",
                2.0 * (rows * cols * n) as f64 / t / 1e9
            );
            println!("{line}");
        }
    }
    // The repacked GEMM (`PackedMatrix`, AVX-512 only): decode at 1 token and prefill.
    if Kernel::Avx512.available() {
        println!("== packed (avx512) ==");
        for ty in types {
            if !(filter.is_empty() || "packed".contains(&filter) || ty.name() == filter) {
                continue;
            }
            let mut line = format!("{:>5}", ty.name());
            for (rows, cols, n) in [
                (576, 1536, 1),
                (896, 4864, 1),
                (896, 4864, 512),
                (4864, 896, 512),
            ] {
                if cols % ty.block_size() != 0 {
                    continue;
                }
                let data = weights(ty, rows, cols);
                let w = QMatrix {
                    ty,
                    rows,
                    cols,
                    data: &data,
                };
                let p = PackedMatrix::new(&w).expect("packable type");
                let x: Vec<f32> = (0..n * cols)
                    .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                    .collect();
                let mut y = vec![0f32; n * rows];
                let run = |y: &mut Vec<f32>| {
                    let k = Kernel::Avx512;
                    matmul_multi_packed_with(k, &pool, &[&w], &[Some(&p)], &x, n, &mut [y]);
                };
                let t = time(|| run(&mut y), if n == 1 { 0.2 } else { 1.0 });
                if n == 1 {
                    line += &format!(
                        "  decode {rows}x{cols}: {:6.1} us {:6.1} GB/s",
                        t * 1e6,
                        data.len() as f64 / t / 1e9
                    );
                } else {
                    line += &format!(
                        "  prefill {n}x{rows}x{cols}: {:7.1} GFLOP/s",
                        2.0 * (rows * cols * n) as f64 / t / 1e9
                    );
                }
            }
            println!("{line}");
        }
    }
    // SmolLM2-135M attention projections (Q 576x576, K/V 192x576, Q4_1) for one token: three
    // dispatches vs one `matmul_multi`.
    let kernel = Kernel::selected();
    let ty = GgmlType::Q4_1;
    let shapes = [(576, 576), (192, 576), (192, 576)];
    let datas: Vec<Vec<u8>> = shapes.iter().map(|&(r, c)| weights(ty, r, c)).collect();
    let mats: Vec<QMatrix> = shapes
        .iter()
        .zip(&datas)
        .map(|(&(rows, cols), data)| QMatrix {
            ty,
            rows,
            cols,
            data,
        })
        .collect();
    let refs: Vec<&QMatrix> = mats.iter().collect();
    let x: Vec<f32> = (0..576).map(|i| (i % 17) as f32 / 8.0 - 1.0).collect();
    let mut outs: Vec<Vec<f32>> = shapes.iter().map(|&(r, _)| vec![0f32; r]).collect();
    let sep = time(
        || {
            for (m, o) in mats.iter().zip(outs.iter_mut()) {
                matmul_with(kernel, &pool, m, &x, 1, o);
            }
        },
        0.3,
    );
    let multi = time(
        || {
            let mut ys: Vec<&mut [f32]> = outs.iter_mut().map(|v| v.as_mut_slice()).collect();
            matmul_multi_with(kernel, &pool, &refs, &x, 1, &mut ys);
        },
        0.3,
    );
    println!(
        "QKV 576->576+192+192 q4_1 decode ({}): 3 x matmul {:.1} us, matmul_multi {:.1} us",
        kernel.name(),
        sep * 1e6,
        multi * 1e6
    );
}
