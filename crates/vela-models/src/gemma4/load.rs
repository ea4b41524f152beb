//! Loading: HF safetensors checkpoints and llama.cpp `gemma4` GGUF files through one
//! [`WeightSource`] (memory-mapped, no copies; `--quant` converts at load), with one tensor
//! lookup under HF names or llama.cpp names.

use super::*;
use crate::blocks::experts::{ExpertTensors, Experts};
use crate::placement::LoadSpec;
use crate::weights::WeightSource;
use vela_compute::HostWeight;

struct Loader<'a, B: Backend> {
    be: &'a B,
    src: &'a WeightSource,
    /// The source uses llama.cpp's GGUF tensor names (`blk.N.attn_q.weight`), not HF's.
    gguf_names: bool,
    /// Bytes of the matrices `weight` has loaded (the decode roofline's numerator; `load`
    /// takes the lookup tables back out and adds the experts a token reads).
    read: std::cell::Cell<u64>,
}

/// llama.cpp's name for an HF Gemma 4 text tensor name without its `model.` prefix
/// (`layers.0.self_attn.q_proj.weight` → `blk.0.attn_q.weight`), as `conversion/gemma.py` writes
/// them; unknown names come back unchanged.
pub fn gguf_name(hf: &str) -> String {
    const TOP: &[(&str, &str)] = &[
        ("embed_tokens.weight", "token_embd.weight"),
        ("norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
        (
            "embed_tokens_per_layer.weight",
            "per_layer_token_embd.weight",
        ),
        (
            "per_layer_model_projection.weight",
            "per_layer_model_proj.weight",
        ),
        (
            "per_layer_projection_norm.weight",
            "per_layer_proj_norm.weight",
        ),
    ];
    const LAYER: &[(&str, &str)] = &[
        ("input_layernorm.weight", "attn_norm.weight"),
        ("self_attn.q_proj.weight", "attn_q.weight"),
        ("self_attn.k_proj.weight", "attn_k.weight"),
        ("self_attn.v_proj.weight", "attn_v.weight"),
        ("self_attn.o_proj.weight", "attn_output.weight"),
        ("self_attn.q_norm.weight", "attn_q_norm.weight"),
        ("self_attn.k_norm.weight", "attn_k_norm.weight"),
        (
            "post_attention_layernorm.weight",
            "post_attention_norm.weight",
        ),
        ("pre_feedforward_layernorm.weight", "ffn_norm.weight"),
        ("post_feedforward_layernorm.weight", "post_ffw_norm.weight"),
        ("mlp.gate_proj.weight", "ffn_gate.weight"),
        ("mlp.up_proj.weight", "ffn_up.weight"),
        ("mlp.down_proj.weight", "ffn_down.weight"),
        ("per_layer_input_gate.weight", "inp_gate.weight"),
        ("per_layer_projection.weight", "proj.weight"),
        ("post_per_layer_input_norm.weight", "post_norm.weight"),
        ("layer_scalar", "layer_output_scale.weight"),
        ("router.proj.weight", "ffn_gate_inp.weight"),
        ("router.scale", "ffn_gate_inp.scale"),
        ("router.per_expert_scale", "ffn_down_exps.scale"),
        (
            "pre_feedforward_layernorm_2.weight",
            "pre_ffw_norm_2.weight",
        ),
        (
            "post_feedforward_layernorm_1.weight",
            "post_ffw_norm_1.weight",
        ),
        (
            "post_feedforward_layernorm_2.weight",
            "post_ffw_norm_2.weight",
        ),
        ("experts.gate_up_proj", "ffn_gate_up_exps.weight"),
        ("experts.down_proj", "ffn_down_exps.weight"),
    ];
    if let Some((_, g)) = TOP.iter().find(|(h, _)| *h == hf) {
        return g.to_string();
    }
    if let Some((il, rest)) = hf.strip_prefix("layers.").and_then(|r| r.split_once('.')) {
        if let Some((_, g)) = LAYER.iter().find(|(h, _)| *h == rest) {
            return format!("blk.{il}.{g}");
        }
    }
    hf.to_string()
}

impl<B: Backend> Loader<'_, B> {
    /// The source's name for an HF tensor name.
    fn name(&self, hf: &str) -> String {
        if self.gguf_names {
            gguf_name(hf)
        } else {
            hf.to_string()
        }
    }

    fn has(&self, hf: &str) -> bool {
        self.src.has(&self.name(hf))
    }

    /// A matrix `[rows, cols]` (PyTorch `[out, in]`; a 3-D expert tensor `[E, out, in]` as
    /// `E·out` rows), converted to the load-time type unless `exact`.
    fn host(&self, name: &str, rows: usize, cols: usize, exact: bool) -> Result<HostWeight> {
        let w = self.src.matrix(name, exact)?;
        if w.rows != rows || w.cols != cols {
            bail!(
                "tensor {name} has shape [{}, {}], expected [{rows}, {cols}]",
                w.rows,
                w.cols
            );
        }
        Ok(w)
    }

    /// [`Self::host`] of an HF name on the backend, its bytes counted as read per token.
    fn weight(&self, hf: &str, rows: usize, cols: usize, exact: bool) -> Result<B::Weight> {
        let head = matches!(hf, "embed_tokens.weight" | "lm_head.weight");
        let w = self.host(&self.name(hf), rows, cols, exact)?.as_head(head);
        self.read.set(self.read.get() + w.bytes().len() as u64);
        self.be.upload_weight(&w)
    }

    fn raw(&self, hf: &str, len: usize) -> Result<Vec<f32>> {
        let name = &self.name(hf);
        let w = self
            .src
            .get(name)
            .ok_or_else(|| anyhow!("missing tensor {name}"))?;
        if w.rows * w.cols != len {
            bail!(
                "tensor {name} has {} elements, expected {len}",
                w.rows * w.cols
            );
        }
        w.to_f32()
    }

    fn vector(&self, name: &str, len: usize) -> Result<B::Vector> {
        self.be.upload_vector(&self.raw(name, len)?)
    }

    /// Layer `il`'s router, extra norms and experts; also returns the experts' bytes.
    fn moe_layer(&self, il: usize, d: usize, mc: &MoeConfig) -> Result<(moe::MoeLayer<B>, u64)> {
        let n = |s: &str| format!("layers.{il}.{s}");
        let (e_n, i_n) = (mc.n_expert, mc.n_ff_exp);
        let mut bytes = 0;
        let mut expert = |name: &str, rows: usize, cols: usize| -> Result<HostWeight> {
            let w = self.host(name, rows, cols, false)?;
            bytes += w.bytes().len() as u64;
            Ok(w)
        };
        let fused = self.name(&n("experts.gate_up_proj"));
        let split = !self.src.has(&fused) && self.gguf_names;
        let gu = if split {
            // llama.cpp may store gate and up apart.
            vec![
                expert(&format!("blk.{il}.ffn_gate_exps.weight"), e_n * i_n, d)?,
                expert(&format!("blk.{il}.ffn_up_exps.weight"), e_n * i_n, d)?,
            ]
        } else {
            vec![expert(&fused, e_n * 2 * i_n, d)?]
        };
        let down = expert(&self.name(&n("experts.down_proj")), e_n * d, i_n)?;
        let t = match &gu[..] {
            [g, u] => ExpertTensors::Split(g, u, &down),
            _ => ExpertTensors::Fused(&gu[0], &down),
        };
        let experts = Experts::place(
            il,
            self.src.host_experts(),
            t,
            |w| self.be.upload_weight(w),
            i_n,
            Activation::GeluTanh,
        )?;
        let layer = moe::MoeLayer {
            router: self.weight(&n("router.proj.weight"), e_n, d, true)?,
            router_scale: self.vector(&n("router.scale"), d)?,
            per_expert_scale: self.vector(&n("router.per_expert_scale"), e_n)?,
            pre_norm_2: self.vector(&n("pre_feedforward_layernorm_2.weight"), d)?,
            post_norm_1: self.vector(&n("post_feedforward_layernorm_1.weight"), d)?,
            post_norm_2: self.vector(&n("post_feedforward_layernorm_2.weight"), d)?,
            experts,
        };
        Ok((layer, bytes))
    }
}

