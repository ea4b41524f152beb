//! Gemma 4 (text decoder) from a Hugging Face checkpoint directory (config.json + safetensors).
//!
//! Reads side by side with transformers 5.23 `models/gemma4/modeling_gemma4.py`
//! (`Gemma4TextModel` / `Gemma4ForCausalLM`):
//!
//! ```text
//! x = E[ids] · sqrt(H)                                  (Gemma4TextScaledWordEmbedding)
//! [PLE] pli = (norm_P(W_ple · x · H^-0.5) + E_ple[ids] · sqrt(P)) · 2^-0.5   → [n, L, P]
//! for each layer i:
//!     h = norm(x); q = q_norm(h·Wq) → rope
//!     if the layer owns K/V:  k = k_norm(h·Wk) → rope ; v = v_norm(h·Wv or raw h·Wk)   (v_norm: no weight)
//!     a = attention(q, K/V of this layer or of its KV-sharing producer), scale 1.0
//!     x += post_attn_norm(a·Wo)
//!     x += post_ffn_norm(down(gelu_tanh(gate(pre_ffn_norm(x))) ⊙ up(…)))
//!     [PLE] x += post_ple_norm(W_proj · (gelu_tanh(W_gate · x) ⊙ pli_i))
//!     x *= layer_scalar
//! logits = softcap(norm(x) · Eᵀ)
//! ```
//!
//! Norms are `x · (mean(x²)+eps)^-0.5 · w` (no `1 + w` offset, unlike Gemma 1-3). Sliding layers
//! use the default RoPE over their whole head; full layers use *proportional* RoPE: with head dim
//! `gd` and `partial_rotary_factor` p, `n = ⌊p·gd/2⌋` frequencies `θ^(-2i/gd)` (the exponent's
//! denominator is the full head dim) and the remaining `gd/2 - n` frequencies are zero, in the
//! rotate-half layout over the whole head. We express that with the backend's NEOX RoPE over
//! `gd` dims and per-frequency divisors of `+∞` for the identity part.
//!
//! Weights: the checkpoint's F32/F16/BF16 tensors are copied into an in-memory GGUF image so that
//! every backend can take them through the existing [`HostWeight`] path unchanged (a zero-copy
//! path for big checkpoints is future work).
//!
//! Not supported yet (clear errors at load): MoE blocks (`enable_moe_block`), attention biases,
//! bidirectional attention, RoPE types other than `default`/`proportional`, activations other
//! than `gelu_pytorch_tanh`, multimodal towers (ignored: only the text weights are read).

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;
use vela_compute::{Activation, AttnParams, Backend, HostWeight, KvLayerSpec, KvType, RopeParams};
use vela_formats::gguf::GgufFile;
use vela_formats::safetensors::Checkpoint;

/// Attention kind of one layer (`config.layer_types`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayerKind {
    Sliding,
    Full,
}

/// Derived per-layer configuration (what `Gemma4TextConfig.per_layer_config` and
/// `kv_sharing_modes` say about layer `i`).
#[derive(Clone, Debug)]
pub struct Gemma4Layer {
    pub kind: LayerKind,
    pub head_dim: usize,
    pub n_head_kv: usize,
    /// `Some(j)`: a KV-sharing consumer that attends over layer `j`'s cache and owns no K/V.
    pub kv_from: Option<usize>,
    /// Full layers with `attention_k_eq_v`: V is the raw K projection (no `v_proj`).
    pub k_eq_v: bool,
    pub n_ff: usize,
    pub rope: RopeParams,
}

/// The parts of `Gemma4TextConfig` the text decoder uses.
#[derive(Clone, Debug)]
pub struct Gemma4Config {
    pub n_vocab: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_layer: usize,
    pub rms_eps: f32,
    pub sliding_window: usize,
    pub final_softcap: Option<f32>,
    /// `hidden_size_per_layer_input` (0 = no per-layer embeddings).
    pub ple_dim: usize,
    pub ple_vocab: usize,
    pub tie_embeddings: bool,
    pub layers: Vec<Gemma4Layer>,
}

fn get_u(j: &Value, k: &str, default: Option<u64>) -> Result<usize> {
    match j.get(k) {
        Some(v) if !v.is_null() => v
            .as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| anyhow!("config.json: {k} is not a non-negative integer")),
        _ => default
            .map(|d| d as usize)
            .ok_or_else(|| anyhow!("config.json: missing {k}")),
    }
}

