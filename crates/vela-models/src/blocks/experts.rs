//! Routed experts: the part every MoE block shares (Gemma 4, Qwen3 MoE, Qwen3.8 Flash Next,
//! DeepSeek V4, GLM 5.3): each token's choice of experts ([`Backend::route`], or
//! [`Backend::route_hash`] for hash-routed layers), the expert products straight from the 3-D
//! expert tensors ([`Backend::matmul_experts`]) and the weighted combine per token in ascending
//! expert order, the order HF's expert loops add in ([`Backend::scatter_add_rows`]). Everything
//! stays on the backend: no read-back, so a MoE decode step can run as one recorded graph. Each
//! architecture's block adds its own router input, shared experts, norms and scales around it.

use vela_compute::{Activation, Backend, RouteParams};

/// The gate and up products of every expert: one fused 3-D tensor or two.
pub enum GateUp<B: Backend> {
    /// `[E·2I, H]`: expert e's gate rows, then its up rows (HF `experts.gate_up_proj`,
    /// llama.cpp `ffn_gate_up_exps`).
    Fused(B::Weight),
    /// `[E·I, H]` each (llama.cpp `ffn_gate_exps`, `ffn_up_exps`).
    Split(B::Weight, B::Weight),
}

/// A layer's experts: gated FFNs of width `n_ff`.
pub struct Experts<B: Backend> {
    pub gate_up: GateUp<B>,
    /// `[E·H, I]`.
    pub down: B::Weight,
    pub n_ff: usize,
    pub act: Activation,
}

/// Per-sequence scratch of the routed experts, for up to `max_batch` tokens of `k` slots.
pub struct ExpertScratch<B: Backend> {
    /// `[n·k]` expert ids and weights ([`Backend::route`] writes them).
    pub ids: B::Ids,
    pub weights: B::Buf,
    /// The token of each slot (`s / k`), for the combine.
    token_of_slot: B::Ids,
    /// Gate+up products `[n·k, 2I]` (the up products when split), activations `[n·k, I]`,
    /// expert outputs `[n·k, H]`.
    gu: B::Buf,
    act: B::Buf,
    y: B::Buf,
    /// `[n, H]` zeros: the combine's starting value.
    zeros: B::Buf,
    k: usize,
}

impl<B: Backend> ExpertScratch<B> {
    /// Scratch for `k` experts per token of width `n_ff`, hidden size `d`.
    pub fn new(be: &B, k: usize, n_ff: usize, d: usize, max_batch: usize) -> Self {
        let nb = max_batch;
        let mut token_of_slot = be.alloc_ids(nb * k);
        let tos: Vec<u32> = (0..nb * k).map(|s| (s / k) as u32).collect();
        be.write_ids(&mut token_of_slot, &tos);
        let mut zeros = be.alloc(nb * d);
        be.write(&mut zeros, &vec![0f32; nb * d]);
        ExpertScratch {
            ids: be.alloc_ids(nb * k),
            weights: be.alloc(nb * k),
            token_of_slot,
            gu: be.alloc(nb * k * 2 * n_ff),
            act: be.alloc(nb * k * n_ff),
            y: be.alloc(nb * k * d),
            zeros,
            k,
        }
    }

    /// Route `n` tokens by their router `logits` (`[n, E]`) into `ids` / `weights`.
    pub fn route(
        &mut self,
        be: &B,
        logits: &B::Buf,
        n: usize,
        p: &RouteParams,
        bias: Option<&B::Vector>,
        expert_scale: Option<&B::Vector>,
    ) {
        debug_assert_eq!(p.k, self.k);
        be.route(
            logits,
            n,
            p,
            bias,
            expert_scale,
            &mut self.ids,
            &mut self.weights,
        );
    }
}

impl<B: Backend> Experts<B> {
    /// Replace the `n` rows of `x` (width `d`, the experts' input) by the sum over each token's
    /// routed slots of weight · expert(x row), with the routing already in `s`
    /// ([`ExpertScratch::route`]).
    pub fn forward(&self, be: &B, x: &mut B::Buf, n: usize, d: usize, s: &mut ExpertScratch<B>) {
        let (k, i_n) = (s.k, self.n_ff);
        match &self.gate_up {
            GateUp::Fused(w) => {
                be.matmul_experts(w, 2 * i_n, x, false, &s.ids, n, k, &mut s.gu);
                be.act_mul_split(&s.gu, n * k, i_n, self.act, &mut s.act);
            }
            GateUp::Split(wg, wu) => {
                be.matmul_experts(wg, i_n, x, false, &s.ids, n, k, &mut s.act);
                be.matmul_experts(wu, i_n, x, false, &s.ids, n, k, &mut s.gu);
                be.act_mul(&mut s.act, &s.gu, n * k * i_n, self.act);
            }
        }
        be.matmul_experts(&self.down, d, &s.act, true, &s.ids, n, k, &mut s.y);
        // The sum from zero, slots in ascending expert order.
        be.copy_rows(&s.zeros, 0, n, d, x, 0);
        be.scatter_add_rows(x, &s.y, &s.token_of_slot, Some(&s.weights), n * k, d);
    }
}
