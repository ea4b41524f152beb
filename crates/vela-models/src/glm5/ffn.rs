//! GLM 5.3's feed-forward blocks (HF 85-206, spec §6): a clamped SwiGLU
//! `down(silu(min(x·Wgᵀ, L)) ⊙ clamp(x·Wuᵀ, −L, L))` for dense layers and the shared expert;
//! MoE layers add the routed experts: scores σ(x·Wrᵀ), chosen by score + bias (with groups:
//! the best `topk_group` groups by their two best keys), weighted by the raw scores,
//! renormalised where `norm_topk_prob`, times `routed_scaling_factor`. Routed experts use the
//! same clamp.

use super::*;
use vela_compute::{Activation, RouteParams, Score};

/// A clamped SwiGLU MLP.
pub(super) struct Mlp<B: Backend> {
    pub gate: B::Weight,
    pub up: B::Weight,
    pub down: B::Weight,
    pub width: usize,
}

pub(super) struct Moe<B: Backend> {
    pub router: B::Weight,
    pub bias: B::Vector,
    pub experts: crate::blocks::experts::Experts<B>,
    pub shared: Mlp<B>,
}

pub(super) enum Ffn<B: Backend> {
    Dense(Mlp<B>),
    Moe(Moe<B>),
}

impl<B: Backend> Glm5Model<B> {
    /// The FFN on `XN` → `Y`.
    pub(super) fn ffn(&self, st: &mut Glm5State<B>, f: &Ffn<B>, n: usize) {
        match f {
            Ffn::Dense(m) => self.mlp(&mut st.bufs, m, n),
            Ffn::Moe(m) => self.moe(st, m, n),
        }
    }

    fn mlp(&self, b: &mut [B::Buf], m: &Mlp<B>, n: usize) {
        let be = &*self.backend;
        {
            let [xn, sg, su] = pick3(b, XN, SG, SU);
            be.matmul_many(&[&m.gate, &m.up], xn, n, &mut [sg, su]);
            be.act_mul(
                sg,
                su,
                n * m.width,
                Activation::SiluLimit(self.cfg.swiglu_limit),
            );
        }
        let [sg, y] = pick2(b, SG, Y);
        be.matmul(&m.down, sg, n, y);
    }

    fn moe(&self, st: &mut Glm5State<B>, m: &Moe<B>, n: usize) {
        let be = &*self.backend;
        let c = &self.cfg;
        let h = c.hidden;
        {
            let [xn, rl] = pick2(&mut st.bufs, XN, RL);
            be.matmul(&m.router, xn, n, rl);
        }
        let p = RouteParams {
            n_expert: c.n_expert,
            k: c.top_k,
            score: Score::Sigmoid,
            n_group: c.n_group,
            topk_group: c.topk_group,
            renorm: c.norm_topk,
            scale: c.routed_scale,
        };
        st.experts
            .route(be, &st.bufs[RL], n, &p, Some(&m.bias), None);
        self.mlp(&mut st.bufs, &m.shared, n);
        let b = &mut st.bufs;
        {
            let [xn, ex] = pick2(b, XN, EX);
            be.copy_rows(xn, 0, n, h, ex, 0);
        }
        m.experts.forward(be, &mut b[EX], n, h, &mut st.experts);
        let [y, ex] = pick2(b, Y, EX);
        be.add(y, ex, n * h);
    }
}