impl<B: Backend> Gemma4Model<B> {
    /// Load `dir/config.json` and the safetensors checkpoint in `dir`.
    pub fn load_hf(backend: Arc<B>, dir: &Path) -> Result<Self> {
        Self::load_hf_with(backend, dir, &LoadSpec::default())
    }

    /// Load a llama.cpp `gemma4` GGUF (metadata translated by [`Gemma4Config::from_gguf`]).
    pub fn load_gguf(backend: Arc<B>, g: Arc<GgufFile>) -> Result<Self> {
        Self::load_gguf_with(backend, g, &LoadSpec::default())
    }

    /// [`Self::load_hf`] converting float matrices to `quant` when given ([`crate::weights`]).
    pub fn load_hf_with(backend: Arc<B>, dir: &Path, spec: &LoadSpec) -> Result<Self> {
        let (j, src) = crate::weights::open_hf_text(dir, spec, "Gemma 4 text")?;
        let cfg = Gemma4Config::from_json(&j)?;
        Self::load(backend, &src, cfg, false)
    }

    /// [`Self::load_gguf`] converting float matrices to `quant` when given.
    pub fn load_gguf_with(backend: Arc<B>, g: Arc<GgufFile>, spec: &LoadSpec) -> Result<Self> {
        let cfg = Gemma4Config::from_gguf(&g)?;
        let src = WeightSource::gguf(g).with_spec(spec);
        Self::load(backend, &src, cfg, true)
    }

