//! Loading a model with its tokenizer and chat template onto a device (shared by the CLI and the
//! server): a GGUF file (every supported architecture) or a Hugging Face checkpoint directory
//! (`config.json` + safetensors + `tokenizer.json` + chat template; Gemma 4).

use anyhow::{anyhow, bail, Context, Result};
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_compute::Backend;
use vela_formats::gguf::GgufFile;
use vela_formats::quant::GgmlType;
use vela_models::placement::{self, ExpertsMode, HostExperts, Plan, Sizes};
use vela_models::{LanguageModel, LoadSpec};
use vela_tokenizer::Tokenizer;

/// Where the weights go (`--device`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Device {
    /// CUDA GPU 0 when one is usable (driver, GPU and NVRTC found), else the CPU.
    #[default]
    Auto,
    Cpu,
    /// A CUDA GPU by ordinal.
    Cuda(usize),
}

impl FromStr for Device {
    type Err = anyhow::Error;
    fn from_str(s: &str) -> Result<Device> {
        match s {
            "auto" => Ok(Device::Auto),
            "cpu" => Ok(Device::Cpu),
            "cuda" | "gpu" => Ok(Device::Cuda(0)),
            _ => {
                if let Some(n) = s.strip_prefix("cuda:") {
                    let n = n
                        .parse()
                        .map_err(|_| anyhow!("bad device '{s}': expected cuda:N"))?;
                    return Ok(Device::Cuda(n));
                }
                bail!("unknown device '{s}' (cpu, cuda, cuda:N or auto)")
            }
        }
    }
}

/// Parse a `--quant` value (`q8_0`, `q4_k`, ...): [`LoadOptions::quant`].
pub use vela_models::weights::parse_load_type as parse_quant;

/// How to load a model.
#[derive(Clone, Debug, Default)]
pub struct LoadOptions {
    /// CPU threads (0 = all cores); also used by the CPU work of a GPU run.
    pub threads: usize,
    pub device: Device,
    /// `--quant`: convert the float matrices to this type at load (`vela_models::weights`).
    pub quant: Option<GgmlType>,
    /// `--experts`: where routed experts go (`vela_models::placement`).
    pub experts: ExpertsMode,
    /// `--gpu-mem`: bytes of GPU memory the model may use (default: what is free).
    pub gpu_mem: Option<u64>,
    /// `--expert-cache`: bytes of GPU memory for the cache of hot host-memory experts, all
    /// layers together (default: what the budget leaves after the plan).
    pub expert_cache: Option<u64>,
}

impl LoadOptions {
    /// From the command-line flags every command shares: `--threads`, `--device`, `--quant`,
    /// `--experts` (gpu, cpu, auto or a number of layers), `--gpu-mem` and `--expert-cache`
    /// (GiB).
    pub fn from_flags(
        threads: usize,
        device: &str,
        quant: Option<&str>,
        experts: &str,
        gpu_mem: Option<f64>,
        expert_cache: Option<f64>,
    ) -> Result<LoadOptions> {
        let gib = |flag: &str, v: Option<f64>, zero_ok: bool| -> Result<Option<u64>> {
            match v {
                Some(g) if !(g.is_finite() && (g > 0.0 || zero_ok && g == 0.0)) => {
                    bail!("--{flag} must be a positive number of GiB, not {g}")
                }
                g => Ok(g.map(|g| (g * (1u64 << 30) as f64) as u64)),
            }
        };
        Ok(LoadOptions {
            threads,
            device: device.parse()?,
            quant: quant.map(parse_quant).transpose()?,
            experts: experts.parse()?,
            gpu_mem: gib("gpu-mem", gpu_mem, false)?,
            expert_cache: gib("expert-cache", expert_cache, true)?,
        })
    }
}

/// GPU memory the experts placement leaves free for the sequence state and scratch.
pub const GPU_RESERVE: u64 = 3 << 30;

