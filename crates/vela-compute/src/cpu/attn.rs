//! Blocked causal attention for prefill batches (AVX-512, or AVX2 with the same results).
//!
//! The per-token attention in `ops.rs` walks the keys once per query token, one 64-element dot
//! at a time; for a batch that is ~10 GFLOP/s. Here a task is one KV head × a block of
//! [`TOKENS`] query tokens (all query heads of that KV head): the task's key range is converted
//! once into a transposed f32 scratch (`kt[d][key]`) and the values into `v[key][d]`, then
//!
//! 1. scores `S = Q·Kᵀ · scale` with a 4-row × 32-key register tile (broadcast `q[r][d]`,
//!    FMA against two 16-key registers of `kt[d]`), over the union of the 4 rows' key ranges;
//! 2. per row, over its own range (window start ..= position): soft-cap, max, `exp(s - max)` and
//!    sum ([`simd::exp_sub_sum`]), multiply by `1 / sum`; zero outside the range;
//! 3. `O = P·V` with a 4-row × 64-column tile, keys in order, one FMA per (key, element).
//!
//! Steps 2 and 3 perform exactly the operations of the per-token path in the same order (so
//! `O` is bit-identical for identical scores); the scores differ from it only in the summation
//! order of the `q·k` dot.
//!
//! The AVX2 tiles (8-lane registers: 16 keys and 16 columns per tile) do the same operations as
//! the AVX-512 ones: a lane is one key (scores) or one column (`P·V`), accumulated over `d` or
//! over the keys in the same order, so both give bit-identical outputs.

use std::arch::x86_64::*;
use std::cell::RefCell;

use super::kvdata::KvData;
use super::pool::ThreadPool;
use super::simd;
use crate::AttnParams;

/// Query tokens per task.
const TOKENS: usize = 16;
/// Rows (query heads × tokens) per register tile.
const RB: usize = 4;
/// Keys per score tile (two 16-lane registers).
const KB: usize = 32;

/// A K or V ring of one layer: `[slot][n_head_kv][dim]`.
pub(crate) type KvRef<'a> = &'a KvData;

/// Values `at..at + dst.len()` of a ring's slot `slot`, as f32.
fn row_into(kv: KvRef, slot: usize, at: usize, dst: &mut [f32]) {
    match kv {
        KvData::F32(k) => dst.copy_from_slice(k.get(slot, at, dst.len())),
        KvData::F16(k) => simd::f16_to_f32(k.get(slot, at, dst.len()), dst),
        KvData::Bf16(k) => simd::bf16_to_f32(k.get(slot, at, dst.len()), dst),
    }
}

/// The register width of the score and `P·V` tiles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Isa {
    Avx2,
    Avx512,
}

