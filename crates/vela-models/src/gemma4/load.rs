//! Loading: HF safetensors checkpoints (through an in-memory GGUF image) and llama.cpp `gemma4`
//! GGUF files, with one tensor lookup under HF names or llama.cpp names.

use super::*;
use anyhow::Context;
use serde_json::Value;
use vela_compute::HostWeight;
use vela_formats::quant::GgmlType;
use vela_formats::safetensors::Checkpoint;

/// Whether an HF text-model tensor name (prefix stripped) is a 3-D expert tensor.
fn is_expert_tensor(name: &str) -> bool {
    name.ends_with(".experts.gate_up_proj") || name.ends_with(".experts.down_proj")
}

/// Copy the text-model tensors of a checkpoint into an in-memory GGUF image, names stripped of
/// their `model.` / `model.language_model.` prefix; the 3-D expert tensors go, split per expert,
/// into a second image (see [`moe::expert_image`]) instead.
///
/// Memory: the image is allocated once at its final size and filled shard by shard, each shard
/// unmapped once copied, so the peak is the text weights (one copy) plus one mapped shard (plus
/// the expert image for MoE checkpoints).
fn checkpoint_to_gguf(cp: Checkpoint, cfg: &Gemma4Config) -> Result<(GgufFile, Option<GgufFile>)> {
    use vela_formats::safetensors::Dtype;
    let prefix = if cp.get("model.language_model.embed_tokens.weight").is_some() {
        "model.language_model."
    } else if cp.get("model.embed_tokens.weight").is_some() {
        "model."
    } else {
        bail!("checkpoint has no model.embed_tokens.weight (is this a Gemma 4 text checkpoint?)");
    };
    let ty = |d: Dtype| match d {
        Dtype::F32 => GgmlType::F32,
        Dtype::F16 => GgmlType::F16,
        Dtype::BF16 => GgmlType::BF16,
    };
    let experts = match &cfg.moe {
        None => None,
        Some(mc) => {
            let (d, e, i) = (cfg.n_embd, mc.n_expert, mc.n_ff_exp);
            let mut layers = Vec::with_capacity(cfg.n_layer);
            for il in 0..cfg.n_layer {
                let get = |part: &str, shape: [usize; 3]| {
                    let name = format!("{prefix}layers.{il}.experts.{part}");
                    let (en, bytes) = cp
                        .get(&name)
                        .ok_or_else(|| anyhow!("missing tensor {name}"))?;
                    if en.shape != shape {
                        bail!("tensor {name} has shape {:?}, expected {shape:?}", en.shape);
                    }
                    Ok((ty(en.dtype), bytes))
                };
                let (ty_gate_up, gate_up) = get("gate_up_proj", [e, 2 * i, d])?;
                let (ty_down, down) = get("down_proj", [e, d, i])?;
                layers.push(moe::ExpertTensors {
                    layer: il,
                    ty_gate_up,
                    gate_up: vec![gate_up],
                    ty_down,
                    down,
                });
            }
            Some(moe::expert_image(&layers, d, mc)?)
        }
    };
    // Directory of the main image, in shard order: (slot, shard, name in the checkpoint).
    let mut slots = Vec::new();
    let mut src = Vec::new();
    for (k, f) in cp.files.iter().enumerate() {
        for (name, e) in &f.tensors {
            let short = match name.strip_prefix(prefix) {
                Some(s) if is_expert_tensor(s) => continue,
                Some(s) => s.to_string(),
                None if name == "lm_head.weight" => name.clone(),
                None => continue,
            };
            let mut dims: Vec<u64> = e.shape.iter().rev().map(|&d| d as u64).collect();
            if dims.is_empty() {
                dims.push(1);
            }
            if dims.contains(&0) {
                bail!("tensor {name} has an empty dimension {:?}", e.shape);
            }
            slots.push((short, dims, ty(e.dtype), e.end - e.start));
            src.push((k, name.clone()));
        }
    }
    let (mut buf, offs) = image::layout(&slots);
    for (k, f) in cp.files.into_iter().enumerate() {
        let here = src.iter().zip(offs.iter().zip(&slots));
        for ((_, name), (&off, slot)) in here.filter(|s| s.0 .0 == k) {
            buf[off..off + slot.3].copy_from_slice(f.data(&f.tensors[name]));
        }
        drop(f); // unmap this shard now that it is copied
    }
    let g = GgufFile::from_bytes(buf).context("building an in-memory GGUF image")?;
    Ok((g, experts))
}

