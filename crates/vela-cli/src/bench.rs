//! `vela bench`: llama-bench-style prompt processing (pp) and text generation (tg) throughput.
//!
//! pp: evaluate `-p` tokens from an empty cache (in `--ubatch` chunks). tg: generate `-n` tokens
//! one at a time after a 1-token prompt, as llama-bench does. Tokens are random ids (content does
//! not change the cost). `--json` prints `{"pp": {"n":..,"tps_mean":..,"tps_std":..,"samples":[..]},
//! "tg": {...}, "weight_bytes_per_token": .., "tg_weight_gbps": ..}`.
//!
//! `--parallel 1,4,16` measures batched decoding instead: that many sequences, each after a
//! 1-token prompt, generate `-n` tokens together, one batched forward per step
//! (`Session::eval_batch`); the rate is the aggregate over all sequences.

use crate::common::{self, ModelArgs};
use anyhow::{bail, Result};
use clap::Args;
use std::time::Instant;
use vela_engine::sampler::Rng;

#[derive(Args)]
pub struct BenchArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// Prompt length (0 to skip).
    #[arg(short = 'p', long = "n-prompt", default_value_t = 512)]
    pub n_prompt: usize,
    /// Generated tokens (0 to skip).
    #[arg(short = 'n', long = "n-gen", default_value_t = 128)]
    pub n_gen: usize,
    /// Repetitions.
    #[arg(short = 'r', long = "repetitions", default_value_t = 5)]
    pub reps: usize,
    /// Tokens already in the cache before tg is measured (tg at depth).
    #[arg(short = 'd', long = "depth", default_value_t = 0)]
    pub depth: usize,
    /// tg sampling temperature: 0 (default) greedy on the device, as llama-bench's fixed tokens
    /// cost; above 0 the default sampler (top-k 40, top-p 0.95, min-p 0.05) draws every token,
    /// as `vela run` and the server do.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Batched decoding of this many sequences at once (a comma-separated list: one
    /// measurement per value) instead of pp/tg.
    #[arg(long, value_delimiter = ',')]
    pub parallel: Vec<usize>,
    #[arg(long)]
    pub json: bool,
    /// Speculative decoding's verification cost: a forward of K + 1 tokens vs one decode step,
    /// K = 0..=--draft-max, at --depth (instead of pp/tg).
    #[arg(long)]
    pub spec_cost: bool,
    /// Greedy speculative generation with the model's drafter forced to these acceptance
    /// probabilities (comma-separated), at every K ≤ --draft-max and adaptive, vs plain.
    #[arg(long, value_delimiter = ',')]
    pub spec_accept: Vec<f64>,
    /// Deepest speculative round of --spec-cost / --spec-accept.
    #[arg(long, default_value_t = 7)]
    pub draft_max: usize,
}

pub(crate) fn stats(v: &[f64]) -> (f64, f64) {
    let m = v.iter().sum::<f64>() / v.len() as f64;
    let var = if v.len() > 1 {
        v.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (v.len() - 1) as f64
    } else {
        0.0
    };
    (m, var.sqrt())
}