/// Whether [`attention`] handles this geometry on this CPU with `isa`.
///
/// Used for every batch size, decode included: each output row is computed by the same
/// operations whatever the batch (row tiles, key blocks and task splits only change which lane
/// or thread computes it), so logits do not depend on how a prompt is split into batches.
pub(crate) fn supported(p: &AttnParams, n_tokens: usize, isa: Isa) -> bool {
    n_tokens >= 1
        && p.head_dim_v.is_multiple_of(64)
        && p.head_dim_k > 0
        && p.n_head_kv > 0
        && p.n_head.is_multiple_of(p.n_head_kv)
        && p.n_head / p.n_head_kv <= 64
        && (isa == Isa::Avx2 || std::arch::is_x86_feature_detected!("avx512f"))
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

#[derive(Clone, Copy)]
struct OutPtr(*mut f32);
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

thread_local! {
    /// Transposed keys and values of the batch's key range (calling thread).
    static KV_SCRATCH: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    /// Per-task query rows, scores and output tile (pool threads).
    static TASK_SCRATCH: RefCell<(Vec<f32>, Vec<f32>, Vec<f32>)> =
        const { RefCell::new((Vec::new(), Vec::new(), Vec::new())) };
}

/// Keys converted per chunk of the parallel K/V conversion.
const CONVERT_KEYS: usize = 64;

/// Causal attention of `positions.len()` query rows (`q`: `[n][n_head][dk]`) over the ring
/// (`capacity` slots, keys for every needed position stored); `out`: `[n][n_head][dv]`.
/// Callers check [`supported`] first.
///
/// The keys and values of the whole batch's key range are converted once (in parallel) into
/// `kt[g][d][key]` / `v[g][key][d]` (f32, key count padded to [`KB`] with zeros); then the
/// tasks (KV head × token block, latest blocks first) read their slices.
#[allow(clippy::too_many_arguments)]
pub(crate) fn attention(
    pool: &ThreadPool,
    q: &[f32],
    k: KvRef,
    v: KvRef,
    capacity: usize,
    layer_window: Option<usize>,
    positions: &[u32],
    p: &AttnParams,
    isa: Isa,
    out: &mut [f32],
) {
    let n = positions.len();
    let (dk, dv, nkv) = (p.head_dim_k, p.head_dim_v, p.n_head_kv);
    assert!(q.len() >= n * p.n_head * dk && out.len() >= n * p.n_head * dv);
    let window = p.window.or(layer_window);
    let kmin = positions
        .iter()
        .map(|&pos| crate::window_start(pos as usize, window))
        .min()
        .unwrap_or(0);
    let kmax = positions.iter().map(|&pos| pos as usize).max().unwrap_or(0);
    let nk = kmax + 1 - kmin;
    let ldk = nk.div_ceil(KB) * KB;
    KV_SCRATCH.with(|cell| {
        let mut guard = cell.borrow_mut();
        let (kt, vv) = &mut *guard;
        if kt.len() < nkv * dk * ldk {
            kt.resize(nkv * dk * ldk, 0.0);
        }
        if vv.len() < nkv * ldk * dv {
            vv.resize(nkv * ldk * dv, 0.0);
        }
        let (ktp, vvp) = (OutPtr(kt.as_mut_ptr()), OutPtr(vv.as_mut_ptr()));
        let chunks = ldk.div_ceil(CONVERT_KEYS);
        pool.run_chunks(nkv * chunks, |c| {
            let (g, j0) = (c / chunks, (c % chunks) * CONVERT_KEYS);
            let j1 = (j0 + CONVERT_KEYS).min(ldk);
            let (ktp, vvp) = (&ktp, &vvp);
            // Keys are converted `TR` at a time into `rows` (`[TR][dk]`), then written to the
            // transposed scratch as runs of `TR` consecutive keys per `d` (not one scattered
            // element per key and `d`).
            const TR: usize = 16;
            let mut rows = vec![0f32; TR * dk];
            for jb in (j0..j1).step_by(TR) {
                let je = (jb + TR).min(j1);
                for j in jb..je {
                    let row = &mut rows[(j - jb) * dk..(j - jb + 1) * dk];
                    // SAFETY: chunk (g, j0..j1) writes only keys j0..j1 of head g's slices.
                    let vrow = unsafe {
                        std::slice::from_raw_parts_mut(vvp.0.add((g * ldk + j) * dv), dv)
                    };
                    if j < nk {
                        let slot = (kmin + j) % capacity;
                        row_into(k, slot, g * dk, row);
                        row_into(v, slot, g * dv, vrow);
                    } else {
                        // Padding keys: finite, so that `0 · v` stays 0.
                        row.fill(0.0);
                        vrow.fill(0.0);
                    }
                }
                for d in 0..dk {
                    // SAFETY: as above, keys jb..je of head g.
                    let dst = unsafe {
                        std::slice::from_raw_parts_mut(
                            ktp.0.add(g * dk * ldk + d * ldk + jb),
                            je - jb,
                        )
                    };
                    for (i, x) in dst.iter_mut().enumerate() {
                        *x = rows[i * dk + d];
                    }
                }
            }
        });
        let n_blocks = n.div_ceil(TOKENS);
        let out_ptr = OutPtr(out.as_mut_ptr());
        let (kt, vv) = (&*kt, &*vv);
        // Small batches (decode): also split the query heads of a KV head across tasks.
        let group = p.n_head / nkv;
        let want = (2 * pool.n_threads()).div_ceil(n_blocks * nkv);
        let hp = group.div_ceil(want.clamp(1, group));
        let hs = group.div_ceil(hp);
        pool.run_chunks(n_blocks * nkv * hs, |c| {
            // Latest (largest) blocks first: causal masking makes them the most expensive.
            let block = n_blocks - 1 - c / (nkv * hs);
            let g = (c / hs) % nkv;
            let heads = (c % hs) * hp..((c % hs + 1) * hp).min(group);
            let t0 = block * TOKENS;
            let t1 = (t0 + TOKENS).min(n);
            let kv = KeySet {
                kt: &kt[g * dk * ldk..(g + 1) * dk * ldk],
                vv: &vv[g * ldk * dv..(g + 1) * ldk * dv],
                kmin,
                ldk,
            };
            let out_ptr = &out_ptr;
            TASK_SCRATCH.with(|cell| {
                let mut sc = cell.borrow_mut();
                // SAFETY: the features of `isa` checked by `supported`; the task writes only the
                // rows of its tokens and query heads.
                unsafe {
                    task(
                        q, &kv, window, positions, p, isa, g, heads, t0, t1, &mut sc, out_ptr.0,
                    )
                };
            });
        });
    });
}

/// One KV head's converted keys (`kt[d * ldk + key]`) and values (`vv[key * dv + d]`) for
/// absolute positions `kmin ..`.
struct KeySet<'a> {
    kt: &'a [f32],
    vv: &'a [f32],
    kmin: usize,
    ldk: usize,
}