fn get_f(j: &Value, k: &str) -> Result<Option<f64>> {
    match j.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| anyhow!("config.json: {k} is not a number")),
    }
}

fn get_b(j: &Value, k: &str) -> bool {
    j.get(k).and_then(Value::as_bool).unwrap_or(false)
}

fn rope_for(j: &Value, kind: &str, head_dim: usize) -> Result<RopeParams> {
    let rp = j
        .get("rope_parameters")
        .and_then(|r| r.get(kind))
        .ok_or_else(|| anyhow!("config.json: rope_parameters.{kind} missing"))?;
    let ty = rp
        .get("rope_type")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let theta =
        get_f(rp, "rope_theta")?.ok_or_else(|| anyhow!("rope_parameters.{kind}: no rope_theta"))?;
    let base = RopeParams {
        n_rot: head_dim,
        freq_base: theta as f32,
        freq_scale: 1.0,
        neox: true,
        freq_factors: None,
    };
    match ty {
        "default" => Ok(base),
        "proportional" => {
            let p = get_f(rp, "partial_rotary_factor")?.unwrap_or(1.0);
            let factor = get_f(rp, "factor")?.unwrap_or(1.0) as f32;
            if !(0.0..=1.0).contains(&p) || factor <= 0.0 {
                bail!(
                    "rope_parameters.{kind}: invalid partial_rotary_factor {p} / factor {factor}"
                );
            }
            let n = (p * head_dim as f64 / 2.0).floor() as usize;
            let ff: Vec<f32> = (0..head_dim / 2)
                .map(|i| if i < n { factor } else { f32::INFINITY })
                .collect();
            Ok(RopeParams {
                freq_factors: Some(Arc::new(ff)),
                ..base
            })
        }
        other => bail!("Gemma 4 rope_type '{other}' ({kind}) is not supported yet"),
    }
}

