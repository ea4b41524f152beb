//! The Gemma 4 assistant drafter (`gemma4_assistant`, transformers 5.23
//! `models/gemma4_assistant/modeling_gemma4_assistant.py`), the small multi-token-prediction
//! model that proposes tokens for speculative decoding of a Gemma 4 target.
//!
//! One draft step at position `p` (the position of the token `t` just sampled, whose K/V the
//! target has *not* computed yet), with `h` the target's post-final-norm hidden state of the
//! position before (or the assistant's own projected state on later steps):
//!
//! ```text
//! x = W_pre · [E_target[t] · sqrt(H_target) ; h]                 (2·H_target → H)
//! for each layer (query-only: every layer reuses the target's K/V):
//!     q = q_norm(norm(x) · Wq) → rope(p)
//!     a = attention(q, K/V of the target's last non-shared layer of the same type,
//!                   keys at 0..p-1; sliding layers: the last `window + 1` of them), scale 1
//!     x += post_attn_norm(a · Wo);  x += post_ffn_norm(down(gelu_tanh(gate(…)) ⊙ up(…)))
//!     x *= layer_scalar
//! y = norm(x)
//! logits = E_assistant · y                (no soft-capping), or the ordered-embedding path:
//!          the top `centroid_intermediate_top_k` of `centroids · y` select clusters of
//!          `vocab / num_centroids` tokens (`token_ordering`); only those get `E·y`, every other
//!          token gets `min(selected) - 1`
//! h' = W_post · y                          (H → H_target: the next step's hidden input)
//! ```
//!
//! The draft position stays `p` for every step of a round (transformers'
//! `SinglePositionMultiTokenCandidateGenerator`). The target's cache is only read: the attention
//! runs with the query at RoPE position `p` but the causal mask of position `p - 1`, so the
//! backend's ordinary causal/sliding attention (with window `window + 1`) gives exactly "keys
//! `0..p-1`, the last `window + 1` for sliding layers" — what transformers' flipped bidirectional
//! sliding mask allows — without touching the cache. The target's ring keeps `window + max_batch`
//! positions, enough as long as a verification batch (drafts + 1) fits in `max_batch`.
//!
//! Checkpoints: an HF directory (`config.json` with `model_type: gemma4_assistant` +
//! `model.safetensors`; the ordered-embedding `token_ordering` buffer is int64, so this module
//! reads the safetensors header itself) or a llama.cpp `gemma4-assistant` GGUF (its converter at
//! 0c1e570 drops the `masked_embedding.*` tensors, so such a file always uses the full head).

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vela_compute::{Activation, AttnParams, Backend, HostWeight};
use vela_formats::gguf::GgufFile;
use vela_formats::quant::GgmlType;
use vela_formats::safetensors::Checkpoint;

use crate::gemma4::{pick2, pick3, Gemma4Config, Gemma4Layer, Gemma4Model, LayerKind};

mod checkpoint;
mod mtp;
use checkpoint::gguf_name;
pub use mtp::Gemma4Mtp;

/// Configuration of an assistant (`Gemma4AssistantConfig` and its text config).
#[derive(Clone, Debug)]
pub struct AssistantConfig {
    /// Vocabulary (must equal the target's).
    pub n_vocab: usize,
    /// The assistant's own width.
    pub n_embd: usize,
    /// `backbone_hidden_size`: the target's width.
    pub backbone: usize,
    /// Query heads of every layer.
    pub n_head: usize,
    pub rms_eps: f32,
    /// Window of the sliding layers (the query sees the last `window + 1` target keys).
    pub sliding_window: usize,
    /// Per layer: kind, head dim, kv heads (those of the target layer it reads), FFN width, RoPE.
    pub layers: Vec<Gemma4Layer>,
    /// `use_ordered_embeddings`: `(num_centroids, centroid_intermediate_top_k)`.
    pub ordered: Option<(usize, usize)>,
}

fn count(j: &Value, k: &str) -> Result<Option<usize>> {
    match j.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|v| Some(v as usize))
            .ok_or_else(|| anyhow!("assistant config: {k} is not a non-negative integer")),
    }
}

