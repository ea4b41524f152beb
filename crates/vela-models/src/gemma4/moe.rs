//! The Gemma 4 MoE block (`enable_moe_block`, 26B-A4B style), as `Gemma4TextDecoderLayer`,
//! `Gemma4TextRouter` and `Gemma4TextExperts` compute it in transformers 5.23:
//!
//! ```text
//! r  = residual stream after attention (the MLP's input before pre_feedforward_layernorm)
//! h1 = post_feedforward_layernorm_1(mlp(pre_feedforward_layernorm(r)))       shared GeGLU MLP
//! p  = softmax(W_router · (rmsnorm_noscale(r) ⊙ router.scale · H^-0.5))          f32, [E]
//! (w, idx) = top_k(p); w /= Σw; w *= per_expert_scale[idx]
//! h2 = post_feedforward_layernorm_2(Σ_k w_k · down_k(gelu_tanh(gate_k(x2)) ⊙ up_k(x2))),
//!      x2 = pre_feedforward_layernorm_2(r)
//! out = h1 + h2        (then post_feedforward_layernorm and the residual add, as without MoE)
//! ```
//!
//! Everything stays on the backend, with no read-back: [`Backend::route`] picks each token's
//! experts and weights (slots in ascending expert id), [`Backend::matmul_experts`] runs the
//! expert products slot by slot straight from the 3-D expert tensors (`[E, 2I, H]` gate+up or
//! separate `[E, I, H]` gate and up, `[E, H, I]` down; llama.cpp's `ffn_*_exps`, the same
//! bytes), and [`Backend::scatter_add_rows`] adds the weighted outputs per token in slot order,
//! i.e. in ascending expert order, the order of HF's `index_add_` loop.

use super::pick2;
use vela_compute::{Activation, Backend, RouteParams, Score};

/// MoE sizes (`num_experts`, `top_k_experts`, `moe_intermediate_size`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeConfig {
    pub n_expert: usize,
    pub top_k: usize,
    /// Intermediate width of one expert.
    pub n_ff_exp: usize,
}

impl MoeConfig {
    /// Gemma 4's routing: softmax scores, top-k, renormalised, times the per-expert scale.
    pub(super) fn route_params(&self) -> RouteParams {
        RouteParams {
            n_expert: self.n_expert,
            k: self.top_k,
            score: Score::Softmax,
            n_group: 1,
            topk_group: 1,
            renorm: true,
            scale: 1.0,
        }
    }
}

/// The gate and up products of every expert: one fused 3-D tensor or two.
pub(super) enum GateUp<B: Backend> {
    /// `[E·2I, H]`: expert e's gate rows, then its up rows.
    Fused(B::Weight),
    /// `[E·I, H]` each.
    Split(B::Weight, B::Weight),
}

/// The MoE part of one decoder layer.
pub(super) struct MoeLayer<B: Backend> {
    pub router: B::Weight,
    /// `router.scale` (applied after the router's weight-free RMSNorm, then × `H^-0.5`).
    pub router_scale: B::Vector,
    pub per_expert_scale: B::Vector,
    pub pre_norm_2: B::Vector,
    pub post_norm_1: B::Vector,
    pub post_norm_2: B::Vector,
    pub gate_up: GateUp<B>,
    /// `[E·H, I]`.
    pub down: B::Weight,
}

/// Per-sequence scratch of the MoE blocks, for up to `max_batch` tokens of `k` slots.
pub(super) struct MoeScratch<B: Backend> {
    /// Router logits `[n, E]`.
    logits: B::Buf,
    /// `[n·k]` expert ids and weights.
    ids: B::Ids,
    weights: B::Buf,
    /// The token of each slot (`s / k`), for the combine.
    token_of_slot: B::Ids,
    /// Gate+up products `[n·k, 2I]` (the up products when split), activations `[n·k, I]`,
    /// expert outputs `[n·k, H]`.
    gu: B::Buf,
    act: B::Buf,
    y: B::Buf,
    /// `[n, H]` zeros: the combine's starting value.
    zeros: B::Buf,
}

impl<B: Backend> MoeScratch<B> {
    pub(super) fn new(be: &B, c: &MoeConfig, d: usize, max_batch: usize) -> Self {
        let (nb, k, i) = (max_batch, c.top_k, c.n_ff_exp);
        let mut token_of_slot = be.alloc_ids(nb * k);
        let tos: Vec<u32> = (0..nb * k).map(|s| (s / k) as u32).collect();
        be.write_ids(&mut token_of_slot, &tos);
        let mut zeros = be.alloc(nb * d);
        be.write(&mut zeros, &vec![0f32; nb * d]);
        MoeScratch {
            logits: be.alloc(nb * c.n_expert),
            ids: be.alloc_ids(nb * k),
            weights: be.alloc(nb * k),
            token_of_slot,
            gu: be.alloc(nb * k * 2 * i),
            act: be.alloc(nb * k * i),
            y: be.alloc(nb * k * d),
            zeros,
        }
    }
}

impl<B: Backend> MoeLayer<B> {
    /// Add the expert branch to `b[out]` (which holds `h1`, the normed shared-MLP output) for
    /// the `n` rows of `b[resid]` (the residual stream `r`). Uses scratch `b[tmp]` and `s`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn forward(
        &self,
        be: &B,
        b: &mut [B::Buf],
        s: &mut MoeScratch<B>,
        c: &MoeConfig,
        n: usize,
        d: usize,
        eps: f32,
        (resid, tmp, out): (usize, usize, usize),
    ) {
        let (k, i_n) = (c.top_k, c.n_ff_exp);
        // Router logits [n, E], then each token's experts and weights.
        {
            let [r, t] = pick2(b, resid, tmp);
            be.rms_norm(r, &self.router_scale, n, d, eps, t);
            be.scale(t, n * d, (d as f32).powf(-0.5));
            be.matmul(&self.router, t, n, &mut s.logits);
        }
        let p = c.route_params();
        let es = Some(&self.per_expert_scale);
        be.route(&s.logits, n, &p, None, es, &mut s.ids, &mut s.weights);
        // Expert input x2 = pre_feedforward_layernorm_2(r).
        {
            let [r, t] = pick2(b, resid, tmp);
            be.rms_norm(r, &self.pre_norm_2, n, d, eps, t);
        }
        let x2 = &b[tmp];
        match &self.gate_up {
            GateUp::Fused(w) => {
                be.matmul_experts(w, 2 * i_n, x2, false, &s.ids, n, k, &mut s.gu);
                be.act_mul_split(&s.gu, n * k, i_n, Activation::GeluTanh, &mut s.act);
            }
            GateUp::Split(wg, wu) => {
                be.matmul_experts(wg, i_n, x2, false, &s.ids, n, k, &mut s.act);
                be.matmul_experts(wu, i_n, x2, false, &s.ids, n, k, &mut s.gu);
                be.act_mul(&mut s.act, &s.gu, n * k * i_n, Activation::GeluTanh);
            }
        }
        be.matmul_experts(&self.down, d, &s.act, true, &s.ids, n, k, &mut s.y);
        // Σ_k w_k · y_k per token, from zero, slots in ascending expert order.
        be.copy_rows(&s.zeros, 0, n, d, &mut b[tmp], 0);
        be.scatter_add_rows(
            &mut b[tmp],
            &s.y,
            &s.token_of_slot,
            Some(&s.weights),
            n * k,
            d,
        );
        be.rms_norm_inplace(&mut b[tmp], &self.post_norm_2, n, d, eps);
        let [o, t] = pick2(b, out, tmp);
        be.add(o, t, n * d);
    }
}
