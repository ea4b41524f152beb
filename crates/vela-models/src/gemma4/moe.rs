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
//! Routing is per token: the router logits are read back, softmax/top-k/renormalisation run on
//! the host in f32, and each expert with at least one token runs as ordinary [`Backend`]
//! matmuls over the rows routed to it (gathered on the host). The weighted expert outputs are
//! summed per token in ascending expert order, the order of HF's `index_add_` loop.
//!
//! Expert weights are stored as 3-D tensors (`[E, 2I, H]` gate+up, `[E, H, I]` down in HF;
//! `ffn_gate_up_exps` / `ffn_down_exps` in llama.cpp's GGUF, same byte layout). Each expert's
//! rows are a contiguous byte range, so [`expert_image`] copies them into a small GGUF image of
//! per-expert 2-D tensors that the unchanged [`vela_compute::HostWeight`] path can take.

use super::pick2;
use anyhow::{anyhow, bail, Result};
use vela_compute::{Activation, Backend};
use vela_formats::gguf::GgufFile;
use vela_formats::quant::GgmlType;

use super::image::{build_image, ImageTensor};

/// MoE sizes (`num_experts`, `top_k_experts`, `moe_intermediate_size`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeConfig {
    pub n_expert: usize,
    pub top_k: usize,
    /// Intermediate width of one expert.
    pub n_ff_exp: usize,
}

/// One expert's GeGLU weights.
pub(super) struct Expert<B: Backend> {
    pub gate: B::Weight,
    pub up: B::Weight,
    pub down: B::Weight,
}

/// The MoE part of one decoder layer.
pub(super) struct MoeLayer<B: Backend> {
    pub router: B::Weight,
    /// `router.scale` (applied after the router's weight-free RMSNorm, then × `H^-0.5`).
    pub router_scale: B::Vector,
    pub per_expert_scale: Vec<f32>,
    pub pre_norm_2: B::Vector,
    pub post_norm_1: B::Vector,
    pub post_norm_2: B::Vector,
    pub experts: Vec<Expert<B>>,
}

/// The 3-D expert tensors of one layer, as raw bytes: `gate_up` is either one fused
/// `[E, 2I, H]` tensor or separate gate and up `[E, I, H]` tensors; `down` is `[E, H, I]`.
pub(super) struct ExpertTensors<'a> {
    pub layer: usize,
    pub ty_gate_up: GgmlType,
    pub gate_up: Vec<&'a [u8]>,
    pub ty_down: GgmlType,
    pub down: &'a [u8],
}

/// Name of expert `e`'s part (`gate`, `up`, `down`) of layer `il` inside [`expert_image`].
pub(super) fn expert_name(il: usize, e: usize, part: &str) -> String {
    format!("layers.{il}.experts.{e}.{part}")
}

/// Split every layer's 3-D expert tensors into per-expert 2-D tensors (a copy of the expert
/// weights) named by [`expert_name`]. `d` = hidden size, `c` = the MoE sizes.
pub(super) fn expert_image(layers: &[ExpertTensors], d: usize, c: &MoeConfig) -> Result<GgufFile> {
    let (e_n, i_n) = (c.n_expert, c.n_ff_exp);
    let mut tensors: Vec<ImageTensor> = Vec::new();
    for l in layers {
        let il = l.layer;
        let row = |ty: GgmlType, cols: usize| -> Result<usize> {
            ty.row_bytes(cols as u64)
                .map(|b| b as usize)
                .ok_or_else(|| {
                    anyhow!("layer {il}: expert rows of {cols} do not fit {ty:?} blocks")
                })
        };
        let rb_gu = row(l.ty_gate_up, d)?;
        let rb_dn = row(l.ty_down, i_n)?;
        let fused = l.gate_up.len() == 1;
        let want_gu = if fused { 2 * i_n } else { i_n } * rb_gu * e_n;
        if l.gate_up.iter().any(|b| b.len() != want_gu) || l.down.len() != d * rb_dn * e_n {
            bail!("layer {il}: expert tensors do not hold {e_n} experts of [{i_n}, {d}]");
        }
        let part = i_n * rb_gu;
        for e in 0..e_n {
            let (gate, up) = if fused {
                let all = &l.gate_up[0][e * 2 * part..(e + 1) * 2 * part];
                (&all[..part], &all[part..])
            } else {
                (
                    &l.gate_up[0][e * part..(e + 1) * part],
                    &l.gate_up[1][e * part..(e + 1) * part],
                )
            };
            let dims = vec![d as u64, i_n as u64];
            tensors.push((expert_name(il, e, "gate"), dims.clone(), l.ty_gate_up, gate));
            tensors.push((expert_name(il, e, "up"), dims, l.ty_gate_up, up));
            let dn = d * rb_dn;
            tensors.push((
                expert_name(il, e, "down"),
                vec![i_n as u64, d as u64],
                l.ty_down,
                &l.down[e * dn..(e + 1) * dn],
            ));
        }
    }
    build_image(&tensors)
}

