//! Loading `qwen4_exp` weights from an HF checkpoint directory (docs/qwen4exp-spec.md §9):
//! tensors read in place; the (1+w) norms offset at load; the per-expert tensors stacked into
//! the 3-D expert layout the shared expert block reads; `q_proj`'s per-head [q | gate]
//! interleave split into two matrices.

use super::*;
use crate::blocks::experts::{stack_per_expert, ExpertTensors, Experts};
use crate::placement::LoadSpec;
use crate::weights::{stack, WeightSource};
use anyhow::{anyhow, Context};
use std::path::Path;
use vela_compute::HostWeight;
use vela_formats::quant::GgmlType;

pub(super) struct Loader<'a, B: Backend> {
    be: &'a B,
    src: &'a WeightSource,
    /// Weight bytes one token reads (experts at their active share).
    pub(super) bytes: u64,
}

impl<'a, B: Backend> Loader<'a, B> {
    pub(super) fn new(be: &'a B, src: &'a WeightSource) -> Self {
        Loader { be, src, bytes: 0 }
    }
    fn host(&self, name: &str) -> Result<HostWeight> {
        self.src.matrix(name, false)
    }
    pub(super) fn upload(&mut self, w: &HostWeight, share: f64) -> Result<B::Weight> {
        self.bytes += (w.bytes().len() as f64 * share) as u64;
        self.be.upload_weight(w)
    }
    pub(super) fn matrix(&mut self, name: &str) -> Result<B::Weight> {
        let w = self.host(name)?;
        self.upload(&w, 1.0)
    }
    /// `q_proj`'s per-head [q | gate] rows as two matrices (queries, gates).
    pub(super) fn split_q(
        &mut self,
        name: &str,
        c: &Qwen4ExpConfig,
    ) -> Result<(B::Weight, B::Weight)> {
        let hd = c.head_dim;
        let q = self.host(name)?;
        if q.rows != 2 * c.n_head * hd {
            bail!("{name}: {} rows, expected {}", q.rows, 2 * c.n_head * hd);
        }
        let part = |off: usize| -> Result<Vec<HostWeight>> {
            (0..c.n_head)
                .map(|h| q.row_range(h * 2 * hd + off, hd, "q_proj head"))
                .collect()
        };
        let wq = stack(&format!("{name} (q)"), &part(0)?)?;
        let wg = stack(&format!("{name} (gate)"), &part(hd)?)?;
        Ok((self.upload(&wq, 1.0)?, self.upload(&wg, 1.0)?))
    }
    fn floats(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let w = self
            .src
            .get(name)
            .ok_or_else(|| anyhow!("missing tensor {name}"))?;
        let v = w.to_f32()?;
        if v.len() != len {
            bail!("{name}: {} values, expected {len}", v.len());
        }
        Ok(v)
    }
    pub(super) fn vector(&self, name: &str, len: usize) -> Result<B::Vector> {
        self.be.upload_vector(&self.floats(name, len)?)
    }
    /// A (1+w) norm weight.
    pub(super) fn norm1p(&self, name: &str, len: usize) -> Result<B::Vector> {
        let v: Vec<f32> = self.floats(name, len)?.iter().map(|w| 1.0 + w).collect();
        self.be.upload_vector(&v)
    }
    /// A (1+w) norm applied right before RoPE, with YaRN's attention factor folded into its
    /// rotated dims (RoPE is linear: scaling its input scales cos and sin alike).
    fn norm1p_rope(&self, name: &str, len: usize, c: &Qwen4ExpConfig) -> Result<B::Vector> {
        let mut v: Vec<f32> = self.floats(name, len)?.iter().map(|w| 1.0 + w).collect();
        for w in v.iter_mut().take(c.n_rot) {
            *w *= c.rope_attn_factor;
        }
        self.be.upload_vector(&v)
    }
    fn ints(&self, name: &str) -> Result<Vec<u64>> {
        let w = self
            .src
            .get(name)
            .ok_or_else(|| anyhow!("missing tensor {name}"))?;
        match w.ty {
            GgmlType::I64 => Ok(w
                .bytes()
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")) as u64)
                .collect()),
            GgmlType::I32 => Ok(w
                .bytes()
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")) as u64)
                .collect()),
            t => bail!("{name}: integer tensor expected, found {}", t.name()),
        }
    }

    pub(super) fn hc(&mut self, p: &str, c: &Qwen4ExpConfig, inject: bool) -> Result<Hc<B>> {
        let sh = c.streams * c.hidden;
        Ok(Hc {
            norm: self.norm1p(&format!("{p}.hc_norm.weight"), sh)?,
            down: self.matrix(&format!("{p}.input_mix_weight_down.weight"))?,
            up: self.matrix(&format!("{p}.input_mix_weight_up.weight"))?,
            inject: if inject {
                Some(self.matrix(&format!("{p}.block_inject_weight.weight"))?)
            } else {
                None
            },
        })
    }