impl Gemma4Config {
    /// Parse a `config.json` (`gemma4_text`, or `gemma4` with a nested `text_config`).
    pub fn from_json(j: &Value) -> Result<Gemma4Config> {
        let j = match j.get("text_config") {
            Some(t) if t.is_object() => t,
            _ => j,
        };
        let mt = j.get("model_type").and_then(Value::as_str).unwrap_or("");
        if mt != "gemma4_text" {
            bail!("config.json: model_type '{mt}' is not gemma4_text");
        }
        for (k, what) in [
            ("enable_moe_block", "MoE blocks"),
            ("attention_bias", "attention biases"),
        ] {
            if get_b(j, k) {
                bail!("Gemma 4 {what} ({k}) are not supported yet");
            }
        }
        if j.get("use_bidirectional_attention")
            .is_some_and(|v| !v.is_null())
        {
            bail!("Gemma 4 use_bidirectional_attention is not supported yet");
        }
        let act = j
            .get("hidden_activation")
            .and_then(Value::as_str)
            .unwrap_or("gelu_pytorch_tanh");
        if act != "gelu_pytorch_tanh" {
            bail!("Gemma 4 hidden_activation '{act}' is not supported yet");
        }
        let n_layer = get_u(j, "num_hidden_layers", None)?;
        let n_head = get_u(j, "num_attention_heads", None)?;
        let n_kv = get_u(j, "num_key_value_heads", None)?;
        let head_dim = get_u(j, "head_dim", None)?;
        let n_ff = get_u(j, "intermediate_size", None)?;
        let n_embd = get_u(j, "hidden_size", None)?;
        if [n_layer, n_head, n_kv, head_dim, n_ff, n_embd]
            .iter()
            .any(|&v| v == 0 || v > 1 << 20)
        {
            bail!("config.json: a layer/head/width count is zero or absurd");
        }
        let kinds: Vec<LayerKind> = match j.get("layer_types").and_then(Value::as_array) {
            Some(a) => a
                .iter()
                .map(|t| match t.as_str() {
                    Some("sliding_attention") => Ok(LayerKind::Sliding),
                    Some("full_attention") => Ok(LayerKind::Full),
                    other => bail!("config.json: unknown layer type {other:?}"),
                })
                .collect::<Result<_>>()?,
            None => (0..n_layer)
                .map(|i| {
                    if (i + 1) % 6 == 0 {
                        LayerKind::Full
                    } else {
                        LayerKind::Sliding
                    }
                })
                .collect(),
        };
        if kinds.len() != n_layer {
            bail!(
                "config.json: {} layer_types for {n_layer} layers",
                kinds.len()
            );
        }
        let mut kinds = kinds;
        kinds[n_layer - 1] = LayerKind::Full; // forced by Gemma4TextConfig.__post_init__
        let k_eq_v = get_b(j, "attention_k_eq_v");
        // Per-layer head dim / kv heads: saved configs carry `per_layer_config`, upstream ones
        // `global_head_dim` (+ `num_global_key_value_heads`, only honoured with k_eq_v).
        let plc = j.get("per_layer_config").and_then(Value::as_object);
        let global_hd = get_u(j, "global_head_dim", Some(512))?;
        let global_kv = match j.get("num_global_key_value_heads") {
            Some(v) if k_eq_v && !v.is_null() => {
                Some(get_u(j, "num_global_key_value_heads", None)?)
            }
            _ => None,
        };
        let n_shared = get_u(j, "num_kv_shared_layers", Some(0))?;
        if n_shared >= n_layer && n_shared > 0 {
            bail!("config.json: num_kv_shared_layers {n_shared} leaves no producer layer");
        }
        let first_shared = n_layer - n_shared;
        let double_wide = get_b(j, "use_double_wide_mlp");
        let mut layers = Vec::with_capacity(n_layer);
        for (i, &kind) in kinds.iter().enumerate() {
            let (mut hd, mut kvh) = (head_dim, n_kv);
            if let Some(p) = plc {
                if let Some(o) = p.get(&i.to_string()) {
                    hd = get_u(o, "head_dim", Some(hd as u64))?;
                    kvh = get_u(o, "num_key_value_heads", Some(kvh as u64))?;
                }
            } else if kind == LayerKind::Full {
                hd = global_hd;
                kvh = global_kv.unwrap_or(kvh);
            }
            if hd == 0 || hd % 2 != 0 || kvh == 0 || n_head % kvh != 0 {
                bail!("layer {i}: head_dim {hd} / kv heads {kvh} invalid for {n_head} heads");
            }
            let kv_from = if i >= first_shared {
                let p = (0..first_shared)
                    .rev()
                    .find(|&p| kinds[p] == kind)
                    .ok_or_else(|| anyhow!("layer {i}: no KV-sharing producer of its type"))?;
                Some(p)
            } else {
                None
            };
            let kind_name = match kind {
                LayerKind::Sliding => "sliding_attention",
                LayerKind::Full => "full_attention",
            };
            layers.push(Gemma4Layer {
                kind,
                head_dim: hd,
                n_head_kv: kvh,
                kv_from,
                k_eq_v: k_eq_v && kind == LayerKind::Full,
                n_ff: if double_wide && kv_from.is_some() {
                    2 * n_ff
                } else {
                    n_ff
                },
                rope: rope_for(j, kind_name, hd)?,
            });
        }
        for i in 0..n_layer {
            if let Some(p) = layers[i].kv_from {
                if (layers[p].head_dim, layers[p].n_head_kv)
                    != (layers[i].head_dim, layers[i].n_head_kv)
                {
                    bail!("layer {i}: head geometry differs from its KV producer {p}");
                }
            }
        }
        let ple_dim = get_u(j, "hidden_size_per_layer_input", Some(256))?;
        Ok(Gemma4Config {
            n_vocab: get_u(j, "vocab_size", None)?,
            n_embd,
            n_head,
            n_layer,
            rms_eps: get_f(j, "rms_norm_eps")?.unwrap_or(1e-6) as f32,
            sliding_window: get_u(j, "sliding_window", Some(512))?.max(1),
            final_softcap: get_f(j, "final_logit_softcapping")?
                .map(|v| v as f32)
                .filter(|&v| v > 0.0),
            ple_dim,
            ple_vocab: if ple_dim > 0 {
                get_u(j, "vocab_size_per_layer_input", Some(262_144))?
            } else {
                0
            },
            tie_embeddings: j
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(true),
            layers,
        })
    }
}

