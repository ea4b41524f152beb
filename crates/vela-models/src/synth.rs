//! `vela synth`: random-weight GGUF models of real geometries, for measuring throughput at real
//! sizes without downloading checkpoints.
//!
//! A synthesized file looks like what llama.cpp's `convert_hf_to_gguf.py` followed by
//! `llama-quantize` writes for that architecture (`llama`, `qwen2`, `gemma3`, `gemma4`): the same
//! metadata keys, tensor names, shapes and per-tensor quant types, and a real tokenizer copied
//! from a vocabulary GGUF (so prompts tokenize exactly as for the real model). Only the weight
//! values are made up.
//!
//! **Values.** Linear weights are ≈ N(0, 1/fan_in) so every projection keeps unit-scale
//! activations; embeddings are ≈ N(0, 1/n_embd) (logits through a tied embedding stay ≈ N(0, 1));
//! norm weights are ≈ 1 + N(0, 0.02²); biases ≈ N(0, 0.02²). Gemma 4 attends with scale 1.0 and
//! relies on learned q-norm weights, so its q-norm weights are ≈ head_dim^-0.5 instead of 1.
//! Nothing is ever all zeros.
//!
//! **Determinism.** Element `j` of tensor `name` is a pure function of `(seed, name, j)`: a
//! SplitMix64 hash of the counter gives four 16-bit uniforms whose sum is an Irwin–Hall
//! approximation of a normal (variance-corrected, bounded at ±3.46σ). Only integer arithmetic and
//! single f32 multiplies are involved (no `ln`/`cos` from the platform's libm), so any machine and
//! any thread count produce a byte-identical file from the same seed and tokenizer source.
//!
//! **Streaming.** Tensors are generated and quantized in chunks of rows by all cores and
//! streamed to disk through [`GgufWriter`], so memory stays at a few chunks whatever the model
//! size.

use anyhow::{anyhow, bail, Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use vela_formats::gguf::{GgufFile, Value};
use vela_formats::gguf_write::{GgufWriter, TensorSpec};
use vela_formats::quant::{GgmlType, QK_K};

/// Architecture family of a geometry (its `general.architecture`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Llama,
    Qwen2,
    Gemma3,
    Gemma4,
}

impl Family {
    /// The GGUF architecture name.
    pub fn arch(self) -> &'static str {
        match self {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Gemma3 => "gemma3",
            Family::Gemma4 => "gemma4",
        }
    }
}

/// The hyper-parameters of one named model shape.
#[derive(Clone, Debug)]
pub struct Geometry {
    /// Name used on the command line (`--arch`).
    pub name: &'static str,
    /// The real checkpoint the numbers come from.
    pub source: &'static str,
    pub family: Family,
    pub n_layer: usize,
    pub n_embd: usize,
    pub n_head: usize,
    /// KV heads (of the sliding layers for Gemma 4).
    pub n_head_kv: usize,
    /// Head size (of the sliding layers for Gemma 4).
    pub head_dim: usize,
    pub n_ff: usize,
    /// Embedding rows; the tokenizer is padded with `[PAD<i>]` tokens up to this like the
    /// converter does (Qwen2.5-7B pads 151936 → 152064), never truncated.
    pub n_vocab: usize,
    pub n_ctx: usize,
    pub rope_base: f32,
    pub rms_eps: f32,
    /// Output projection shared with the token embeddings (no `output.weight`).
    pub tied: bool,
    /// Vocabulary GGUF to copy `tokenizer.*` from (a file name searched by [`find_tokenizer`]).
    pub tokenizer: &'static str,
    /// Gemma: sliding window; every `swa_period`-th layer is global.
    pub sliding_window: usize,
    pub swa_period: usize,
    /// Gemma 3 linear RoPE scaling factor of the global layers (1 = none).
    pub rope_scale: f32,
    pub final_softcap: Option<f32>,
    /// Gemma 4 full-attention layers: head size, KV heads, `attention_k_eq_v`, rotary fraction.
    pub head_dim_full: usize,
    pub n_head_kv_full: usize,
    pub k_eq_v: bool,
    pub partial_rotary_full: f32,
    /// Gemma 4 MoE blocks (`enable_moe_block`): experts per layer (0: dense), experts per
    /// token, width of one expert.
    pub n_expert: usize,
    pub n_expert_used: usize,
    pub n_ff_exp: usize,
}