/// Top-k routing of one token: softmax (f32, max-subtracted) over the router logits, the `k`
/// largest probabilities (ties to the lower index), renormalised to sum 1, times the expert's
/// `per_expert_scale`. Returns `(expert, weight)` pairs.
pub(super) fn route(logits: &[f32], k: usize, per_expert_scale: &[f32]) -> Vec<(usize, f32)> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    let probs: Vec<f32> = exps.iter().map(|&e| e / sum).collect();
    let mut order: Vec<usize> = (0..probs.len()).collect();
    order.sort_by(|&a, &b| probs[b].total_cmp(&probs[a]).then(a.cmp(&b)));
    order.truncate(k);
    let top_sum: f32 = order.iter().map(|&e| probs[e]).sum();
    order
        .into_iter()
        .map(|e| (e, probs[e] / top_sum * per_expert_scale[e]))
        .collect()
}

// Indices into `Gemma4State::bufs` used by the MoE block (allocated only for MoE models).
pub(super) const M_X: usize = 12;
pub(super) const M_G: usize = 13;
pub(super) const M_U: usize = 14;
pub(super) const M_O: usize = 15;
pub(super) const M_L: usize = 16;

impl<B: Backend> MoeLayer<B> {
    /// Add the expert branch to `b[out]` (which holds `h1`, the normed shared-MLP output) for
    /// the `n` rows of `b[resid]` (the residual stream `r`). Uses scratch `b[tmp]`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn forward(
        &self,
        be: &B,
        b: &mut [B::Buf],
        c: &MoeConfig,
        n: usize,
        d: usize,
        eps: f32,
        (resid, tmp, out): (usize, usize, usize),
    ) {
        let e_n = c.n_expert;
        // Router logits [n, E].
        {
            let [r, t] = pick2(b, resid, tmp);
            be.rms_norm(r, &self.router_scale, n, d, eps, t);
            be.scale(t, n * d, (d as f32).powf(-0.5));
        }
        {
            let [t, l] = pick2(b, tmp, M_L);
            be.matmul(&self.router, t, n, l);
        }
        let mut logits = vec![0f32; n * e_n];
        be.read(&b[M_L], &mut logits);
        // Expert input x2 = pre_feedforward_layernorm_2(r), on the host for the gathers.
        {
            let [r, t] = pick2(b, resid, tmp);
            be.rms_norm(r, &self.pre_norm_2, n, d, eps, t);
        }
        let mut x2 = vec![0f32; n * d];
        be.read(&b[tmp], &mut x2);
        // Per expert: the (token, weight) pairs routed to it, tokens ascending.
        let mut routed: Vec<Vec<(usize, f32)>> = vec![Vec::new(); e_n];
        for t in 0..n {
            for (e, w) in route(
                &logits[t * e_n..(t + 1) * e_n],
                c.top_k,
                &self.per_expert_scale,
            ) {
                routed[e].push((t, w));
            }
        }
        let mut acc = vec![0f32; n * d];
        let mut rows = Vec::new();
        let mut y = Vec::new();
        for (ex, list) in self.experts.iter().zip(&routed) {
            if list.is_empty() {
                continue;
            }
            let m = list.len();
            rows.clear();
            for &(t, _) in list {
                rows.extend_from_slice(&x2[t * d..(t + 1) * d]);
            }
            be.write(&mut b[M_X], &rows);
            {
                let [x, g, u] = b
                    .get_disjoint_mut([M_X, M_G, M_U])
                    .expect("distinct buffer indices");
                be.matmul_many(&[&ex.gate, &ex.up], x, m, &mut [g, u]);
                be.act_mul(g, u, m * c.n_ff_exp, Activation::GeluTanh);
            }
            {
                let [g, o] = pick2(b, M_G, M_O);
                be.matmul(&ex.down, g, m, o);
            }
            y.resize(m * d, 0.0);
            be.read(&b[M_O], &mut y);
            for (j, &(t, w)) in list.iter().enumerate() {
                for (a, &v) in acc[t * d..(t + 1) * d]
                    .iter_mut()
                    .zip(&y[j * d..(j + 1) * d])
                {
                    *a += v * w;
                }
            }
        }
        be.write(&mut b[tmp], &acc);
        be.rms_norm_inplace(&mut b[tmp], &self.post_norm_2, n, d, eps);
        let [o, t] = pick2(b, out, tmp);
        be.add(o, t, n * d);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn route_normalises_and_scales_the_top_k() {
        let logits = [0.0f32, 2.0, 1.0, 2.0f32.ln() + 1.0];
        let scale = [1.0f32, 1.0, 3.0, 0.5];
        let r = route(&logits, 2, &scale);
        // Probabilities ∝ 1, e², e, 2e: the top 2 are expert 1 (e²) then expert 3 (2e).
        assert_eq!(r.iter().map(|p| p.0).collect::<Vec<_>>(), [1, 3]);
        let e = std::f32::consts::E;
        let (w1, w3) = (e * e / (e * e + 2.0 * e), 2.0 * e / (e * e + 2.0 * e) * 0.5);
        assert!(
            (r[0].1 - w1).abs() < 1e-6 && (r[1].1 - w3).abs() < 1e-6,
            "{r:?}"
        );
        // Ties go to the lower index.
        let r = route(&[1.0, 1.0, 1.0], 1, &[1.0; 3]);
        assert_eq!(r, [(0, 1.0)]);
    }

    #[test]
    fn expert_image_splits_fused_gate_up_rows() {
        // 2 experts, I = 1, H = 2, F32: gate_up [E=2, 2I=2, H=2], down [E=2, H=2, I=1].
        let gu: Vec<u8> = (0..8).flat_map(|v| (v as f32).to_le_bytes()).collect();
        let dn: Vec<u8> = (10..14).flat_map(|v| (v as f32).to_le_bytes()).collect();
        let c = MoeConfig {
            n_expert: 2,
            top_k: 1,
            n_ff_exp: 1,
        };
        let t = ExpertTensors {
            layer: 3,
            ty_gate_up: GgmlType::F32,
            gate_up: vec![&gu],
            ty_down: GgmlType::F32,
            down: &dn,
        };
        let g = expert_image(&[t], 2, &c).unwrap();
        let vals = |name: &str| -> Vec<f32> {
            let t = g.tensor(name).unwrap();
            g.tensor_data(t)
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect()
        };
        assert_eq!(vals(&expert_name(3, 1, "gate")), [4.0, 5.0]);
        assert_eq!(vals(&expert_name(3, 1, "up")), [6.0, 7.0]);
        assert_eq!(vals(&expert_name(3, 0, "down")), [10.0, 11.0]);
        assert_eq!(vals(&expert_name(3, 1, "down")), [12.0, 13.0]);
        // A tensor of the wrong size is a clear error.
        let t = ExpertTensors {
            layer: 0,
            ty_gate_up: GgmlType::F32,
            gate_up: vec![&gu[..12]],
            ty_down: GgmlType::F32,
            down: &dn,
        };
        let err = expert_image(&[t], 2, &c).err().unwrap().to_string();
        assert!(err.contains("do not hold 2 experts"), "{err}");
    }
}