impl AssistantConfig {
    /// Parse an HF `config.json` of `model_type: gemma4_assistant`.
    pub fn from_json(j: &Value) -> Result<AssistantConfig> {
        let mt = j.get("model_type").and_then(Value::as_str).unwrap_or("");
        if mt != "gemma4_assistant" {
            bail!(
                "config.json: model_type '{}' is not gemma4_assistant",
                mt.escape_debug()
            );
        }
        let text = j
            .get("text_config")
            .filter(|t| t.is_object())
            .ok_or_else(|| anyhow!("gemma4_assistant config.json has no text_config"))?;
        for (k, bad) in [
            ("hidden_size_per_layer_input", "per-layer inputs"),
            ("vocab_size_per_layer_input", "per-layer inputs"),
        ] {
            if count(text, k)?.unwrap_or(0) != 0 {
                bail!("gemma4_assistant with {bad} ({k} != 0) is not a valid assistant");
            }
        }
        for k in ["enable_moe_block", "use_double_wide_mlp"] {
            if text.get(k).and_then(Value::as_bool).unwrap_or(false) {
                bail!("gemma4_assistant with {k} is not a valid assistant");
            }
        }
        // Every layer reads the target's cache; parse the geometry as a non-sharing text model.
        let mut t = text.clone();
        let o = t.as_object_mut().expect("checked object");
        o.insert("num_kv_shared_layers".into(), 0.into());
        o.insert("hidden_size_per_layer_input".into(), 0.into());
        o.insert("model_type".into(), "gemma4_text".into());
        let tc = Gemma4Config::from_json(&t).context("gemma4_assistant text_config")?;
        let backbone = count(j, "backbone_hidden_size")?
            .ok_or_else(|| anyhow!("gemma4_assistant config.json: missing backbone_hidden_size"))?;
        let ordered = if j
            .get("use_ordered_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(false)
        {
            let n = count(j, "num_centroids")?.unwrap_or(2048);
            let k = count(j, "centroid_intermediate_top_k")?.unwrap_or(32);
            Some((n, k))
        } else {
            None
        };
        Self::from_text(tc, backbone, ordered)
    }

    fn from_text(
        tc: Gemma4Config,
        backbone: usize,
        ordered: Option<(usize, usize)>,
    ) -> Result<AssistantConfig> {
        if backbone == 0 || backbone > 1 << 20 {
            bail!("gemma4_assistant: backbone_hidden_size {backbone} is invalid");
        }
        if let Some((n, k)) = ordered {
            if n == 0 || k == 0 || k > n || !tc.n_vocab.is_multiple_of(n) {
                bail!(
                    "gemma4_assistant: {n} centroids (top {k}) do not divide the vocabulary of {}",
                    tc.n_vocab
                );
            }
        }
        let mut layers = tc.layers;
        for l in &mut layers {
            l.k_eq_v = false; // query-only layers: how the target built its V does not matter
        }
        Ok(AssistantConfig {
            n_vocab: tc.n_vocab,
            n_embd: tc.n_embd,
            backbone,
            n_head: tc.n_head,
            rms_eps: tc.rms_eps,
            sliding_window: tc.sliding_window,
            layers,
            ordered,
        })
    }

    /// Translate llama.cpp `gemma4-assistant` GGUF metadata into the equivalent `config.json`.
    pub fn from_gguf(g: &GgufFile) -> Result<AssistantConfig> {
        let arch = g.architecture()?;
        if arch != "gemma4-assistant" {
            bail!(
                "GGUF architecture '{}' is not gemma4-assistant",
                arch.escape_debug()
            );
        }
        let key = |k: &str| format!("gemma4-assistant.{k}");
        let u = |k: &str| g.get_u64(&key(k)).map(|v| v as usize);
        let u_opt = |k: &str| -> Result<Option<usize>> {
            match g.get(&key(k)) {
                None => Ok(None),
                Some(_) => u(k).map(Some),
            }
        };
        let f_opt = |k: &str| -> Result<Option<f64>> {
            match g.get(&key(k)) {
                None => Ok(None),
                Some(_) => g.get_f64(&key(k)).map(Some),
            }
        };
        let n_layer = u("block_count")?;
        if n_layer == 0 || n_layer > 1 << 12 {
            bail!("invalid gemma4-assistant.block_count {n_layer}");
        }
        let swa: Vec<bool> = g
            .get_array(&key("attention.sliding_window_pattern"))?
            .iter()
            .map(|v| v.as_bool())
            .collect::<Option<_>>()
            .ok_or_else(|| anyhow!("sliding_window_pattern is not boolean"))?;
        if swa.len() != n_layer {
            bail!(
                "sliding_window_pattern has {} entries for {n_layer} layers",
                swa.len()
            );
        }
        let per_layer = |k: &str| -> Result<Vec<usize>> {
            let v = g
                .get(&key(k))
                .ok_or_else(|| anyhow!("missing GGUF key {}", key(k)))?;
            let vals: Vec<usize> = match v.as_array() {
                Some(a) => a
                    .iter()
                    .map(|x| x.as_i64().filter(|&x| x >= 0).map(|x| x as usize))
                    .collect::<Option<_>>()
                    .ok_or_else(|| anyhow!("{} is not an array of counts", key(k)))?,
                None => vec![u(k)?; n_layer],
            };
            if vals.len() != n_layer {
                bail!("{} has {} entries for {n_layer} layers", key(k), vals.len());
            }
            Ok(vals)
        };
        let kv = per_layer("attention.head_count_kv")?;
        let ff = per_layer("feed_forward_length")?;
        if ff.iter().any(|&f| f != ff[0]) {
            bail!("gemma4-assistant: per-layer feed_forward_length {ff:?} is not supported");
        }
        let hd_full = u("attention.key_length")?;
        let hd_swa = u_opt("attention.key_length_swa")?.unwrap_or(hd_full);
        let partial = match g.tensor("rope_freqs.weight") {
            Some(t) => {
                let mut v = vec![0f32; t.n_elements() as usize];
                vela_formats::quant::dequantize(t.ty, g.tensor_data(t), &mut v)?;
                let n_rot = v.iter().take_while(|&&f| f == 1.0).count();
                if v.len() * 2 != hd_full || v[n_rot..].iter().any(|&f| f < 1e20) {
                    bail!("rope_freqs.weight does not describe a proportional RoPE");
                }
                n_rot as f64 * 2.0 / hd_full as f64
            }
            None => 1.0,
        };
        let per_layer_config: serde_json::Map<String, Value> = (0..n_layer)
            .filter(|&i| !swa[i])
            .map(|i| {
                let o = serde_json::json!({"head_dim": hd_full, "num_key_value_heads": kv[i]});
                (i.to_string(), o)
            })
            .collect();
        let swa_kv = (0..n_layer).find(|&i| swa[i]).map_or(kv[0], |i| kv[i]);
        let vocab = g
            .tensor("token_embd.weight")
            .ok_or_else(|| anyhow!("gemma4-assistant GGUF: missing token_embd.weight"))?
            .n_rows();
        let j = serde_json::json!({
            "model_type": "gemma4_text",
            "vocab_size": vocab,
            "hidden_size": u("embedding_length")?,
            "intermediate_size": ff[0],
            "num_hidden_layers": n_layer,
            "num_attention_heads": u("attention.head_count")?,
            "num_key_value_heads": swa_kv,
            "head_dim": hd_swa,
            "per_layer_config": per_layer_config,
            "layer_types": swa.iter().map(|&s| if s { "sliding_attention" } else { "full_attention" })
                .collect::<Vec<_>>(),
            "sliding_window": u_opt("attention.sliding_window")?.unwrap_or(512),
            "rms_norm_eps": f_opt("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-6),
            "hidden_size_per_layer_input": 0,
            "num_kv_shared_layers": 0,
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default",
                    "rope_theta": f_opt("rope.freq_base_swa")?.unwrap_or(10_000.0)},
                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": partial,
                    "rope_theta": f_opt("rope.freq_base")?.unwrap_or(1_000_000.0)},
            },
        });
        let tc = Gemma4Config::from_json(&j).context("gemma4-assistant GGUF metadata")?;
        let backbone = u("embedding_length_out")?;
        // Not written by the 0c1e570 converter; a file that carries the centroids gets the
        // transformers default of 32 active centroids (no metadata key exists for it).
        let ordered = g
            .tensor("masked_embd_centroids.weight")
            .map(|t| (t.n_rows(), 32));
        Self::from_text(tc, backbone, ordered)
    }

    /// The target layers the assistant reads, `(last sliding, last full)` non-KV-shared layer,
    /// after checking that the assistant fits `target` (width, vocabulary, head geometry).
    pub fn check_target(&self, target: &Gemma4Config) -> Result<(Option<usize>, usize)> {
        if self.backbone != target.n_embd {
            bail!(
                "assistant expects a target of width {} (backbone_hidden_size), the target has {}",
                self.backbone,
                target.n_embd
            );
        }
        if self.n_vocab != target.n_vocab {
            bail!(
                "assistant vocabulary {} differs from the target's {}",
                self.n_vocab,
                target.n_vocab
            );
        }
        let producer = |kind: LayerKind| {
            (0..target.n_layer)
                .rev()
                .find(|&i| target.layers[i].kind == kind && target.layers[i].kv_from.is_none())
        };
        let (swa, full) = (producer(LayerKind::Sliding), producer(LayerKind::Full));
        let full =
            full.ok_or_else(|| anyhow!("target has no full-attention layer with a cache"))?;
        for (i, l) in self.layers.iter().enumerate() {
            let t = match l.kind {
                LayerKind::Sliding => swa.ok_or_else(|| {
                    anyhow!("assistant layer {i} is sliding but the target has no sliding layer")
                })?,
                LayerKind::Full => full,
            };
            let tl = &target.layers[t];
            if (tl.head_dim, tl.n_head_kv) != (l.head_dim, l.n_head_kv) {
                bail!(
                    "assistant layer {i} (head dim {}, {} kv heads) does not match target layer \
                     {t} (head dim {}, {} kv heads)",
                    l.head_dim,
                    l.n_head_kv,
                    tl.head_dim,
                    tl.n_head_kv
                );
            }
        }
        if swa.is_some() && self.sliding_window > target.sliding_window {
            bail!(
                "assistant sliding window {} exceeds the target's {} (the target's ring does not \
                 keep that many keys)",
                self.sliding_window,
                target.sliding_window
            );
        }
        Ok((swa, full))
    }
}

