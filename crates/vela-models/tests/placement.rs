//! Routed experts in host memory (`vela_models::placement`) compute what experts on the model's
//! backend compute: on the CPU backend bit for bit (the same kernels in the same order, the
//! weights used in place instead of repacked), for every MoE architecture, in prefill chunks and
//! single-token steps, with every layer or some layers on the host, f32 and quantized experts.

mod common;
use common::*;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_compute::KvType;
use vela_formats::quant::GgmlType;
use vela_models::deepseekv4::DeepseekV4Model;
use vela_models::gemma4::Gemma4Model;
use vela_models::glm5::Glm5Model;
use vela_models::placement::{HostExperts, Prefill};
use vela_models::qwen4exp::Qwen4ExpModel;
use vela_models::{LanguageModel, LoadSpec};

/// More layers than any test model has: "every layer".
const ALL: usize = 64;

/// Every position's logits of `tokens`: a prefill in chunks of 8, then single-token steps.
fn logits(m: Arc<dyn LanguageModel>, tokens: &[u32]) -> Vec<f32> {
    let mut st = m.new_state(256, 8, KvType::F32).unwrap();
    let split = tokens.len() * 2 / 3;
    let mut out = Vec::new();
    for (ci, c) in tokens[..split].chunks(8).enumerate() {
        let pos: Vec<u32> = (0..c.len()).map(|i| (ci * 8 + i) as u32).collect();
        out.extend(st.forward(c, &pos, 0).unwrap());
    }
    for (i, &t) in tokens.iter().enumerate().skip(split) {
        out.extend(st.forward(&[t], &[i as u32], 0).unwrap());
    }
    out
}

/// Host experts on `layers`, run by a CPU backend of their own, with `cache_bytes` of device
/// cache each.
fn host_cached(layers: &[usize], cache_bytes: u64) -> Option<HostExperts> {
    let mut h = HostExperts::new(Arc::new(CpuBackend::new(2)), layers.to_vec(), cache_bytes);
    // The CPU's products (the measured choice may stream a batch once it has measured both).
    h.prefill = Prefill::Cpu;
    Some(h)
}

fn host(layers: &[usize]) -> Option<HostExperts> {
    host_cached(layers, 0)
}

fn spec(quant: Option<GgmlType>, layers: &[usize]) -> LoadSpec {
    LoadSpec {
        quant,
        host_experts: host(layers),
    }
}

/// Host-expert layer calls so far (every test of this binary adds to them).
fn host_calls() -> u64 {
    vela_models::blocks::experts::HOST_TRAFFIC
        .calls
        .load(std::sync::atomic::Ordering::Relaxed)
}