const BASE: Geometry = Geometry {
    name: "",
    source: "",
    family: Family::Llama,
    n_layer: 0,
    n_embd: 0,
    n_head: 0,
    n_head_kv: 0,
    head_dim: 0,
    n_ff: 0,
    n_vocab: 0,
    n_ctx: 4096,
    rope_base: 10000.0,
    rms_eps: 1e-5,
    tied: false,
    tokenizer: "",
    sliding_window: 0,
    swa_period: 0,
    rope_scale: 1.0,
    final_softcap: None,
    head_dim_full: 0,
    n_head_kv_full: 0,
    k_eq_v: false,
    partial_rotary_full: 1.0,
    n_expert: 0,
    n_expert_used: 0,
    n_ff_exp: 0,
};

/// The small Gemma 4 test shape (`gemma4-tiny`).
const GEMMA4_TINY: Geometry = Geometry {
    name: "gemma4-tiny",
    source: "(test shape)",
    family: Family::Gemma4,
    n_layer: 6,
    n_embd: 256,
    n_head: 4,
    n_head_kv: 2,
    head_dim: 64,
    n_ff: 512,
    n_vocab: 262144,
    n_ctx: 4096,
    rope_base: 1e6,
    rms_eps: 1e-6,
    tied: true,
    tokenizer: "ggml-vocab-gemma-4.gguf",
    sliding_window: 64,
    swa_period: 6,
    final_softcap: Some(30.0),
    head_dim_full: 128,
    n_head_kv_full: 1,
    k_eq_v: true,
    partial_rotary_full: 0.25,
    ..BASE
};