/// The loaded bytes of the model at `path` (a GGUF file, a checkpoint directory or a
/// `synth:` DeepSeek V4 or GLM 5 geometry) per MoE layer's routed experts and the rest; `None` where
/// they are not known before loading (other `synth:` geometries).
pub fn model_sizes(path: &Path, quant: Option<GgmlType>) -> Result<Option<Sizes>> {
    let one = |ty: GgmlType, cols: usize, rows: usize, stored: u64| {
        vela_models::weights::loaded_bytes(std::iter::once((ty, cols, rows, stored)), quant)
    };
    if let Some(spec) = path.to_str().and_then(|s| s.strip_prefix("synth:")) {
        let (geometry, ty, _) = synth_spec(spec)?;
        use vela_models::{deepseekv4::synth as d4, glm5::synth as g5};
        if g5::is_geometry(geometry) {
            return g5::sizes(geometry, ty).map(Some);
        }
        return d4::is_geometry(geometry)
            .then(|| d4::sizes(geometry, ty))
            .transpose();
    }
    if path.is_dir() {
        let cp = vela_formats::safetensors::Checkpoint::open(path)?;
        let list: Vec<(String, u64)> = cp
            .files
            .iter()
            .flat_map(|f| f.tensors.iter())
            .map(|(name, e)| {
                let cols = e.shape.last().copied().unwrap_or(1);
                let rows = e.shape.iter().rev().skip(1).product();
                (
                    name.clone(),
                    one(e.dtype.ggml(), cols, rows, (e.end - e.start) as u64),
                )
            })
            .collect();
        return Ok(Some(Sizes::from_tensors(
            list.iter().map(|(n, b)| (n.as_str(), *b)),
        )));
    }
    Ok(Some(gguf_sizes(&GgufFile::open(path)?, quant)))
}

/// The experts placement for a model of `sizes` on a device with `free` bytes of memory (a
/// GPU's, or the host's for the CPU backend), as `opts` asks. On the CPU, experts "in host
/// memory" are used where they lie in the file instead of repacked (`auto`: when a repacked
/// copy would not fit the free memory twice over).
pub fn plan_experts(
    sizes: &Sizes,
    opts: &LoadOptions,
    gpu: bool,
    free: Option<u64>,
) -> Result<Plan> {
    if gpu {
        let cap = match (free, opts.gpu_mem) {
            (Some(f), Some(c)) => Some(f.min(c)),
            (f, c) => f.or(c),
        };
        // The reserve only where there is a choice to make: a dense model, or every expert on
        // the GPU, is checked against free memory as before (`upload_checked`'s margin).
        let reserve = if sizes.experts.is_empty() || opts.experts == ExpertsMode::Gpu {
            0
        } else {
            GPU_RESERVE
        };
        let mut p = placement::plan(sizes, opts.experts, cap.map(|c| c.saturating_sub(reserve)))?;
        if let (Some(c), n) = (opts.expert_cache, p.host_layers.len()) {
            p.cache_bytes = p.cache_bytes.min(c / n.max(1) as u64);
        }
        return Ok(p);
    }
    let mode = match opts.experts {
        ExpertsMode::Auto => match free {
            Some(f) if 2 * sizes.total() > f => ExpertsMode::Cpu,
            _ => ExpertsMode::Gpu,
        },
        m => m,
    };
    placement::plan(sizes, mode, None)
}

/// The [`LoadSpec`] of `plan` (host experts run by `cpu`), printing the plan when the model
/// has routed experts.
fn spec_of(
    gpu: bool,
    sizes: Option<&Sizes>,
    plan: Option<&Plan>,
    quant: Option<GgmlType>,
    cpu: impl FnOnce() -> Arc<CpuBackend>,
) -> LoadSpec {
    let mut spec = LoadSpec::quant(quant);
    if let (Some(s), Some(p)) = (sizes, plan) {
        if !s.experts.is_empty() {
            eprintln!("{}", p.describe(s, gpu));
        }
        if !p.host_layers.is_empty() {
            spec.host_experts = Some(HostExperts::new(
                cpu(),
                p.host_layers.clone(),
                p.cache_bytes,
            ));
        }
    }
    spec
}

/// A model ready to serve: weights on a backend, tokenizer, chat template.
pub struct LoadedModel {
    pub path: PathBuf,
    /// The GGUF file when the model came from one.
    pub gguf: Option<Arc<GgufFile>>,
    pub model: Arc<dyn LanguageModel>,
    pub tokenizer: Tokenizer,
    /// The model's own Jinja chat template, if it has one.
    pub chat_template: Option<String>,
    /// BOS/EOS token texts for the template when the tokenizer config names them.
    special_texts: Option<(String, String)>,
}