#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments, clippy::needless_range_loop)]
unsafe fn task(
    q: &[f32],
    kv: &KeySet,
    window: Option<usize>,
    positions: &[u32],
    p: &AttnParams,
    isa: Isa,
    g: usize,
    heads: std::ops::Range<usize>,
    t0: usize,
    t1: usize,
    scratch: &mut (Vec<f32>, Vec<f32>, Vec<f32>),
    out: *mut f32,
) {
    let (dk, dv) = (p.head_dim_k, p.head_dim_v);
    // Query head of row r: h_base + r % nh (KV head g's heads `heads`); token t0 + r / nh.
    let h_base = g * (p.n_head / p.n_head_kv) + heads.start;
    let nh = heads.len();
    let rows = (t1 - t0) * nh;
    let rows_pad = rows.div_ceil(RB) * RB;
    let (kt, vv, kmin, ldk) = (kv.kt, kv.vv, kv.kmin, kv.ldk);
    // Per row: absolute key range [first, pos + 1); padding rows: empty.
    let mut range = [(kmin, kmin); TOKENS * 64];
    let range = if rows_pad <= range.len() {
        &mut range[..rows_pad]
    } else {
        unreachable!("group sizes above 64 are rejected by `supported`")
    };
    for t in t0..t1 {
        let pos = positions[t] as usize;
        let first = crate::window_start(pos, window);
        for hh in 0..nh {
            range[(t - t0) * nh + hh] = (first, pos + 1);
        }
    }
    let (qs, s, o) = (&mut scratch.0, &mut scratch.1, &mut scratch.2);
    for (buf, len) in [
        (&mut *qs, rows_pad * dk),
        (&mut *s, rows_pad * ldk),
        (&mut *o, RB * dv),
    ] {
        if buf.len() < len {
            buf.resize(len, 0.0);
        }
    }
    // Queries of the task.
    for r in 0..rows {
        let (t, hh) = (t0 + r / nh, h_base + r % nh);
        qs[r * dk..(r + 1) * dk].copy_from_slice(&q[(t * p.n_head + hh) * dk..][..dk]);
    }
    for rb in (0..rows_pad).step_by(RB) {
        let real = rb..(rb + RB).min(rows);
        let lo = range[real.clone()]
            .iter()
            .map(|r| r.0)
            .min()
            .unwrap_or(kmin)
            - kmin;
        let hi = range[real].iter().map(|r| r.1).max().unwrap_or(kmin) - kmin;
        if hi <= lo {
            continue;
        }
        let (klo, khi) = (lo / KB * KB, hi.div_ceil(KB) * KB);
        // 1. scores.
        let rows_q = &qs[rb * dk..(rb + RB) * dk];
        let srows = &mut s[rb * ldk..(rb + RB) * ldk];
        match isa {
            Isa::Avx512 => scores_avx512(rows_q, kt, srows, dk, ldk, klo..khi, p.scale),
            Isa::Avx2 => scores_avx2(rows_q, kt, srows, dk, ldk, klo..khi, p.scale),
        }
        // 2. softmax per row over its own range; zero the rest of the block's range.
        for r in rb..rb + RB {
            let srow = &mut s[r * ldk..(r + 1) * ldk];
            let (a, b) = (range[r].0 - kmin, range[r].1 - kmin);
            if a < b {
                let sc = &mut srow[a..b];
                if let Some(c) = p.softcap {
                    sc.iter_mut().for_each(|d| *d = (*d / c).tanh() * c);
                }
                let m = sc.iter().fold(f32::NEG_INFINITY, |m, &d| m.max(d));
                let sum = simd::exp_sub_sum(sc, m);
                let inv = (1.0 / sum) as f32;
                sc.iter_mut().for_each(|x| *x *= inv);
            }
            if a < b {
                srow[lo..a].iter_mut().for_each(|x| *x = 0.0);
                srow[b..hi].iter_mut().for_each(|x| *x = 0.0);
            } else {
                srow[lo..hi].iter_mut().for_each(|x| *x = 0.0);
            }
        }
        // 3. O = P·V over the block's key range.
        let prows = &s[rb * ldk..(rb + RB) * ldk];
        match isa {
            Isa::Avx512 => pv_avx512(prows, vv, o, ldk, dv, lo..hi),
            Isa::Avx2 => pv_avx2(prows, vv, o, ldk, dv, lo..hi),
        }
        for r in rb..(rb + RB).min(rows) {
            let (t, hh) = (t0 + r / nh, h_base + r % nh);
            let dst = out.add((t * p.n_head + hh) * dv);
            std::ptr::copy_nonoverlapping(o.as_ptr().add((r - rb) * dv), dst, dv);
        }
    }
}