/// Every geometry `synth` knows. The numbers are the HF `config.json` values of the named
/// checkpoint. Gemma 4 31B: 60 layers (llama.cpp's 60-layer → 31B type), hidden 5376, 32 heads,
/// sliding layers 16 KV heads × 256, full layers `global_head_dim` 512 with
/// `num_global_key_value_heads` 4 and `attention_k_eq_v`, FFN 21504, window 1024, softcap 30, tied
/// 262144 vocabulary — 30.7B parameters, the published size (checked by a test).
static GEOMETRIES: &[Geometry] = &[
    // A few-MB llama for quick tests (SentencePiece Llama-2 vocab).
    Geometry {
        name: "llama-tiny",
        source: "(test shape)",
        n_layer: 2,
        n_embd: 256,
        n_head: 4,
        n_head_kv: 2,
        head_dim: 64,
        n_ff: 768,
        n_vocab: 32000,
        n_ctx: 2048,
        tokenizer: "ggml-vocab-llama-spm.gguf",
        ..BASE
    },
    // HuggingFaceTB/SmolLM2-135M-Instruct
    Geometry {
        name: "smollm2-135m",
        source: "HuggingFaceTB/SmolLM2-135M-Instruct",
        n_layer: 30,
        n_embd: 576,
        n_head: 9,
        n_head_kv: 3,
        head_dim: 64,
        n_ff: 1536,
        n_vocab: 49152,
        n_ctx: 8192,
        rope_base: 100000.0,
        tied: true,
        tokenizer: "SmolLM2-135M-Instruct.Q4_1.gguf",
        ..BASE
    },
    // meta-llama/Meta-Llama-3-8B (no rope scaling; 3.1 adds rope_freqs)
    Geometry {
        name: "llama3-8b",
        source: "meta-llama/Meta-Llama-3-8B",
        n_layer: 32,
        n_embd: 4096,
        n_head: 32,
        n_head_kv: 8,
        head_dim: 128,
        n_ff: 14336,
        n_vocab: 128256,
        n_ctx: 8192,
        rope_base: 500000.0,
        tokenizer: "ggml-vocab-llama-bpe.gguf",
        ..BASE
    },
    // Qwen/Qwen2.5-0.5B
    Geometry {
        name: "qwen2.5-0.5b",
        source: "Qwen/Qwen2.5-0.5B",
        family: Family::Qwen2,
        n_layer: 24,
        n_embd: 896,
        n_head: 14,
        n_head_kv: 2,
        head_dim: 64,
        n_ff: 4864,
        n_vocab: 151936,
        n_ctx: 32768,
        rope_base: 1e6,
        rms_eps: 1e-6,
        tied: true,
        tokenizer: "ggml-vocab-qwen2.gguf",
        ..BASE
    },
    // Qwen/Qwen2.5-7B
    Geometry {
        name: "qwen2.5-7b",
        source: "Qwen/Qwen2.5-7B",
        family: Family::Qwen2,
        n_layer: 28,
        n_embd: 3584,
        n_head: 28,
        n_head_kv: 4,
        head_dim: 128,
        n_ff: 18944,
        n_vocab: 152064,
        n_ctx: 32768,
        rope_base: 1e6,
        rms_eps: 1e-6,
        tokenizer: "ggml-vocab-qwen2.gguf",
        ..BASE
    },
    // google/gemma-3-270m
    Geometry {
        name: "gemma3-270m",
        source: "google/gemma-3-270m",
        family: Family::Gemma3,
        n_layer: 18,
        n_embd: 640,
        n_head: 4,
        n_head_kv: 1,
        head_dim: 256,
        n_ff: 2048,
        n_vocab: 262144,
        n_ctx: 32768,
        rope_base: 1e6,
        rms_eps: 1e-6,
        tied: true,
        tokenizer: "gemma-3-270m-q4_k_m.gguf",
        sliding_window: 512,
        swa_period: 6,
        ..BASE
    },
    // google/gemma-3-27b-it (vocab_size 262208 in config.json; the converter drops the 64 rows
    // beyond the tokenizer, so the GGUF has 262144)
    Geometry {
        name: "gemma3-27b",
        source: "google/gemma-3-27b-it",
        family: Family::Gemma3,
        n_layer: 62,
        n_embd: 5376,
        n_head: 32,
        n_head_kv: 16,
        head_dim: 128,
        n_ff: 21504,
        n_vocab: 262144,
        n_ctx: 131072,
        rope_base: 1e6,
        rms_eps: 1e-6,
        tied: true,
        tokenizer: "gemma-3-270m-q4_k_m.gguf",
        sliding_window: 1024,
        swa_period: 6,
        rope_scale: 8.0,
        ..BASE
    },
    // A small Gemma 4 (real vocabulary, 12B-style attention layout) for quick tests.
    GEMMA4_TINY,
    // gemma4-tiny with a MoE block in every layer (the GPU tests' MoE shape).
    Geometry {
        name: "gemma4-tiny-moe",
        n_expert: 8,
        n_expert_used: 2,
        n_ff_exp: 128,
        ..GEMMA4_TINY
    },
    // Gemma 4 26B-A4B (MoE: 128 experts of width 704, 8 per token, next to a dense MLP of 2112;
    // 25 sliding + 5 full layers). The numbers are third-party spec pages' (no config.json is
    // reachable here), consistent with the published 25.2B total / 3.8B active: a benchmark shape.
    Geometry {
        name: "gemma4-26b-a4b",
        source: "google/gemma-4-26B-A4B-it (approximate)",
        family: Family::Gemma4,
        n_layer: 30,
        n_embd: 2816,
        n_head: 16,
        n_head_kv: 8,
        head_dim: 256,
        n_ff: 2112,
        n_vocab: 262144,
        n_ctx: 262144,
        rope_base: 1e6,
        rms_eps: 1e-6,
        tied: true,
        tokenizer: "ggml-vocab-gemma-4.gguf",
        sliding_window: 1024,
        swa_period: 6,
        final_softcap: Some(30.0),
        head_dim_full: 512,
        n_head_kv_full: 2,
        k_eq_v: true,
        partial_rotary_full: 0.25,
        n_expert: 128,
        n_expert_used: 8,
        n_ff_exp: 704,
        ..BASE
    },
    // Gemma 4 12B (dense; 40 sliding + 8 full layers; shape from the seeds' notes, gem.md 2.1)
    Geometry {
        name: "gemma4-12b",
        source: "google/gemma-4-12B-it",
        family: Family::Gemma4,
        n_layer: 48,
        n_embd: 3840,
        n_head: 16,
        n_head_kv: 8,
        head_dim: 256,
        n_ff: 15360,
        n_vocab: 262144,
        n_ctx: 262144,
        rope_base: 1e6,
        rms_eps: 1e-6,
        tied: true,
        tokenizer: "ggml-vocab-gemma-4.gguf",
        sliding_window: 1024,
        swa_period: 6,
        final_softcap: Some(30.0),
        head_dim_full: 512,
        n_head_kv_full: 1,
        k_eq_v: true,
        partial_rotary_full: 0.25,
        ..BASE
    },
    // google/gemma-4-31B-it (dense; 50 sliding + 10 full layers)
    Geometry {
        name: "gemma4-31b",
        source: "google/gemma-4-31B-it",
        family: Family::Gemma4,
        n_layer: 60,
        n_embd: 5376,
        n_head: 32,
        n_head_kv: 16,
        head_dim: 256,
        n_ff: 21504,
        n_vocab: 262144,
        n_ctx: 262144,
        rope_base: 1e6,
        rms_eps: 1e-6,
        tied: true,
        tokenizer: "ggml-vocab-gemma-4.gguf",
        sliding_window: 1024,
        swa_period: 6,
        final_softcap: Some(30.0),
        head_dim_full: 512,
        n_head_kv_full: 4,
        k_eq_v: true,
        partial_rotary_full: 0.25,
        ..BASE
    },
];

