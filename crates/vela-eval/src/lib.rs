//! vela-eval: the headless harness behind `vela eval` (docs/eval.md).
//!
//! A workload (a file: a multi-turn conversation with frozen user turns and per-turn checks, or a
//! parametrised synthetic one) is driven through an OpenAI-compatible endpoint: vela's own server
//! started in this process (the same generation path `vela serve` uses), or any `--url`
//! (vela, llama-server, vLLM). Each turn yields one set of metrics (`metrics.rs` defines them);
//! a stall probe samples responsiveness per engine phase; `vela eval ab` compares two
//! configurations in fresh processes and gives a verdict.

pub mod gate;
pub mod stats;
