//! `vela synth`: a random-weight GGUF of a real model geometry (deterministic from the seed), for
//! measuring throughput at real sizes without downloading weights. The `qwen4_exp` geometries
//! (Qwen3.8 Flash Next) are written by `vela_models::qwen4exp::synth_gguf`: the file llama.cpp's
//! converter and llama-quantize would make from the checkpoint `--model synth:GEOMETRY` generates;
//! the `glm5_next` ones (GLM 5.3 Flash) likewise by `vela_models::glm5::synth_gguf`.

use anyhow::{bail, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
use vela_models::deepseekv4::{synth as d4synth, DeepseekV4Config};
use vela_models::glm5::{synth as g5synth, synth_gguf as g5gguf, Glm5Config};
use vela_models::qwen4exp::{synth as q4synth, synth_gguf, Qwen4ExpConfig};
use vela_models::synth::{self, QuantScheme, SynthOptions};

#[derive(Args)]
pub struct SynthArgs {
    /// Geometry name (see --list), e.g. llama3-8b, qwen2.5-7b, gemma3-27b, gemma4-31b,
    /// qwen3.8-flash-next-12l-smallple (Qwen3.8 Flash Next's first 12 layers with a small n-gram
    /// table: the same file for llama.cpp and vela; the published n-gram table, 51B parameters,
    /// is too large for a file), glm5-flash-12l (GLM 5.3 Flash's first 12 layers).
    #[arg(long, required_unless_present_any = ["list", "vocab_only"])]
    pub arch: Option<String>,
    /// Weight type: f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q4_k q5_k q6_k q4_k_m q5_k_m (for the
    /// qwen4exp and glm5 geometries: f32/f16/bf16 as llama.cpp's converter writes them, the others
    /// as llama-quantize makes them from its f32 conversion).
    #[arg(long = "type", default_value = "q4_0")]
    pub ty: String,
    /// Seed: the same seed gives a byte-identical file on any machine.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output file.
    #[arg(long, short = 'o', required_unless_present = "list")]
    pub out: Option<PathBuf>,
    /// Tokenizer source GGUF (default: the geometry's own, found in llama.cpp's vocab files or
    /// $VELA_CACHE/vocab/; for the real qwen4exp geometries ggml-vocab-qwen35.gguf, the one
    /// --model synth: uses, if found, else, as for the tiny ones, a synthetic vocabulary <t0>,
    /// <t1>, ...).
    #[arg(long)]
    pub tokenizer: Option<PathBuf>,
    /// Worker threads (default: all cores).
    #[arg(long, short = 't')]
    pub threads: Option<usize>,
    /// List the geometries.
    #[arg(long)]
    pub list: bool,
    /// Write only the tokenizer of this GGUF to --out (small enough to carry elsewhere).
    #[arg(long)]
    pub vocab_only: Option<PathBuf>,
    /// qwen4exp geometries: write the indexer's compress ratio on the QSA layers (llama.cpp then
    /// runs its QSA block selection) instead of the zeros llama.cpp's converter writes under
    /// transformers >= 5.23 (llama.cpp then attends densely on those layers; vela always runs
    /// QSA).
    #[arg(long)]
    pub compress_ratios: bool,
}

pub fn synth(a: SynthArgs) -> Result<()> {
    if a.list {
        println!("| name | family | layers | width | heads/kv | vocab | source |");
        println!("|---|---|---:|---:|---|---:|---|");
        for g in synth::geometries() {
            println!(
                "| {} | {:?} | {} | {} | {}/{} | {} | {} |",
                g.name, g.family, g.n_layer, g.n_embd, g.n_head, g.n_head_kv, g.n_vocab, g.source
            );
        }
        for name in q4synth::GEOMETRIES {
            let c = Qwen4ExpConfig::from_json(&q4synth::config(name)?)?;
            println!(
                "| {name} | Qwen4Exp | {} | {} | {}/{} | {} | {} |",
                c.mixers.len(),
                c.hidden,
                c.n_head,
                c.n_head_kv,
                c.n_vocab,
                if name.starts_with("qwen3.8") {
                    "Qwen/Qwen3.8-Flash-Next (docs/qwen4exp.md)"
                } else {
                    "(test shape)"
                }
            );
        }
        for name in d4synth::GEOMETRIES {
            let c = DeepseekV4Config::from_json(&d4synth::config(name)?)?;
            println!(
                "| {name} | DeepseekV4 | {} | {} | {}/1 | {} | {} |",
                c.attn.len(),
                c.hidden,
                c.n_head,
                c.n_vocab,
                if name.starts_with("deepseek-v4-flash") {
                    "deepseek-ai/DeepSeek-V4-Flash (--model synth: only; docs/deepseekv4.md)"
                } else {
                    "(test shape; --model synth: only)"
                }
            );
        }
        for name in g5synth::GEOMETRIES {
            let c = Glm5Config::from_json(&g5synth::config(name)?)?;
            println!(
                "| {name} | Glm5Next | {} | {} | {}/{} | {} | {} |",
                c.mixers.len(),
                c.hidden,
                c.n_head,
                c.n_head,
                c.n_vocab,
                if name.starts_with("glm5-flash") {
                    "zai-org/GLM-5.3-Flash (docs/glm5.md)"
                } else {
                    "(test shape)"
                }
            );
        }
        return Ok(());
    }
    let Some(out) = a.out else {
        bail!("--out is required")
    };
    if let Some(src) = a.vocab_only {
        return synth::write_vocab_only(&src, &out);
    }
    let Some(arch) = a.arch else {
        bail!("--arch is required (see --list)")
    };
    let scheme = QuantScheme::parse(&a.ty)?;
    let tty = std::io::stderr().is_terminal();
    let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr());
    if tty {
        bar.set_style(
            ProgressStyle::with_template(
                "synth {msg} [{bar:30}] {decimal_bytes}/{decimal_total_bytes} ETA {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        bar.set_message(format!("{arch} {}", a.ty));
    } else {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    let t0 = std::time::Instant::now();
    let opts = SynthOptions {
        tokenizer: a.tokenizer,
        threads: a.threads,
    };
    let mut total_seen = 0;
    let mut progress = |done, total| {
        if bar.length() != Some(total) {
            bar.set_length(total);
        }
        bar.set_position(done);
        total_seen = total;
    };
    if g5gguf::is_geometry(&arch) {
        g5gguf::write(&arch, scheme, a.seed, &out, &opts, &mut progress)?;
    } else if synth_gguf::is_geometry(&arch) {
        synth_gguf::write(
            &arch,
            scheme,
            a.seed,
            &out,
            &opts,
            a.compress_ratios,
            &mut progress,
        )?;
    } else {
        synth::synth_with(&arch, scheme, a.seed, &out, &opts, &mut progress)?;
    }
    bar.finish_and_clear();
    eprintln!(
        "wrote {} ({:.2} GB, {arch} {}, seed {}) in {:.1} s",
        out.display(),
        total_seen as f64 / 1e9,
        a.ty,
        a.seed,
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