impl Gemma4Config {
    /// Translate llama.cpp `gemma4` GGUF metadata (as `conversion/gemma.py` writes it) into the
    /// equivalent HF `config.json` and parse that, so both paths share one set of checks.
    pub fn from_gguf(g: &GgufFile) -> Result<Gemma4Config> {
        let arch = g.architecture()?;
        if arch != "gemma4" {
            bail!("GGUF architecture '{arch}' is not gemma4");
        }
        let n_layer = g.arch_u64("block_count")? as usize;
        if n_layer == 0 || n_layer > 1 << 16 {
            bail!("invalid gemma4.block_count {n_layer}");
        }
        // A scalar or a per-layer array of unsigned integers.
        let per_layer = |key: &str| -> Result<Vec<u64>> {
            let full = format!("gemma4.{key}");
            let v = g
                .get(&full)
                .ok_or_else(|| anyhow!("missing GGUF key {full}"))?;
            let vals: Vec<u64> = match v.as_array() {
                Some(a) => a
                    .iter()
                    .map(|x| x.as_i64().filter(|&x| x >= 0).map(|x| x as u64))
                    .collect::<Option<_>>()
                    .ok_or_else(|| anyhow!("{full} is not an array of counts"))?,
                None => vec![g.arch_u64(key)?; n_layer],
            };
            if vals.len() != n_layer {
                bail!("{full} has {} entries for {n_layer} layers", vals.len());
            }
            Ok(vals)
        };
        let swa: Vec<bool> = g
            .get_array("gemma4.attention.sliding_window_pattern")?
            .iter()
            .map(|v| v.as_bool())
            .collect::<Option<_>>()
            .ok_or_else(|| anyhow!("gemma4.attention.sliding_window_pattern is not boolean"))?;
        if swa.len() != n_layer {
            bail!(
                "sliding_window_pattern has {} entries for {n_layer} layers",
                swa.len()
            );
        }
        let kv = per_layer("attention.head_count_kv")?;
        let ff = per_layer("feed_forward_length")?;
        let hd_full = g.arch_u64("attention.key_length")?;
        let hd_swa = g
            .arch_u64_opt("attention.key_length_swa")?
            .unwrap_or(hd_full);
        let n_shared = g.arch_u64_opt("attention.shared_kv_layers")?.unwrap_or(0) as usize;
        if n_shared >= n_layer && n_shared > 0 {
            bail!("gemma4.attention.shared_kv_layers {n_shared} leaves no producer layer");
        }
        let first_shared = n_layer - n_shared;
        let double_wide = ff[first_shared..].iter().any(|&f| f == 2 * ff[0]);
        for (i, &f) in ff.iter().enumerate() {
            if f != ff[0]
                * if double_wide && i >= first_shared {
                    2
                } else {
                    1
                }
            {
                bail!("gemma4.feed_forward_length {ff:?}: this per-layer pattern is not supported");
            }
        }
        if g.arch_u64_opt("rope.dimension_count_swa")?
            .is_some_and(|r| r != hd_swa)
        {
            bail!("gemma4 partial RoPE on sliding layers is not supported yet");
        }
        // Proportional RoPE of the full layers: rope_freqs holds 1 for rotated frequencies and
        // a huge divisor (1e30) for the identity ones.
        let partial = match g.tensor("rope_freqs.weight") {
            Some(t) => {
                let mut v = vec![0f32; t.n_elements() as usize];
                vela_formats::quant::dequantize(t.ty, g.tensor_data(t), &mut v)?;
                let n_rot = v.iter().take_while(|&&f| f == 1.0).count();
                if v.len() as u64 * 2 != hd_full || v[n_rot..].iter().any(|&f| f < 1e20) {
                    bail!("rope_freqs.weight does not describe a proportional RoPE");
                }
                n_rot as f64 * 2.0 / hd_full as f64
            }
            None => 1.0,
        };
        let full_layers: Vec<usize> = (0..n_layer).filter(|&i| !swa[i]).collect();
        let k_eq_v = full_layers
            .iter()
            .filter(|&&i| i < first_shared)
            .any(|&i| g.tensor(&format!("blk.{i}.attn_v.weight")).is_none());
        let per_layer_config: serde_json::Map<String, Value> = full_layers
            .iter()
            .map(|&i| {
                let o = serde_json::json!({"head_dim": hd_full, "num_key_value_heads": kv[i]});
                (i.to_string(), o)
            })
            .collect();
        let swa_kv = (0..n_layer).find(|&i| swa[i]).map_or(kv[0], |i| kv[i]);
        let rows = |name: &str| g.tensor(name).map(|t| t.n_rows() as u64);
        let ple = g
            .arch_u64_opt("embedding_length_per_layer_input")?
            .unwrap_or(0);
        let j = serde_json::json!({
            "model_type": "gemma4_text",
            "vocab_size": rows("token_embd.weight").ok_or_else(|| anyhow!("missing token_embd"))?,
            "hidden_size": g.arch_u64("embedding_length")?,
            "intermediate_size": ff[0],
            "num_hidden_layers": n_layer,
            "num_attention_heads": g.arch_u64("attention.head_count")?,
            "num_key_value_heads": swa_kv,
            "head_dim": hd_swa,
            "per_layer_config": per_layer_config,
            "layer_types": swa.iter().map(|&s| if s { "sliding_attention" } else { "full_attention" })
                .collect::<Vec<_>>(),
            "sliding_window": g.arch_u64_opt("attention.sliding_window")?.unwrap_or(512),
            "rms_norm_eps": g.arch_f64_opt("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-6),
            "final_logit_softcapping": g.arch_f64_opt("final_logit_softcapping")?,
            "hidden_size_per_layer_input": ple,
            "vocab_size_per_layer_input": rows("per_layer_token_embd.weight").unwrap_or(0),
            "attention_k_eq_v": k_eq_v,
            "num_kv_shared_layers": n_shared,
            "use_double_wide_mlp": double_wide,
            "tie_word_embeddings": g.tensor("output.weight").is_none(),
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default",
                    "rope_theta": g.arch_f64_opt("rope.freq_base_swa")?.unwrap_or(10_000.0)},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": partial,
                    "rope_theta": g.arch_f64_opt("rope.freq_base")?.unwrap_or(1_000_000.0)},
            },
        });
        if g.arch_u64_opt("expert_count")?.is_some_and(|e| e > 0) {
            bail!("Gemma 4 MoE blocks are not supported yet");
        }
        Gemma4Config::from_json(&j)
    }
}

