//! Prefill attention through cuBLAS for head dims the flash kernel cannot hold in registers
//! (Gemma 4's full-attention layers: 512). Per KV head g, for its `group` query heads j at once
//! (strided batches; K and V shared through a batch stride of 0):
//!
//! 1. S_j = Q_j · K_gᵀ (f16 operands, f32 scores `[group][n_tok][kmax]`),
//! 2. `attn_softmax_f16` (flash.cu): scale, soft-cap, causal / window mask by position, the
//!    row softmax, rounded to f16 (P),
//! 3. O_j = P_j · V_g (f32, straight into the output rows of the query heads).
//!
//! Keys are the cache slots 0 .. kmax - 1 with kmax = the last position + 1 (rounded up to 8
//! within the capacity): only without ring wrap (every position below the capacity). Numerics as
//! the flash kernel: Q and P rounded to 16 bits, f32 accumulation; not used in exact mode. Gemma 4
//! 12B prefill of 8,192 tokens runs 4.9 times as fast as on the plain `attention_*_w4_d512`
//! kernel (docs/perf-log.md).

use crate::attn::ATT_MAXD;
use crate::backend::CudaBackend;
use crate::cublas::Operand;
use crate::device::Arg;
use crate::kv::KvLayer;
use crate::weight::CudaBuf;
use anyhow::Result;
use vela_compute::{AttnParams, KvType};

/// Fewest query rows for the cuBLAS attention (smaller batches keep the plain kernel).
const ATTN_GEMM_MIN_ROWS: usize = 16;

impl CudaBackend {
    /// Whether `attention_gemm` applies: f16 cache, head dims above 256 and equal, a prefill
    /// batch, no ring wrap, not exact mode and cuBLAS loadable.
    pub(crate) fn attention_gemm_applies(
        &self,
        ty: KvType,
        p: &AttnParams,
        positions: &[u32],
        capacity: usize,
    ) -> bool {
        ty == KvType::F16
            && !self.tune.exact()
            && p.head_dim_k == p.head_dim_v
            && p.head_dim_k > ATT_MAXD
            && p.head_dim_k.is_multiple_of(8)
            && p.n_head_kv > 0
            && p.n_head.is_multiple_of(p.n_head_kv)
            && positions.len() >= ATTN_GEMM_MIN_ROWS
            && positions.iter().all(|&x| (x as usize) < capacity)
            && self.gemm_available()
    }

    /// The attention of `positions.len()` query rows (`q`: `[n_tok][n_head][hd]` f32) over layer
    /// `l`'s cache into `out` (`[n_tok][n_head][hd]` f32); `pos` is the device copy of
    /// `positions`. The caller checked `attention_gemm_applies`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention_gemm(
        &self,
        q: &CudaBuf,
        l: &KvLayer,
        pos: u64,
        positions: &[u32],
        p: &AttnParams,
        window: usize,
        out: &mut CudaBuf,
    ) -> Result<()> {
        self.flush_recording();
        let n_tok = positions.len();
        let hd = p.head_dim_k;
        let group = p.n_head / p.n_head_kv;
        let last = *positions.iter().max().expect("non-empty batch") as usize;
        let kmax = (last + 1).next_multiple_of(8).min(l.spec.capacity);
        let (nq, ns) = (n_tok * p.n_head * hd, group * n_tok * kmax);
        let mut g = self.gemm.lock().unwrap_or_else(|e| e.into_inner());
        let g = &mut *g;
        let cublas = self.cublas_bound(&g.cublas)?;
        // Scratch: Q in f16, then S (f32) and P (f16) of one KV head's group, 16-byte aligned.
        let (qb, sb, pb) = (nq * 2, ns * 4, ns * 2);
        let need = qb.next_multiple_of(256) + sb.next_multiple_of(256) + pb;
        if g.att.as_ref().is_none_or(|b| b.len() < need) {
            g.att = Some(self.dev.stream.alloc_zeros::<u8>(need)?);
        }
        let base = self.ptr(g.att.as_ref().expect("allocated above"));
        let (qh, sp) = (base, base + qb.next_multiple_of(256) as u64);
        let ph = sp + sb.next_multiple_of(256) as u64;
        let n2 = nq / 2;
        let blocks = n2.div_ceil(256).min(65_535) as u32;
        let args = [Arg::P(self.ptr(q)), Arg::P(qh), Arg::L(n2 as i64)];
        self.launch("to_f16", (blocks, 1, 1), 256, &args);
        let (kb, vb, ob) = (l.k.ptr(), l.v.ptr(), self.ptr(&*out));
        let d = Dims {
            n_tok,
            n_head: p.n_head,
            n_kv: p.n_head_kv,
            hd,
            kmax,
        };
        // One planned product: operand offsets are in elements (f16 for K, V, Q and P; f32 for S
        // and the output), added to the buffers' addresses.
        let run = |c: Call, a: u64, b: u64, out: u64, name: &str| -> Result<()> {
            let at = |base: u64, o: Operand| Operand {
                ptr: base + 2 * o.ptr,
                ..o
            };
            let t = self.prof.begin(&self.dev);
            let (oc, ld, stride) = c.c;
            let out = (out + 4 * oc, ld, stride);
            cublas.gemm_batched_f16(c.m, c.n, c.k, at(a, c.a), at(b, c.b), out, c.batch)?;
            self.prof.end(&self.dev, name, t);
            Ok(())
        };
        for kvh in 0..p.n_head_kv {
            run(qk_call(&d, kvh), kb, qh, sp, "cublas_attn_qk")?;
            let args = [
                Arg::P(sp),
                Arg::P(ph),
                Arg::P(pos),
                Arg::I(n_tok as i32),
                Arg::I(kmax as i32),
                Arg::I(window as i32),
                Arg::F(p.scale),
                Arg::F(p.softcap.unwrap_or(0.0)),
            ];
            let blocks = (group * n_tok) as u32;
            self.launch("attn_softmax_f16", (blocks, 1, 1), 256, &args);
            run(pv_call(&d, kvh), vb, ph, ob, "cublas_attn_pv")?;
        }
        Ok(())
    }
}