/// Where an assistant for `target_path` would sit by convention, if one is there:
/// for a GGUF file `D/NAME.gguf`, the file `D/mtp-NAME.gguf`; for an HF directory `D/NAME`, the
/// directory `D/NAME-assistant` (the Hugging Face repository naming, e.g.
/// `gemma-4-31B-it` → `gemma-4-31B-it-assistant`), then `D/NAME/assistant`, then the file
/// `D/mtp-NAME.gguf`. Only a regular file / a directory with a `config.json` counts; the
/// candidate still has to pass [`AssistantConfig::check_target`] when loaded.
pub fn discover_assistant(target_path: &Path) -> Option<PathBuf> {
    let dir = target_path.parent()?;
    let name = target_path.file_name()?.to_str()?;
    let file = |p: PathBuf| p.is_file().then_some(p);
    let hf = |p: PathBuf| p.join("config.json").is_file().then_some(p);
    if target_path.is_file() {
        return crate::mtp::file_beside(target_path);
    }
    if target_path.is_dir() {
        return hf(dir.join(format!("{name}-assistant")))
            .or_else(|| hf(target_path.join("assistant")))
            .or_else(|| file(dir.join(format!("mtp-{name}.gguf"))));
    }
    None
}

struct Layer<B: Backend> {
    input_norm: B::Vector,
    wq: B::Weight,
    q_norm: B::Vector,
    wo: B::Weight,
    post_attn_norm: B::Vector,
    pre_ffn_norm: B::Vector,
    w_gate: B::Weight,
    w_up: B::Weight,
    w_down: B::Weight,
    post_ffn_norm: B::Vector,
    scalar: f32,
}