impl LoadedModel {
    /// A short name for APIs (`/v1/models`): the file stem, or the directory name.
    pub fn name(&self) -> String {
        self.path
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "model".into())
    }
    /// Text of the BOS/EOS tokens for chat templates ("" when absent).
    pub fn bos_eos_text(&self) -> (String, String) {
        if let Some(t) = &self.special_texts {
            return t.clone();
        }
        let t = |id: Option<u32>| {
            id.and_then(|i| self.tokenizer.token_text(i))
                .unwrap_or_default()
        };
        (t(self.tokenizer.bos()), t(self.tokenizer.eos()))
    }
}

/// Load a GGUF file or a Hugging Face checkpoint directory onto the chosen device; or generate
/// a model in memory: `synth:GEOMETRY[:TYPE[:SEED]]` ([`load_synth`]).
pub fn load(path: &Path, opts: &LoadOptions) -> Result<LoadedModel> {
    if let Some(spec) = path.to_str().and_then(|s| s.strip_prefix("synth:")) {
        return load_synth(spec, opts);
    }
    if path.is_dir() {
        return load_hf_dir(path, opts);
    }
    let gguf = Arc::new(GgufFile::open(path)?);
    let tokenizer = Tokenizer::from_gguf(&gguf).context("cannot load the tokenizer")?;
    let sizes = gguf_sizes(&gguf, opts.quant);
    let model = on_device(opts, |be| {
        load_placed(be, opts, Some(sizes), |be, spec| match be {
            AnyBackend::Cpu(b) => vela_models::load_gguf_spec(b, gguf.clone(), spec),
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(b) => vela_models::load_gguf_spec(b, gguf.clone(), spec),
        })
    })?;
    let chat_template = gguf
        .get_str("tokenizer.chat_template")
        .ok()
        .map(str::to_string);
    Ok(LoadedModel {
        path: path.to_path_buf(),
        gguf: Some(gguf),
        model,
        tokenizer,
        chat_template,
        special_texts: None,
    })
}

/// `synth:GEOMETRY[:TYPE[:SEED]]`: a geometry of `vela_models::qwen4exp::synth`,
/// `vela_models::deepseekv4::synth` or `vela_models::glm5::synth` with random weights generated
/// in memory (matrices in TYPE, default q4_0; seed default 1), for measuring real sizes without a
/// file; the tokenizer is llama.cpp's `ggml-vocab-qwen35.gguf` or `ggml-vocab-deepseek-llm.gguf`
/// (found as `vela synth` finds vocabularies; DeepSeek V3/V4's own vocabulary is not among them),
/// for GLM 5 the one its `vela synth` file carries (`glm5::synth_gguf::vocabulary`).
pub fn load_synth(spec: &str, opts: &LoadOptions) -> Result<LoadedModel> {
    let (geometry, ty, seed) = synth_spec(spec)?;
    use vela_models::deepseekv4::{synth as d4synth, DeepseekV4Model};
    use vela_models::glm5::{synth as g5synth, synth_gguf as g5gguf, Glm5Model};
    let deepseek = d4synth::is_geometry(geometry);
    let glm5 = g5synth::is_geometry(geometry);
    if !deepseek && !glm5 {
        vela_models::qwen4exp::synth::config(geometry).map_err(|e| {
            anyhow!(
                "{e:#}; or a deepseek_v4 one ({}), or a glm5_next one ({})",
                d4synth::GEOMETRIES.join(", "),
                g5synth::GEOMETRIES.join(", ")
            )
        })?;
    }
    let vocab = if glm5 {
        g5gguf::vocabulary(geometry)?
    } else {
        let path = vela_models::synth::find_tokenizer(if deepseek {
            "ggml-vocab-deepseek-llm.gguf"
        } else {
            "ggml-vocab-qwen35.gguf"
        })?;
        GgufFile::open(&path)?
    };
    let tokenizer = Tokenizer::from_gguf(&vocab).context("cannot load the tokenizer")?;
    let t0 = std::time::Instant::now();
    let sizes = if deepseek {
        Some(d4synth::sizes(geometry, ty)?)
    } else if glm5 {
        Some(g5synth::sizes(geometry, ty)?)
    } else {
        None
    };
    let model = on_device(opts, |be| {
        load_placed(
            be,
            opts,
            sizes,
            |be, spec| -> Result<Arc<dyn LanguageModel>> {
                use vela_models::qwen4exp::Qwen4ExpModel;
                let host = spec.host_experts.clone();
                Ok(match be {
                    AnyBackend::Cpu(b) if deepseek => {
                        Arc::new(DeepseekV4Model::synth_placed(b, geometry, ty, seed, host)?)
                    }
                    AnyBackend::Cpu(b) if glm5 => {
                        Arc::new(Glm5Model::synth_placed(b, geometry, ty, seed, host)?)
                    }
                    AnyBackend::Cpu(b) => Arc::new(Qwen4ExpModel::synth(b, geometry, ty, seed)?),
                    #[cfg(feature = "cuda")]
                    AnyBackend::Cuda(b) if deepseek => {
                        Arc::new(DeepseekV4Model::synth_placed(b, geometry, ty, seed, host)?)
                    }
                    #[cfg(feature = "cuda")]
                    AnyBackend::Cuda(b) if glm5 => {
                        Arc::new(Glm5Model::synth_placed(b, geometry, ty, seed, host)?)
                    }
                    #[cfg(feature = "cuda")]
                    AnyBackend::Cuda(b) => Arc::new(Qwen4ExpModel::synth(b, geometry, ty, seed)?),
                })
            },
        )
    })?;
    eprintln!(
        "synthesized {geometry} ({}, seed {seed}) on {} in {:.1} s",
        ty.name(),
        model.backend_name(),
        t0.elapsed().as_secs_f64()
    );
    // GLM's stand-in vocabulary carries GLM's chat template (the others carry none of their own).
    let chat_template = glm5
        .then(|| {
            vocab
                .get_str("tokenizer.chat_template")
                .ok()
                .map(str::to_string)
        })
        .flatten();
    Ok(LoadedModel {
        path: PathBuf::from(format!("synth:{spec}")),
        gguf: None,
        model,
        tokenizer,
        chat_template,
        special_texts: None,
    })
}