/// Scores of [`RB`] rows (`qs`: `[RB][dk]`) over the keys `keys` (multiples of [`KB`]):
/// `s[r][key] = (q_r · k_key) · scale`, one lane per key, FMAs over `d` in order.
#[target_feature(enable = "avx2,fma,avx512f")]
#[allow(clippy::needless_range_loop)]
unsafe fn scores_avx512(
    qs: &[f32],
    kt: &[f32],
    s: &mut [f32],
    dk: usize,
    ldk: usize,
    keys: std::ops::Range<usize>,
    scale: f32,
) {
    for kb in keys.step_by(KB) {
        let mut acc = [[_mm512_setzero_ps(); 2]; RB];
        for d in 0..dk {
            let k0 = _mm512_loadu_ps(kt.as_ptr().add(d * ldk + kb));
            let k1 = _mm512_loadu_ps(kt.as_ptr().add(d * ldk + kb + 16));
            for r in 0..RB {
                let qd = _mm512_set1_ps(*qs.get_unchecked(r * dk + d));
                acc[r][0] = _mm512_fmadd_ps(qd, k0, acc[r][0]);
                acc[r][1] = _mm512_fmadd_ps(qd, k1, acc[r][1]);
            }
        }
        let sc = _mm512_set1_ps(scale);
        for r in 0..RB {
            let dst = s.as_mut_ptr().add(r * ldk + kb);
            _mm512_storeu_ps(dst, _mm512_mul_ps(acc[r][0], sc));
            _mm512_storeu_ps(dst.add(16), _mm512_mul_ps(acc[r][1], sc));
        }
    }
}

