//! Speculative decoding options of `vela run` / `vela chat`: the Gemma 4 assistant (`--mtp`,
//! discovered next to the target unless `--no-mtp`) or any small draft model with the target's
//! vocabulary (`--draft-model`).

use crate::common::{self, Loaded};
use anyhow::{bail, Result};
use clap::Args;
use std::path::PathBuf;
use vela_engine::speculative::{load_mtp, Drafter, ModelDrafter, NgramDrafter, SpecStats};
use vela_engine::Session;

/// Speculative decoding (output distribution identical to plain decoding).
#[derive(Args, Clone, Debug)]
pub struct SpecArgs {
    /// The model's own drafter: a Gemma 4 assistant (HF directory or `gemma4-assistant` GGUF),
    /// or the MTP layer of Qwen3.8 Flash Next / DeepSeek V4 / GLM 5.3 (the checkpoint directory;
    /// for a DeepSeek V4 GGUF, llama.cpp's `--mtp` export beside it; a GLM 5.3 GGUF carries its
    /// block). Without it, the model's drafter
    /// is used when found (`mtp-NAME.gguf` beside `NAME.gguf`, `NAME-assistant/` beside an HF
    /// directory, the checkpoint's own MTP layer; see docs/speculative.md).
    #[arg(long, conflicts_with = "no_mtp")]
    pub mtp: Option<PathBuf>,
    /// Plain decoding even if an assistant is found.
    #[arg(long)]
    pub no_mtp: bool,
    /// A small model with the target's vocabulary as the drafter (classic speculative decoding).
    #[arg(long, conflicts_with_all = ["mtp"])]
    pub draft_model: Option<String>,
    /// Prompt-lookup decoding: draft the tokens that followed the latest earlier occurrence of
    /// the last 2-4 tokens (no draft model; pays off when the output repeats the context).
    #[arg(long, conflicts_with_all = ["mtp", "draft_model"])]
    pub lookup: bool,
    /// Drafted tokens per verification round at most (K); each round's depth comes from a cost
    /// model measured while generating (0 when drafting does not pay), unless `--draft-fixed`.
    #[arg(long, default_value_t = 4)]
    pub draft_max: usize,
    /// Always draft `--draft-max` tokens per round.
    #[arg(long)]
    pub draft_fixed: bool,
}

/// The drafter these options ask for, if any (validated against the target).
pub fn drafter(
    a: &SpecArgs,
    l: &Loaded,
    margs: &common::ModelArgs,
    target: &Session,
) -> Result<Option<Box<dyn Drafter>>> {
    if a.no_mtp {
        return Ok(None);
    }
    if a.draft_max == 0 {
        bail!("--draft-max must be at least 1");
    }
    if a.lookup {
        eprintln!("speculative decoding with prompt lookup (n-grams of 2-4 tokens)");
        return Ok(Some(Box::new(NgramDrafter::new(2, 4)?)));
    }
    if let Some(m) = &a.draft_model {
        let path = common::resolve(Some(m))?;
        let lo = common::load_options(margs)?;
        let dm = vela_engine::loader::load(&path, &lo)?;
        if dm.model.n_vocab() != target.model.n_vocab() {
            bail!(
                "draft model {} has {} tokens, the target {}: they must share the vocabulary",
                path.display(),
                dm.model.n_vocab(),
                target.model.n_vocab()
            );
        }
        let session = Session::new(dm.model.clone(), &l.opts)?;
        eprintln!("speculative decoding with draft model {}", path.display());
        return Ok(Some(Box::new(ModelDrafter { session })));
    }
    let path = match &a.mtp {
        Some(p) => Some(p.clone()),
        None => l.model.discover_mtp(&l.path),
    };
    let Some(path) = path else { return Ok(None) };
    let d = load_mtp(target, &path)?;
    eprintln!("MTP drafting with the assistant {}", path.display());
    Ok(Some(d))
}

/// One line of speculative-decoding statistics for stderr.
pub fn report(s: &SpecStats) -> String {
    format!(
        "[speculative: {} rounds, {}/{} drafts accepted ({:.1} %), {:.2} tokens/round; \
         draft {:.2} s, verify {:.2} s, sampling {:.2} s]",
        s.rounds,
        s.accepted,
        s.drafted,
        100.0 * s.acceptance(),
        if s.rounds == 0 {
            0.0
        } else {
            (s.accepted + s.rounds) as f64 / s.rounds as f64
        },
        s.draft_time.as_secs_f64(),
        s.verify_time.as_secs_f64(),
        s.sample_time.as_secs_f64()
    )
}