/// The ordered-embedding output path (`Gemma4AssistantMaskedEmbedder`).
struct Ordered<B: Backend> {
    centroids: B::Weight,
    /// `token_ordering` viewed as `[num_centroids, vocab / num_centroids]`: canonical token ids.
    ordering: Vec<u32>,
    top_k: usize,
}

/// A loaded assistant.
pub struct Gemma4Assistant<B: Backend> {
    /// Must be the target's backend (the assistant reads the target's cache and buffers).
    pub backend: Arc<B>,
    pub cfg: AssistantConfig,
    lm_head: B::Weight,
    norm: B::Vector,
    pre_proj: B::Weight,
    post_proj: B::Weight,
    layers: Vec<Layer<B>>,
    ordered: Option<Ordered<B>>,
}

/// Scratch buffers of one drafting sequence (batch 1), bound to a target's layer choice.
pub struct AssistantState<B: Backend> {
    /// Target layers read by sliding / full assistant layers.
    pub target_layers: (Option<usize>, usize),
    bufs: Vec<B::Buf>,
}

// Indices into `AssistantState::bufs`.
const X: usize = 0;
const H: usize = 1;
const Q: usize = 2;
const A: usize = 3;
const O: usize = 4;
const G: usize = 5;
const U: usize = 6;
const IN: usize = 7;
const LG: usize = 8;
const P: usize = 9;
const C: usize = 10;
const SEL: usize = 11;