/// All known geometries.
pub fn geometries() -> &'static [Geometry] {
    GEOMETRIES
}

/// Look a geometry up by name.
pub fn geometry(name: &str) -> Result<&'static Geometry> {
    GEOMETRIES.iter().find(|g| g.name == name).ok_or_else(|| {
        let names: Vec<_> = GEOMETRIES.iter().map(|g| g.name).collect();
        anyhow!(
            "unknown geometry '{}' (known: {})",
            name.escape_debug(),
            names.join(", ")
        )
    })
}

impl Geometry {
    /// Whether layer `il` is a sliding-window layer (Gemma: all but every `swa_period`-th).
    pub fn is_swa(&self, il: usize) -> bool {
        self.swa_period > 0 && !(il + 1).is_multiple_of(self.swa_period)
    }
    /// (head size, KV heads, has V projection) of layer `il`.
    fn attn_shape(&self, il: usize) -> (usize, usize, bool) {
        if self.family == Family::Gemma4 && !self.is_swa(il) {
            (self.head_dim_full, self.n_head_kv_full, !self.k_eq_v)
        } else {
            (self.head_dim, self.n_head_kv, true)
        }
    }
}

/// How tensors are quantized: one type for all matrices (with llama-quantize's rules for the
/// output tensor and the k-quant fallbacks), or one of llama.cpp's `_M` mixtures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QuantScheme {
    Mostly(GgmlType),
    Q4KM,
    Q5KM,
}

impl QuantScheme {
    /// Parse `f32`, `f16`, `bf16`, `q4_0`, `q4_1`, `q5_0`, `q5_1`, `q8_0`, `q4_k`, `q5_k`, `q6_k`,
    /// `q4_k_m`, `q5_k_m` (case-insensitive; `q4_k_s` = `q4_k`).
    pub fn parse(s: &str) -> Result<QuantScheme> {
        use GgmlType::*;
        Ok(match s.to_ascii_lowercase().as_str() {
            "q4_k_m" => QuantScheme::Q4KM,
            "q5_k_m" => QuantScheme::Q5KM,
            "q4_k_s" => QuantScheme::Mostly(Q4_K),
            "q5_k_s" => QuantScheme::Mostly(Q5_K),
            other => {
                let ty = [
                    F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K,
                ]
                .into_iter()
                .find(|t| t.name().eq_ignore_ascii_case(other))
                .ok_or_else(|| {
                    anyhow!(
                        "unsupported synth type '{}' (f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, \
                             q8_0, q4_k, q5_k, q6_k, q4_k_m, q5_k_m)",
                        s.escape_debug()
                    )
                })?;
                QuantScheme::Mostly(ty)
            }
        })
    }

    /// The matrix type most tensors get.
    pub fn base(self) -> GgmlType {
        match self {
            QuantScheme::Mostly(t) => t,
            QuantScheme::Q4KM => GgmlType::Q4_K,
            QuantScheme::Q5KM => GgmlType::Q5_K,
        }
    }

    /// `general.file_type` (llama.cpp's `llama_ftype`).
    pub fn file_type(self) -> Result<u32> {
        use GgmlType::*;
        Ok(match self {
            QuantScheme::Q4KM => 15,
            QuantScheme::Q5KM => 17,
            QuantScheme::Mostly(t) => match t {
                F32 => 0,
                F16 => 1,
                Q4_0 => 2,
                Q4_1 => 3,
                Q8_0 => 7,
                Q5_0 => 8,
                Q5_1 => 9,
                Q4_K => 14,
                Q5_K => 16,
                Q6_K => 18,
                BF16 => 32,
                other => bail!("synth cannot write {other} models"),
            },
        })
    }
}

/// What a tensor is, for type selection and initialization.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    TokenEmbd,
    Output,
    AttnV,
    FfnDown,
    Matrix,
    Norm,
    QNormScaled,
    Bias,
    One,
    RopeFreqs,
    /// A MoE router (llama-quantize keeps it in F32).
    Router,
}

/// llama.cpp's `use_more_bits` (which layers get more bits in the `_M` mixtures).
fn use_more_bits(i: usize, n: usize) -> bool {
    i < n / 8 || i >= 7 * n / 8 || (i as i64 - (n / 8) as i64) % 3 == 2
}

/// llama-quantize's replacement when a row is not a multiple of the type's block size.
pub(crate) fn fallback(ty: GgmlType, ne0: usize) -> GgmlType {
    if ne0.is_multiple_of(ty.block_size()) {
        return ty;
    }
    let f = match ty {
        GgmlType::Q4_K => GgmlType::Q5_0,
        GgmlType::Q5_K => GgmlType::Q5_1,
        GgmlType::Q6_K => GgmlType::Q8_0,
        other => other,
    };
    if ne0.is_multiple_of(f.block_size()) {
        f
    } else {
        GgmlType::F16
    }
}

