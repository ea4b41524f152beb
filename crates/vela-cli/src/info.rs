//! `vela tokenize` and `vela info`.

use crate::common;
use anyhow::{bail, Context, Result};
use clap::Args;
use std::collections::BTreeMap;
use vela_formats::gguf::{GgufFile, Value};

#[derive(Args)]
pub struct TokenizeArgs {
    /// GGUF file (vocab-only files too) or HF checkpoint directory.
    #[arg(long, short = 'm')]
    pub model: String,
    #[arg(long, conflicts_with = "text_file")]
    pub text: Option<String>,
    #[arg(long)]
    pub text_file: Option<std::path::PathBuf>,
    /// Do not add BOS/special prefix tokens.
    #[arg(long)]
    pub no_bos: bool,
    /// Recognise control-token text (e.g. `<|im_end|>`) in the input.
    #[arg(long)]
    pub parse_special: bool,
}

pub fn tokenize(a: TokenizeArgs) -> Result<()> {
    let text = match (&a.text, &a.text_file) {
        (Some(t), _) => t.clone(),
        (None, Some(f)) => {
            std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?
        }
        (None, None) => bail!("give --text or --text-file"),
    };
    // An existing path (GGUF, HF checkpoint directory or tokenizer.json) is used as is; anything
    // else is a model name for the hub.
    let p = std::path::Path::new(&a.model);
    let path = if p.exists() {
        p.to_path_buf()
    } else {
        crate::common::resolve(Some(&a.model))?
    };
    let tok = vela_tokenizer::load(&path)?;
    let ids = tok.encode(&text, !a.no_bos, a.parse_special)?;
    println!("{}", serde_json::to_string(&ids)?);
    Ok(())
}

#[derive(Args)]
pub struct InfoArgs {
    #[arg(long, short = 'm')]
    pub model: Option<String>,
    /// Also list every tensor.
    #[arg(long)]
    pub tensors: bool,
}

fn short(v: &Value) -> String {
    match v {
        Value::String(s) if s.len() > 80 => {
            format!("{:?}… ({} chars)", &s[..s.floor_char_boundary(60)], s.len())
        }
        Value::String(s) => format!("{s:?}"),
        Value::Array(a) => format!(
            "[{} × {}]",
            a.len(),
            a.first().map(|x| x.type_name()).unwrap_or("?")
        ),
        other => format!("{other:?}")
            .trim_start_matches(|c: char| c.is_alphanumeric())
            .trim_matches(|c| c == '(' || c == ')')
            .to_string(),
    }
}

pub fn info(a: InfoArgs) -> Result<()> {
    if let Some(spec) = a.model.as_deref().and_then(|m| m.strip_prefix("synth:")) {
        return info_synth(spec);
    }
    let path = crate::common::resolve(a.model.as_deref())?;
    if path.is_dir() {
        return info_hf(&path, a.tensors);
    }
    let g = GgufFile::open(&path)?;
    let arch = g.architecture().unwrap_or("?");
    println!("file: {}", path.display());
    println!(
        "gguf: v{}, {} metadata keys, {} tensors, alignment {}",
        g.version,
        g.metadata.len(),
        g.tensors.len(),
        g.alignment
    );
    println!("architecture: {arch}");
    for k in &g.key_order {
        if k.starts_with(&format!("{arch}.")) || k.starts_with("general.") {
            println!("  {k} = {}", short(&g.metadata[k]));
        }
    }
    match vela_models::registry::for_gguf(&g).and_then(|a| a.describe_gguf(&g)) {
        Ok(d) => println!("model: {d}"),
        Err(e) => println!("model: not runnable by this build: {e:#}"),
    }
    let mut types: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    let mut params = 0u64;
    for t in &g.tensors {
        let e = types.entry(t.ty.name().to_string()).or_default();
        e.0 += 1;
        e.1 += t.size;
        params += t.n_elements();
    }
    println!("parameters: {:.1} M", params as f64 / 1e6);
    for (ty, (n, bytes)) in &types {
        println!(
            "  {ty:>6}: {n:4} tensors, {:8.1} MiB",
            *bytes as f64 / (1 << 20) as f64
        );
    }
    if a.tensors {
        for t in &g.tensors {
            println!("  {:40} {:6} {:?}", t.name, t.ty.name(), t.dims);
        }
    }
    for k in &g.key_order {
        if k.starts_with("tokenizer.") {
            println!("  {k} = {}", short(&g.metadata[k]));
        }
    }
    match vela_tokenizer::Tokenizer::from_gguf(&g) {
        Ok(t) => println!(
            "tokenizer: {} tokens, bos {:?}, eos {:?}, add_bos {}",
            t.n_vocab(),
            t.bos().and_then(|b| t.token_text(b)),
            t.eos().and_then(|b| t.token_text(b)),
            t.add_bos()
        ),
        Err(e) => println!("tokenizer: unavailable: {e:#}"),
    }
    Ok(())
}

