//! `vela run`, `vela chat`, `vela logits`.

use crate::common::{self, ModelArgs, SampleArgs};
use crate::spec::{self, SpecArgs};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::{BufRead, Write};
use vela_engine::grammar::{Constraint, Grammar, GrammarCompiler};
use vela_engine::speculative::{
    generate_speculative, AcceptRule, DepthModel, Drafter, SpecOptions,
};
use vela_engine::{generate, generate_constrained, GenerateOptions, Sampler, SamplerConfig};
use vela_template::{ChatTemplate, RenderRequest};

#[derive(Args)]
pub struct RunArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sample: SampleArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// The prompt (raw text completion; BOS is added as the model's metadata says). Also as
    /// the positional argument, or from standard input when neither is given.
    #[arg(long, short = 'p', conflicts_with = "text")]
    pub prompt: Option<String>,
    /// The prompt, as a positional argument.
    #[arg(value_name = "PROMPT")]
    pub text: Option<String>,
    /// Do not add BOS even if the model asks for it.
    #[arg(long)]
    pub no_bos: bool,
    /// Constrain the output to one JSON value valid under the JSON Schema in FILE (no
    /// speculative decoding then).
    #[arg(long, value_name = "FILE")]
    pub json_schema: Option<std::path::PathBuf>,
}

#[derive(Args)]
pub struct ChatArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[command(flatten)]
    pub sample: SampleArgs,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// System prompt.
    #[arg(long, short = 's')]
    pub system: Option<String>,
}

#[derive(Args)]
pub struct LogitsArgs {
    /// GGUF model file or Hugging Face checkpoint directory.
    #[arg(long, short = 'm')]
    pub model: String,
    /// cpu, cuda, cuda:N or auto.
    #[arg(long, default_value = "auto")]
    pub device: String,
    /// Comma-separated token ids, used verbatim (no BOS added).
    #[arg(long, conflicts_with = "prompt")]
    pub tokens: Option<String>,
    /// Text to tokenize (BOS per model metadata unless --no-bos).
    #[arg(long, short = 'p')]
    pub prompt: Option<String>,
    #[arg(long)]
    pub no_bos: bool,
    #[arg(long, short = 't', default_value_t = 0)]
    pub threads: usize,
    #[arg(long, default_value_t = 512)]
    pub ubatch: usize,
    #[arg(long, short = 'c', default_value_t = 0)]
    pub ctx: usize,
    #[arg(long, default_value = "f16")]
    pub kv_type: String,
    /// Convert the model's float matrices to this type at load (q8_0, q4_k, ...).
    #[arg(long)]
    pub quant: Option<String>,
    /// Print the logits of every position (row after row, `n_tokens × n_vocab` values) instead
    /// of the last one's.
    #[arg(long)]
    pub all_positions: bool,
}

/// How tokens are produced: plain sampling, or speculative decoding with a drafter.
struct Gen {
    sampler: Sampler,
    cfg: SamplerConfig,
    drafter: Option<Box<dyn Drafter>>,
    draft_max: usize,
    /// The depth cost model (`None` with `--draft-fixed`).
    depth: Option<DepthModel>,
    /// `--json-schema`: the grammar of the output.
    grammar: Option<Constraint>,
}

impl Gen {
    fn new(
        cfg: SamplerConfig,
        a: &SpecArgs,
        l: &common::Loaded,
        margs: &ModelArgs,
        session: &vela_engine::Session,
    ) -> Result<Gen> {
        Ok(Gen {
            sampler: Sampler::new(cfg.clone()),
            drafter: spec::drafter(a, l, margs, session)?,
            cfg,
            draft_max: a.draft_max,
            depth: (!a.draft_fixed).then(|| DepthModel::new(a.draft_max)),
            grammar: None,
        })
    }
}