pub fn bench(a: BenchArgs) -> Result<()> {
    if a.reps == 0 {
        bail!("--repetitions must be at least 1");
    }
    let mut margs = a.model.clone();
    if margs.ctx == 0 {
        // (At least 3 decode positions: the warm-up's steps follow a full-length prompt.)
        margs.ctx = (a.depth + a.n_prompt.max(1) + a.n_gen.max(3) + 1).max(256);
    }
    let l = common::load(&margs)?;
    if !a.parallel.is_empty() {
        return bench_parallel(&a, &l);
    }
    if a.spec_cost || !a.spec_accept.is_empty() {
        if a.spec_cost {
            crate::bench_spec::spec_cost(&a, &l)?;
        }
        if !a.spec_accept.is_empty() {
            crate::bench_spec::spec_accept(&a, &l)?;
        }
        return Ok(());
    }
    let n_vocab = l.model.n_vocab() as u64;
    let mut rng = Rng::new(42);
    let mut rand_tokens = |n: usize| {
        (0..n)
            .map(|_| (rng.next_u64() % n_vocab) as u32)
            .collect::<Vec<u32>>()
    };
    let mut session = l.session()?;
    // Warm-up, like llama-bench: one prompt of the measured length (pages in the weights,
    // spins up threads, loads a GPU's prefill kernels) and two decode steps (capture the GPU's
    // decode-step graph).
    session.eval(&rand_tokens(a.n_prompt.max(8).min(session.ubatch())))?;
    vela_engine::generate::greedy_steps(&mut session, rand_tokens(1)[0], 3)?;
    session.reset();
    let (mut pp, mut tg) = (Vec::new(), Vec::new());
    // Host-memory experts during tg (`--experts`): [calls, to host, to device, cache hits,
    // cache misses].
    let mut host = [0u64; 5];
    // And during pp: [layer calls, batches streamed to the device, bytes streamed].
    let mut host_pp = [0u64; 3];
    for _ in 0..a.reps {
        if a.n_prompt > 0 {
            session.reset();
            let toks = rand_tokens(a.n_prompt);
            let h0 = host_prefill();
            let t = Instant::now();
            session.eval(&toks)?;
            pp.push(a.n_prompt as f64 / t.elapsed().as_secs_f64());
            let h1 = host_prefill();
            (0..3).for_each(|i| host_pp[i] += h1[i] - h0[i]);
        }
        if a.n_gen > 0 {
            session.reset();
            if a.depth > 0 {
                session.eval(&rand_tokens(a.depth))?;
            }
            let tok = rand_tokens(1)[0];
            let h0 = host_traffic();
            let t = Instant::now();
            if a.temperature > 0.0 {
                // Sampled like `vela run` (never stopping at an end token).
                let cfg = vela_engine::SamplerConfig {
                    temperature: a.temperature,
                    ..Default::default()
                };
                let mut sampler = vela_engine::Sampler::new(cfg);
                let opts = vela_engine::GenerateOptions {
                    max_tokens: a.n_gen,
                    is_eog: &|_| false,
                };
                vela_engine::generate(&mut session, &mut sampler, &[tok], &opts, &mut |_| true)?;
            } else {
                // Greedy on the backend (a GPU copies back one id, not the vocabulary), each
                // step launched before the previous id is read back, as `vela run` decodes
                // greedily.
                vela_engine::generate::greedy_steps(&mut session, tok, a.n_gen)?;
            }
            tg.push(a.n_gen as f64 / t.elapsed().as_secs_f64());
            let h1 = host_traffic();
            (0..5).for_each(|i| host[i] += h1[i] - h0[i]);
        }
    }
    let tg_tokens = (a.n_gen * a.reps).max(1) as f64;
    let reps = a.reps.max(1) as f64;
    let host_per_token = host.map(|x| x as f64 / tg_tokens);
    let wb = l.model.weight_bytes_per_token();
    let (ppm, pps) = if pp.is_empty() {
        (0.0, 0.0)
    } else {
        stats(&pp)
    };
    let (tgm, tgs) = if tg.is_empty() {
        (0.0, 0.0)
    } else {
        stats(&tg)
    };
    let gbps = tgm * wb as f64 / 1e9;
    if a.json {
        let j = serde_json::json!({
            "model": l.path.display().to_string(),
            "backend": l.model.backend_name(),
            "pp": {"n": a.n_prompt, "tps_mean": ppm, "tps_std": pps, "samples": pp},
            "tg": {"n": a.n_gen, "depth": a.depth, "tps_mean": tgm, "tps_std": tgs, "samples": tg},
            "weight_bytes_per_token": wb,
            "tg_weight_gbps": gbps,
            "pp_host_experts_per_run": {"layer_calls": host_pp[0] as f64 / reps,
                "streamed_batches": host_pp[1] as f64 / reps, "streamed_bytes": host_pp[2] as f64 / reps},
            "tg_host_experts_per_token": {"layer_calls": host_per_token[0],
                "bytes_to_host": host_per_token[1], "bytes_to_device": host_per_token[2],
                "cache_hits": host_per_token[3], "cache_misses": host_per_token[4]},
        });
        println!("{j}");
    } else {
        println!("| model | backend | test | t/s |");
        println!("|---|---|---|---|");
        let name = l
            .path
            .file_name()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        let be = l.model.backend_name();
        if !pp.is_empty() {
            println!("| {name} | {be} | pp{} | {ppm:.2} ± {pps:.2} |", a.n_prompt);
        }
        if host_pp[0] > 0 {
            println!(
                "experts in host memory at pp, per run: {:.1} layer batches, {:.1} of them streamed to the device ({:.2} GB)",
                host_pp[0] as f64 / reps,
                host_pp[1] as f64 / reps,
                host_pp[2] as f64 / reps / 1e9
            );
        }
        if !tg.is_empty() {
            let d = if a.depth > 0 {
                format!(" @ d{}", a.depth)
            } else {
                String::new()
            };
            let t = if a.temperature > 0.0 {
                format!(" T={}", a.temperature)
            } else {
                String::new()
            };
            println!(
                "| {name} | {be} | tg{}{d}{t} | {tgm:.2} ± {tgs:.2} |",
                a.n_gen
            );
            println!(
                "weights read per token: {:.1} MiB → {gbps:.2} GB/s achieved at tg",
                wb as f64 / (1 << 20) as f64
            );
            if host[0] > 0 {
                let [c, th, td, hit, miss] = host_per_token;
                let cache = if hit + miss > 0.0 {
                    format!(
                        "; GPU cache {hit:.1} hits, {miss:.1} misses ({:.1} % hit rate)",
                        100.0 * hit / (hit + miss)
                    )
                } else {
                    String::new()
                };
                println!(
                    "experts in host memory at tg, per token: {c:.1} layer calls, {:.1} KiB to the host, {:.1} KiB back{cache}",
                    th / 1024.0,
                    td / 1024.0
                );
            }
        }
    }
    Ok(())
}

