//! One forward pass over several sequences of the shared decoder: a ragged batch in which each
//! sequence brings its own cache, tokens and positions (prefill chunks and single decode tokens
//! mixed). The products (Q/K/V, output projection, FFN, head) run once over the rows of every
//! sequence, so the weights are read once per step instead of once per sequence; RoPE, the K/V
//! store and attention run per sequence on its own cache and scratch.

use super::{check_batch, Attended, Bufs, DecoderModel, ForwardState};
use crate::lm::BatchItem;
use anyhow::Result;
use vela_compute::{AttnParams, Backend};

/// Most rows of an item that [`DecoderModel::attend_together`] takes (decode steps and short
/// speculative checks; longer prompt chunks run the prefill kernels per sequence).
const TOGETHER_ROWS: usize = 8;

impl<B: Backend> DecoderModel<B> {
    /// Evaluate every item (each sequence appears once) and return, per item, the logits of
    /// its rows `logits_from..` (row-major `[rows, n_vocab]`). One item runs exactly as
    /// [`Self::forward`].
    pub fn forward_batch(
        &self,
        items: &mut [BatchItem<'_, ForwardState<B>>],
    ) -> Result<Vec<Vec<f32>>> {
        for it in items.iter() {
            let st = &*it.state;
            check_batch(
                it.tokens.len(),
                it.positions,
                st.max_batch,
                st.n_ctx,
                it.logits_from,
            )?;
        }
        if let [it] = items {
            return Ok(vec![self.forward(
                it.state,
                it.tokens,
                it.positions,
                it.logits_from,
            )?]);
        }
        let be = &*self.backend;
        let c = &self.cfg;
        let total: usize = items.iter().map(|it| it.tokens.len()).sum();
        let tokens: Vec<u32> = items.iter().flat_map(|it| it.tokens).copied().collect();
        // A batch leaves no device token to chain on and may not reuse a recorded step.
        be.decode_step_discard();
        let mut guard = self.batch.lock().unwrap_or_else(|e| e.into_inner());
        if guard.as_ref().is_none_or(|(cap, _)| *cap < total) {
            *guard = Some((total, Bufs::new(be, c, total)));
        }
        let (_, b) = guard.as_mut().expect("allocated above");
        let n_layer = self.layers.len();
        let (qw, kw, vw) = (
            c.n_head * c.head_dim_k,
            c.n_head_kv * c.head_dim_k,
            c.n_head_kv * c.head_dim_v,
        );
        let aw = c.n_head * c.head_dim_v;
        // Decode-sized items whose every row gives logits: the backend may run a layer's RoPE,
        // store and attention for all of them at once (`Backend::rope_store_attend_batch`).
        let mut together = items
            .iter()
            .all(|it| it.tokens.len() <= TOGETHER_ROWS && it.logits_from == 0);
        let rows = self.pass(b, &tokens, &mut |b, il| {
            let last = il + 1 == n_layer;
            let ap = self.attn_params(il);
            // (A backend without the path says so at the first layer; the others skip asking.)
            together = together && self.attend_together(b, items, il, &ap);
            if together {
                if last {
                    be.precise_products(true);
                }
                be.matmul(&self.layers[il].wo, &b.a, total, &mut b.o);
                return Ok(Attended {
                    rows: total,
                    swap_qa: false,
                    swap_xh: false,
                });
            }
            // `off`: the item's first row in the batch; `kept`: rows kept so far (the last
            // layer moves each item's logits rows to the front of `a` and `h`).
            let (mut off, mut kept) = (0, 0);
            for it in items.iter_mut() {
                let n = it.tokens.len();
                let st = &mut *it.state;
                let s = &mut st.b;
                be.copy_rows(&b.q, off, n, qw, &mut s.q, 0);
                be.copy_rows(&b.k, off, n, kw, &mut s.k, 0);
                be.copy_rows(&b.v, off, n, vw, &mut s.v, 0);
                self.rope_store(il, &mut s.q, &mut s.k, &mut s.v, &mut st.kv, it.positions);
                let from = if last { it.logits_from } else { 0 };
                let rows = n - from;
                if rows > 0 {
                    let pos = &it.positions[from..];
                    if from > 0 {
                        be.copy_rows(&s.q, from, rows, qw, &mut s.a, 0);
                        be.attention(&s.a, &st.kv, il, pos, &ap, &mut s.q);
                        be.copy_rows(&s.q, 0, rows, aw, &mut b.a, kept);
                    } else {
                        be.attention(&s.q, &st.kv, il, pos, &ap, &mut s.a);
                        be.copy_rows(&s.a, 0, rows, aw, &mut b.a, kept);
                    }
                    if last {
                        be.copy_rows(&b.x, off + from, rows, c.n_embd, &mut b.h, kept);
                    }
                }
                off += n;
                kept += rows;
            }
            if last {
                if kept == 0 {
                    return Ok(Attended {
                        rows: 0,
                        swap_qa: false,
                        swap_xh: false,
                    });
                }
                std::mem::swap(&mut b.x, &mut b.h);
                be.precise_products(true);
            }
            be.matmul(&self.layers[il].wo, &b.a, kept, &mut b.o);
            Ok(Attended {
                rows: kept,
                swap_qa: false,
                swap_xh: last,
            })
        })?;
        let nv = c.n_vocab;
        let mut all = vec![0f32; rows * nv];
        if rows > 0 {
            be.read(&b.logits, &mut all);
        }
        let mut out = Vec::with_capacity(items.len());
        let mut at = 0;
        for it in items.iter() {
            let r = it.tokens.len() - it.logits_from;
            out.push(all[at * nv..(at + r) * nv].to_vec());
            at += r;
        }
        Ok(out)
    }
}

impl<B: Backend> DecoderModel<B> {
    /// Layer `il`'s RoPE, K/V store and attention of every item's rows in `b` (q, k, v → a)
    /// through one [`Backend::rope_store_attend_batch`]; false where the backend has no such
    /// path (nothing was done).
    fn attend_together(
        &self,
        b: &mut Bufs<B>,
        items: &mut [BatchItem<'_, ForwardState<B>>],
        il: usize,
        ap: &AttnParams,
    ) -> bool {
        let c = &self.cfg;
        let l = &self.layers[il];
        let norms = match (&l.q_norm, &l.k_norm) {
            (Some(qn), Some(kn)) => Some((qn, kn, c.rms_eps)),
            _ => None,
        };
        let positions: Vec<&[u32]> = items.iter().map(|it| it.positions).collect();
        let mut kvs: Vec<&mut B::Kv> = items.iter_mut().map(|it| &mut it.state.kv).collect();
        self.backend.rope_store_attend_batch(
            &mut b.q,
            &mut b.k,
            &mut b.v,
            &mut kvs,
            il,
            &positions,
            &c.layers[il].rope,
            norms,
            ap,
            &mut b.a,
        )
    }
}