/// What one draft step produces.
#[derive(Clone, Debug)]
pub struct DraftStep {
    /// `[vocab]` logits (masked values outside the selected clusters on the ordered path).
    pub logits: Vec<f32>,
    /// `[backbone]` projected state: the hidden input of the next step.
    pub hidden: Vec<f32>,
}

impl<B: Backend> Gemma4Assistant<B> {
    /// Load an HF directory or a `gemma4-assistant` GGUF file.
    pub fn load(backend: Arc<B>, path: &Path) -> Result<Self> {
        if path.is_dir() {
            Self::load_hf(backend, path)
        } else {
            let g = GgufFile::open(path)
                .with_context(|| format!("cannot open assistant {}", path.display()))?;
            Self::load_gguf(backend, Arc::new(g))
        }
    }

    /// Load `dir/config.json` + safetensors (mapped in place, as the target's weights are).
    pub fn load_hf(backend: Arc<B>, dir: &Path) -> Result<Self> {
        let cpath = dir.join("config.json");
        let text = std::fs::read_to_string(&cpath)
            .with_context(|| format!("cannot read {}", cpath.display()))?;
        let j: Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not valid JSON", cpath.display()))?;
        let cfg = AssistantConfig::from_json(&j)?;
        let cp = Arc::new(Checkpoint::open(dir)?);
        // llama.cpp's name of each tensor we read → its name in the checkpoint.
        let names: HashMap<String, String> = cp
            .names()
            .filter_map(|n| gguf_name(n).map(|g| (g, n.to_string())))
            .collect();
        for (g, hf) in &names {
            let dt = cp.get(hf).expect("listed").0.dtype.ggml();
            if !matches!(dt, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
                bail!("tensor '{hf}' ({g}): dtype {dt} is not a float type");
            }
        }
        let ordering = match cp.get("masked_embedding.token_ordering") {
            Some(_) => Some(cp.to_i64("masked_embedding.token_ordering")?),
            None => None,
        };
        let get = |name: &str| {
            let w = HostWeight::from_safetensors(&cp, names.get(name)?)?;
            Some(w.as_head(matches!(name, "token_embd.weight" | "output.weight")))
        };
        Self::build(backend, &get, cfg, ordering)
    }

    /// Load a llama.cpp `gemma4-assistant` GGUF.
    pub fn load_gguf(backend: Arc<B>, g: Arc<GgufFile>) -> Result<Self> {
        let cfg = AssistantConfig::from_gguf(&g)?;
        let ordering = match g.tensor("masked_embd_ordering.weight") {
            Some(t) => {
                let b = g.tensor_data(t);
                Some(match t.ty {
                    GgmlType::I32 => b
                        .chunks_exact(4)
                        .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")) as i64)
                        .collect(),
                    GgmlType::I64 => b
                        .chunks_exact(8)
                        .map(|c| i64::from_le_bytes(c.try_into().expect("8 bytes")))
                        .collect(),
                    _ => {
                        let mut v = vec![0f32; t.n_elements() as usize];
                        vela_formats::quant::dequantize(t.ty, b, &mut v)?;
                        v.into_iter().map(|x| x as i64).collect()
                    }
                })
            }
            None => None,
        };
        let get = |name: &str| HostWeight::from_gguf(&g, name);
        Self::build(backend, &get, cfg, ordering)
    }