/// The type of a tensor under `scheme` (llama-quantize's default, non-imatrix choices).
/// `idx`/`count`: position among the tensors of the same role (attn_v, ffn_down).
///
/// llama-quantize counts those tensors in *file order*; files converted from safetensors often
/// list layers lexicographically (0, 1, 10, 11, …), which moves the `_M` mixtures' Q6_K layers
/// around. Here the count follows the layer number: the same number of Q6_K tensors (same size
/// and speed), possibly on different layers than a given real file.
fn tensor_type(
    scheme: QuantScheme,
    role: Role,
    tied: bool,
    ne0: usize,
    idx: usize,
    count: usize,
) -> GgmlType {
    let base = scheme.base();
    let float = matches!(base, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
    let ty = match role {
        Role::Norm
        | Role::QNormScaled
        | Role::Bias
        | Role::One
        | Role::RopeFreqs
        | Role::Router => return GgmlType::F32,
        _ if float => return base,
        Role::Output => {
            if !ne0.is_multiple_of(QK_K) || base == GgmlType::Q8_0 {
                GgmlType::Q8_0
            } else {
                GgmlType::Q6_K
            }
        }
        Role::TokenEmbd if tied => {
            return tensor_type(scheme, Role::Output, tied, ne0, idx, count);
        }
        Role::AttnV | Role::FfnDown
            if scheme != QuantScheme::Mostly(base) && use_more_bits(idx, count) =>
        {
            GgmlType::Q6_K
        }
        _ => base,
    };
    fallback(ty, ne0)
}

/// One tensor of the plan.
struct Planned {
    name: String,
    dims: Vec<u64>,
    role: Role,
    /// Per-role index and count (for `use_more_bits`).
    idx: usize,
}

/// The converter's tensor list for a geometry, in its order.
fn plan(g: &Geometry) -> Vec<Planned> {
    let mut v = Vec::new();
    let mut push = |name: String, dims: &[usize], role: Role| {
        v.push(Planned {
            name,
            dims: dims.iter().map(|&d| d as u64).collect(),
            role,
            idx: 0,
        })
    };
    let (d, f) = (g.n_embd, g.n_ff);
    let gemma = matches!(g.family, Family::Gemma3 | Family::Gemma4);
    if g.family == Family::Gemma4 {
        push(
            "rope_freqs.weight".into(),
            &[g.head_dim_full / 2],
            Role::RopeFreqs,
        );
    }
    push("token_embd.weight".into(), &[d, g.n_vocab], Role::TokenEmbd);
    for il in 0..g.n_layer {
        let n = |s: &str| format!("blk.{il}.{s}.weight");
        let (hd, kv, has_v) = g.attn_shape(il);
        let qd = g.n_head * hd;
        push(n("attn_norm"), &[d], Role::Norm);
        if g.family == Family::Gemma4 {
            push(n("layer_output_scale"), &[1], Role::One);
        }
        push(n("ffn_down"), &[f, d], Role::FfnDown);
        push(n("ffn_gate"), &[d, f], Role::Matrix);
        push(n("ffn_up"), &[d, f], Role::Matrix);
        if gemma {
            push(n("post_attention_norm"), &[d], Role::Norm);
            push(n("post_ffw_norm"), &[d], Role::Norm);
        }
        push(n("ffn_norm"), &[d], Role::Norm);
        if g.n_expert > 0 {
            let (e, i) = (g.n_expert, g.n_ff_exp);
            push(n("ffn_gate_inp"), &[d, e], Role::Router);
            push(format!("blk.{il}.ffn_gate_inp.scale"), &[d], Role::Norm);
            push(format!("blk.{il}.ffn_down_exps.scale"), &[e], Role::Norm);
            push(n("ffn_gate_up_exps"), &[d, 2 * i, e], Role::Matrix);
            push(n("ffn_down_exps"), &[i, d, e], Role::Matrix);
            for s in ["pre_ffw_norm_2", "post_ffw_norm_1", "post_ffw_norm_2"] {
                push(n(s), &[d], Role::Norm);
            }
        }
        if gemma {
            push(n("attn_k_norm"), &[hd], Role::Norm);
        }
        push(n("attn_k"), &[d, kv * hd], Role::Matrix);
        push(n("attn_output"), &[qd, d], Role::Matrix);
        if gemma {
            let role = if g.family == Family::Gemma4 {
                Role::QNormScaled
            } else {
                Role::Norm
            };
            push(n("attn_q_norm"), &[hd], role);
        }
        push(n("attn_q"), &[d, qd], Role::Matrix);
        if has_v {
            push(n("attn_v"), &[d, kv * hd], Role::AttnV);
        }
        if g.family == Family::Qwen2 {
            let b = |s: &str| format!("blk.{il}.{s}.bias");
            push(b("attn_q"), &[qd], Role::Bias);
            push(b("attn_k"), &[kv * hd], Role::Bias);
            push(b("attn_v"), &[kv * hd], Role::Bias);
        }
    }
    push("output_norm.weight".into(), &[d], Role::Norm);
    if !g.tied {
        push("output.weight".into(), &[d, g.n_vocab], Role::Output);
    }
    for role in [Role::AttnV, Role::FfnDown] {
        for (i, t) in v.iter_mut().filter(|t| t.role == role).enumerate() {
            t.idx = i;
        }
    }
    v
}

/// Metadata of the architecture (everything but `tokenizer.*`), in the converter's order.
fn arch_metadata(g: &Geometry, scheme: QuantScheme, seed: u64) -> Result<Vec<(String, Value)>> {
    let a = g.family.arch();
    let mut m: Vec<(String, Value)> = Vec::new();
    let mut kv = |k: &str, v: Value| {
        let key = if k.starts_with("general.") {
            k.to_string()
        } else {
            format!("{a}.{k}")
        };
        m.push((key, v));
    };
    let u = |x: usize| Value::U32(x as u32);
    kv("general.architecture", Value::String(a.into()));
    kv("general.type", Value::String("model".into()));
    kv(
        "general.name",
        Value::String(format!("vela synth {} seed {seed}", g.name)),
    );
    kv("block_count", u(g.n_layer));
    kv("context_length", u(g.n_ctx));
    kv("embedding_length", u(g.n_embd));
    kv("feed_forward_length", u(g.n_ff));
    kv("attention.head_count", u(g.n_head));
    if g.family == Family::Gemma4 {
        let kvs = (0..g.n_layer).map(|il| u(g.attn_shape(il).1)).collect();
        kv("attention.head_count_kv", Value::Array(kvs));
        kv("rope.freq_base", Value::F32(g.rope_base));
        kv("rope.freq_base_swa", Value::F32(10000.0));
    } else {
        kv("attention.head_count_kv", u(g.n_head_kv));
        kv("rope.freq_base", Value::F32(g.rope_base));
    }
    kv("attention.layer_norm_rms_epsilon", Value::F32(g.rms_eps));
    match g.family {
        Family::Llama => {
            kv("vocab_size", u(g.n_vocab));
            kv("rope.dimension_count", u(g.head_dim));
        }
        Family::Qwen2 => {}
        Family::Gemma3 => {
            kv("attention.key_length", u(g.head_dim));
            kv("attention.value_length", u(g.head_dim));
            kv("attention.sliding_window", u(g.sliding_window));
            if g.rope_scale != 1.0 {
                kv("rope.scaling.type", Value::String("linear".into()));
                kv("rope.scaling.factor", Value::F32(g.rope_scale));
            }
        }
        Family::Gemma4 => {
            kv("attention.key_length", u(g.head_dim_full));
            kv("attention.value_length", u(g.head_dim_full));
            if let Some(c) = g.final_softcap {
                kv("final_logit_softcapping", Value::F32(c));
            }
            kv("attention.sliding_window", u(g.sliding_window));
            kv("attention.shared_kv_layers", u(0));
            kv("embedding_length_per_layer_input", u(0));
            let pat = (0..g.n_layer).map(|il| Value::Bool(g.is_swa(il))).collect();
            kv("attention.sliding_window_pattern", Value::Array(pat));
            kv("attention.key_length_swa", u(g.head_dim));
            kv("attention.value_length_swa", u(g.head_dim));
            kv("rope.dimension_count", u(g.head_dim_full));
            kv("rope.dimension_count_swa", u(g.head_dim));
            if g.n_expert > 0 {
                kv("expert_count", u(g.n_expert));
                kv("expert_used_count", u(g.n_expert_used));
                kv("expert_feed_forward_length", u(g.n_ff_exp));
            }
        }
    }
    kv("general.file_type", Value::U32(scheme.file_type()?));
    kv("general.quantization_version", Value::U32(2));
    Ok(m)
}

/// Find a tokenizer source file by name: `$VELA_CACHE/vocab/`, the real-model directory, then
/// the llama.cpp source tree's `models/` (where the `ggml-vocab-*.gguf` files live).
pub fn find_tokenizer(name: &str) -> Result<PathBuf> {
    use vela_formats::testdata::{cache_dir, llama_cpp_src, models_dir};
    let dirs = [
        cache_dir().join("vocab"),
        models_dir(),
        llama_cpp_src().join("models"),
    ];
    dirs.iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            anyhow!(
                "tokenizer source {name} not found in {} (pass a tokenizer GGUF explicitly)",
                dirs.iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        })
}