/// The host-memory experts' counters: [layer calls, bytes to the host, bytes to the device,
/// device cache hits, misses].
fn host_traffic() -> [u64; 5] {
    use std::sync::atomic::Ordering::Relaxed;
    let t = &vela_engine::expert_stats::HOST_TRAFFIC;
    let c = &vela_engine::expert_stats::CACHE_STATS;
    [
        t.calls.load(Relaxed),
        t.bytes_to_host.load(Relaxed),
        t.bytes_to_device.load(Relaxed),
        c.hits.load(Relaxed),
        c.misses.load(Relaxed),
    ]
}

/// The host-memory experts' prefill counters: [layer calls, batches streamed to the device,
/// bytes streamed].
fn host_prefill() -> [u64; 3] {
    use std::sync::atomic::Ordering::Relaxed;
    let t = &vela_engine::expert_stats::HOST_TRAFFIC;
    let s = &vela_engine::expert_stats::STREAM_STATS;
    [
        t.calls.load(Relaxed),
        s.batches.load(Relaxed),
        s.bytes.load(Relaxed),
    ]
}

/// `--parallel`: aggregate decode throughput of N sequences stepping together.
fn bench_parallel(a: &BenchArgs, l: &common::Loaded) -> Result<()> {
    if a.n_gen == 0 || a.parallel.contains(&0) {
        bail!("--parallel needs -n ≥ 1 and sequence counts ≥ 1");
    }
    let n_vocab = l.model.n_vocab() as u64;
    let mut rng = Rng::new(42);
    let mut results = Vec::new();
    for &n_seq in &a.parallel {
        let mut sessions = (0..n_seq)
            .map(|_| l.session())
            .collect::<Result<Vec<_>>>()?;
        let mut samples = Vec::new();
        // One warm-up round, then the measured ones.
        for rep in 0..=a.reps {
            for s in sessions.iter_mut() {
                s.reset();
            }
            let mut next: Vec<Vec<u32>> = (0..n_seq)
                .map(|_| vec![(rng.next_u64() % n_vocab) as u32])
                .collect();
            let steps = if rep == 0 { 2 } else { a.n_gen };
            let t = Instant::now();
            for _ in 0..steps {
                let mut refs: Vec<&mut vela_engine::Session> = sessions.iter_mut().collect();
                let inputs: Vec<&[u32]> = next.iter().map(|v| v.as_slice()).collect();
                // Greedy: the argmax of each row, as the server asks for it.
                let sel = vec![vela_models::Select::Argmax; n_seq];
                let out = vela_engine::Session::eval_batch_select(&mut refs, &inputs, &sel)?;
                next = out
                    .into_iter()
                    .map(|o| match o {
                        vela_models::Selected::Argmax(ids) => Ok(ids),
                        _ => bail!("an argmax selection returned something else"),
                    })
                    .collect::<Result<_>>()?;
            }
            if rep > 0 {
                samples.push((n_seq * steps) as f64 / t.elapsed().as_secs_f64());
            }
        }
        results.push((n_seq, samples));
    }
    let name = l
        .path
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let be = l.model.backend_name();
    if a.json {
        let rows: Vec<serde_json::Value> = results
            .iter()
            .map(|(n, v)| {
                let (m, s) = stats(v);
                serde_json::json!({"n_seq": n, "n_gen": a.n_gen, "tps_mean": m, "tps_std": s, "samples": v})
            })
            .collect();
        let j = serde_json::json!({"model": l.path.display().to_string(), "backend": be, "parallel": rows});
        println!("{j}");
    } else {
        println!("| model | backend | test | sequences | t/s (all sequences) | t/s per sequence |");
        println!("|---|---|---|---:|---|---:|");
        for (n, v) in &results {
            let (m, s) = stats(v);
            println!(
                "| {name} | {be} | tg{} | {n} | {m:.2} ± {s:.2} | {:.2} |",
                a.n_gen,
                m / *n as f64
            );
        }
    }
    Ok(())
}