    /// The assistant from its tensors, looked up by llama.cpp's names through `get`.
    fn build(
        backend: Arc<B>,
        get: &dyn Fn(&str) -> Option<HostWeight>,
        cfg: AssistantConfig,
        ordering: Option<Vec<i64>>,
    ) -> Result<Self> {
        let be = &*backend;
        let weight = |name: &str, rows: usize, cols: usize| -> Result<B::Weight> {
            let w = get(name).ok_or_else(|| anyhow!("assistant: missing tensor {name}"))?;
            if (w.rows, w.cols) != (rows, cols) {
                bail!(
                    "assistant tensor {name} has shape [{}, {}], expected [{rows}, {cols}]",
                    w.rows,
                    w.cols
                );
            }
            be.upload_weight(&w)
        };
        let raw = |name: &str, len: usize| -> Result<Vec<f32>> {
            let w = get(name).ok_or_else(|| anyhow!("assistant: missing tensor {name}"))?;
            if w.rows * w.cols != len {
                bail!(
                    "assistant tensor {name} has {} elements, expected {len}",
                    w.rows * w.cols
                );
            }
            w.to_f32()
        };
        let vector = |name: &str, len: usize| be.upload_vector(&raw(name, len)?);
        let (d, nh, v) = (cfg.n_embd, cfg.n_head, cfg.n_vocab);
        let head = if get("output.weight").is_some() {
            "output.weight"
        } else {
            "token_embd.weight"
        };
        let mut layers = Vec::with_capacity(cfg.layers.len());
        for (i, l) in cfg.layers.iter().enumerate() {
            let n = |s: &str| format!("blk.{i}.{s}");
            let scalar = match get(&n("layer_output_scale.weight")) {
                Some(_) => raw(&n("layer_output_scale.weight"), 1)?[0],
                None => 1.0,
            };
            layers.push(Layer {
                input_norm: vector(&n("attn_norm.weight"), d)?,
                wq: weight(&n("attn_q.weight"), nh * l.head_dim, d)?,
                q_norm: vector(&n("attn_q_norm.weight"), l.head_dim)?,
                wo: weight(&n("attn_output.weight"), d, nh * l.head_dim)?,
                post_attn_norm: vector(&n("post_attention_norm.weight"), d)?,
                pre_ffn_norm: vector(&n("ffn_norm.weight"), d)?,
                w_gate: weight(&n("ffn_gate.weight"), l.n_ff, d)?,
                w_up: weight(&n("ffn_up.weight"), l.n_ff, d)?,
                w_down: weight(&n("ffn_down.weight"), d, l.n_ff)?,
                post_ffn_norm: vector(&n("post_ffw_norm.weight"), d)?,
                scalar,
            });
        }
        let ordered = match (cfg.ordered, ordering) {
            (Some((nc, top_k)), Some(ord)) => {
                if ord.len() != v {
                    bail!(
                        "token_ordering has {} entries for a vocabulary of {v}",
                        ord.len()
                    );
                }
                let ordering = ord
                    .iter()
                    .map(|&t| u32::try_from(t).ok().filter(|&t| (t as usize) < v))
                    .collect::<Option<Vec<u32>>>()
                    .ok_or_else(|| anyhow!("token_ordering has an id outside 0..{v}"))?;
                Some(Ordered {
                    centroids: weight("masked_embd_centroids.weight", nc, d)?,
                    ordering,
                    top_k,
                })
            }
            (Some(_), None) => bail!("use_ordered_embeddings is set but token_ordering is missing"),
            (None, _) => None,
        };
        Ok(Gemma4Assistant {
            lm_head: weight(head, v, d)?,
            norm: vector("output_norm.weight", d)?,
            pre_proj: weight("nextn.pre_projection.weight", d, 2 * cfg.backbone)?,
            post_proj: weight("nextn.post_projection.weight", cfg.backbone, d)?,
            layers,
            ordered,
            backend,
            cfg,
        })
    }

    /// Whether logits come from the ordered-embedding (masked) path.
    pub fn uses_ordered_embeddings(&self) -> bool {
        self.ordered.is_some()
    }

    /// Scratch for drafting against `target` (checked with [`AssistantConfig::check_target`]).
    pub fn new_state(&self, target: &Gemma4Config) -> Result<AssistantState<B>> {
        let target_layers = self.cfg.check_target(target)?;
        let c = &self.cfg;
        let be = &*self.backend;
        let qd = c
            .layers
            .iter()
            .map(|l| c.n_head * l.head_dim)
            .max()
            .unwrap_or(1);
        let ff = c.layers.iter().map(|l| l.n_ff).max().unwrap_or(1);
        let (nc, sel) = match (c.ordered, &self.ordered) {
            (Some((nc, _)), Some(o)) => (nc, o.top_k * (c.n_vocab / nc) * c.n_embd),
            _ => (1, 1),
        };
        let sizes = [
            c.n_embd,
            c.n_embd,
            qd,
            qd,
            c.n_embd,
            ff,
            ff,
            2 * c.backbone,
            c.n_vocab,
            c.backbone,
            nc,
            sel,
        ];
        Ok(AssistantState {
            target_layers,
            bufs: sizes.iter().map(|&s| be.alloc(s.max(1))).collect(),
        })
    }