/// Load a GGUF model on the CPU backend with `threads` threads (0 = all cores).
pub fn load_gguf(path: &Path, threads: usize) -> Result<LoadedModel> {
    load(
        path,
        &LoadOptions {
            threads,
            device: Device::Cpu,
            ..Default::default()
        },
    )
}

fn load_hf_dir(dir: &Path, opts: &LoadOptions) -> Result<LoadedModel> {
    let tokenizer = Tokenizer::from_hf_dir(dir)
        .with_context(|| format!("cannot load the tokenizer of {}", dir.display()))?;
    let (chat_template, special_texts) = match vela_template::load_model_dir(dir) {
        Ok(t) => {
            let src = t
                .templates
                .as_ref()
                .and_then(|s| s.select(None, false).ok())
                .map(str::to_string);
            let texts = Some((
                t.bos_token.clone().unwrap_or_default(),
                t.eos_token.clone().unwrap_or_default(),
            ))
            .filter(|(b, e)| !b.is_empty() || !e.is_empty());
            (src, texts)
        }
        Err(_) => (None, None),
    };
    let sizes = model_sizes(dir, opts.quant)?;
    let model = on_device(opts, |be| {
        load_placed(be, opts, sizes, |be, spec| match be {
            AnyBackend::Cpu(b) => vela_models::load_hf_spec(b, dir, spec),
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(b) => vela_models::load_hf_spec(b, dir, spec),
        })
    })?;
    if model.n_vocab() < tokenizer_vocab(&tokenizer) {
        bail!(
            "{}: the tokenizer has {} tokens but the model only {}",
            dir.display(),
            tokenizer_vocab(&tokenizer),
            model.n_vocab()
        );
    }
    Ok(LoadedModel {
        path: dir.to_path_buf(),
        gguf: None,
        model,
        tokenizer,
        chat_template,
        special_texts,
    })
}

fn tokenizer_vocab(t: &Tokenizer) -> usize {
    t.n_vocab()
}