/// Copy the text-model tensors of a checkpoint into an in-memory GGUF image, names stripped of
/// their `model.` / `model.language_model.` prefix.
fn checkpoint_to_gguf(cp: &Checkpoint) -> Result<GgufFile> {
    let prefix = if cp.get("model.language_model.embed_tokens.weight").is_some() {
        "model.language_model."
    } else if cp.get("model.embed_tokens.weight").is_some() {
        "model."
    } else {
        bail!("checkpoint has no model.embed_tokens.weight (is this a Gemma 4 text checkpoint?)");
    };
    cp.to_gguf_image(|name| match name.strip_prefix(prefix) {
        Some(s) => Some(s.to_string()),
        None => (name == "lm_head.weight").then(|| name.to_string()),
    })
}

/// K/V projections of a layer that owns its cache.
struct OwnKv<B: Backend> {
    wk: B::Weight,
    /// `None` with `attention_k_eq_v`: V is the raw K projection.
    wv: Option<B::Weight>,
    k_norm: B::Vector,
}

struct Layer<B: Backend> {
    input_norm: B::Vector,
    wq: B::Weight,
    q_norm: B::Vector,
    /// `None` for KV-sharing consumers.
    kv: Option<OwnKv<B>>,
    wo: B::Weight,
    post_attn_norm: B::Vector,
    pre_ffn_norm: B::Vector,
    w_gate: B::Weight,
    w_up: B::Weight,
    w_down: B::Weight,
    post_ffn_norm: B::Vector,
    /// `(per_layer_input_gate, per_layer_projection, post_per_layer_input_norm)`.
    ple: Option<(B::Weight, B::Weight, B::Vector)>,
    scalar: f32,
    /// All-ones weight of the scale-free `v_norm`.
    ones: B::Vector,
}

/// A loaded Gemma 4 text model.
pub struct Gemma4Model<B: Backend> {
    pub backend: Arc<B>,
    pub cfg: Gemma4Config,
    embd: B::Weight,
    lm_head: B::Weight,
    norm: B::Vector,
    /// `(embed_tokens_per_layer, per_layer_model_projection, per_layer_projection_norm)`.
    ple: Option<(B::Weight, B::Weight, B::Vector)>,
    layers: Vec<Layer<B>>,
}