/// The per-expert image of a llama.cpp GGUF: `blk.N.ffn_gate_up_exps.weight` (or separate
/// `ffn_gate_exps` / `ffn_up_exps`) and `ffn_down_exps.weight`, split per expert.
fn gguf_experts(g: &GgufFile, cfg: &Gemma4Config) -> Result<Option<GgufFile>> {
    let Some(mc) = &cfg.moe else {
        return Ok(None);
    };
    let (d, e, i) = (cfg.n_embd as u64, mc.n_expert as u64, mc.n_ff_exp as u64);
    let mut layers = Vec::with_capacity(cfg.n_layer);
    for il in 0..cfg.n_layer {
        let get = |part: &str, dims: [u64; 3]| -> Result<Option<(GgmlType, &[u8])>> {
            let name = format!("blk.{il}.{part}.weight");
            let Some(t) = g.tensor(&name) else {
                return Ok(None);
            };
            if t.dims != dims {
                bail!("tensor {name} has dims {:?}, expected {dims:?}", t.dims);
            }
            Ok(Some((t.ty, g.tensor_data(t))))
        };
        let missing = |n: &str| anyhow!("missing tensor blk.{il}.{n}.weight");
        let (ty_gate_up, gate_up) = match get("ffn_gate_up_exps", [d, 2 * i, e])? {
            Some((ty, b)) => (ty, vec![b]),
            None => {
                let (tg, bg) =
                    get("ffn_gate_exps", [d, i, e])?.ok_or_else(|| missing("ffn_gate_exps"))?;
                let (tu, bu) =
                    get("ffn_up_exps", [d, i, e])?.ok_or_else(|| missing("ffn_up_exps"))?;
                if tg != tu {
                    bail!("layer {il}: ffn_gate_exps and ffn_up_exps have different types");
                }
                (tg, vec![bg, bu])
            }
        };
        let (ty_down, down) =
            get("ffn_down_exps", [i, d, e])?.ok_or_else(|| missing("ffn_down_exps"))?;
        layers.push(moe::ExpertTensors {
            layer: il,
            ty_gate_up,
            gate_up,
            ty_down,
            down,
        });
    }
    Ok(Some(moe::expert_image(&layers, cfg.n_embd, mc)?))
}

struct Loader<'a, B: Backend> {
    be: &'a B,
    g: Arc<GgufFile>,
    /// The image uses llama.cpp's GGUF tensor names (`blk.N.attn_q.weight`), not HF's.
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
    /// The image's name for an HF tensor name.
    fn name(&self, hf: &str) -> String {
        if self.gguf_names {
            gguf_name(hf)
        } else {
            hf.to_string()
        }
    }

    fn has(&self, hf: &str) -> bool {
        self.g.tensor(&self.name(hf)).is_some()
    }

    /// A matrix `[rows, cols]` (PyTorch `[out, in]`).
    fn weight(&self, hf: &str, rows: usize, cols: usize) -> Result<B::Weight> {
        let name = &self.name(hf);
        let w =
            HostWeight::from_gguf(&self.g, name).ok_or_else(|| anyhow!("missing tensor {name}"))?;
        let size = self.g.tensor(name).map_or(0, |t| t.size);
        self.read.set(self.read.get() + size);
        if w.rows != rows || w.cols != cols {
            bail!(
                "tensor {name} has shape [{}, {}], expected [{rows}, {cols}]",
                w.rows,
                w.cols
            );
        }
        self.be.upload_weight(&w)
    }

    fn raw(&self, hf: &str, len: usize) -> Result<Vec<f32>> {
        let name = &self.name(hf);
        let w =
            HostWeight::from_gguf(&self.g, name).ok_or_else(|| anyhow!("missing tensor {name}"))?;
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
}