/// [`scores_avx512`] with 8-lane registers, 16 keys per tile.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)]
unsafe fn scores_avx2(
    qs: &[f32],
    kt: &[f32],
    s: &mut [f32],
    dk: usize,
    ldk: usize,
    keys: std::ops::Range<usize>,
    scale: f32,
) {
    for kb in keys.step_by(16) {
        let mut acc = [[_mm256_setzero_ps(); 2]; RB];
        for d in 0..dk {
            let k0 = _mm256_loadu_ps(kt.as_ptr().add(d * ldk + kb));
            let k1 = _mm256_loadu_ps(kt.as_ptr().add(d * ldk + kb + 8));
            for r in 0..RB {
                let qd = _mm256_set1_ps(*qs.get_unchecked(r * dk + d));
                acc[r][0] = _mm256_fmadd_ps(qd, k0, acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(qd, k1, acc[r][1]);
            }
        }
        let sc = _mm256_set1_ps(scale);
        for r in 0..RB {
            let dst = s.as_mut_ptr().add(r * ldk + kb);
            _mm256_storeu_ps(dst, _mm256_mul_ps(acc[r][0], sc));
            _mm256_storeu_ps(dst.add(8), _mm256_mul_ps(acc[r][1], sc));
        }
    }
}

/// `o[r] = Σ_key p[r][key] · v[key]` for [`RB`] rows (`p`: `[RB][ldk]`) over `keys` in order,
/// one lane per column, 64 columns per tile.
#[target_feature(enable = "avx2,fma,avx512f")]
#[allow(clippy::needless_range_loop)]
unsafe fn pv_avx512(
    p: &[f32],
    vv: &[f32],
    o: &mut [f32],
    ldk: usize,
    dv: usize,
    keys: std::ops::Range<usize>,
) {
    for c0 in (0..dv).step_by(64) {
        let mut acc = [[_mm512_setzero_ps(); 4]; RB];
        for j in keys.clone() {
            let vp = vv.as_ptr().add(j * dv + c0);
            let vr = [
                _mm512_loadu_ps(vp),
                _mm512_loadu_ps(vp.add(16)),
                _mm512_loadu_ps(vp.add(32)),
                _mm512_loadu_ps(vp.add(48)),
            ];
            for r in 0..RB {
                let pr = _mm512_set1_ps(*p.get_unchecked(r * ldk + j));
                for x in 0..4 {
                    acc[r][x] = _mm512_fmadd_ps(pr, vr[x], acc[r][x]);
                }
            }
        }
        for r in 0..RB {
            for x in 0..4 {
                _mm512_storeu_ps(o.as_mut_ptr().add(r * dv + c0 + 16 * x), acc[r][x]);
            }
        }
    }
}

/// [`pv_avx512`] with 8-lane registers, 16 columns per tile.
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::needless_range_loop)]
unsafe fn pv_avx2(
    p: &[f32],
    vv: &[f32],
    o: &mut [f32],
    ldk: usize,
    dv: usize,
    keys: std::ops::Range<usize>,
) {
    for c0 in (0..dv).step_by(16) {
        let mut acc = [[_mm256_setzero_ps(); 2]; RB];
        for j in keys.clone() {
            let vp = vv.as_ptr().add(j * dv + c0);
            let vr = [_mm256_loadu_ps(vp), _mm256_loadu_ps(vp.add(8))];
            for r in 0..RB {
                let pr = _mm256_set1_ps(*p.get_unchecked(r * ldk + j));
                acc[r][0] = _mm256_fmadd_ps(pr, vr[0], acc[r][0]);
                acc[r][1] = _mm256_fmadd_ps(pr, vr[1], acc[r][1]);
            }
        }
        for r in 0..RB {
            _mm256_storeu_ps(o.as_mut_ptr().add(r * dv + c0), acc[r][0]);
            _mm256_storeu_ps(o.as_mut_ptr().add(r * dv + c0 + 8), acc[r][1]);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::cpu::CpuBackend;
    use crate::{AttnParams, Backend, KvLayerSpec, KvType};

    /// The batch path (in the selected kernel family's width) is bit-identical to one-token
    /// calls (batch invariance) and agrees with a naive f64 reference, with GQA, a wrapping
    /// sliding window, soft-capping and every cache type.
    #[test]
    fn batch_equals_one_token_calls_and_matches_f64_reference() {
        let any = AttnParams {
            n_head: 1,
            n_head_kv: 1,
            head_dim_k: 1,
            head_dim_v: 64,
            scale: 1.0,
            window: None,
            softcap: None,
        };
        if !super::supported(&any, 8, super::Isa::Avx2) {
            eprintln!("skipped: no AVX2");
            return;
        }
        let be = CpuBackend::new(2);
        let mut seed = 5u32;
        let mut rnd = move || {
            seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
            (seed >> 8) as f32 / (1 << 24) as f32 - 0.5
        };
        for (ty, window, softcap, dk, dv) in [
            (KvType::F32, None, None, 64, 64),
            (KvType::F16, Some(13), None, 48, 128),
            (KvType::F32, Some(40), Some(5.0), 256, 256),
            (KvType::Bf16, Some(13), Some(5.0), 128, 64),
        ] {
            let (n_head, n_head_kv) = (6, 2);
            let (past, n) = (21usize, 37usize);
            let capacity = match window {
                Some(w) => w + n,
                None => past + n,
            };
            let spec = KvLayerSpec {
                n_head_kv,
                head_dim_k: dk,
                head_dim_v: dv,
                capacity,
                window,
            };
            let mut kv = be.new_kv(&[spec], ty).unwrap();
            let p = AttnParams {
                n_head,
                n_head_kv,
                head_dim_k: dk,
                head_dim_v: dv,
                scale: 0.3,
                window,
                softcap,
            };
            let mut all_k = Vec::new();
            let mut all_v = Vec::new();
            let mut store = |kv: &mut _, pos: Vec<u32>| {
                let k: Vec<f32> = (0..pos.len() * n_head_kv * dk).map(|_| rnd()).collect();
                let v: Vec<f32> = (0..pos.len() * n_head_kv * dv)
                    .map(|_| rnd() * 4.0)
                    .collect();
                be.kv_store(kv, 0, &k, &v, &pos);
                all_k.extend_from_slice(&k);
                all_v.extend_from_slice(&v);
            };
            store(&mut kv, (0..past as u32).collect());
            let positions: Vec<u32> = (past as u32..(past + n) as u32).collect();
            store(&mut kv, positions.clone());
            // What the cache holds (f16 and bf16 caches round).
            let round = |x: &Vec<f32>| -> Vec<f32> {
                match ty {
                    KvType::F16 => x.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect(),
                    KvType::Bf16 => x
                        .iter()
                        .map(|&v| half::bf16::from_f32(v).to_f32())
                        .collect(),
                    KvType::F32 => x.clone(),
                }
            };
            let (all_k, all_v) = (round(&all_k), round(&all_v));
            let q: Vec<f32> = (0..n * n_head * dk).map(|_| rnd() * 2.0).collect();
            let mut batch = vec![f32::NAN; n * n_head * dv];
            be.attention(&q, &kv, 0, &positions, &p, &mut batch);
            for (t, &pos) in positions.iter().enumerate() {
                let qt = q[t * n_head * dk..(t + 1) * n_head * dk].to_vec();
                let mut one = vec![0f32; n_head * dv];
                be.attention(&qt, &kv, 0, &[pos], &p, &mut one);
                let row = &batch[t * n_head * dv..(t + 1) * n_head * dv];
                assert!(
                    row.iter()
                        .zip(&one)
                        .all(|(a, b)| a.to_bits() == b.to_bits()),
                    "{ty:?} window {window:?} token {t}: batch differs from a one-token call"
                );
                let first = window.map_or(0, |w| (pos as usize + 1).saturating_sub(w));
                for h in 0..n_head {
                    let g = h / (n_head / n_head_kv);
                    let sc: Vec<f64> = (first..=pos as usize)
                        .map(|j| {
                            let kr = &all_k[(j * n_head_kv + g) * dk..][..dk];
                            let qr = &qt[h * dk..(h + 1) * dk];
                            let d: f64 =
                                qr.iter().zip(kr).map(|(&a, &b)| a as f64 * b as f64).sum();
                            let d = d * 0.3;
                            softcap.map_or(d, |c| (d / c as f64).tanh() * c as f64)
                        })
                        .collect();
                    let m = sc.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = sc.iter().map(|s| (s - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for c in 0..dv {
                        let want: f64 = (first..=pos as usize)
                            .zip(&e)
                            .map(|(j, w)| w / z * all_v[(j * n_head_kv + g) * dv + c] as f64)
                            .sum();
                        let got = row[h * dv + c] as f64;
                        assert!(
                            (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                            "{ty:?} window {window:?} token {t} head {h} col {c}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    /// The AVX2 tiles give the AVX-512 tiles' output bit for bit (same operations per lane).
    #[test]
    fn avx2_tiles_equal_avx512_tiles() {
        use super::super::kvdata::{KvData, Pages};
        use super::{attention, supported, Isa};
        let p = AttnParams {
            n_head: 6,
            n_head_kv: 2,
            head_dim_k: 80,
            head_dim_v: 128,
            scale: 0.2,
            window: Some(50),
            softcap: Some(7.0),
        };
        if !supported(&p, 1, Isa::Avx512) {
            eprintln!("skipped: no AVX-512");
            return;
        }
        let pool = crate::cpu::pool::ThreadPool::new(2);
        let (cap, n) = (100usize, 37usize);
        let mut seed = 9u32;
        let mut rnd = move || {
            seed = seed.wrapping_mul(1664525).wrapping_add(1013904223);
            (seed >> 8) as f32 / (1 << 24) as f32 - 0.5
        };
        let k: Vec<f32> = (0..cap * 2 * 80).map(|_| rnd()).collect();
        let v: Vec<f32> = (0..cap * 2 * 128).map(|_| rnd()).collect();
        let q: Vec<f32> = (0..n * 6 * 80).map(|_| rnd() * 3.0).collect();
        let positions: Vec<u32> = (90..90 + n as u32).collect();
        let run = |isa| {
            let mut out = vec![f32::NAN; n * 6 * 128];
            let (kr, vr) = (
                KvData::F32(Pages::from_values(2 * 80, &k)),
                KvData::F32(Pages::from_values(2 * 128, &v)),
            );
            attention(
                &pool, &q, &kr, &vr, cap, None, &positions, &p, isa, &mut out,
            );
            out
        };
        let (a, b) = (run(Isa::Avx2), run(Isa::Avx512));
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
}
