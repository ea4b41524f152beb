//! The parameter types of the [`crate::Backend`] ops: rotary embedding, attention, KV cache
//! layout, activations, expert routing and the sparse-attention indexers.

use std::sync::Arc;

/// A backend could not allocate memory for sequence state (K/V pages or blocks, a copy of a
/// cache): a condition of the machine's load, not of the request, so a server answers it as
/// overloaded. Found in an `anyhow` chain with `downcast_ref` / [`OutOfMemory::in_chain`].
#[derive(Clone, Debug)]
pub struct OutOfMemory(pub String);

impl std::fmt::Display for OutOfMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for OutOfMemory {}

impl OutOfMemory {
    /// Whether `e` or one of its causes is an [`OutOfMemory`].
    pub fn in_chain(e: &anyhow::Error) -> bool {
        e.chain().any(|c| c.is::<OutOfMemory>())
    }
}

/// Rotary embedding parameters of one layer.
#[derive(Clone, Debug)]
pub struct RopeParams {
    /// Number of rotated dimensions per head (≤ head_dim).
    pub n_rot: usize,
    pub freq_base: f32,
    /// Linear position scaling (1.0 = none).
    pub freq_scale: f32,
    /// NEOX style rotates (x[i], x[i + n_rot/2]); normal style rotates (x[2i], x[2i+1]).
    pub neox: bool,
    /// Per-frequency divisors (Llama 3 rope scaling stores them as `rope_freqs.weight`).
    pub freq_factors: Option<Arc<Vec<f32>>>,
}

/// The sparse-attention indexer's selection rule ([`Backend::indexer_select`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexerParams {
    /// Indexer query heads and their width (the pooled key is one head of the same width).
    pub n_head: usize,
    pub head_dim: usize,
    /// Positions per key block.
    pub block: usize,
    /// Blocks kept per query (the budget in blocks).
    pub max_blocks: usize,
}

impl IndexerParams {
    /// Positions one query can select: the kept blocks and an open block's tail.
    pub fn max_selected(&self) -> usize {
        self.max_blocks * self.block + self.block - 1
    }
}

/// The Lightning indexer's selection rule (DeepSeek V4's CSA layers,
/// [`crate::Backend::lightning_select`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LightningParams {
    /// Indexer query heads and their width (the compressed keys are one head of that width).
    pub n_head: usize,
    pub head_dim: usize,
    /// Positions per compressed entry: a query at `pos` sees entries `0..⌊(pos+1)/ratio⌋`.
    pub ratio: usize,
    /// Entries kept per query.
    pub top_k: usize,
    /// Multiplier of each head's `relu(q·k)` (`head_dim^-½`).
    pub scale: f32,
    /// List positions instead of entries (GLM 5.3's pools): those of each kept entry, then the
    /// open entry's tail (see [`crate::Backend::lightning_select`]).
    pub expand: bool,
}

impl LightningParams {
    /// Width of a row of the selection: `top_k` entries, or with `expand` their positions and
    /// the open entry's tail.
    pub fn width(&self) -> usize {
        if self.expand {
            self.top_k * self.ratio + self.ratio - 1
        } else {
            self.top_k
        }
    }
}

/// Attention geometry and options of one layer.
#[derive(Clone, Debug)]
pub struct AttnParams {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    /// Multiplier applied to q·k.
    pub scale: f32,
    /// Sliding window: a query at position p sees keys at p-window+1 ..= p.
    pub window: Option<usize>,
    /// Attention logit soft-capping: s = cap * tanh(s / cap).
    pub softcap: Option<f32>,
}

/// KV cache element type. F16 and BF16 round to nearest even when stored; BF16 keeps f32's range
/// (no overflow for large activations) at 8 bits of mantissa.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvType {
    F32,
    F16,
    Bf16,
}

impl KvType {
    /// Bytes per cached element.
    pub fn bytes(self) -> usize {
        match self {
            KvType::F32 => 4,
            KvType::F16 | KvType::Bf16 => 2,
        }
    }

    /// Parse `f32`, `f16` or `bf16` (the `--kv-type` values).
    pub fn parse(s: &str) -> Option<KvType> {
        match s {
            "f32" => Some(KvType::F32),
            "f16" => Some(KvType::F16),
            "bf16" => Some(KvType::Bf16),
            _ => None,
        }
    }
}

/// KV storage of one layer.
#[derive(Clone, Debug)]
pub struct KvLayerSpec {
    pub n_head_kv: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
    /// Number of slots; position p lives in slot p % capacity. Full-attention layers have
    /// capacity = context length; sliding layers window + max batch.
    pub capacity: usize,
    pub window: Option<usize>,
}

/// Activation functions of gated FFNs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    Silu,
    /// GELU, tanh approximation.
    GeluTanh,
    /// SwiGLU with a limit (DeepSeek V4's `swiglu_limit` L): silu(min(gate, L)) · clamp(up, −L, L).
    SiluLimit(f32),
}

/// How router logits become expert scores ([`crate::Backend::route`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Score {
    /// Softmax over the experts (Qwen3 MoE, Gemma 4).
    Softmax,
    /// `1 / (1 + exp(-x))` per expert (DeepSeek V3, GLM).
    Sigmoid,
    /// `sqrt(softplus(x))`, softplus as torch's (`x` above 20, else `ln(1 + exp(x))`;
    /// DeepSeek V4).
    SqrtSoftplus,
}

/// Routing settings of an MoE layer ([`crate::Backend::route`]).
#[derive(Clone, Debug, PartialEq)]
pub struct RouteParams {
    pub n_expert: usize,
    /// Experts per token.
    pub k: usize,
    pub score: Score,
    /// Expert groups (DeepSeek V3 `n_group`; 1 = no grouping); must divide `n_expert`.
    pub n_group: usize,
    /// Groups kept per token (`topk_group`; ≥ `n_group` = all).
    pub topk_group: usize,
    /// Divide the chosen weights by their sum (`norm_topk_prob`).
    pub renorm: bool,
    /// Multiplier of the weights (`routed_scaling_factor`; 1 = none).
    pub scale: f32,
}

impl RouteParams {
    /// The renormalisation's epsilon: 1e-20 for the sigmoid-type scores (DeepSeek adds it),
    /// 0 for softmax (Qwen3 MoE and Gemma 4 divide by the plain sum).
    pub fn renorm_eps(&self) -> f32 {
        match self.score {
            Score::Softmax => 0.0,
            Score::Sigmoid | Score::SqrtSoftplus => 1e-20,
        }
    }
}