    fn gdn(&mut self, p: &str, c: &Qwen4ExpConfig) -> Result<Gdn<B>> {
        let a_log = self.floats(&format!("{p}.A_log"), c.n_v)?;
        let neg_a: Vec<f32> = a_log.iter().map(|a| -a.exp()).collect();
        Ok(Gdn {
            qkv: self.matrix(&format!("{p}.in_proj_qkv.weight"))?,
            z: self.matrix(&format!("{p}.in_proj_z.weight"))?,
            b: self.matrix(&format!("{p}.in_proj_b.weight"))?,
            a: self.matrix(&format!("{p}.in_proj_a.weight"))?,
            conv: self.vector(&format!("{p}.conv1d.weight"), c.qkv_width() * c.conv_k)?,
            dt_bias: self.vector(&format!("{p}.dt_bias"), c.n_v)?,
            neg_a: self.be.upload_vector(&neg_a)?,
            norm: self.vector(&format!("{p}.norm.weight"), c.dv)?,
            out: self.matrix(&format!("{p}.out_proj.weight"))?,
        })
    }

    pub(super) fn qsa(&mut self, p: &str, c: &Qwen4ExpConfig) -> Result<Qsa<B>> {
        let hd = c.head_dim;
        let (wq, wgate) = self.split_q(&format!("{p}.q_proj.weight"), c)?;
        let idx = self.host(&format!("{p}.indexer.index_qk_proj.weight"))?;
        let (ni, di) = (c.idx_heads, c.idx_dim);
        if idx.rows != (ni + 1) * di {
            bail!(
                "{p}.indexer.index_qk_proj: {} rows, expected {}",
                idx.rows,
                (ni + 1) * di
            );
        }
        Ok(Qsa {
            wq,
            wgate,
            wk: self.matrix(&format!("{p}.k_proj.weight"))?,
            wv: self.matrix(&format!("{p}.v_proj.weight"))?,
            wo: self.matrix(&format!("{p}.o_proj.weight"))?,
            q_norm: self.norm1p_rope(&format!("{p}.q_norm.weight"), hd, c)?,
            k_norm: self.norm1p_rope(&format!("{p}.k_norm.weight"), hd, c)?,
            idx_q: self.upload(&idx.row_range(0, ni * di, "indexer q")?, 1.0)?,
            idx_k: self.upload(&idx.row_range(ni * di, di, "indexer k")?, 1.0)?,
            idx_q_norm: self.norm1p_rope(&format!("{p}.indexer.q_layernorm.weight"), di, c)?,
            idx_k_norm: self.norm1p_rope(&format!("{p}.indexer.k_layernorm.weight"), di, c)?,
        })
    }

    /// A MoE block; `layer`: the trunk layer's index (its experts may stay in host memory), `None`
    /// for the MTP layer's.
    pub(super) fn moe(
        &mut self,
        p: &str,
        layer: Option<usize>,
        c: &Qwen4ExpConfig,
    ) -> Result<Moe<B>> {
        let e = c.n_expert;
        let share = c.top_k as f64 / e as f64;
        let src = self.src;
        let (gu, down) = stack_per_expert(&format!("{p}.experts"), e, |x| {
            let m = |w: &str| src.matrix(&format!("{p}.experts.{x}.{w}.weight"), false);
            Ok([m("gate_proj")?, m("up_proj")?, m("down_proj")?])
        })?;
        Ok(Moe {
            router: self.matrix(&format!("{p}.gate.weight"))?,
            experts: Experts::place(
                layer.unwrap_or(usize::MAX),
                layer.and(self.src.host_experts()),
                ExpertTensors::Fused(&gu, &down),
                |w| self.upload(w, share),
                c.n_ff_exp,
                Activation::Silu,
            )?,
            sh_gate: self.matrix(&format!("{p}.shared_expert.gate_proj.weight"))?,
            sh_up: self.matrix(&format!("{p}.shared_expert.up_proj.weight"))?,
            sh_down: self.matrix(&format!("{p}.shared_expert.down_proj.weight"))?,
            sh_scale: self.matrix(&format!("{p}.shared_expert_gate.weight"))?,
        })
    }

    fn ple(&mut self, p: &str, c: &Qwen4ExpConfig, pc: &PleConfig) -> Result<Ple<B>> {
        let e = format!("{p}.ple_embedding");
        if let Some(seed) = self.src.synthetic_seed() {
            // The rows' type, when the source names one (`Qwen4ExpModel::synth_typed`).
            let t = format!("{e}.ngram_embedding");
            let ty = self.src.get(&t).map_or(GgmlType::F32, |w| w.ty);
            let table = ple::NgramTable::synthetic(
                crate::synth::tensor_key(seed, &t),
                pc.dim / pc.n_heads(),
                ty,
                self.ints(&format!("{e}.layer_multipliers"))?,
                self.ints(&format!("{e}.ngram_heads_vocab_sizes"))?,
                self.ints(&format!("{e}.ngram_heads_offsets"))?,
                pc.heads_per_ngram,
            )?;
            return self.ple_with(p, c, pc, table);
        }
        let mut shards = Vec::new();
        while let Some(w) = self.src.get(&format!(
            "{e}.ngram_embedding.shard_{}.weight",
            shards.len()
        )) {
            shards.push(w);
        }
        let table = ple::NgramTable::new(
            shards,
            self.ints(&format!("{e}.layer_multipliers"))?,
            self.ints(&format!("{e}.ngram_heads_vocab_sizes"))?,
            self.ints(&format!("{e}.ngram_heads_offsets"))?,
            pc.heads_per_ngram,
        )
        .with_context(|| format!("{p}: n-gram table"))?;
        self.ple_with(p, c, pc, table)
    }