/// `vela info -m synth:GEOMETRY`: the geometry's config and, for DeepSeek V4 and GLM 5, its
/// memory plan (nothing is generated).
fn info_synth(spec: &str) -> Result<()> {
    use vela_models::deepseekv4::{synth as d4, DeepseekV4Config};
    use vela_models::glm5::{synth as g5, Glm5Config};
    use vela_models::qwen4exp::{synth as q4, Qwen4ExpConfig};
    let geometry = spec.split(':').next().unwrap_or_default();
    if g5::is_geometry(geometry) {
        let c = Glm5Config::from_json(&g5::config(geometry)?)?;
        println!("synth geometry {geometry}: {}\n", c.summary());
        print!("{}", g5::memory_plan(&c));
    } else if d4::is_geometry(geometry) {
        let c = DeepseekV4Config::from_json(&d4::config(geometry)?)?;
        println!("synth geometry {geometry}: {}\n", c.summary());
        print!("{}", d4::memory_plan(&c));
    } else {
        let c = Qwen4ExpConfig::from_json(&q4::config(geometry)?)?;
        println!("synth geometry {geometry}: {}", c.summary());
    }
    Ok(())
}

/// `vela info` for a Hugging Face checkpoint directory.
fn info_hf(dir: &std::path::Path, list: bool) -> Result<()> {
    let cfg_path = dir.join("config.json");
    let j: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&cfg_path)
            .with_context(|| format!("cannot read {}", cfg_path.display()))?,
    )
    .with_context(|| format!("{}: invalid JSON", cfg_path.display()))?;
    println!("directory: {} (Hugging Face checkpoint)", dir.display());
    let mt = j["model_type"].as_str().unwrap_or("?");
    println!("model_type: {mt}, architectures: {}", j["architectures"]);
    let ckpt = vela_formats::safetensors::Checkpoint::open(dir)?;
    let mut by_prefix: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    let mut dtypes: BTreeMap<String, (usize, u64)> = BTreeMap::new();
    for f in &ckpt.files {
        for (name, e) in &f.tensors {
            let bytes = (e.end - e.start) as u64;
            // The tower a tensor belongs to: `model.language_model`, `model.vision_tower`, ...
            let parts: Vec<&str> = name.split('.').collect();
            let prefix =
                if parts.len() > 2 && parts[0] == "model" && !parts[1].starts_with("layers") {
                    format!("model.{}", parts[1])
                } else {
                    parts[0].to_string()
                };
            let p = by_prefix.entry(prefix).or_default();
            p.0 += 1;
            p.1 += bytes;
            let d = dtypes.entry(format!("{:?}", e.dtype)).or_default();
            d.0 += 1;
            d.1 += bytes;
            if list {
                println!("  {name:60} {:?} {:?}", e.dtype, e.shape);
            }
        }
    }
    println!("safetensors: {} file(s)", ckpt.files.len());
    for (d, (n, b)) in &dtypes {
        println!(
            "  {d:>5}: {n:5} tensors, {:10.1} MiB",
            *b as f64 / (1 << 20) as f64
        );
    }
    // Multimodal towers and their projections (Gemma 4's vision and audio parts).
    let other_modalities = ["vision", "audio", "multi_modal"];
    for (p, (n, b)) in &by_prefix {
        let used = !other_modalities.iter().any(|m| p.contains(m));
        println!(
            "  {p:32} {n:5} tensors, {:10.1} MiB{}",
            *b as f64 / (1 << 20) as f64,
            if used {
                ""
            } else {
                "  (ignored: vela runs the text model only)"
            }
        );
    }
    match vela_models::registry::for_hf(&j).and_then(|a| a.describe_hf(&j)) {
        Ok(d) => println!("model: {d}"),
        Err(e) => println!("model: not runnable by this build: {e:#}"),
    }
    match vela_tokenizer::Tokenizer::from_hf_dir(dir) {
        Ok(t) => println!(
            "tokenizer: {} tokens, bos {:?}, eos {:?}",
            t.n_vocab(),
            t.bos().and_then(|b| t.token_text(b)),
            t.eos().and_then(|b| t.token_text(b))
        ),
        Err(e) => println!("tokenizer: unavailable: {e:#}"),
    }
    match vela_template::load_model_dir(dir) {
        Ok(_) => println!("chat template: present"),
        Err(e) => println!("chat template: {e:#}"),
    }
    Ok(())
}

#[derive(Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub m: common::ModelArgs,
}

/// `vela plan`: where each part of the model would go on this machine (the experts placement,
/// `--experts`, `--gpu-mem`), from the tensors' sizes, without loading any weight.
pub fn plan(a: PlanArgs) -> Result<()> {
    let path = common::resolve(a.m.model.as_deref())?;
    let lo = common::load_options(&a.m)?;
    let sizes = vela_engine::loader::model_sizes(&path, lo.quant)?
        .ok_or_else(|| anyhow::anyhow!("{}: sizes are not known before loading", path.display()))?;
    let (gpu, free, name) = vela_engine::loader::device_memory(&lo)?;
    let gib = |b: u64| format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64);
    println!("model: {}", path.display());
    println!(
        "device: {name}, free memory {}",
        free.map_or("unknown".into(), gib)
    );
    let ex: u64 = sizes.experts.values().sum();
    println!(
        "weights: {} ({} dense, {} routed experts in {} MoE layers)",
        gib(sizes.total()),
        gib(sizes.dense),
        gib(ex),
        sizes.experts.len()
    );
    let p = vela_engine::loader::plan_experts(&sizes, &lo, gpu, free)?;
    println!("{}", p.describe(&sizes, gpu));
    Ok(())
}