    /// Load from a source named with HF text-model names (no prefix) or GGUF names.
    fn load(
        backend: Arc<B>,
        src: &WeightSource,
        cfg: Gemma4Config,
        gguf_names: bool,
    ) -> Result<Self> {
        let ld = Loader {
            be: &*backend,
            src,
            gguf_names,
            read: std::cell::Cell::new(0),
        };
        let (d, nh, p) = (cfg.n_embd, cfg.n_head, cfg.ple_dim);
        let embd = ld.weight("embed_tokens.weight", cfg.n_vocab, d, false)?;
        // (A token reads one row of each embedding table: not counted, unless the embedding is
        // also the output head: tied, uploaded once and counted once.)
        let embd_bytes = ld.read.replace(0);
        let lm_head = if !cfg.tie_embeddings && ld.has("lm_head.weight") {
            Some(ld.weight("lm_head.weight", cfg.n_vocab, d, false)?)
        } else {
            ld.read.set(ld.read.get() + embd_bytes);
            None
        };
        let ple = if p > 0 {
            let lp = cfg.n_layer * p;
            let before = ld.read.get();
            let table = ld.weight("embed_tokens_per_layer.weight", cfg.ple_vocab, lp, false)?;
            ld.read.set(before);
            Some((
                table,
                // Kept exact, as llama.cpp's converter keeps it in F32.
                ld.weight("per_layer_model_projection.weight", lp, d, true)?,
                ld.vector("per_layer_projection_norm.weight", p)?,
            ))
        } else {
            None
        };
        let mut expert_bytes = 0;
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for (i, lc) in cfg.layers.iter().enumerate() {
            let n = |s: &str| format!("layers.{i}.{s}");
            let (hd, kvd) = (lc.head_dim, lc.n_head_kv * lc.head_dim);
            let kv = match lc.kv_from {
                Some(_) => None,
                None => Some(OwnKv {
                    wk: ld.weight(&n("self_attn.k_proj.weight"), kvd, d, false)?,
                    wv: if lc.k_eq_v {
                        None
                    } else {
                        Some(ld.weight(&n("self_attn.v_proj.weight"), kvd, d, false)?)
                    },
                    k_norm: ld.vector(&n("self_attn.k_norm.weight"), hd)?,
                }),
            };
            let scalar = match ld.has(&n("layer_scalar")) {
                true => ld.raw(&n("layer_scalar"), 1)?[0],
                false => 1.0,
            };
            let moe = match &cfg.moe {
                Some(mc) => {
                    let (m, b) = ld.moe_layer(i, d, mc)?;
                    // Each token reads top_k of the layer's experts.
                    expert_bytes += b * mc.top_k as u64 / mc.n_expert.max(1) as u64;
                    Some(m)
                }
                None => None,
            };
            layers.push(Layer {
                input_norm: ld.vector(&n("input_layernorm.weight"), d)?,
                wq: ld.weight(&n("self_attn.q_proj.weight"), nh * hd, d, false)?,
                q_norm: ld.vector(&n("self_attn.q_norm.weight"), hd)?,
                kv,
                wo: ld.weight(&n("self_attn.o_proj.weight"), d, nh * hd, false)?,
                post_attn_norm: ld.vector(&n("post_attention_layernorm.weight"), d)?,
                pre_ffn_norm: ld.vector(&n("pre_feedforward_layernorm.weight"), d)?,
                w_gate: ld.weight(&n("mlp.gate_proj.weight"), lc.n_ff, d, false)?,
                w_up: ld.weight(&n("mlp.up_proj.weight"), lc.n_ff, d, false)?,
                w_down: ld.weight(&n("mlp.down_proj.weight"), d, lc.n_ff, false)?,
                post_ffn_norm: ld.vector(&n("post_feedforward_layernorm.weight"), d)?,
                ple: if p > 0 {
                    Some((
                        ld.weight(&n("per_layer_input_gate.weight"), p, d, false)?,
                        ld.weight(&n("per_layer_projection.weight"), d, p, false)?,
                        ld.vector(&n("post_per_layer_input_norm.weight"), d)?,
                    ))
                } else {
                    None
                },
                scalar,
                ones: backend.upload_vector(&vec![1.0; hd])?,
                moe,
            });
        }
        let norm = ld.vector("norm.weight", d)?;
        let weight_bytes_per_token = ld.read.get() + expert_bytes;
        Ok(Gemma4Model {
            backend,
            cfg,
            embd,
            lm_head,
            norm,
            ple,
            layers,
            weight_bytes_per_token,
            batch: std::sync::Mutex::new(None),
        })
    }
}
