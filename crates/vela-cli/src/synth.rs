//! `vela synth`: a random-weight GGUF of a real model geometry (deterministic from the seed), for
//! measuring throughput at real sizes without downloading weights.

use anyhow::{bail, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::path::PathBuf;
use vela_models::synth::{self, QuantScheme, SynthOptions};

#[derive(Args)]
pub struct SynthArgs {
    /// Geometry name (see --list), e.g. llama3-8b, qwen2.5-7b, gemma3-27b, gemma4-31b.
    #[arg(long, required_unless_present_any = ["list", "vocab_only"])]
    pub arch: Option<String>,
    /// Weight type: f32 f16 bf16 q4_0 q4_1 q5_0 q5_1 q8_0 q4_k q5_k q6_k q4_k_m q5_k_m.
    #[arg(long = "type", default_value = "q4_0")]
    pub ty: String,
    /// Seed: the same seed gives a byte-identical file on any machine.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Output file.
    #[arg(long, short = 'o', required_unless_present = "list")]
    pub out: Option<PathBuf>,
    /// Tokenizer source GGUF (default: the geometry's own, found in llama.cpp's vocab files or
    /// $VELA_CACHE/vocab/).
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
    synth::synth_with(&arch, scheme, a.seed, &out, &opts, &mut |done, total| {
        if bar.length() != Some(total) {
            bar.set_length(total);
        }
        bar.set_position(done);
        total_seen = total;
    })?;
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