/// The shapes of one `attention_gemm` call.
struct Dims {
    n_tok: usize,
    n_head: usize,
    n_kv: usize,
    hd: usize,
    kmax: usize,
}

/// One strided-batched product (column-major, cuBLAS's view) with operand addresses as element
/// offsets into their buffers: A into K or V, B into Q or P, C (offset, ld, batch stride) into
/// S or the output.
struct Call {
    m: usize,
    n: usize,
    k: usize,
    a: Operand,
    b: Operand,
    c: (u64, usize, usize),
    batch: usize,
}

/// S_j = Q_j · K_gᵀ for the query heads j of KV head `kvh`. K: `[slot][n_kv][hd]`; Q:
/// `[t][n_head][hd]`; S: `[j][t][kmax]`. Column-major: Sᵀ_j (kmax × n_tok, ld kmax) = K_g
/// (stored hd × kmax, ld n_kv·hd, transposed) · Q_jᵀ (stored hd × n_tok, ld n_head·hd).
fn qk_call(d: &Dims, kvh: usize) -> Call {
    let group = d.n_head / d.n_kv;
    Call {
        m: d.kmax,
        n: d.n_tok,
        k: d.hd,
        a: Operand {
            ptr: (kvh * d.hd) as u64,
            trans: true,
            ld: d.n_kv * d.hd,
            stride: 0,
        },
        b: Operand {
            ptr: (kvh * group * d.hd) as u64,
            trans: false,
            ld: d.n_head * d.hd,
            stride: d.hd,
        },
        c: (0, d.kmax, d.n_tok * d.kmax),
        batch: group,
    }
}

/// O_j = P_j · V_g into the output rows of the query heads j of KV head `kvh`. V: `[slot][n_kv]
/// [hd]`; P: `[j][t][kmax]`; O: `[t][n_head][hd]`. Column-major: O_jᵀ (hd × n_tok, ld n_head·hd)
/// = V_gᵀ (stored hd × kmax, ld n_kv·hd) · P_jᵀ (stored kmax × n_tok, ld kmax).
fn pv_call(d: &Dims, kvh: usize) -> Call {
    let group = d.n_head / d.n_kv;
    Call {
        m: d.hd,
        n: d.n_tok,
        k: d.kmax,
        a: Operand {
            ptr: (kvh * d.hd) as u64,
            trans: false,
            ld: d.n_kv * d.hd,
            stride: 0,
        },
        b: Operand {
            ptr: 0,
            trans: false,
            ld: d.kmax,
            stride: d.n_tok * d.kmax,
        },
        c: ((kvh * group * d.hd) as u64, d.n_head * d.hd, d.hd),
        batch: group,
    }
}

