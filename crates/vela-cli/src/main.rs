//! `vela`: run, chat with, benchmark and inspect LLMs.
//!
//! Every subcommand prints its result on stdout and logs on stderr; errors are one line on stderr
//! with exit status 1 (2 for usage errors, from clap).

mod agent;
mod bench;
mod bench_spec;
mod common;
mod info;
mod run;
mod spec;
mod synth;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "vela", version, about = "Rust-native LLM inference engine")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Complete a prompt, streaming only the generated text to stdout.
    Run(run::RunArgs),
    /// Interactive chat using the model's chat template.
    Chat(run::ChatArgs),
    /// Evaluate a token sequence and print the last position's logits (or every position's) as JSON.
    Logits(run::LogitsArgs),
    /// Print the token ids of a text as a JSON array.
    Tokenize(info::TokenizeArgs),
    /// Print architecture, shapes, tensor types and tokenizer summary.
    Info(info::InfoArgs),
    /// Where the weights would go on this machine (routed experts on the GPU or in host memory).
    Plan(info::PlanArgs),
    /// Prompt-processing and generation throughput (llama-bench style).
    Bench(bench::BenchArgs),
    /// OpenAI/Anthropic-compatible HTTP server with an exact prefix cache.
    Serve(vela_server::ServeArgs),
    /// A coding-agent client (Claude Code, aider) against a local `vela serve` started for it.
    Agent(agent::AgentArgs),
    /// Headless evaluation: multi-turn workloads, per-turn metrics, stall probe, A/B gates.
    Eval(vela_eval::EvalArgs),
    /// Write a random-weight GGUF of a real model geometry (for benchmarks at real sizes).
    Synth(synth::SynthArgs),
}

/// A closed stdout (`vela run ... | head`) ends the process quietly, like other command-line
/// tools, instead of a panic in the next `println!` (Rust ignores SIGPIPE, so every write would
/// fail with EPIPE). Not for `serve`: its sockets must see EPIPE as an error, not a signal.
fn default_sigpipe() {
    #[cfg(unix)]
    // SAFETY: at the start of main, before any thread exists; SIG_DFL is a valid disposition.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn main() {
    let cli = Cli::parse();
    if !matches!(cli.cmd, Cmd::Serve(_) | Cmd::Eval(_)) {
        default_sigpipe();
    }
    let r = match cli.cmd {
        Cmd::Run(a) => run::run(a),
        Cmd::Chat(a) => run::chat(a),
        Cmd::Logits(a) => run::logits(a),
        Cmd::Tokenize(a) => info::tokenize(a),
        Cmd::Info(a) => info::info(a),
        Cmd::Plan(a) => info::plan(a),
        Cmd::Bench(a) => bench::bench(a),
        Cmd::Serve(a) => vela_server::serve(a),
        Cmd::Synth(a) => synth::synth(a),
        Cmd::Eval(a) => vela_eval::eval(a),
        Cmd::Agent(a) => agent::agent(a),
    };
    if let Err(e) = r {
        // One line: the chain of causes joined.
        let msg = format!("{e:#}").replace('\n', " ");
        eprintln!("error: {msg}");
        std::process::exit(1);
    }
}
