//! The expert-indexed product on the CPU ([`crate::Backend::matmul_experts`]): the routed slots
//! are grouped by expert, each group's activation rows gathered and multiplied by the expert's
//! rows of the 3-D weight through the ordinary quantized product (`matmul::matmul_rows_packed`:
//! the same int8-activation arithmetic, SIMD kernels and, on AVX-512, the repacked copy's row
//! range), then the rows scattered back. A single token's slots (decode) share one dispatch.
//!
//! Bit-identical to [`crate::Backend::matmul`] of a weight holding only the expert's rows over
//! the same gathered rows (what the Gemma 4 MoE block runs today): a row's product does not
//! depend on the batch it is in (`matmul::tests::rows_do_not_depend_on_batch_size`), and the
//! packed row range gives the whole packed matrix's bits, which are the scalar kernel's as are
//! a per-expert packed copy's (`packed_row_ranges_match_the_whole_matrix`).

use super::matmul::{self, PackedMatrix, PackedRows, QMatrix};
use super::pool::ThreadPool;

/// See [`crate::Backend::matmul_experts`]; `w` is the whole `[E · rows_per_expert, cols]` weight
/// and `packed` its repacked copy, if any; `refine` as `matmul_multi_packed`'s.
#[allow(clippy::too_many_arguments)]
pub fn matmul_experts(
    pool: &ThreadPool,
    w: &QMatrix,
    packed: Option<&PackedMatrix>,
    rows_per_expert: usize,
    x: &[f32],
    x_per_slot: bool,
    ids: &[u32],
    n_tokens: usize,
    k: usize,
    y: &mut [f32],
    refine: bool,
) {
    let (rpe, cols) = (rows_per_expert, w.cols);
    assert!(
        rpe > 0 && w.rows.is_multiple_of(rpe),
        "matmul_experts: {} rows are not experts of {rpe} rows",
        w.rows
    );
    let n_exp = w.rows / rpe;
    let n_slots = n_tokens * k;
    let x_rows = if x_per_slot { n_slots } else { n_tokens };
    assert!(
        ids.len() >= n_slots && x.len() >= x_rows * cols && y.len() >= n_slots * rpe,
        "matmul_experts: buffers too small for {n_tokens} tokens x {k} slots"
    );
    let wrow = w.ty.row_bytes(cols as u64).expect("checked at upload") as usize;
    // Slots in (expert, slot) order; unknown experts give zero rows.
    let mut order: Vec<usize> = Vec::with_capacity(n_slots);
    for s in 0..n_slots {
        if (ids[s] as usize) < n_exp {
            order.push(s);
        } else {
            y[s * rpe..(s + 1) * rpe].fill(0.0);
        }
    }
    order.sort_by_key(|&s| ids[s]);
    let view = |e: usize| QMatrix {
        ty: w.ty,
        rows: rpe,
        cols,
        data: &w.data[e * rpe * wrow..(e + 1) * rpe * wrow],
    };
    if n_tokens == 1 && !x_per_slot {
        // Decode: every expert takes the one activation row, so all of them go in one dispatch
        // (bit-identical to separate products, see `matmul_multi`), repeated experts once.
        let mut experts: Vec<usize> = order.iter().map(|&s| ids[s] as usize).collect();
        experts.dedup();
        let views: Vec<QMatrix> = experts.iter().map(|&e| view(e)).collect();
        let vrefs: Vec<&QMatrix> = views.iter().collect();
        let pr: Vec<Option<PackedRows>> = experts
            .iter()
            .map(|&e| packed.map(|m| PackedRows { m, row0: e * rpe }))
            .collect();
        let mut yg = vec![0f32; experts.len() * rpe];
        let mut outs: Vec<&mut [f32]> = yg.chunks_exact_mut(rpe).collect();
        matmul::matmul_rows_packed(pool, &vrefs, &pr, &x[..cols], 1, &mut outs, refine);
        for &s in &order {
            let i = experts.binary_search(&(ids[s] as usize)).expect("listed");
            y[s * rpe..(s + 1) * rpe].copy_from_slice(&yg[i * rpe..(i + 1) * rpe]);
        }
        return;
    }
    let (mut xg, mut yg) = (Vec::new(), Vec::new());
    for group in order.chunk_by(|&a, &b| ids[a] == ids[b]) {
        let e = ids[group[0]] as usize;
        let n = group.len();
        xg.clear();
        for &s in group {
            let r = if x_per_slot { s } else { s / k };
            xg.extend_from_slice(&x[r * cols..(r + 1) * cols]);
        }
        yg.resize(n * rpe, 0.0);
        let pr = packed.map(|m| PackedRows { m, row0: e * rpe });
        matmul::matmul_rows_packed(pool, &[&view(e)], &[pr], &xg, n, &mut [&mut yg[..]], refine);
        for (i, &s) in group.iter().enumerate() {
            y[s * rpe..(s + 1) * rpe].copy_from_slice(&yg[i * rpe..(i + 1) * rpe]);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::cpu::kit::tests::Rng;
    use crate::cpu::CpuBackend;
    use crate::{Backend, HostWeight};
    use std::sync::Arc;
    use vela_formats::gguf::GgufFile;
    use vela_formats::quant::GgmlType as G;

    fn f16(v: f32) -> [u8; 2] {
        half::f16::from_f32(v).to_le_bytes()
    }

    /// Random valid weight bytes: random quants, small positive f16 scales, or random floats.
    fn random_weight(ty: G, rows: usize, cols: usize, rng: &mut Rng) -> Vec<u8> {
        let n = ty.row_bytes(cols as u64).unwrap() as usize * rows;
        let mut b: Vec<u8> = (0..n).map(|_| rng.next() as u8).collect();
        let scales: &[usize] = match ty {
            G::Q4_0 | G::Q8_0 => &[0],
            G::Q5_1 | G::Q4_K => &[0, 2],
            G::Q6_K => &[208],
            G::F16 => {
                b.chunks_exact_mut(2)
                    .for_each(|c| c.copy_from_slice(&f16(rng.f())));
                &[]
            }
            G::F32 => {
                b.chunks_exact_mut(4)
                    .for_each(|c| c.copy_from_slice(&rng.f().to_le_bytes()));
                &[]
            }
            _ => unreachable!(),
        };
        if !scales.is_empty() {
            for blk in b.chunks_exact_mut(ty.type_size()) {
                for &o in scales {
                    blk[o..o + 2].copy_from_slice(&f16(0.01 + 0.02 * rng.f().abs()));
                }
            }
        }
        b
    }

    /// A GGUF v3 image holding 2-D tensors `(name, type, rows, cols, data)`.
    fn gguf(tensors: &[(String, G, usize, usize, Vec<u8>)]) -> Arc<GgufFile> {
        let mut h = Vec::new();
        h.extend_from_slice(b"GGUF");
        h.extend_from_slice(&3u32.to_le_bytes());
        h.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&0u64.to_le_bytes());
        let mut off = 0u64;
        for (name, ty, rows, cols, data) in tensors {
            h.extend_from_slice(&(name.len() as u64).to_le_bytes());
            h.extend_from_slice(name.as_bytes());
            h.extend_from_slice(&2u32.to_le_bytes());
            h.extend_from_slice(&(*cols as u64).to_le_bytes());
            h.extend_from_slice(&(*rows as u64).to_le_bytes());
            h.extend_from_slice(&ty.id().to_le_bytes());
            h.extend_from_slice(&off.to_le_bytes());
            off += (data.len() as u64).div_ceil(32) * 32;
        }
        h.resize(h.len().next_multiple_of(32), 0);
        for (.., data) in tensors {
            h.extend_from_slice(data);
            h.resize(h.len().next_multiple_of(32), 0);
        }
        Arc::new(GgufFile::from_bytes(h).unwrap())
    }

    /// `matmul_experts` against `Backend::matmul` of per-expert weights (each uploaded alone,
    /// with its own packed copy) over each expert's gathered rows in ascending slot order, as the
    /// Gemma 4 MoE block computes today: bit-identical, for the 32-element, k-quant and float
    /// types, expert sizes on and off the packed tiles, k = 1..3, repeated experts, shared and
    /// per-slot activations, 1 to 6 tokens, with and without precise products.
    #[test]
    fn matches_per_expert_matmul_bit_exactly() {
        let be = CpuBackend::new(2);
        let mut rng = Rng(31337);
        let mut cases = 0;
        for ty in [G::Q4_0, G::Q8_0, G::Q5_1, G::Q4_K, G::Q6_K, G::F16, G::F32] {
            let cols = match ty.block_size() {
                1 => 40,
                32 => 96,
                _ => 512,
            };
            for (n_exp, rpe) in [(4usize, 17usize), (3, 32), (5, 7), (2, 1)] {
                let mut tensors = vec![];
                let data = random_weight(ty, n_exp * rpe, cols, &mut rng);
                let wrow = ty.row_bytes(cols as u64).unwrap() as usize;
                tensors.push(("all".to_string(), ty, n_exp * rpe, cols, data.clone()));
                for e in 0..n_exp {
                    let part = data[e * rpe * wrow..(e + 1) * rpe * wrow].to_vec();
                    tensors.push((format!("e{e}"), ty, rpe, cols, part));
                }
                let file = gguf(&tensors);
                let up = |name: &str| {
                    let hw = HostWeight::from_gguf(&file, name).unwrap();
                    be.upload_weight(&hw).unwrap()
                };
                let all = up("all");
                let experts: Vec<_> = (0..n_exp).map(|e| up(&format!("e{e}"))).collect();
                for (k, precise) in [(1usize, false), (2, false), (3, false), (2, true)] {
                    // `precise_products` (the rounding residual's product too) on and off.
                    be.precise_products(precise);
                    for (n_tokens, per_slot) in [(1usize, false), (2, true), (6, false), (3, true)]
                    {
                        let n_slots = n_tokens * k;
                        let x_rows = if per_slot { n_slots } else { n_tokens };
                        let x: Vec<f32> = (0..x_rows * cols).map(|_| rng.f() * 2.0).collect();
                        // Random experts, repeats within a token allowed.
                        let ids: Vec<u32> = (0..n_slots)
                            .map(|_| (rng.next() % n_exp as u64) as u32)
                            .collect();
                        let mut y = vec![f32::NAN; n_slots * rpe];
                        be.matmul_experts(&all, rpe, &x, per_slot, &ids, n_tokens, k, &mut y);
                        for (e, ew) in experts.iter().enumerate() {
                            let slots: Vec<usize> =
                                (0..n_slots).filter(|&s| ids[s] as usize == e).collect();
                            if slots.is_empty() {
                                continue;
                            }
                            let mut xg = vec![];
                            for &s in &slots {
                                let r = if per_slot { s } else { s / k };
                                xg.extend_from_slice(&x[r * cols..(r + 1) * cols]);
                            }
                            let mut yg = vec![f32::NAN; slots.len() * rpe];
                            be.matmul(ew, &xg, slots.len(), &mut yg);
                            for (i, &s) in slots.iter().enumerate() {
                                let (a, b) =
                                    (&y[s * rpe..(s + 1) * rpe], &yg[i * rpe..(i + 1) * rpe]);
                                let same = a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
                                assert!(
                                    same,
                                    "{} E={n_exp} rows={rpe} k={k} n={n_tokens} \
                                     precise={precise} slot {s} expert {e}",
                                    ty.name()
                                );
                            }
                        }
                        cases += 1;
                    }
                }
            }
        }
        assert_eq!(cases, 7 * 4 * 4 * 4);
    }

    /// An expert id past the tensor (release builds: the debug assertion is off) gives a zero row.
    #[test]
    fn unknown_expert_gives_zero_rows() {
        if cfg!(debug_assertions) {
            return;
        }
        let be = CpuBackend::new(1);
        let mut rng = Rng(3);
        let data = random_weight(G::Q8_0, 4, 32, &mut rng);
        let file = gguf(&[("w".to_string(), G::Q8_0, 4, 32, data)]);
        let w = be
            .upload_weight(&HostWeight::from_gguf(&file, "w").unwrap())
            .unwrap();
        let x: Vec<f32> = (0..32).map(|_| rng.f()).collect();
        let mut y = vec![f32::NAN; 4];
        be.matmul_experts(&w, 2, &x, false, &vec![1, 2], 1, 2, &mut y);
        assert!(y[..2].iter().all(|v| v.is_finite()) && y[2..] == [0.0, 0.0]);
    }
}
