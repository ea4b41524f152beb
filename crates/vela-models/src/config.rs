//! The configuration of the shared decoder, filled in by each family file from GGUF metadata.

use anyhow::{anyhow, bail, Result};
use std::sync::Arc;
use vela_compute::{Activation, RopeParams};
use vela_formats::gguf::GgufFile;

/// Per-layer options (they differ between sliding and full layers in Gemma 3).
#[derive(Clone, Debug)]
pub struct LayerConfig {
    pub rope: RopeParams,
    /// Sliding-window size for local layers, `None` for full attention.
    pub window: Option<usize>,
}

/// Everything the shared decoder needs to know about one model.
#[derive(Clone, Debug)]
pub struct DecoderConfig {
    pub arch: String,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    /// Multiplier on q·k (1/sqrt(head_dim) unless the family says otherwise).
    pub attn_scale: f32,
    /// Multiplier on the token embeddings (Gemma: sqrt(n_embd)).
    pub embed_scale: f32,
    pub act: Activation,
    /// Per-head RMSNorm of q and k before RoPE (Qwen3, Gemma 3).
    pub qk_norm: bool,
    /// RMSNorm of the attention and FFN outputs before the residual add (Gemma 2/3).
    pub post_norms: bool,
    pub final_softcap: Option<f32>,
    pub attn_softcap: Option<f32>,
    pub layers: Vec<LayerConfig>,
}

/// Common hyper-parameters every family reads the same way.
pub(crate) struct Common {
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    pub n_ff: usize,
    pub n_vocab: usize,
    pub n_ctx_train: usize,
    pub rms_eps: f32,
    pub freq_base: f32,
    pub freq_scale: f32,
    pub n_rot: usize,
    pub freq_factors: Option<Arc<Vec<f32>>>,
}

fn positive(v: u64, what: &str) -> Result<usize> {
    if v == 0 || v > 1 << 24 {
        bail!("invalid {what} = {v} in model metadata");
    }
    Ok(v as usize)
}

impl Common {
    pub fn read(g: &GgufFile) -> Result<Common> {
        let n_layer = positive(g.arch_u64("block_count")?, "block_count")?;
        let n_embd = positive(g.arch_u64("embedding_length")?, "embedding_length")?;
        let n_head = positive(g.arch_u64("attention.head_count")?, "head_count")?;
        let n_head_kv = positive(
            g.arch_u64_opt("attention.head_count_kv")?
                .unwrap_or(n_head as u64),
            "head_count_kv",
        )?;
        if n_head % n_head_kv != 0 {
            bail!("head_count {n_head} is not a multiple of head_count_kv {n_head_kv}");
        }
        let head_dim_k = positive(
            g.arch_u64_opt("attention.key_length")?
                .unwrap_or((n_embd / n_head) as u64),
            "key_length",
        )?;
        let head_dim_v = positive(
            g.arch_u64_opt("attention.value_length")?
                .unwrap_or(head_dim_k as u64),
            "value_length",
        )?;
        let n_ff = positive(g.arch_u64("feed_forward_length")?, "feed_forward_length")?;
        let emb = g
            .tensor("token_embd.weight")
            .ok_or_else(|| anyhow!("missing tensor token_embd.weight"))?;
        let n_vocab = emb.n_rows();
        let n_ctx_train = positive(
            g.arch_u64_opt("context_length")?.unwrap_or(4096),
            "context_length",
        )?;
        let rms_eps = g
            .arch_f64_opt("attention.layer_norm_rms_epsilon")?
            .unwrap_or(1e-6) as f32;
        let freq_base = g.arch_f64_opt("rope.freq_base")?.unwrap_or(10000.0) as f32;
        let n_rot = g
            .arch_u64_opt("rope.dimension_count")?
            .map(|v| v as usize)
            .unwrap_or(head_dim_k);
        if n_rot > head_dim_k || n_rot % 2 != 0 {
            bail!("invalid rope.dimension_count {n_rot} for head size {head_dim_k}");
        }
        let mut freq_scale = 1.0f32;
        let scaling = g
            .get(&format!("{}.rope.scaling.type", g.architecture()?))
            .and_then(|v| v.as_str().map(str::to_string));
        match scaling.as_deref() {
            None | Some("none") => {}
            Some("linear") => {
                let f = g.arch_f64_opt("rope.scaling.factor")?.unwrap_or(1.0) as f32;
                if f > 0.0 {
                    freq_scale = 1.0 / f;
                }
            }
            Some(other) => bail!(
                "rope scaling type '{}' is not supported yet",
                other.escape_debug()
            ),
        }
        // Llama 3 style scaling is baked into a per-frequency factor tensor.
        let freq_factors = match g.tensor("rope_freqs.weight") {
            Some(t) => {
                let mut v = vec![0f32; t.n_elements() as usize];
                vela_formats::quant::dequantize(t.ty, g.tensor_data(t), &mut v)?;
                if v.len() < n_rot / 2 {
                    bail!(
                        "rope_freqs.weight has {} entries, need {}",
                        v.len(),
                        n_rot / 2
                    );
                }
                Some(Arc::new(v))
            }
            None => None,
        };
        Ok(Common {
            n_layer,
            n_embd,
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
            n_ff,
            n_vocab,
            n_ctx_train,
            rms_eps,
            freq_base,
            freq_scale,
            n_rot,
            freq_factors,
        })
    }

    pub fn rope(&self, neox: bool) -> RopeParams {
        RopeParams {
            n_rot: self.n_rot,
            freq_base: self.freq_base,
            freq_scale: self.freq_scale,
            neox,
            freq_factors: self.freq_factors.clone(),
        }
    }

    /// A config with the defaults of a plain Llama-style decoder.
    pub fn into_config(self, arch: &str, neox: bool) -> DecoderConfig {
        let layer = LayerConfig {
            rope: self.rope(neox),
            window: None,
        };
        DecoderConfig {
            arch: arch.to_string(),
            n_layer: self.n_layer,
            n_embd: self.n_embd,
            n_head: self.n_head,
            n_head_kv: self.n_head_kv,
            head_dim_k: self.head_dim_k,
            head_dim_v: self.head_dim_v,
            n_ff: self.n_ff,
            n_vocab: self.n_vocab,
            n_ctx_train: self.n_ctx_train,
            rms_eps: self.rms_eps,
            attn_scale: 1.0 / (self.head_dim_k as f32).sqrt(),
            embed_scale: 1.0,
            act: Activation::Silu,
            qk_norm: false,
            post_norms: false,
            final_softcap: None,
            attn_softcap: None,
            layers: vec![layer; self.n_layer],
        }
    }
}

impl DecoderConfig {
    /// One line for `vela info`.
    pub fn summary(&self) -> String {
        let windows = self.layers.iter().filter(|l| l.window.is_some()).count();
        format!(
            "{} layers, d={}, heads {}/{} kv, head_dim {}/{}, ffn {}, vocab {}, ctx {}, {} sliding-window layers",
            self.n_layer,
            self.n_embd,
            self.n_head,
            self.n_head_kv,
            self.head_dim_k,
            self.head_dim_v,
            self.n_ff,
            self.n_vocab,
            self.n_ctx_train,
            windows
        )
    }
}