impl<B: Backend> Loader<'_, B> {
    /// Layer `il`'s router, extra norms and experts (from the per-expert image `img`).
    fn moe_layer(
        &self,
        img: &Arc<GgufFile>,
        il: usize,
        d: usize,
        mc: &MoeConfig,
    ) -> Result<moe::MoeLayer<B>> {
        let n = |s: &str| format!("layers.{il}.{s}");
        let (e_n, i_n) = (mc.n_expert, mc.n_ff_exp);
        let expert = |e: usize, part: &str, rows: usize, cols: usize| -> Result<B::Weight> {
            let name = moe::expert_name(il, e, part);
            let w = HostWeight::from_gguf(img, &name)
                .ok_or_else(|| anyhow!("missing expert tensor {name}"))?;
            if (w.rows, w.cols) != (rows, cols) {
                bail!(
                    "expert tensor {name} has shape [{}, {}], expected [{rows}, {cols}]",
                    w.rows,
                    w.cols
                );
            }
            self.be.upload_weight(&w)
        };
        let experts = (0..e_n)
            .map(|e| {
                Ok(moe::Expert {
                    gate: expert(e, "gate", i_n, d)?,
                    up: expert(e, "up", i_n, d)?,
                    down: expert(e, "down", d, i_n)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(moe::MoeLayer {
            router: self.weight(&n("router.proj.weight"), e_n, d)?,
            router_scale: self.vector(&n("router.scale"), d)?,
            per_expert_scale: self.raw(&n("router.per_expert_scale"), e_n)?,
            pre_norm_2: self.vector(&n("pre_feedforward_layernorm_2.weight"), d)?,
            post_norm_1: self.vector(&n("post_feedforward_layernorm_1.weight"), d)?,
            post_norm_2: self.vector(&n("post_feedforward_layernorm_2.weight"), d)?,
            experts,
        })
    }
}

impl<B: Backend> Gemma4Model<B> {
    /// Load `dir/config.json` and the safetensors checkpoint in `dir`.
    pub fn load_hf(backend: Arc<B>, dir: &Path) -> Result<Self> {
        let cpath = dir.join("config.json");
        let text = std::fs::read_to_string(&cpath)
            .with_context(|| format!("cannot read {}", cpath.display()))?;
        let j: Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not valid JSON", cpath.display()))?;
        let cfg = Gemma4Config::from_json(&j)?;
        let cp = Checkpoint::open(dir)?;
        let (g, experts) = checkpoint_to_gguf(cp, &cfg)?;
        Self::load(backend, Arc::new(g), experts, cfg, false)
    }

    /// Load a llama.cpp `gemma4` GGUF (metadata translated by [`Gemma4Config::from_gguf`]).
    pub fn load_gguf(backend: Arc<B>, g: Arc<GgufFile>) -> Result<Self> {
        let cfg = Gemma4Config::from_gguf(&g)?;
        let experts = gguf_experts(&g, &cfg)?;
        Self::load(backend, g, experts, cfg, true)
    }

    /// Load from a weight image named with HF text-model names (no prefix) or GGUF names.
    fn load(
        backend: Arc<B>,
        g: Arc<GgufFile>,
        experts: Option<GgufFile>,
        cfg: Gemma4Config,
        gguf_names: bool,
    ) -> Result<Self> {
        let experts = experts.map(Arc::new);
        let ld = Loader {
            be: &*backend,
            g: g.clone(),
            gguf_names,
            read: std::cell::Cell::new(0),
        };
        let (d, nh, p) = (cfg.n_embd, cfg.n_head, cfg.ple_dim);
        let embd = ld.weight("embed_tokens.weight", cfg.n_vocab, d)?;
        // (A token reads one row of each embedding table: not counted.)
        ld.read.set(0);
        // (Tied: the embedding is also the output head, uploaded once and counted once.)
        let lm_head = if !cfg.tie_embeddings && ld.has("lm_head.weight") {
            Some(ld.weight("lm_head.weight", cfg.n_vocab, d)?)
        } else {
            let t = ld.g.tensor(&ld.name("embed_tokens.weight"));
            ld.read.set(ld.read.get() + t.map_or(0, |t| t.size));
            None
        };
        let ple = if p > 0 {
            let lp = cfg.n_layer * p;
            let before = ld.read.get();
            let table = ld.weight("embed_tokens_per_layer.weight", cfg.ple_vocab, lp)?;
            ld.read.set(before);
            Some((
                table,
                ld.weight("per_layer_model_projection.weight", lp, d)?,
                ld.vector("per_layer_projection_norm.weight", p)?,
            ))
        } else {
            None
        };
        let mut layers = Vec::with_capacity(cfg.n_layer);
        for (i, lc) in cfg.layers.iter().enumerate() {
            let n = |s: &str| format!("layers.{i}.{s}");
            let (hd, kvd) = (lc.head_dim, lc.n_head_kv * lc.head_dim);
            let kv = match lc.kv_from {
                Some(_) => None,
                None => Some(OwnKv {
                    wk: ld.weight(&n("self_attn.k_proj.weight"), kvd, d)?,
                    wv: if lc.k_eq_v {
                        None
                    } else {
                        Some(ld.weight(&n("self_attn.v_proj.weight"), kvd, d)?)
                    },
                    k_norm: ld.vector(&n("self_attn.k_norm.weight"), hd)?,
                }),
            };
            let scalar = match ld.has(&n("layer_scalar")) {
                true => ld.raw(&n("layer_scalar"), 1)?[0],
                false => 1.0,
            };
            layers.push(Layer {
                input_norm: ld.vector(&n("input_layernorm.weight"), d)?,
                wq: ld.weight(&n("self_attn.q_proj.weight"), nh * hd, d)?,
                q_norm: ld.vector(&n("self_attn.q_norm.weight"), hd)?,
                kv,
                wo: ld.weight(&n("self_attn.o_proj.weight"), d, nh * hd)?,
                post_attn_norm: ld.vector(&n("post_attention_layernorm.weight"), d)?,
                pre_ffn_norm: ld.vector(&n("pre_feedforward_layernorm.weight"), d)?,
                w_gate: ld.weight(&n("mlp.gate_proj.weight"), lc.n_ff, d)?,
                w_up: ld.weight(&n("mlp.up_proj.weight"), lc.n_ff, d)?,
                w_down: ld.weight(&n("mlp.down_proj.weight"), d, lc.n_ff)?,
                post_ffn_norm: ld.vector(&n("post_feedforward_layernorm.weight"), d)?,
                ple: if p > 0 {
                    Some((
                        ld.weight(&n("per_layer_input_gate.weight"), p, d)?,
                        ld.weight(&n("per_layer_projection.weight"), d, p)?,
                        ld.vector(&n("post_per_layer_input_norm.weight"), d)?,
                    ))
                } else {
                    None
                },
                scalar,
                ones: backend.upload_vector(&vec![1.0; hd])?,
                moe: match (&cfg.moe, &experts) {
                    (Some(mc), Some(img)) => Some(ld.moe_layer(img, i, d, mc)?),
                    _ => None,
                },
            });
        }
        let norm = ld.vector("norm.weight", d)?;
        // Each token reads top_k of every MoE layer's experts (their bytes: the image's).
        let mut weight_bytes_per_token = ld.read.get();
        if let (Some(mc), Some(img)) = (&cfg.moe, &experts) {
            for il in 0..cfg.n_layer {
                let mut all = 0;
                for e in 0..mc.n_expert {
                    for part in ["gate", "up", "down"] {
                        let t = img.tensor(&moe::expert_name(il, e, part));
                        all += t.map_or(0, |t| t.size);
                    }
                }
                weight_bytes_per_token += all * mc.top_k as u64 / mc.n_expert.max(1) as u64;
            }
        }
        Ok(Gemma4Model {
            backend,
            cfg,
            embd,
            lm_head,
            norm,
            ple,
            layers,
            weight_bytes_per_token,
        })
    }
}