/// Stream generated text to stdout as complete UTF-8 characters become available.
fn stream_generate(
    l: &common::Loaded,
    session: &mut vela_engine::Session,
    gen: &mut Gen,
    prompt: &[u32],
    max_tokens: usize,
) -> Result<Vec<u32>> {
    let tok = &l.tokenizer;
    let mut detok = tok.detokenizer(false);
    let stdout = std::io::stdout();
    let mut ok = true;
    let is_eog = |t: u32| tok.is_eog(t);
    let opts = GenerateOptions {
        max_tokens,
        is_eog: &is_eog,
    };
    let mut emit = |t: u32| {
        let text = detok.push(t);
        if !text.is_empty() {
            let mut o = stdout.lock();
            ok = o.write_all(text.as_bytes()).and_then(|_| o.flush()).is_ok();
        }
        ok // stop when stdout is gone (e.g. `| head`)
    };
    let out = match (&mut gen.grammar, &mut gen.drafter) {
        (Some(g), _) => {
            generate_constrained(session, &mut gen.sampler, prompt, &opts, g, &mut emit)?.0
        }
        (None, None) => generate(session, &mut gen.sampler, prompt, &opts, &mut emit)?.0,
        (None, Some(d)) => {
            let so = SpecOptions {
                depth: gen.depth.as_ref(),
                max_tokens,
                draft_max: gen.draft_max,
                is_eog: &is_eog,
                rule: AcceptRule::Exact,
            };
            let (out, _, stats) =
                generate_speculative(session, &mut **d, &gen.cfg, prompt, &so, &mut emit)?;
            eprintln!("{}", spec::report(&stats));
            out
        }
    };
    let rest = detok.flush();
    let _ = stdout.lock().write_all(rest.as_bytes());
    Ok(out)
}

/// The prompt given (`--prompt` or positional), else standard input read to its end when it is
/// not a terminal, less one final line break (what `echo` and editors append).
fn prompt_text(given: Option<String>) -> Result<String> {
    use std::io::{IsTerminal, Read};
    if let Some(t) = given {
        return Ok(t);
    }
    let mut stdin = std::io::stdin();
    if stdin.is_terminal() {
        bail!("no prompt: give it as an argument, with --prompt, or on standard input");
    }
    let mut t = String::new();
    stdin
        .read_to_string(&mut t)
        .context("reading the prompt from standard input")?;
    let keep = t
        .strip_suffix('\n')
        .map_or(t.len(), |s| s.strip_suffix('\r').unwrap_or(s).len());
    t.truncate(keep);
    Ok(t)
}

pub fn run(a: RunArgs) -> Result<()> {
    let cfg = a.sample.config()?;
    let text = prompt_text(a.prompt.or(a.text))?;
    let l = common::load(&a.model)?;
    let prompt = l.tokenizer.encode(&text, !a.no_bos, false)?;
    if prompt.is_empty() {
        bail!("the prompt is empty after tokenization");
    }
    let mut session = l.session()?;
    let mut gen = Gen::new(cfg, &a.spec, &l, &a.model, &session)?;
    if let Some(path) = &a.json_schema {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let schema: serde_json::Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not JSON", path.display()))?;
        let g = GrammarCompiler::new(&l.tokenizer)?
            .compile(&Grammar::JsonSchema(schema))
            .with_context(|| format!("the schema in {} cannot be enforced", path.display()))?;
        gen.grammar = Some(g);
    }
    let t0 = std::time::Instant::now();
    let out = stream_generate(&l, &mut session, &mut gen, &prompt, a.sample.max_tokens)?;
    println!();
    let dt = t0.elapsed().as_secs_f64();
    eprintln!(
        "[{} prompt + {} generated tokens in {:.2} s]",
        prompt.len(),
        out.len(),
        dt
    );
    Ok(())
}

