//! Kimi Delta Attention, GLM 5.3's linear layers (HF 620-770, spec §4):
//!
//! ```text
//! u      = x·[Wq; Wk; Wv]ᵀ;  q, k, v = silu(causalconv(u))        depthwise, kernel Kc
//!                                                                  (state: the last Kc−1 rows of u)
//! gr     = f_b(f_a(x)) + dt_bias                                   [n, nk·dk]
//! g      = lb·σ(a_h·gr)   (lower bound set)   or   −a_h·softplus(gr)   (none), a_h = exp(A_log[h])
//! β      = σ(x·Wbᵀ)
//! o      = delta rule with the per-channel decay exp(g) over l2n(q)/√dk, l2n(k), v
//! out    = o_proj(rms(o; o_norm) ⊙ σ(g_b(g_a(x))))                 the norm per head
//! ```
//!
//! At load a_h is folded into the rows of `f_b` and into `dt_bias` for the bounded gate (a·gr =
//! (a·W_fb)(f_a x) + a·dt_bias), so the gate is one scaled sigmoid; the recurrent form runs for
//! every forward (HF runs a chunked form for several tokens: the same function).

use super::*;
use vela_compute::DeltaDims;

pub(super) struct Kda<B: Backend> {
    /// `[q; k; v]` projections stacked, `[3·nk·dk, H]`.
    pub qkv: B::Weight,
    /// `[3·nk·dk, Kc]`: the three depthwise kernels in the same order.
    pub conv: B::Vector,
    pub f_a: B::Weight,
    /// `f_b`, its rows scaled by a_h for the bounded gate.
    pub f_b: B::Weight,
    /// `dt_bias` (scaled by a_h for the bounded gate).
    pub dt_bias: B::Vector,
    /// −a_h repeated over each head's channels (the softplus gate).
    pub neg_a: B::Vector,
    pub b: B::Weight,
    pub g_a: B::Weight,
    pub g_b: B::Weight,
    pub o_norm: B::Vector,
    pub o: B::Weight,
}

impl<B: Backend> Glm5Model<B> {
    /// KDA on `XN` → `Y`; `ent`: the layer's (conv tail, matrix) entries.
    pub(super) fn kda(
        &self,
        st: &mut Glm5State<B>,
        k: &Kda<B>,
        ent: &[usize],
        p0: usize,
        n: usize,
    ) -> Result<()> {
        let be = &*self.backend;
        let c = &self.cfg;
        let (nk, dk) = (c.kda_heads, c.kda_dim);
        let kc = nk * dk;
        let b = &mut st.bufs;
        {
            let [xn, u, lo, be_, lo2] = b
                .get_disjoint_mut([XN, U, LOW, BETA, LOW2])
                .expect("distinct");
            be.matmul_many(
                &[&k.qkv, &k.f_a, &k.b, &k.g_a],
                xn,
                n,
                &mut [u, lo, be_, lo2],
            );
        }
        be.sigmoid(&mut b[BETA], n * nk);
        {
            let [lo, g] = pick2(b, LOW, G);
            be.matmul(&k.f_b, lo, n, g);
            match c.lower_bound {
                Some(lb) => {
                    be.add_bias(g, &k.dt_bias, n);
                    be.sigmoid_scaled(g, n * kc, 1.0, lb);
                }
                None => be.decay_gate(g, &k.dt_bias, &k.neg_a, n, kc),
            }
        }
        {
            let [lo2, gate] = pick2(b, LOW2, GATE);
            be.matmul(&k.g_b, lo2, n, gate);
        }
        {
            let [u, uc] = pick2(b, U, UC);
            crate::state::segments(
                be,
                &mut st.extra,
                (ent[0], SNAPSHOTS),
                p0,
                n,
                &mut |from, m, state| {
                    be.conv1d_causal(u, from, m, 3 * kc, &k.conv, c.conv_k, 1, true, state, uc)
                },
            )?;
        }
        {
            let [uc, g, beta, o] = b.get_disjoint_mut([UC, G, BETA, O]).expect("distinct");
            crate::state::segments(
                be,
                &mut st.extra,
                (ent[1], SNAPSHOTS),
                p0,
                n,
                &mut |from, m, state| {
                    let dims = DeltaDims {
                        n: m,
                        n_k: nk,
                        n_v: nk,
                        dk,
                        dv: dk,
                        tiled: false,
                        from,
                    };
                    be.gated_delta_rule_channels(uc, g, beta, dims, state, o)
                },
            )?;
        }
        {
            let [o, on, gate] = pick3(b, O, ON, GATE);
            be.rms_norm(o, &k.o_norm, n * nk, dk, c.eps, on);
            be.sigmoid_mul(on, gate, n * kc);
        }
        let [on, y] = pick2(b, ON, Y);
        be.matmul(&k.o, on, n, y);
        Ok(())
    }
}