    fn ple_with(
        &mut self,
        p: &str,
        c: &Qwen4ExpConfig,
        pc: &PleConfig,
        table: ple::NgramTable,
    ) -> Result<Ple<B>> {
        if table.n_heads() != pc.n_heads() || table.width * pc.n_heads() != pc.dim {
            bail!("{p}: the n-gram table does not match the config");
        }
        let sh = c.streams * c.hidden;
        Ok(Ple {
            table,
            key: self.matrix(&format!("{p}.key_proj.weight"))?,
            value: self.matrix(&format!("{p}.value_proj.weight"))?,
            norm_key: self.norm1p(&format!("{p}.norm_key.weight"), sh)?,
            norm_query: self.norm1p(&format!("{p}.norm_query.weight"), sh)?,
            norm_conv: self.norm1p(&format!("{p}.norm_conv.weight"), sh)?,
            conv: self.vector(&format!("{p}.conv1d.weight"), sh * pc.conv_k)?,
        })
    }
}

impl<B: Backend> Qwen4ExpModel<B> {
    /// Load from an HF checkpoint directory, converting float matrices to `quant` when given.
    pub fn load_hf(backend: Arc<B>, dir: &Path, spec: &LoadSpec) -> Result<Self> {
        let (j, src) = crate::weights::open_hf_text(dir, spec, "qwen4_exp")?;
        let cfg = Qwen4ExpConfig::from_json(&j)?;
        let mut m = Self::load(backend, &src, cfg)?;
        m.source = Some(dir.to_path_buf());
        Ok(m)
    }

    pub(super) fn load(backend: Arc<B>, src: &WeightSource, cfg: Qwen4ExpConfig) -> Result<Self> {
        let mut ld = Loader::new(&*backend, src);
        let embd_host = src
            .get("embed_tokens.weight")
            .ok_or_else(|| anyhow!("missing tensor embed_tokens.weight"))?
            .as_head(true);
        if embd_host.rows != cfg.n_vocab || embd_host.cols != cfg.hidden {
            bail!(
                "embed_tokens: [{}, {}], expected [{}, {}]",
                embd_host.rows,
                embd_host.cols,
                cfg.n_vocab,
                cfg.hidden
            );
        }
        let embd = backend.upload_weight(&embd_host)?;
        let head = if cfg.tie_embeddings {
            ld.upload(&embd_host, 1.0)?
        } else {
            let w = src.matrix("lm_head.weight", false)?.as_head(true);
            ld.upload(&w, 1.0)?
        };
        let has_mtp = src.has("mtp.fc_hidden.weight");
        let (layout, mut entries) = Self::build_layout(&cfg, has_mtp);
        let mtp_entries = if has_mtp { entries.pop() } else { None };
        let mut layers = Vec::with_capacity(cfg.mixers.len());
        for (i, (m, state)) in cfg.mixers.iter().zip(entries).enumerate() {
            let p = format!("layers.{i}");
            let mixer = match m {
                Mixer::Gdn => Block::Gdn(ld.gdn(&format!("{p}.linear_attn"), &cfg)?),
                Mixer::Qsa => Block::Qsa(ld.qsa(&format!("{p}.self_attn"), &cfg)?),
            };
            let ple = match cfg.ple.as_ref().filter(|pc| pc.layers.contains(&i)) {
                Some(pc) => Some(ld.ple(&format!("{p}.ple"), &cfg, pc)?),
                None => None,
            };
            layers.push(Layer {
                attn_hc: ld.hc(&format!("{p}.attn_hyper_connection"), &cfg, true)?,
                mlp_hc: ld.hc(&format!("{p}.mlp_hyper_connection"), &cfg, true)?,
                mixer,
                moe: ld.moe(&format!("{p}.mlp"), Some(i), &cfg)?,
                ple,
                state,
            });
        }
        let mixer = ld.hc("hyper_connection_mixer", &cfg, false)?;
        let weight_bytes_per_token = ld.bytes;
        let mtp = match mtp_entries {
            Some(ent) => Some(ld.mtp(&cfg, ent)?),
            None => None,
        };
        let rope_factors = cfg.rope_divisors.clone().map(std::sync::Arc::new);
        Ok(Qwen4ExpModel {
            backend,
            cfg,
            embd,
            head,
            mixer,
            layers,
            mtp,
            mtp_on: AtomicBool::new(false),
            source: None,
            layout,
            weight_bytes_per_token,
            rope_factors,
        })
    }
}