/// Check that `bytes` of weights fit the GPU's free memory (before allocating anything), then
/// run `load` with an upload progress bar.
#[cfg(feature = "cuda")]
fn upload_checked<T>(
    be: &vela_cuda::CudaBackend,
    bytes: u64,
    load: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    let (free, total) = be.memory_info()?;
    // Weights are padded per tensor and the KV cache and scratch come on top: keep a margin.
    let need = bytes + bytes / 50 + (256 << 20);
    if need > free {
        bail!(
            "the model's weights need {:.2} GiB on the GPU but only {:.2} of {:.2} GiB are free",
            gib(need),
            gib(free),
            gib(total)
        );
    }
    be.begin_upload(bytes);
    let r = load();
    if let Some((done, secs)) = be.end_upload() {
        if r.is_ok() {
            eprintln!(
                "uploaded {:.2} GiB of weights to the GPU in {secs:.1} s",
                gib(done)
            );
        }
    }
    r
}

/// `synth:GEOMETRY[:TYPE[:SEED]]`'s parts (type default q4_0, seed default 1).
fn synth_spec(spec: &str) -> Result<(&str, GgmlType, u64)> {
    let mut it = spec.split(':');
    let geometry = it.next().unwrap_or_default();
    let ty = match it.next() {
        Some(t) => parse_quant(t)?,
        None => GgmlType::Q4_0,
    };
    let seed = match it.next() {
        Some(s) => s
            .parse()
            .map_err(|_| anyhow!("synth:{spec}: the seed must be an integer"))?,
        None => 1,
    };
    if it.next().is_some() {
        bail!("synth:{spec}: expected synth:GEOMETRY[:TYPE[:SEED]]");
    }
    Ok((geometry, ty, seed))
}

/// A GGUF file's loaded bytes ([`model_sizes`]).
fn gguf_sizes(g: &GgufFile, quant: Option<GgmlType>) -> Sizes {
    Sizes::from_tensors(g.tensors.iter().map(|t| {
        let b = vela_models::weights::loaded_bytes(
            std::iter::once((t.ty, t.ne0(), t.n_rows(), t.size)),
            quant,
        );
        (t.name.as_str(), b)
    }))
}

/// Plan the experts placement of a model of `sizes` on `be` ([`plan_experts`]), print it, and
/// load with it: on a GPU after checking the device's share fits its free memory.
fn load_placed(
    be: AnyBackend,
    opts: &LoadOptions,
    sizes: Option<Sizes>,
    load: impl FnOnce(AnyBackend, &LoadSpec) -> Result<Arc<dyn LanguageModel>>,
) -> Result<Arc<dyn LanguageModel>> {
    match be {
        AnyBackend::Cpu(b) => {
            let plan = match &sizes {
                Some(s) => Some(plan_experts(s, opts, false, b.memory_free())?),
                None => None,
            };
            let spec = spec_of(false, sizes.as_ref(), plan.as_ref(), opts.quant, || {
                b.clone()
            });
            load(AnyBackend::Cpu(b), &spec)
        }
        #[cfg(feature = "cuda")]
        AnyBackend::Cuda(b) => {
            let (free, _) = b.memory_info()?;
            let plan = match &sizes {
                Some(s) => Some(plan_experts(s, opts, true, Some(free))?),
                None if opts.experts != ExpertsMode::Auto && opts.experts != ExpertsMode::Gpu => {
                    bail!("--experts: this model's sizes are not known before loading (only DeepSeek V4 and GLM 5 synth geometries, GGUF files and checkpoints are placed)")
                }
                None => None,
            };
            let threads = opts.threads;
            let spec = spec_of(true, sizes.as_ref(), plan.as_ref(), opts.quant, || {
                Arc::new(CpuBackend::new(threads))
            });
            match plan {
                Some(p) => upload_checked(&b, p.device_bytes, || {
                    load(AnyBackend::Cuda(b.clone()), &spec)
                }),
                None => load(AnyBackend::Cuda(b), &spec),
            }
        }
    }
}

/// The device `opts` selects: whether it is a GPU, its free memory (the host's for the CPU)
/// and its name.
pub fn device_memory(opts: &LoadOptions) -> Result<(bool, Option<u64>, String)> {
    on_device(opts, |be| {
        Ok(match be {
            AnyBackend::Cpu(b) => (false, b.memory_free(), b.name()),
            #[cfg(feature = "cuda")]
            AnyBackend::Cuda(b) => (true, Some(b.memory_info()?.0), b.name()),
        })
    })
}