/// `a` (run with host experts, after `calls0` host calls) equals `b` bit for bit.
fn assert_same(name: &str, calls0: u64, a: &[f32], b: &[f32]) {
    assert!(host_calls() > calls0, "{name}: no layer ran on the host");
    assert_eq!(a.len(), b.len(), "{name}");
    let diff = a
        .iter()
        .zip(b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    assert_eq!(diff, 0, "{name}: {diff} of {} logits differ", a.len());
}

#[test]
fn gemma4_moe_host_experts_are_exact() {
    let Some(dir) = fixture("moe") else { return };
    let tokens = ids(&tokens_json(&dir), "tokens");
    let load = |s: &LoadSpec| -> Arc<dyn LanguageModel> {
        Arc::new(Gemma4Model::load_hf_with(Arc::new(CpuBackend::new(2)), &dir, s).unwrap())
    };
    let all: Vec<usize> = (0..ALL).collect();
    for quant in [None, Some(GgmlType::Q4_0)] {
        let base = logits(load(&LoadSpec::quant(quant)), &tokens);
        for layers in [&all[..], &[1][..]] {
            let (c0, m) = (host_calls(), load(&spec(quant, layers)));
            let name = format!("gemma4 {quant:?} {layers:?}");
            assert_same(&name, c0, &logits(m, &tokens), &base);
        }
    }
}

#[test]
fn deepseekv4_host_experts_are_exact() {
    let tokens: Vec<u32> = (0..40).map(|i| (i * 37 + 5) % 500).collect();
    let synth = |h: Option<HostExperts>| -> Arc<dyn LanguageModel> {
        let be = Arc::new(CpuBackend::new(2));
        Arc::new(
            DeepseekV4Model::synth_placed(be, "deepseek-v4-tiny", GgmlType::Q8_0, 1, h).unwrap(),
        )
    };
    let base = logits(synth(None), &tokens);
    // Every layer (the hash-routed first ones too), and one of the top-k layers alone.
    let all: Vec<usize> = (0..ALL).collect();
    for layers in [&all[..], &[3][..]] {
        let c0 = host_calls();
        let got = logits(synth(host(layers)), &tokens);
        assert_same(&format!("deepseek_v4 {layers:?}"), c0, &got, &base);
    }
    // Every batch's experts streamed to the device (here the CPU's repacked copy of the
    // batch's experts), and the measured choice: the same bits.
    for prefill in [Prefill::Stream, Prefill::Measured] {
        let streamed = &vela_models::blocks::expert_stream::STREAM_STATS.batches;
        let (c0, s0) = (
            host_calls(),
            streamed.load(std::sync::atomic::Ordering::Relaxed),
        );
        let mut h = host(&all).unwrap();
        h.prefill = prefill;
        let got = logits(synth(Some(h)), &tokens);
        assert_same(&format!("deepseek_v4 {prefill:?}"), c0, &got, &base);
        let n = streamed.load(std::sync::atomic::Ordering::Relaxed) - s0;
        assert!(prefill != Prefill::Stream || n > 0, "nothing streamed");
    }
    // With a device cache of a few experts per layer (some slots on the device, the rest on the
    // CPU in the same step) and of every expert: still the same bits.
    for cache in [1 << 15, 1 << 30] {
        let (c0, h0, m0) = (host_calls(), cache_stat(0), cache_stat(1));
        let got = logits(synth(host_cached(&all, cache)), &tokens);
        assert_same(&format!("deepseek_v4 cache {cache}"), c0, &got, &base);
        let (hits, misses) = (cache_stat(0) - h0, cache_stat(1) - m0);
        eprintln!("cache {cache}: {hits} hits, {misses} misses");
        assert!(hits > 0, "cache {cache}: no slot ran from the cache");
        if cache < 1 << 20 {
            assert!(misses > hits / 4, "cache {cache}: {misses} misses");
        }
    }
    // Long enough for later choices of the cached set: experts replaced in their slots.
    let tokens: Vec<u32> = (0..240).map(|i| (i * 97 + 11) % 500).collect();
    let base = logits(synth(None), &tokens);
    let stats = &vela_models::blocks::expert_cache::CACHE_STATS;
    let (c0, r0) = (host_calls(), stats.replaced.load(Ordering::Relaxed));
    let got = logits(synth(host_cached(&all, 1 << 15)), &tokens);
    assert_same("deepseek_v4 cache refreshed", c0, &got, &base);
    let replaced = stats.replaced.load(Ordering::Relaxed) - r0;
    eprintln!("cache refreshed: {replaced} experts replaced");
    assert!(replaced > 0, "no cached expert was replaced");
}

/// The caches' hits (0) or misses (1) so far.
fn cache_stat(i: usize) -> u64 {
    let s = &vela_models::blocks::expert_cache::CACHE_STATS;
    [&s.hits, &s.misses][i].load(std::sync::atomic::Ordering::Relaxed)
}

#[test]
fn qwen4exp_host_experts_are_exact() {
    let Some(dir) = golden_fixture("qwen4exp", "gdn_qsa", "config.json") else {
        return;
    };
    let p = prompts(&dir);
    let tokens = id_list(&p["prompts"]["long"]);
    let tokens = &tokens[..tokens.len().min(48)];
    let load = |s: &LoadSpec| -> Arc<dyn LanguageModel> {
        Arc::new(Qwen4ExpModel::load_hf(Arc::new(CpuBackend::new(2)), Path::new(&dir), s).unwrap())
    };
    let base = logits(load(&LoadSpec::default()), tokens);
    let all: Vec<usize> = (0..ALL).collect();
    let c0 = host_calls();
    let got = logits(load(&spec(None, &all)), tokens);
    assert_same("qwen4exp", c0, &got, &base);
}

/// GLM 5.3 (`glm5-tiny`: one dense layer, then MoE layers on KDA and MLA mixers): every MoE
/// layer or one on the host, with every batch streamed, and with a small device cache.
#[test]
fn glm5_host_experts_are_exact() {
    let tokens: Vec<u32> = (0..40).map(|i| (i * 53 + 7) % 512).collect();
    let synth = |h: Option<HostExperts>| -> Arc<dyn LanguageModel> {
        let be = Arc::new(CpuBackend::new(2));
        Arc::new(Glm5Model::synth_placed(be, "glm5-tiny", GgmlType::Q8_0, 1, h).unwrap())
    };
    let base = logits(synth(None), &tokens);
    let all: Vec<usize> = (0..ALL).collect();
    for layers in [&all[..], &[5][..]] {
        let c0 = host_calls();
        let got = logits(synth(host(layers)), &tokens);
        assert_same(&format!("glm5 {layers:?}"), c0, &got, &base);
    }
    let mut h = host(&all).unwrap();
    h.prefill = Prefill::Stream;
    let c0 = host_calls();
    assert_same("glm5 streamed", c0, &logits(synth(Some(h)), &tokens), &base);
    let (c0, h0) = (host_calls(), cache_stat(0));
    let got = logits(synth(host_cached(&all, 1 << 14)), &tokens);
    assert_same("glm5 cache", c0, &got, &base);
    assert!(cache_stat(0) > h0, "glm5: no slot ran from the cache");
}