#[cfg(test)]
mod tests {
    //! The operand plan checked on the host: cuBLAS's strided-batched GEMM semantics
    //! (column-major, op, leading dimensions, batch strides) applied to host arrays, with the
    //! softmax kernel's semantics in between, must give plain causal attention.
    use super::*;

    /// cuBLAS `C_i = op(A_i) op(B_i)` on host data (element offsets as in `Call`).
    fn gemm(c: &Call, a: &[f32], b: &[f32], out: &mut [f32]) {
        let at = |o: &Operand, buf: &[f32], bi: usize, row: usize, col: usize| {
            // Element (row, col) of op(X): X stored column-major with leading dimension ld.
            let (r, cc) = if o.trans { (col, row) } else { (row, col) };
            buf[o.ptr as usize + bi * o.stride + r + cc * o.ld]
        };
        for bi in 0..c.batch {
            for i in 0..c.m {
                for j in 0..c.n {
                    let mut s = 0.0f32;
                    for k in 0..c.k {
                        s += at(&c.a, a, bi, i, k) * at(&c.b, b, bi, k, j);
                    }
                    out[c.c.0 as usize + bi * c.c.2 + i + j * c.c.1] = s;
                }
            }
        }
    }

    #[test]
    fn operand_plan_computes_causal_attention() {
        let (n_tok, n_head, n_kv, hd, p0) = (5usize, 4usize, 2usize, 8usize, 3usize);
        let group = n_head / n_kv;
        let kmax = (p0 + n_tok).next_multiple_of(8);
        let cap = kmax + 4;
        let val = |i: usize, salt: usize| ((i * 7919 + salt * 104_729) % 97) as f32 / 48.0 - 1.0;
        let kc: Vec<f32> = (0..cap * n_kv * hd).map(|i| val(i, 1)).collect();
        let vc: Vec<f32> = (0..cap * n_kv * hd).map(|i| val(i, 2)).collect();
        let q: Vec<f32> = (0..n_tok * n_head * hd).map(|i| val(i, 3)).collect();
        let d = Dims {
            n_tok,
            n_head,
            n_kv,
            hd,
            kmax,
        };
        let mut out = vec![0.0f32; n_tok * n_head * hd];
        for kvh in 0..n_kv {
            let mut s = vec![0.0f32; group * n_tok * kmax];
            gemm(&qk_call(&d, kvh), &kc, &q, &mut s);
            // attn_softmax_f16's semantics (scale 1, no softcap, causal).
            let mut pm = vec![0.0f32; s.len()];
            for r in 0..group * n_tok {
                let pos = p0 + r % n_tok;
                let row = &s[r * kmax..][..kmax];
                let m = row[..=pos].iter().cloned().fold(f32::MIN, f32::max);
                let sum: f32 = row[..=pos].iter().map(|x| (x - m).exp()).sum();
                for k in 0..=pos {
                    pm[r * kmax + k] = (row[k] - m).exp() / sum;
                }
            }
            gemm(&pv_call(&d, kvh), &vc, &pm, &mut out);
        }
        // Plain attention: head h on KV head h / group, keys 0..=pos.
        for t in 0..n_tok {
            for h in 0..n_head {
                let (g, pos) = (h / group, p0 + t);
                let qr = &q[(t * n_head + h) * hd..][..hd];
                let sc: Vec<f32> = (0..=pos)
                    .map(|k| (0..hd).map(|e| qr[e] * kc[(k * n_kv + g) * hd + e]).sum())
                    .collect();
                let m = sc.iter().cloned().fold(f32::MIN, f32::max);
                let w: Vec<f32> = sc.iter().map(|x| (x - m).exp()).collect();
                let z: f32 = w.iter().sum();
                for e in 0..hd {
                    let want: f32 = (0..=pos)
                        .map(|k| w[k] / z * vc[(k * n_kv + g) * hd + e])
                        .sum();
                    let got = out[(t * n_head + h) * hd + e];
                    assert!(
                        (got - want).abs() < 1e-5,
                        "t {t} h {h} e {e}: {got} vs {want}"
                    );
                }
            }
        }
    }
}