/// A backend instance of either kind.
pub enum AnyBackend {
    Cpu(Arc<CpuBackend>),
    #[cfg(feature = "cuda")]
    Cuda(Arc<vela_cuda::CudaBackend>),
}

/// Create the backend for `opts.device` and run `f` with it. `Auto` falls back to the CPU (with
/// a note on stderr naming the reason) when no usable GPU is found.
pub fn on_device<T>(opts: &LoadOptions, f: impl FnOnce(AnyBackend) -> Result<T>) -> Result<T> {
    match opts.device {
        Device::Cpu => f(AnyBackend::Cpu(Arc::new(CpuBackend::new(opts.threads)))),
        #[cfg(feature = "cuda")]
        Device::Cuda(n) => {
            let be = vela_cuda::CudaBackend::new(n).with_context(|| format!("device cuda:{n}"))?;
            f(AnyBackend::Cuda(Arc::new(be)))
        }
        #[cfg(not(feature = "cuda"))]
        Device::Cuda(_) => bail!("this build of vela has no CUDA support (feature `cuda`)"),
        Device::Auto => {
            #[cfg(feature = "cuda")]
            if std::env::var_os("VELA_NO_AUTO_GPU").is_none() {
                match vela_cuda::CudaBackend::new(0) {
                    Ok(be) => return f(AnyBackend::Cuda(Arc::new(be))),
                    Err(e) => {
                        // No driver at all is the normal CPU-only machine: say nothing.
                        let msg = format!("{e:#}");
                        if !msg.starts_with("no NVIDIA driver found") {
                            eprintln!("note: no usable GPU, running on the CPU: {msg}");
                        }
                    }
                }
            }
            f(AnyBackend::Cpu(Arc::new(CpuBackend::new(opts.threads))))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_parsing() {
        assert_eq!("cpu".parse::<Device>().unwrap(), Device::Cpu);
        assert_eq!("cuda".parse::<Device>().unwrap(), Device::Cuda(0));
        assert_eq!("cuda:3".parse::<Device>().unwrap(), Device::Cuda(3));
        assert_eq!("auto".parse::<Device>().unwrap(), Device::Auto);
        for bad in ["cuda:x", "tpu", "", "cuda:"] {
            let e = bad.parse::<Device>().unwrap_err().to_string();
            assert!(e.contains("device"), "{bad}: {e}");
        }
    }

    #[test]
    fn expert_plans_follow_the_flags() {
        let gib = 1u64 << 30;
        let sizes = Sizes::from_tensors(
            [
                ("token_embd.weight", 2 * gib),
                ("blk.0.ffn_gate_up_exps.weight", 4 * gib),
                ("blk.1.ffn_gate_up_exps.weight", 4 * gib),
            ]
            .into_iter(),
        );
        let opts = |flags: &[(&str, f64)], experts: &str| {
            let get = |k: &str| flags.iter().find(|f| f.0 == k).map(|f| f.1);
            LoadOptions::from_flags(0, "cpu", None, experts, get("gpu"), get("cache")).unwrap()
        };
        // 12 GiB free: 9 after the reserve; the dense 2 and one layer's 4 fit, the other stays
        // on the host with the 3 GiB left as its cache (or what --expert-cache allows).
        let p = plan_experts(&sizes, &opts(&[], "auto"), true, Some(12 * gib)).unwrap();
        assert_eq!((p.host_layers.clone(), p.cache_bytes), (vec![1], 3 * gib));
        let p = plan_experts(
            &sizes,
            &opts(&[("cache", 1.0)], "auto"),
            true,
            Some(12 * gib),
        );
        assert_eq!(p.unwrap().cache_bytes, gib);
        let p = plan_experts(
            &sizes,
            &opts(&[("cache", 0.0)], "auto"),
            true,
            Some(12 * gib),
        );
        assert_eq!(p.unwrap().cache_bytes, 0);
        // --gpu-mem below the free memory is the budget.
        let p = plan_experts(&sizes, &opts(&[("gpu", 6.0)], "auto"), true, Some(12 * gib));
        assert_eq!(p.unwrap().host_layers, vec![0, 1]);
        let e = plan_experts(&sizes, &opts(&[], "gpu"), true, Some(9 * gib)).unwrap_err();
        assert!(e.to_string().contains("--experts auto or cpu"), "{e}");
        // All on the GPU (or a dense model) keeps no reserve: 10 GiB fit 10 GiB free.
        let p = plan_experts(&sizes, &opts(&[], "gpu"), true, Some(10 * gib)).unwrap();
        assert!(p.host_layers.is_empty());
        let dense = Sizes::from_tensors([("token_embd.weight", 10 * gib)].into_iter());
        assert!(plan_experts(&dense, &opts(&[], "auto"), true, Some(10 * gib)).is_ok());
        let e = plan_experts(&sizes, &opts(&[("gpu", 4.0)], "auto"), true, None).unwrap_err();
        assert!(e.to_string().contains("even with"), "{e}");
        // On the CPU: in place when twice the model exceeds the free memory.
        let p = plan_experts(&sizes, &opts(&[], "auto"), false, Some(16 * gib)).unwrap();
        assert_eq!(p.host_layers, vec![0, 1]);
        let p = plan_experts(&sizes, &opts(&[], "auto"), false, Some(64 * gib)).unwrap();
        assert!(p.host_layers.is_empty());
        for bad in [
            ("gpu", -1.0),
            ("gpu", 0.0),
            ("cache", -2.0),
            ("cache", f64::NAN),
        ] {
            let e = LoadOptions::from_flags(0, "cpu", None, "auto", None, None);
            assert!(e.is_ok());
            let (g, c) = if bad.0 == "gpu" {
                (Some(bad.1), None)
            } else {
                (None, Some(bad.1))
            };
            let e = LoadOptions::from_flags(0, "cpu", None, "auto", g, c).unwrap_err();
            assert!(e.to_string().contains("GiB"), "{bad:?}: {e}");
        }
    }

    /// `synth:glm5-flash` tokenizes text with the vocabulary its `vela synth` file carries
    /// (the GLM stand-in over llama.cpp's qwen35 ranks, 154,880 tokens, when found);
    /// `synth:glm5-tiny` has the fixtures' synthetic vocabulary of 512.
    #[test]
    fn glm5_synth_vocabularies() {
        use vela_models::glm5::synth_gguf::vocabulary;
        let t = Tokenizer::from_gguf(&vocabulary("glm5-tiny").unwrap()).unwrap();
        assert_eq!(t.n_vocab(), 512);
        let g = vocabulary("glm5-flash").unwrap();
        let t = Tokenizer::from_gguf(&g).unwrap();
        assert_eq!(t.n_vocab(), 154_880);
        let found = vela_models::synth::find_tokenizer("ggml-vocab-qwen35.gguf").is_ok();
        assert_eq!(g.get_str("tokenizer.ggml.pre").ok() == Some("glm4"), found);
        let template = g.get_str("tokenizer.chat_template").ok();
        assert_eq!(
            template.is_some_and(|t| t.contains("<arg_key>")),
            found && vela_models::glm5::vocab::find_template().is_some()
        );
        if found {
            let ids = t.encode("Hello world", false, false).unwrap();
            assert!(
                !ids.is_empty() && ids.iter().all(|&i| i < 151_643),
                "{ids:?}"
            );
            // GLM's turn tokens are control tokens at GLM 5's ids, parsed only when asked.
            let text = "[gMASK]<sop><|user|>Hi<|assistant|><think>";
            let ids = t.encode(text, false, true).unwrap();
            assert_eq!(ids[..3], [154_822, 154_824, 154_827], "{ids:?}");
            assert_eq!(ids[ids.len() - 2..], [154_828, 154_841], "{ids:?}");
            assert!(t
                .encode(text, false, false)
                .unwrap()
                .iter()
                .all(|&i| i < 151_643));
            for eog in [154_820, 154_827, 154_829] {
                assert!(t.is_eog(eog), "{eog}");
            }
        }
    }

    #[test]
    fn missing_files_are_clear_errors() {
        let dir = std::env::temp_dir().join(format!("vela-loader-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let opts = LoadOptions {
            threads: 1,
            device: Device::Cpu,
            ..Default::default()
        };
        let e = load(&dir, &opts).err().unwrap();
        assert!(format!("{e:#}").contains("tokenizer"), "{e:#}");
        let e = load(&dir.join("nope.gguf"), &opts).err().unwrap();
        assert!(!format!("{e:#}").contains('\n'), "{e:#}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
