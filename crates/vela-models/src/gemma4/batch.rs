//! One forward pass of Gemma 4 over several sequences: a ragged batch in which each sequence
//! brings its own cache, tokens and positions (prefill chunks and decode tokens mixed), as the
//! shared decoder's (`decoder/batch.rs`). The norms, products, MoE blocks and per-layer inputs
//! run once over the rows of every sequence (the weights, the experts' included, are read once
//! per step instead of once per sequence); the q/k/v norms, RoPE, the cache store and attention
//! run per sequence on its own cache and scratch, then `wo` once over all rows.

use super::{pick2, Gemma4Model, Gemma4State, A, K, LOGITS, O, Q, V, X};
use crate::decoder::{batch_tokens, select_rows, wants};
use crate::lm::{BatchItem, CausalLm, Selected};
use crate::state::alloc_kv;
use anyhow::Result;
use vela_compute::{Backend, KvType};

impl<B: Backend + 'static> Gemma4Model<B> {
    /// Evaluate every item (each sequence appears once) and return, per item, what its
    /// selection asks of its rows `logits_from..` (selected once over the batch's logits, on
    /// the device by a GPU). One item runs exactly as [`Gemma4Model::forward`] (or
    /// `forward_argmax` / `forward_top_k`). On the CPU every row's logits are the bits that
    /// sequence gets alone (its products give each row the same result in any batch).
    pub fn forward_batch(
        &self,
        items: &mut [BatchItem<'_, Gemma4State<B>>],
    ) -> Result<Vec<Selected>> {
        let tokens = batch_tokens(items)?;
        if let [it] = items {
            return Ok(vec![self.forward_one(it)?]);
        }
        let be = &*self.backend;
        let c = &self.cfg;
        let total = tokens.len();
        // A batch leaves no device token to chain on and may not reuse a recorded step.
        be.decode_step_discard();
        let mut guard = self.batch.lock().unwrap_or_else(|e| e.into_inner());
        if guard.as_ref().is_none_or(|s| s.max_batch < total) {
            // The batch's scratch: a state for `total` rows whose cache is never used.
            let kv = alloc_kv(be, &self.state_layout(), 1, total, KvType::F32)?;
            *guard = Some(self.state_with_kv(kv, 1, total));
        }
        let bs = guard.as_mut().expect("allocated above");
        self.embed_inputs(bs, &tokens)?;
        let Gemma4State {
            bufs,
            moe,
            pli,
            logits_rows,
            ..
        } = bs;
        self.trunk(bufs, moe.as_mut(), pli, total, &mut |b, il| {
            let (l, lc) = (&self.layers[il], &c.layers[il]);
            let qw = c.n_head * lc.head_dim;
            let kw = lc.n_head_kv * lc.head_dim;
            let ap = self.attn_params(il);
            let mut off = 0;
            for it in items.iter_mut() {
                let n = it.tokens.len();
                let s = &mut *it.state;
                be.copy_rows(&b[Q], off, n, qw, &mut s.bufs[Q], 0);
                if l.kv.is_some() {
                    be.copy_rows(&b[K], off, n, kw, &mut s.bufs[K], 0);
                    be.copy_rows(&b[V], off, n, kw, &mut s.bufs[V], 0);
                }
                self.rope_store(&mut s.bufs, &mut s.kv, il, n, it.positions);
                let [q, a] = pick2(&mut s.bufs, Q, A);
                be.attention(q, &s.kv, lc.kv_from.unwrap_or(il), it.positions, &ap, a);
                be.copy_rows(&s.bufs[A], 0, n, qw, &mut b[A], off);
                off += n;
            }
            let [a, o] = pick2(b, A, O);
            be.matmul(&l.wo, a, total, o);
        });
        // Each item's logits rows, in turn, to the front of `O`, then the head over them.
        let (mut off, mut kept) = (0, 0);
        for it in items.iter() {
            let n = it.tokens.len();
            let rows = n - it.logits_from;
            if rows > 0 {
                let [x, o] = pick2(bufs, X, O);
                be.copy_rows(x, off + it.logits_from, rows, c.n_embd, o, kept);
            }
            off += n;
            kept += rows;
        }
        if kept > 0 {
            self.head(bufs, logits_rows, kept);
        }
        Ok(select_rows(be, &bufs[LOGITS], c.n_vocab, &wants(items)))
    }
}