/// The `tokenizer.*` metadata of `src`, with the token arrays padded to `n_vocab` the way the
/// converter pads a vocabulary smaller than the embedding (`[PAD<i>]`, type UNUSED, score 0).
pub(crate) fn tokenizer_metadata(src: &GgufFile, n_vocab: usize) -> Result<Vec<(String, Value)>> {
    let n_tok = src.get_array("tokenizer.ggml.tokens")?.len();
    if n_tok > n_vocab {
        bail!("the tokenizer has {n_tok} tokens but the geometry only {n_vocab} embedding rows");
    }
    let mut out = Vec::new();
    for k in src.key_order.iter().filter(|k| k.starts_with("tokenizer.")) {
        let mut v = src.get(k).cloned().unwrap();
        let pad: Option<fn(usize) -> Value> = match k.as_str() {
            "tokenizer.ggml.tokens" => Some(|i| Value::String(format!("[PAD{i}]"))),
            "tokenizer.ggml.scores" => Some(|_| Value::F32(0.0)),
            "tokenizer.ggml.token_type" => Some(|_| Value::I32(5)),
            _ => None,
        };
        if let (Value::Array(a), Some(f)) = (&mut v, pad) {
            if a.len() == n_tok {
                a.extend((n_tok..n_vocab).map(f));
            }
        }
        out.push((k.clone(), v));
    }
    Ok(out)
}

