//! Loading a model + tokenizer from the command line's `--model`, shared by the subcommands.

use anyhow::Result;
use clap::Args;
use std::path::PathBuf;
use std::sync::Arc;
use vela_compute::KvType;
use vela_engine::loader::LoadOptions;
use vela_engine::{SamplerConfig, Session, SessionOptions};
use vela_models::LanguageModel;
use vela_tokenizer::Tokenizer;

/// Options every model-running command takes.
#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// GGUF file, Hugging Face checkpoint directory (Gemma 4), a known model name
    /// (default: Qwen2.5-Coder-0.5B-Instruct, fetched on first use), or synth:GEOMETRY[:TYPE[:SEED]]:
    /// random weights generated in memory (qwen3.8-flash-next[-12l], qwen4exp-tiny,
    /// deepseek-v4-flash[-12l], deepseek-v4-tiny, each with -dspark for its DSpark drafter,
    /// glm5-flash[-12l], glm5-tiny; TYPE default q4_0).
    #[arg(long, short = 'm')]
    pub model: Option<String>,
    /// Where to run: cpu, cuda, cuda:N, or auto (a usable CUDA GPU, else the CPU).
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Convert the model's F32/F16/BF16 matrices to this type at load (q8_0, q4_k, q4_0, ...;
    /// quantized tensors are used as they are).
    #[arg(long)]
    pub quant: Option<String>,
    /// Where routed experts of MoE models go: gpu, cpu (host memory, run by the CPU), auto
    /// (on the GPU while they fit, the rest in host memory; on the CPU backend: used in place
    /// from the file when a repacked copy would not fit), or N (the first N MoE layers' in host
    /// memory).
    #[arg(long, default_value = "auto")]
    pub experts: String,
    /// GPU memory the model may use, in GiB (default: all that is free).
    #[arg(long)]
    pub gpu_mem: Option<f64>,
    /// GPU memory for the cache of the most used host-memory experts, in GiB, all layers
    /// together (default: what the budget leaves; 0: no cache).
    #[arg(long)]
    pub expert_cache: Option<f64>,
    /// Worker threads (default: all cores).
    #[arg(long, short = 't', default_value_t = 0)]
    pub threads: usize,
    /// Context size in tokens (default: the model's, capped at 8192).
    #[arg(long, short = 'c', default_value_t = 0)]
    pub ctx: usize,
    /// Prefill chunk size in tokens.
    #[arg(long, default_value_t = 512)]
    pub ubatch: usize,
    /// KV cache type: f16, bf16 or f32.
    #[arg(long, default_value = "f16")]
    pub kv_type: String,
}

/// Sampling options.
#[derive(Args, Clone, Debug)]
pub struct SampleArgs {
    /// Maximum number of tokens to generate.
    #[arg(long, short = 'n', default_value_t = 256)]
    pub max_tokens: usize,
    /// Sampling temperature; 0 = greedy.
    #[arg(long, default_value_t = 0.8)]
    pub temperature: f32,
    #[arg(long, default_value_t = 40)]
    pub top_k: usize,
    #[arg(long, default_value_t = 0.95)]
    pub top_p: f32,
    #[arg(long, default_value_t = 0.05)]
    pub min_p: f32,
    #[arg(long, default_value_t = 1.0)]
    pub repeat_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// RNG seed (same seed + settings → same output).
    #[arg(long, default_value_t = 0xC0FFEE)]
    pub seed: u64,
}

impl SampleArgs {
    pub fn config(&self) -> anyhow::Result<SamplerConfig> {
        if self.max_tokens == 0 {
            anyhow::bail!("--max-tokens must be at least 1");
        }
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            anyhow::bail!("--temperature must be a finite number ≥ 0");
        }
        if !(0.0..=1.0).contains(&self.top_p) || !(0.0..=1.0).contains(&self.min_p) {
            anyhow::bail!("--top-p and --min-p must be within [0, 1]");
        }
        Ok(SamplerConfig {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            ..Default::default()
        })
    }
}

pub struct Loaded {
    pub path: PathBuf,
    pub model: Arc<dyn LanguageModel>,
    pub tokenizer: Tokenizer,
    pub chat_template: Option<String>,
    /// BOS/EOS texts for the chat template.
    pub bos_eos: (String, String),
    pub opts: SessionOptions,
}

impl Loaded {
    pub fn session(&self) -> Result<Session> {
        Session::new(self.model.clone(), &self.opts)
    }
}

/// Resolve `--model` (fetching the default model if needed) to a path; an existing directory
/// (a Hugging Face checkpoint) is taken as it is.
pub fn resolve(model: Option<&str>) -> Result<PathBuf> {
    if let Some(m) = model {
        let p = PathBuf::from(m);
        if p.is_dir() || m.starts_with("synth:") {
            return Ok(p);
        }
    }
    vela_hub::resolve_model(model)
}

/// The load options of the model flags.
pub fn load_options(a: &ModelArgs) -> Result<LoadOptions> {
    LoadOptions::from_flags(
        a.threads,
        &a.device,
        a.quant.as_deref(),
        &a.experts,
        a.gpu_mem,
        a.expert_cache,
    )
}

/// Load the GGUF, the tokenizer and the model.
pub fn load(a: &ModelArgs) -> Result<Loaded> {
    let path = resolve(a.model.as_deref())?;
    let lo = load_options(a)?;
    let m = vela_engine::loader::load(&path, &lo)?;
    let bos_eos = m.bos_eos_text();
    let (model, tokenizer, chat_template) = (m.model, m.tokenizer, m.chat_template);
    let Some(kv_type) = KvType::parse(&a.kv_type) else {
        anyhow::bail!("unknown --kv-type '{}' (f16, bf16 or f32)", a.kv_type);
    };
    if a.ubatch == 0 {
        anyhow::bail!("--ubatch must be at least 1");
    }
    let opts = SessionOptions {
        n_ctx: a.ctx,
        ubatch: a.ubatch,
        kv_type,
    };
    Ok(Loaded {
        path,
        model,
        tokenizer,
        chat_template,
        bos_eos,
        opts,
    })
}