    /// One draft step at position `pos` (≥ 1) for `token`, with `hidden` the target's hidden
    /// state of position `pos - 1` (first step) or the previous step's [`DraftStep::hidden`].
    /// `target_kv` must hold the target's K/V of positions `0..pos` (later positions may hold
    /// anything: they are masked).
    pub fn step(
        &self,
        st: &mut AssistantState<B>,
        target: &Gemma4Model<B>,
        target_kv: &B::Kv,
        token: u32,
        hidden: &[f32],
        pos: usize,
    ) -> Result<DraftStep> {
        let be = &*self.backend;
        let c = &self.cfg;
        let (d, bb) = (c.n_embd, c.backbone);
        if pos == 0 {
            bail!("the assistant drafts after at least one target position");
        }
        if hidden.len() != bb {
            bail!(
                "hidden state has {} values, the assistant expects {bb}",
                hidden.len()
            );
        }
        if token as usize >= c.n_vocab {
            bail!("token {token} is outside the vocabulary ({})", c.n_vocab);
        }
        let b = &mut st.bufs;
        // [E_target[t]·sqrt(H) ; h] → pre-projection.
        target.embed_scaled(&[token], &mut b[IN])?;
        let mut inp = vec![0f32; 2 * bb];
        be.read(&b[IN], &mut inp[..bb]);
        inp[bb..].copy_from_slice(hidden);
        be.write(&mut b[IN], &inp);
        {
            let [i, x] = pick2(b, IN, X);
            be.matmul(&self.pre_proj, i, 1, x);
        }
        let rope_pos = [pos as u32];
        let mask_pos = [pos as u32 - 1];
        for (l, lc) in self.layers.iter().zip(&c.layers) {
            let hd = lc.head_dim;
            // Input norm and Q in one call a backend may fuse (GPU: the norm also quantizes).
            {
                let [x, h, q] = pick3(b, X, H, Q);
                be.norm_matmul_many(
                    x,
                    None,
                    &l.input_norm,
                    1,
                    d,
                    c.rms_eps,
                    h,
                    &[&l.wq],
                    &[],
                    &mut [q],
                );
            }
            be.rms_norm_inplace(&mut b[Q], &l.q_norm, c.n_head, hd, c.rms_eps);
            be.rope(&mut b[Q], c.n_head, hd, &rope_pos, &lc.rope);
            let (layer, window) = match lc.kind {
                // transformers' flipped bidirectional sliding mask keeps the last
                // `window + 1` keys (checked against it at positions past the window).
                LayerKind::Sliding => (
                    st.target_layers.0.expect("checked by check_target"),
                    Some(c.sliding_window + 1),
                ),
                LayerKind::Full => (st.target_layers.1, None),
            };
            let ap = AttnParams {
                n_head: c.n_head,
                n_head_kv: lc.n_head_kv,
                head_dim_k: hd,
                head_dim_v: hd,
                scale: 1.0,
                window,
                softcap: None,
            };
            {
                let [q, a, o] = pick3(b, Q, A, O);
                be.attention_matmul(q, target_kv, layer, &mask_pos, &ap, a, &l.wo, o);
            }
            // x += post_attn_norm(o), the pre-FFN norm and gate/up in one call; then the
            // activation and the down product.
            {
                let [x, o, h, g, u] = b.get_disjoint_mut([X, O, H, G, U]).expect("buffers");
                let (post, pre) = (&l.post_attn_norm, &l.pre_ffn_norm);
                let ws = [&l.w_gate, &l.w_up];
                be.post_norm_matmul_many(
                    x,
                    o,
                    post,
                    1.0,
                    pre,
                    1,
                    d,
                    c.rms_eps,
                    h,
                    &ws,
                    &[],
                    &mut [g, u],
                );
            }
            {
                let [g, u, o] = pick3(b, G, U, O);
                be.act_mul_matmul(g, u, 1, lc.n_ff, Activation::GeluTanh, &l.w_down, o);
            }
            be.rms_norm_inplace(&mut b[O], &l.post_ffn_norm, 1, d, c.rms_eps);
            {
                let [x, o] = pick2(b, X, O);
                be.add(x, o, d);
            }
            if l.scalar != 1.0 {
                be.scale(&mut b[X], d, l.scalar);
            }
        }
        {
            let [x, h] = pick2(b, X, H);
            be.rms_norm(x, &self.norm, 1, d, c.rms_eps, h);
        }
        {
            let [h, p] = pick2(b, H, P);
            be.matmul(&self.post_proj, h, 1, p);
        }
        let mut hidden_out = vec![0f32; bb];
        be.read(&b[P], &mut hidden_out);
        let logits = match &self.ordered {
            None => {
                let [h, lg] = pick2(b, H, LG);
                be.matmul(&self.lm_head, h, 1, lg);
                let mut out = vec![0f32; c.n_vocab];
                be.read(lg, &mut out);
                out
            }
            Some(o) => self.ordered_logits(o, b)?,
        };
        Ok(DraftStep {
            logits,
            hidden: hidden_out,
        })
    }

