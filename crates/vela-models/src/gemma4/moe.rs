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
//! The routed experts are the shared block (`crate::blocks::experts`): everything stays on the
//! backend, the expert products read the 3-D expert tensors in place (`[E, 2I, H]` gate+up or
//! separate `[E, I, H]` gate and up, `[E, H, I]` down; llama.cpp's `ffn_*_exps`, the same
//! bytes), and the weighted outputs are summed in ascending expert order, the order of HF's
//! `index_add_` loop. This file adds Gemma 4's router input and scales and its extra norms.

use super::pick2;
use crate::blocks::experts::{ExpertScratch, Experts};
use vela_compute::{Backend, RouteParams, Score};

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

/// The MoE part of one decoder layer.
pub(super) struct MoeLayer<B: Backend> {
    pub router: B::Weight,
    /// `router.scale` (applied after the router's weight-free RMSNorm, then × `H^-0.5`).
    pub router_scale: B::Vector,
    pub per_expert_scale: B::Vector,
    pub pre_norm_2: B::Vector,
    pub post_norm_1: B::Vector,
    pub post_norm_2: B::Vector,
    pub experts: Experts<B>,
}

/// Per-sequence scratch of the MoE blocks, for up to `max_batch` tokens.
pub(super) struct MoeScratch<B: Backend> {
    /// Router logits `[n, E]`.
    logits: B::Buf,
    experts: ExpertScratch<B>,
}

impl<B: Backend> MoeScratch<B> {
    pub(super) fn new(be: &B, c: &MoeConfig, d: usize, max_batch: usize) -> Self {
        MoeScratch {
            logits: be.alloc(max_batch * c.n_expert),
            experts: ExpertScratch::new(be, c.top_k, c.n_ff_exp, d, max_batch),
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
        // Router logits [n, E], then each token's experts and weights.
        {
            let [r, t] = pick2(b, resid, tmp);
            be.rms_norm(r, &self.router_scale, n, d, eps, t);
            be.scale(t, n * d, (d as f32).powf(-0.5));
            be.matmul(&self.router, t, n, &mut s.logits);
        }
        let es = Some(&self.per_expert_scale);
        s.experts
            .route(be, &s.logits, n, &c.route_params(), None, es);
        // Expert input x2 = pre_feedforward_layernorm_2(r), replaced by the experts' sum.
        {
            let [r, t] = pick2(b, resid, tmp);
            be.rms_norm(r, &self.pre_norm_2, n, d, eps, t);
        }
        let [t, o] = pick2(b, tmp, out);
        self.experts.forward(be, t, n, d, &mut s.experts);
        be.rms_norm_inplace(t, &self.post_norm_2, n, d, eps);
        be.add(o, t, n * d);
    }
}