pub fn chat(a: ChatArgs) -> Result<()> {
    let cfg = a.sample.config()?;
    let l = common::load(&a.model)?;
    let src = l
        .chat_template
        .as_deref()
        .context("this model has no chat template; use `vela run` for raw completion")?;
    let tmpl = ChatTemplate::new(src, &l.bos_eos.0, &l.bos_eos.1)?;
    let mut messages: Vec<serde_json::Value> = Vec::new();
    if let Some(s) = &a.system {
        messages.push(serde_json::json!({"role": "system", "content": s}));
    }
    let mut session = l.session()?;
    let mut gen = Gen::new(cfg, &a.spec, &l, &a.model, &session)?;
    eprintln!(
        "vela chat — {} ({}). Type /exit or Ctrl-D to quit, /reset to clear.",
        l.path.display(),
        l.model.arch()
    );
    let stdin = std::io::stdin();
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let line = line.trim_end_matches(['\n', '\r']);
        match line {
            "/exit" | "/quit" => break,
            "/reset" => {
                messages.retain(|m| m["role"] == "system");
                session.reset();
                continue;
            }
            "" => continue,
            _ => {}
        }
        messages.push(serde_json::json!({"role": "user", "content": line}));
        let rendered = tmpl.render(&RenderRequest {
            messages: serde_json::Value::Array(messages.clone()),
            add_generation_prompt: true,
            ..Default::default()
        })?;
        let ids = vela_engine::prompt::tokenize_chat(&l.tokenizer, &rendered, &messages)?;
        // Reuse the cached prefix: only the new tokens are evaluated.
        let common_len = session
            .tokens()
            .iter()
            .zip(&ids)
            .take_while(|(a, b)| a == b)
            .count();
        let keep = common_len.min(ids.len() - 1);
        if session.truncate(keep).is_err() {
            session.reset();
        }
        let new = ids[session.n_past()..].to_vec();
        let out = stream_generate(&l, &mut session, &mut gen, &new, a.sample.max_tokens)?;
        println!();
        let reply = l.tokenizer.decode(&out, true)?;
        messages.push(serde_json::json!({"role": "assistant", "content": reply}));
    }
    Ok(())
}

pub fn logits(a: LogitsArgs) -> Result<()> {
    let margs = ModelArgs {
        model: Some(a.model.clone()),
        device: a.device.clone(),
        threads: a.threads,
        ctx: a.ctx,
        ubatch: a.ubatch,
        kv_type: a.kv_type.clone(),
        quant: a.quant.clone(),
        experts: "auto".into(),
        gpu_mem: None,
        expert_cache: None,
    };
    let l = common::load(&margs)?;
    let tokens: Vec<u32> = match (&a.tokens, &a.prompt) {
        (Some(t), _) => t
            .split(',')
            .map(|s| {
                s.trim()
                    .parse::<u32>()
                    .with_context(|| format!("invalid token id '{s}'"))
            })
            .collect::<Result<_>>()?,
        (None, Some(p)) => l.tokenizer.encode(p, !a.no_bos, false)?,
        (None, None) => bail!("give --tokens or --prompt"),
    };
    if tokens.is_empty() {
        bail!("no tokens to evaluate");
    }
    let n_vocab = l.model.n_vocab();
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
        bail!("token id {bad} is out of range (vocabulary has {n_vocab} entries)");
    }
    let mut opts = l.opts.clone();
    if opts.n_ctx == 0 {
        opts.n_ctx = tokens
            .len()
            .max(vela_engine::Session::default_n_ctx(&*l.model));
    }
    let mut session = vela_engine::Session::new(l.model.clone(), &opts)?;
    let logits = if a.all_positions {
        let mut all = Vec::with_capacity(tokens.len() * n_vocab);
        for chunk in tokens.chunks(session.ubatch()) {
            all.extend(session.eval_all_logits(chunk)?);
        }
        all
    } else {
        session.eval(&tokens)?
    };
    let out = serde_json::json!({"n_vocab": n_vocab, "tokens": tokens, "logits": logits});
    println!("{out}");
    Ok(())
}
