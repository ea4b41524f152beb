//! vela-eval: the headless harness behind `vela eval` (docs/eval.md).
//!
//! A workload (a file: a multi-turn conversation with frozen user turns and per-turn checks, or a
//! parametrised synthetic one) is driven through an OpenAI-compatible endpoint: vela's own server
//! started in this process (the same generation path `vela serve` uses), or any `--url`
//! (vela, llama-server, vLLM). Each turn yields one set of metrics (`metrics.rs` defines them);
//! a stall probe samples responsiveness per engine phase; `vela eval ab` compares two
//! configurations in fresh processes and gives a verdict.

pub mod checks;
pub mod client;
pub mod gate;
pub mod metrics;
pub mod probe;
pub mod report;
pub mod run;
pub mod stats;
pub mod workload;

use anyhow::Result;

/// `vela eval`.
#[derive(clap::Args, Debug)]
pub struct EvalArgs {
    #[command(subcommand)]
    pub cmd: EvalCmd,
}

#[derive(clap::Subcommand, Debug)]
pub enum EvalCmd {
    /// Run a workload and write its report (per-turn metrics, stall probe, checks).
    Run(Box<run::RunArgs>),
    /// Compare two configurations in fresh processes (ABBA, paired statistics, a verdict).
    Ab(Box<gate::AbArgs>),
    /// List the built-in workloads.
    List,
    /// Print a built-in workload's file (a starting point for your own).
    Show {
        /// The workload's name.
        name: String,
    },
}

pub fn eval(args: EvalArgs) -> Result<()> {
    match args.cmd {
        EvalCmd::Run(a) => run::run(*a),
        EvalCmd::Ab(a) => gate::ab(*a),
        EvalCmd::List => {
            for (n, d) in workload::builtin_list() {
                println!("{n:14} {d}");
            }
            Ok(())
        }
        EvalCmd::Show { name } => match workload::builtin_source(&name) {
            Some(s) => {
                print!("{s}");
                Ok(())
            }
            None => anyhow::bail!("no built-in workload {name} (`vela eval list`)"),
        },
    }
}