/// Per-sequence state: KV cache and scratch buffers for up to `max_batch` tokens.
pub struct Gemma4State<B: Backend> {
    pub kv: B::Kv,
    pub n_ctx: usize,
    pub max_batch: usize,
    bufs: Vec<B::Buf>,
    pli: Vec<B::Buf>,
}

// Indices into `Gemma4State::bufs`.
const X: usize = 0;
const H: usize = 1;
const Q: usize = 2;
const K: usize = 3;
const V: usize = 4;
const A: usize = 5;
const O: usize = 6;
const G: usize = 7;
const U: usize = 8;
const LOGITS: usize = 9;
const PA: usize = 10;
const PB: usize = 11;

struct Loader<'a, B: Backend> {
    be: &'a B,
    g: Arc<GgufFile>,
    /// The image uses llama.cpp's GGUF tensor names (`blk.N.attn_q.weight`), not HF's.
    gguf_names: bool,
}

/// llama.cpp's name for an HF Gemma 4 text tensor (as `conversion/gemma.py` writes them).
fn gguf_name(hf: &str) -> String {
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
        let g = Arc::new(checkpoint_to_gguf(&cp)?);
        Self::load(backend, g, cfg, false)
    }

    /// Load a llama.cpp `gemma4` GGUF (metadata translated by [`Gemma4Config::from_gguf`]).
    pub fn load_gguf(backend: Arc<B>, g: Arc<GgufFile>) -> Result<Self> {
        let cfg = Gemma4Config::from_gguf(&g)?;
        Self::load(backend, g, cfg, true)
    }

    /// Load from a weight image named with HF text-model names (no prefix) or GGUF names.
    fn load(
        backend: Arc<B>,
        g: Arc<GgufFile>,
        cfg: Gemma4Config,
        gguf_names: bool,
    ) -> Result<Self> {
        let ld = Loader {
            be: &*backend,
            g: g.clone(),
            gguf_names,
        };
        let (d, nh, p) = (cfg.n_embd, cfg.n_head, cfg.ple_dim);
        let embd = ld.weight("embed_tokens.weight", cfg.n_vocab, d)?;
        let lm_head = if !cfg.tie_embeddings && ld.has("lm_head.weight") {
            ld.weight("lm_head.weight", cfg.n_vocab, d)?
        } else {
            ld.weight("embed_tokens.weight", cfg.n_vocab, d)?
        };
        let ple = if p > 0 {
            let lp = cfg.n_layer * p;
            Some((
                ld.weight("embed_tokens_per_layer.weight", cfg.ple_vocab, lp)?,
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
            });
        }
        let norm = ld.vector("norm.weight", d)?;
        Ok(Gemma4Model {
            backend,
            cfg,
            embd,
            lm_head,
            norm,
            ple,
            layers,
        })
    }

    /// KV layout: sliding layers keep `window + max_batch` slots, full layers `n_ctx`,
    /// KV-sharing consumers a dummy slot (they read their producer's layer).
    pub fn kv_layout(&self, n_ctx: usize, max_batch: usize) -> Vec<KvLayerSpec> {
        self.cfg
            .layers
            .iter()
            .map(|l| {
                let window = (l.kind == LayerKind::Sliding).then_some(self.cfg.sliding_window);
                if l.kv_from.is_some() {
                    return KvLayerSpec {
                        n_head_kv: 1,
                        head_dim_k: 1,
                        head_dim_v: 1,
                        capacity: 1,
                        window: None,
                    };
                }
                KvLayerSpec {
                    n_head_kv: l.n_head_kv,
                    head_dim_k: l.head_dim,
                    head_dim_v: l.head_dim,
                    capacity: vela_compute::ring_capacity(window, n_ctx, max_batch),
                    window,
                }
            })
            .collect()
    }

    /// A fresh sequence state.
    pub fn new_state(
        &self,
        n_ctx: usize,
        max_batch: usize,
        kv_type: KvType,
    ) -> Result<Gemma4State<B>> {
        if n_ctx == 0 || max_batch == 0 {
            bail!("context size and batch size must be positive");
        }
        let be = &*self.backend;
        let c = &self.cfg;
        let nb = max_batch;
        let max = |f: &dyn Fn(&Gemma4Layer) -> usize| c.layers.iter().map(f).max().unwrap_or(0);
        let qd = max(&|l| c.n_head * l.head_dim);
        let kvd = max(&|l| l.n_head_kv * l.head_dim);
        let ff = max(&|l| l.n_ff).max(c.ple_dim);
        let lp = c.n_layer * c.ple_dim;
        let sizes = [
            c.n_embd, c.n_embd, qd, kvd, kvd, qd, c.n_embd, ff, ff, c.n_vocab, lp, lp,
        ];
        Ok(Gemma4State {
            kv: be.new_kv(&self.kv_layout(n_ctx, max_batch), kv_type)?,
            n_ctx,
            max_batch,
            bufs: sizes.iter().map(|&s| be.alloc(nb * s.max(1))).collect(),
            pli: (0..if c.ple_dim > 0 { c.n_layer } else { 0 })
                .map(|_| be.alloc(nb * c.ple_dim))
                .collect(),
        })
    }

    /// Per-layer inputs `pli[i] : [n, P]` for the batch (see the module docs).
    fn per_layer_inputs(&self, st: &mut Gemma4State<B>, tokens: &[u32]) -> Result<()> {
        let Some((table, proj, pnorm)) = &self.ple else {
            return Ok(());
        };
        let be = &*self.backend;
        let c = &self.cfg;
        let (n, p, l) = (tokens.len(), c.ple_dim, c.n_layer);
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= c.ple_vocab) {
            bail!(
                "token id {t} is outside the per-layer embedding vocabulary ({})",
                c.ple_vocab
            );
        }
        let [x, pa, pb] = pick3(&mut st.bufs, X, PA, PB);
        be.get_rows(table, tokens, (p as f32).sqrt(), pb)?;
        be.matmul(proj, x, n, pa);
        be.scale(pa, n * l * p, (c.n_embd as f32).powf(-0.5));
        be.rms_norm_inplace(pa, pnorm, n * l, p, c.rms_eps);
        be.add(pa, pb, n * l * p);
        be.scale(pa, n * l * p, std::f32::consts::FRAC_1_SQRT_2);
        let mut host = vec![0f32; n * l * p];
        be.read(pa, &mut host);
        let mut part = vec![0f32; n * p];
        for (il, buf) in st.pli.iter_mut().enumerate() {
            for t in 0..n {
                part[t * p..(t + 1) * p].copy_from_slice(&host[(t * l + il) * p..][..p]);
            }
            be.write(buf, &part);
        }
        Ok(())
    }

    /// Run `tokens` at `positions` (≤ `max_batch`, all earlier positions already cached), append
    /// their K/V, and return the logits of rows `logits_from..` (row-major `[rows, n_vocab]`).
    pub fn forward(
        &self,
        st: &mut Gemma4State<B>,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
    ) -> Result<Vec<f32>> {
        let n = tokens.len();
        crate::decoder::check_batch(n, positions, st.max_batch, st.n_ctx, logits_from)?;
        let be = &*self.backend;
        let c = &self.cfg;
        let d = c.n_embd;
        be.get_rows(&self.embd, tokens, (d as f32).sqrt(), &mut st.bufs[X])?;
        self.per_layer_inputs(st, tokens)?;
        let b = &mut st.bufs;
        for (il, (l, lc)) in self.layers.iter().zip(&c.layers).enumerate() {
            let hd = lc.head_dim;
            {
                let [x, h] = pick2(b, X, H);
                be.rms_norm(x, &l.input_norm, n, d, c.rms_eps, h);
            }
            {
                let [h, q] = pick2(b, H, Q);
                be.matmul(&l.wq, h, n, q);
            }
            be.rms_norm_inplace(&mut b[Q], &l.q_norm, n * c.n_head, hd, c.rms_eps);
            be.rope(&mut b[Q], c.n_head, hd, positions, &lc.rope);
            if let Some(OwnKv { wk, wv, k_norm }) = &l.kv {
                let [h, k, v] = pick3(b, H, K, V);
                be.matmul_many(&[wk, wv.as_ref().unwrap_or(wk)], h, n, &mut [k, v]);
                be.rms_norm_inplace(k, k_norm, n * lc.n_head_kv, hd, c.rms_eps);
                be.rms_norm_inplace(v, &l.ones, n * lc.n_head_kv, hd, c.rms_eps);
                be.rope(k, lc.n_head_kv, hd, positions, &lc.rope);
                be.kv_store(&mut st.kv, il, k, v, positions);
            }
            let ap = AttnParams {
                n_head: c.n_head,
                n_head_kv: lc.n_head_kv,
                head_dim_k: hd,
                head_dim_v: hd,
                scale: 1.0,
                window: (lc.kind == LayerKind::Sliding).then_some(c.sliding_window),
                softcap: None,
            };
            {
                let [q, a] = pick2(b, Q, A);
                be.attention(q, &st.kv, lc.kv_from.unwrap_or(il), positions, &ap, a);
            }
            {
                let [a, o] = pick2(b, A, O);
                be.matmul(&l.wo, a, n, o);
            }
            be.rms_norm_inplace(&mut b[O], &l.post_attn_norm, n, d, c.rms_eps);
            {
                let [x, o] = pick2(b, X, O);
                be.add(x, o, n * d);
            }
            {
                let [x, h] = pick2(b, X, H);
                be.rms_norm(x, &l.pre_ffn_norm, n, d, c.rms_eps, h);
            }
            {
                let [h, g, u] = pick3(b, H, G, U);
                be.matmul_many(&[&l.w_gate, &l.w_up], h, n, &mut [g, u]);
                be.act_mul(g, u, n * lc.n_ff, Activation::GeluTanh);
            }
            {
                let [g, o] = pick2(b, G, O);
                be.matmul(&l.w_down, g, n, o);
            }
            be.rms_norm_inplace(&mut b[O], &l.post_ffn_norm, n, d, c.rms_eps);
            {
                let [x, o] = pick2(b, X, O);
                be.add(x, o, n * d);
            }
            if let Some((w_gate, w_proj, pnorm)) = &l.ple {
                let p = c.ple_dim;
                {
                    let [x, g] = pick2(b, X, G);
                    be.matmul(w_gate, x, n, g);
                    be.act_mul(g, &st.pli[il], n * p, Activation::GeluTanh);
                }
                {
                    let [g, o] = pick2(b, G, O);
                    be.matmul(w_proj, g, n, o);
                }
                be.rms_norm_inplace(&mut b[O], pnorm, n, d, c.rms_eps);
                let [x, o] = pick2(b, X, O);
                be.add(x, o, n * d);
            }
            if l.scalar != 1.0 {
                be.scale(&mut b[X], n * d, l.scalar);
            }
        }
        let rows = n - logits_from;
        if rows == 0 {
            return Ok(Vec::new());
        }
        {
            let [x, o] = pick2(b, X, O);
            be.copy_rows(x, logits_from, rows, d, o);
        }
        {
            let [o, h] = pick2(b, O, H);
            be.rms_norm(o, &self.norm, rows, d, c.rms_eps, h);
        }
        {
            let [h, lg] = pick2(b, H, LOGITS);
            be.matmul(&self.lm_head, h, rows, lg);
        }
        if let Some(cap) = c.final_softcap {
            be.softcap(&mut b[LOGITS], rows * c.n_vocab, cap);
        }
        let mut out = vec![0f32; rows * c.n_vocab];
        be.read(&b[LOGITS], &mut out);
        Ok(out)
    }
}

/// Two distinct mutable elements of a slice.
fn pick2<T>(v: &mut [T], i: usize, j: usize) -> [&mut T; 2] {
    v.get_disjoint_mut([i, j]).expect("distinct buffer indices")
}

/// Three distinct mutable elements of a slice.
fn pick3<T>(v: &mut [T], i: usize, j: usize, k: usize) -> [&mut T; 3] {
    v.get_disjoint_mut([i, j, k])
        .expect("distinct buffer indices")
}

/// Load a llama.cpp `gemma4` GGUF file.
pub fn load_gguf_gemma4<B: Backend>(backend: Arc<B>, g: Arc<GgufFile>) -> Result<Gemma4Model<B>> {
    Gemma4Model::load_gguf(backend, g)
}

/// Load a Gemma 4 text model from a Hugging Face checkpoint directory.
pub fn load_hf_gemma4<B: Backend>(backend: Arc<B>, dir: &Path) -> Result<Gemma4Model<B>> {
    Gemma4Model::load_hf(backend, dir)
}
