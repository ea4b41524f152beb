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
//! within the capacity): only without ring wrap (every position below the capacity). The plain
//! `attention_*_w4_d512` kernel took 23.7 ms per 512-query chunk of a Gemma 4 12B full layer at
//! 8K keys on the H200 (session 12); this path does the same work as two tensor-core products.
//! Numerics as the flash kernel: Q and P rounded to 16 bits, f32 accumulation; not used in exact
//! mode. `VELA_CUDA_ATTN_GEMM=0` turns it off.

use crate::cublas::Operand;
use crate::kv::KvLayer;
use crate::{Arg, CudaBackend, CudaBuf};
use anyhow::{anyhow, Result};
use std::sync::atomic::Ordering;
use vela_compute::{AttnParams, KvType};

/// Fewest query rows for the cuBLAS attention (smaller batches keep the plain kernel).
const ATTN_GEMM_MIN_ROWS: usize = 16;

impl CudaBackend {
    /// Whether `attention_gemm` applies: f16 cache, head dims above 256 and equal, a prefill
    /// batch, no ring wrap, not exact mode, the switch on and cuBLAS loadable.
    pub(crate) fn attention_gemm_applies(
        &self,
        ty: KvType,
        p: &AttnParams,
        positions: &[u32],
        capacity: usize,
    ) -> bool {
        ty == KvType::F16
            && self.attn_gemm.load(Ordering::Relaxed)
            && !self.exact.load(Ordering::Relaxed)
            && p.head_dim_k == p.head_dim_v
            && p.head_dim_k > crate::ATT_MAXD
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
        let Some(Ok(cublas)) = &g.cublas else {
            return Err(anyhow!("cuBLAS not loaded"));
        };
        self.ctx
            .bind_to_thread()
            .map_err(|e| anyhow!("binding the CUDA context: {e:?}"))?;
        // Scratch: Q in f16, then S (f32) and P (f16) of one KV head's group, 16-byte aligned.
        let (qb, sb, pb) = (nq * 2, ns * 4, ns * 2);
        let need = qb.next_multiple_of(256) + sb.next_multiple_of(256) + pb;
        if g.att.as_ref().is_none_or(|b| b.len() < need) {
            g.att = Some(self.stream.alloc_zeros::<u8>(need)?);
        }
        let base = self.ptr(g.att.as_ref().expect("allocated above"));
        let (qh, sp) = (base, base + qb.next_multiple_of(256) as u64);
        let ph = sp + sb.next_multiple_of(256) as u64;
        let n2 = nq / 2;
        let blocks = n2.div_ceil(256).min(65_535) as u32;
        let args = [Arg::P(self.ptr(q)), Arg::P(qh), Arg::L(n2 as i64)];
        self.launch("to_f16", (blocks, 1, 1), 256, &args);
        let (kb, vb) = (self.ptr(&l.k), self.ptr(&l.v));
        let ldkv = p.n_head_kv * hd;
        let ldq = p.n_head * hd;
        for kvh in 0..p.n_head_kv {
            let k_op = Operand {
                ptr: kb + (kvh * hd * 2) as u64,
                trans: true,
                ld: ldkv,
                stride: 0,
            };
            let q_op = Operand {
                ptr: qh + (kvh * group * hd * 2) as u64,
                trans: false,
                ld: ldq,
                stride: hd,
            };
            // Column-major: Sᵀ_j (kmax × n_tok) = K_g (kmax × hd) · Q_jᵀ (hd × n_tok).
            let t = self.prof_begin();
            cublas.gemm_batched_f16(
                kmax,
                n_tok,
                hd,
                k_op,
                q_op,
                (sp, kmax, n_tok * kmax),
                false,
                group,
            )?;
            self.prof_end("cublas_attn_qk", t);
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
            self.launch(
                "attn_softmax_f16",
                ((group * n_tok) as u32, 1, 1),
                256,
                &args,
            );
            let v_op = Operand {
                ptr: vb + (kvh * hd * 2) as u64,
                trans: false,
                ld: ldkv,
                stride: 0,
            };
            let p_op = Operand {
                ptr: ph,
                trans: false,
                ld: kmax,
                stride: n_tok * kmax,
            };
            // Column-major: O_jᵀ (hd × n_tok, rows of the output) = V_gᵀ (hd × kmax) · P_jᵀ.
            let o = self.ptr(&*out) + (kvh * group * hd * 4) as u64;
            let t = self.prof_begin();
            cublas.gemm_batched_f16(hd, n_tok, kmax, v_op, p_op, (o, ldq, hd), false, group)?;
            self.prof_end("cublas_attn_pv", t);
        }
        Ok(())
    }
}