/// Write a vocabulary-only GGUF with the `general.*` and `tokenizer.*` metadata of `src` (no
/// tensors): a few MB to carry to a machine that lacks the full model the tokenizer came from.
pub fn write_vocab_only(src: &Path, dst: &Path) -> Result<()> {
    let g = GgufFile::open(src)?;
    let mut w = GgufWriter::new();
    for k in &g.key_order {
        let keep =
            k.starts_with("tokenizer.") || k == "general.architecture" || k == "general.name";
        if keep {
            w.add_kv(k.clone(), g.get(k).cloned().unwrap())?;
        }
    }
    w.write_file(dst, |_, _, _| Ok(()))?;
    Ok(())
}

/// SplitMix64 finalizer.
#[inline]
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The per-tensor stream key: FNV-1a of the name mixed with the seed.
pub(crate) fn tensor_key(seed: u64, name: &str) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for b in name.bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix64(h ^ mix64(seed.wrapping_add(0x9e37_79b9_7f4a_7c15)))
}

/// Irwin–Hall normal approximation for counter `j` of stream `key`: four 16-bit uniforms summed,
/// centred and scaled to unit variance (sum of 4 U(0,1) has variance 1/3).
#[inline]
pub(crate) fn normal(key: u64, j: u64) -> f32 {
    let h = mix64(key ^ j.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let s = (h & 0xffff) + ((h >> 16) & 0xffff) + ((h >> 32) & 0xffff) + (h >> 48);
    // (s + 2) / 65536 is the sum of four uniforms on (0, 1); its mean is 2.
    const SCALE: f32 = 1.732_050_8 / 65536.0;
    (s as f32 - 131_070.0) * SCALE
}

/// Fill `out` with elements `first..first + out.len()` of a tensor.
fn gen_values(role: Role, std: f32, g: &Geometry, key: u64, first: u64, out: &mut [f32]) {
    for (i, x) in out.iter_mut().enumerate() {
        let j = first + i as u64;
        *x = match role {
            Role::One => 1.0,
            Role::RopeFreqs => {
                // Proportional RoPE: the first ⌊p·hd/2⌋ frequencies rotate, the rest are frozen
                // by a huge divisor (what convert_hf_to_gguf.py writes for Gemma 4).
                let n_rot = (g.head_dim_full as f32 * g.partial_rotary_full / 2.0) as u64;
                if j < n_rot {
                    1.0
                } else {
                    1e30
                }
            }
            Role::Norm => 1.0 + 0.02 * normal(key, j),
            Role::QNormScaled => std * (1.0 + 0.02 * normal(key, j)),
            _ => std * normal(key, j),
        };
    }
}

/// Standard deviation (or, for the Gemma 4 q-norm, the mean) of a tensor's values.
fn value_std(role: Role, dims: &[u64], g: &Geometry, hd: u64) -> f32 {
    match role {
        Role::TokenEmbd => 1.0 / (g.n_embd as f32).sqrt(),
        Role::Bias => 0.02,
        Role::QNormScaled => 1.0 / (hd as f32).sqrt(),
        _ => 1.0 / (dims[0] as f32).sqrt(),
    }
}

/// Options beyond the four essentials.
#[derive(Clone, Debug, Default)]
pub struct SynthOptions {
    /// Tokenizer source GGUF (default: the geometry's file found by [`find_tokenizer`]).
    pub tokenizer: Option<PathBuf>,
    /// Worker threads (default: all cores).
    pub threads: Option<usize>,
}

/// Progress callback: (bytes written so far, total file size).
pub type Progress<'a> = &'a mut dyn FnMut(u64, u64);

/// Write a random-weight GGUF of `geometry` with every matrix in `qtype` (llama-quantize rules for
/// the output tensor and k-quant fallbacks), deterministic from `seed`. See [`synth_with`].
pub fn synth(
    geometry: &str,
    qtype: GgmlType,
    seed: u64,
    out: &Path,
    progress: Progress,
) -> Result<()> {
    synth_with(
        geometry,
        QuantScheme::Mostly(qtype),
        seed,
        out,
        &SynthOptions::default(),
        progress,
    )
}

/// [`synth`] with a quantization mixture and options.
pub fn synth_with(
    geometry: &str,
    scheme: QuantScheme,
    seed: u64,
    out: &Path,
    opts: &SynthOptions,
    progress: Progress,
) -> Result<()> {
    let g = self::geometry(geometry)?;
    scheme.file_type()?;
    let tok_path = match &opts.tokenizer {
        Some(p) => p.clone(),
        None => find_tokenizer(g.tokenizer)?,
    };
    let tok = GgufFile::open(&tok_path)
        .with_context(|| format!("reading the tokenizer of {}", tok_path.display()))?;
    let mut w = GgufWriter::new();
    for (k, v) in arch_metadata(g, scheme, seed)? {
        w.add_kv(k, v)?;
    }
    for (k, v) in tokenizer_metadata(&tok, g.n_vocab)? {
        w.add_kv(k, v)?;
    }
    let planned = plan(g);
    let counts = |r: Role| planned.iter().filter(|t| t.role == r).count();
    let (n_v, n_down) = (counts(Role::AttnV), counts(Role::FfnDown));
    for t in &planned {
        let count = if t.role == Role::AttnV { n_v } else { n_down };
        let ty = tensor_type(scheme, t.role, g.tied, t.dims[0] as usize, t.idx, count);
        w.add_tensor(t.name.clone(), &t.dims, ty)?;
    }
    let threads = opts
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let total = w.file_size();
    let header = w.header_bytes().len() as u64;
    let mut done = header;
    progress(done, total);
    w.write_file(out, |i, spec, sink| {
        let p = &planned[i];
        let hd = if p.role == Role::QNormScaled {
            p.dims[0]
        } else {
            0
        };
        let std = value_std(p.role, &p.dims, g, hd);
        let key = tensor_key(seed, &spec.name);
        write_tensor(spec, p.role, std, g, key, threads, sink, &mut |n| {
            done += n;
            progress(done, total);
        })
    })?;
    progress(total, total);
    Ok(())
}

/// Generate, quantize and stream one tensor in chunks of rows, `threads` rows-ranges at a time.
#[allow(clippy::too_many_arguments)]
fn write_tensor(
    spec: &TensorSpec,
    role: Role,
    std: f32,
    g: &Geometry,
    key: u64,
    threads: usize,
    sink: &mut dyn Write,
    advanced: &mut dyn FnMut(u64),
) -> Result<()> {
    let ne0 = spec.ne0();
    let rows = spec.n_rows();
    let row_bytes = spec.ty.row_bytes(ne0 as u64).unwrap() as usize;
    // About 4M elements per chunk: large enough to keep every thread busy, small in memory.
    let chunk_rows = ((1 << 22) / ne0).clamp(1, rows);
    let mut buf = vec![0u8; chunk_rows * row_bytes];
    let mut r0 = 0;
    while r0 < rows {
        let nr = chunk_rows.min(rows - r0);
        let out = &mut buf[..nr * row_bytes];
        quantize_rows(spec.ty, ne0, r0 as u64, threads, out, &|row, vals| {
            gen_values(role, std, g, key, row * ne0 as u64, vals)
        })?;
        sink.write_all(out)?;
        advanced(out.len() as u64);
        r0 += nr;
    }
    Ok(())
}

#[path = "synth_values.rs"]
mod values;
pub(crate) use values::{normal_weight, quantize_rows};

#[cfg(test)]
#[path = "synth_tests.rs"]
mod tests;
