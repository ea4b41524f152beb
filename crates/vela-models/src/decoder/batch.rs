//! One forward pass over several sequences of the shared decoder: a ragged batch in which each
//! sequence brings its own cache, tokens and positions (prefill chunks and single decode tokens
//! mixed). The products (Q/K/V, output projection, FFN, head) run once over the rows of every
//! sequence, so the weights are read once per step instead of once per sequence; RoPE, the K/V
//! store and attention run per sequence on its own cache and scratch.

use super::{check_batch, Attended, Bufs, DecoderModel, ForwardState};
use crate::lm::{BatchItem, CausalLm, Select, Selected};
use crate::stepper::StepState;
use anyhow::Result;
use vela_compute::{AttnParams, Backend, TopK};

/// Most rows of an item that [`DecoderModel::attend_together`] takes (decode steps and short
/// speculative checks; longer prompt chunks run the prefill kernels per sequence).
const TOGETHER_ROWS: usize = 8;

impl<B: Backend + 'static> DecoderModel<B> {
    /// Evaluate every item (each sequence appears once) and return, per item, what its
    /// selection asks of its rows `logits_from..` ([`Select`]: the selections run once over
    /// the batch's logits, on the device by a GPU). One item runs exactly as [`Self::forward`]
    /// (or `forward_argmax` / `forward_top_k`).
    pub fn forward_batch(
        &self,
        items: &mut [BatchItem<'_, ForwardState<B>>],
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
        // Such a step may be recorded and run as one graph: its launches then depend on the
        // batch's composition, not on the tokens and positions (`Backend::decode_batch_begin`).
        let recorded = together && {
            let positions: Vec<u32> = items.iter().flat_map(|it| it.positions).copied().collect();
            be.decode_batch_begin(&tokens, &positions)
        };
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
        });
        if recorded {
            be.decode_step_end();
        }
        let rows = rows?;
        let wants = wants(items);
        debug_assert_eq!(rows, wants.iter().map(|w| w.0).sum::<usize>());
        Ok(select_rows(be, &b.logits, c.n_vocab, &wants))
    }
}

/// Check every item of a batch against its own state ([`check_batch`]) and return the
/// batch's tokens, item after item.
pub(crate) fn batch_tokens<B: Backend, S: StepState<B>>(
    items: &[BatchItem<'_, S>],
) -> Result<Vec<u32>> {
    for it in items {
        let st = &*it.state;
        let n = it.tokens.len();
        check_batch(n, it.positions, st.max_batch(), st.n_ctx(), it.logits_from)?;
    }
    Ok(items.iter().flat_map(|it| it.tokens).copied().collect())
}

/// Each item's number of logits rows and its selection, as [`select_rows`] takes them.
pub(crate) fn wants<'a, S>(items: &[BatchItem<'a, S>]) -> Vec<(usize, Select<'a>)> {
    items
        .iter()
        .map(|it| (it.tokens.len() - it.logits_from, it.select))
        .collect()
}

/// The selections of a batch's logits rows (`logits`: each item's rows in turn, `wants`: each
/// item's row count and selection): the argmaxes and the top-k (at the largest k asked,
/// truncated per item) over all rows at once, and the rows read back only when an item asks
/// for them.
pub(crate) fn select_rows<B: Backend>(
    be: &B,
    logits: &B::Buf,
    nv: usize,
    wants: &[(usize, Select)],
) -> Vec<Selected> {
    let rows: usize = wants.iter().map(|w| w.0).sum();
    let asked = |f: &dyn Fn(&Select) -> Option<usize>| {
        wants
            .iter()
            .filter(|w| w.0 > 0)
            .filter_map(|w| f(&w.1))
            .max()
    };
    let argmax = asked(&|s| matches!(s, Select::Argmax).then_some(0)).is_some();
    let ids = if argmax {
        be.argmax_rows(logits, rows, nv)
    } else {
        Vec::new()
    };
    let k = asked(&|s| match s {
        Select::TopK(k, _) => Some(*k),
        _ => None,
    });
    let mut tops = k.map_or_else(Vec::new, |k| be.top_k_rows(logits, rows, nv, k));
    // Each item's top-k at its own k, and which rows are asked for.
    let (mut need, mut at) = (vec![false; rows], 0);
    for &(r, sel) in wants {
        match sel {
            Select::Logits => need[at..at + r].fill(true),
            Select::Argmax => {}
            Select::TopK(k, f) => {
                for i in at..at + r {
                    tops[i].items.truncate(k);
                    need[i] = f(&tops[i]);
                }
            }
        }
        at += r;
    }
    let mut all = Vec::new();
    if need.contains(&true) {
        all = vec![0f32; rows * nv];
        be.read(logits, &mut all);
    }
    let mut tops: Vec<Option<TopK>> = tops.into_iter().map(Some).collect();
    let mut out = Vec::with_capacity(wants.len());
    let mut at = 0;
    for &(r, sel) in wants {
        out.push(match sel {
            Select::Logits => Selected::Logits(all[at * nv..(at + r) * nv].to_vec()),
            Select::Argmax => Selected::Argmax(ids[at..at + r].to_vec()),
            Select::TopK(..) => Selected::TopK(
                (at..at + r)
                    .map(|i| {
                        let t = tops[i].take().expect("a top-k per row");
                        (t, need[i].then(|| all[i * nv..(i + 1) * nv].to_vec()))
                    })
                    .collect(),
            ),
        });
        at += r;
    }
    out
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