    /// `Gemma4AssistantMaskedEmbedder.forward` for one row held in `bufs[H]`.
    fn ordered_logits(&self, o: &Ordered<B>, b: &mut [B::Buf]) -> Result<Vec<f32>> {
        let be = &*self.backend;
        let c = &self.cfg;
        let d = c.n_embd;
        let nc = c.ordered.map_or(1, |x| x.0);
        let per = c.n_vocab / nc;
        {
            let [h, cb] = pick2(b, H, C);
            be.matmul(&o.centroids, h, 1, cb);
        }
        let mut cl = vec![0f32; nc];
        be.read(&b[C], &mut cl);
        // torch.topk: the k largest, ties to the lower index.
        let mut idx: Vec<usize> = (0..nc).collect();
        idx.sort_by(|&i, &j| cl[j].total_cmp(&cl[i]).then(i.cmp(&j)));
        let ids: Vec<u32> = idx[..o.top_k]
            .iter()
            .flat_map(|&ci| o.ordering[ci * per..(ci + 1) * per].iter().copied())
            .collect();
        be.get_rows(&self.lm_head, &ids, 1.0, &mut b[SEL])?;
        let mut rows = vec![0f32; ids.len() * d];
        be.read(&b[SEL], &mut rows);
        let mut h = vec![0f32; d];
        be.read(&b[H], &mut h);
        let sel: Vec<f32> = rows
            .chunks_exact(d)
            .map(|r| {
                r.iter()
                    .zip(&h)
                    .map(|(a, b)| *a as f64 * *b as f64)
                    .sum::<f64>() as f32
            })
            .collect();
        let fill = sel.iter().copied().fold(f32::INFINITY, f32::min) - 1.0;
        let mut out = vec![fill; c.n_vocab];
        for (&t, &v) in ids.iter().zip(&sel) {
            out[t as usize] = v;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discovery_follows_the_naming_convention() {
        let tmp = std::env::temp_dir().join(format!("vela-disc-{}", std::process::id()));
        std::fs::create_dir_all(tmp.join("gemma-4-it")).unwrap();
        std::fs::write(tmp.join("gemma-4-it").join("config.json"), "{}").unwrap();
        std::fs::write(tmp.join("model.gguf"), b"x").unwrap();
        assert_eq!(discover_assistant(&tmp.join("model.gguf")), None);
        std::fs::write(tmp.join("mtp-model.gguf"), b"x").unwrap();
        assert_eq!(
            discover_assistant(&tmp.join("model.gguf")),
            Some(tmp.join("mtp-model.gguf"))
        );
        assert_eq!(discover_assistant(&tmp.join("gemma-4-it")), None);
        std::fs::create_dir_all(tmp.join("gemma-4-it-assistant")).unwrap();
        assert_eq!(
            discover_assistant(&tmp.join("gemma-4-it")),
            None,
            "no config.json yet"
        );
        std::fs::write(tmp.join("gemma-4-it-assistant").join("config.json"), "{}").unwrap();
        assert_eq!(
            discover_assistant(&tmp.join("gemma-4-it")),
            Some(tmp.join("gemma-4-it-assistant"))
        );
        std::fs::remove_dir_all(&tmp).unwrap();
    }
}
