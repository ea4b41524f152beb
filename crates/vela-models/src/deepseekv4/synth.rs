//! DeepSeek V4 Flash at real size without a file: the release checkpoint's tensors (its names,
//! docs/deepseekv4-spec.md §10.1) generated in memory as the loader asks for them,
//! deterministic from the seed (the element values of `crate::synth`'s generator), matrices
//! directly in the load type; and the memory plan of a geometry (weights per storage type,
//! per-sequence state at a context length).
//!
//! Geometries: `deepseek-v4-flash` (the release config, spec §1 "real (Flash)": 43 layers, 284B
//! parameters), `deepseek-v4-flash-12l` (its first 12 layers: 2 sliding, 5 CSA, 5 HCA, the 3
//! hash-routed ones included) and `deepseek-v4-tiny` (the shapes of the `flash_mini` fixture of
//! scripts/gen-deepseekv4-fixtures.py: every layer kind, hash and top-k routing).
//! Every geometry carries the MTP block (spec §11), generated the same way; the memory plan
//! leaves it out. Any of them with `-dspark` appended carries DeepSeek-V4-Flash-DSpark's drafter
//! instead (the release puts its stages where the MTP block was): three stages (full blocks,
//! sliding attention, top-k routing) reading the last three layers, 5-token blocks, rank-256
//! Markov and confidence heads ([`super::dspark`]); such a model drafts whole blocks (its
//! random confidence head would stop them at random).

use super::*;
use crate::placement::{HostExperts, Sizes};
use crate::synth::tensor_key;
use crate::weights::{load_type, WeightSource};
use anyhow::Context;
use serde_json::{json, Value};
use std::collections::HashMap;
use vela_compute::HostWeight;
use vela_formats::quant::GgmlType;

/// Names of the geometries [`config`] knows.
pub const GEOMETRIES: &[&str] = &[
    "deepseek-v4-flash",
    "deepseek-v4-flash-12l",
    "deepseek-v4-tiny",
];

/// The DSpark suffix of a geometry name.
const DSPARK: &str = "-dspark";

/// DSpark's stages and Markov rank in the release.
const DSPARK_STAGES: usize = 3;
const DSPARK_RANK: usize = 256;

/// Whether `name` is one of [`GEOMETRIES`], with or without `-dspark`.
pub fn is_geometry(name: &str) -> bool {
    GEOMETRIES.contains(&name.strip_suffix(DSPARK).unwrap_or(name))
}

/// The release's `compress_ratios` for its 43 layers: `[0, 0] + [4, 128] × 20 + [4]`.
pub fn release_ratios() -> Vec<u64> {
    let mut r = vec![0, 0];
    for _ in 0..20 {
        r.extend([4, 128]);
    }
    r.push(4);
    r
}

/// The config.json of a geometry (the release's keys).
pub fn config(name: &str) -> Result<Value> {
    let real = |layers: usize| {
        json!({
            "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
            "vocab_size": 129280, "hidden_size": 4096, "num_hidden_layers": layers,
            "num_attention_heads": 64, "num_key_value_heads": 1, "head_dim": 512,
            "qk_rope_head_dim": 64, "q_lora_rank": 1024, "o_groups": 8, "o_lora_rank": 1024,
            "sliding_window": 128, "compress_ratios": release_ratios()[..layers],
            "num_hash_layers": 3, "index_n_heads": 64, "index_head_dim": 128, "index_topk": 512,
            "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 6,
            "moe_intermediate_size": 2048, "scoring_func": "sqrtsoftplus",
            "topk_method": "noaux_tc", "norm_topk_prob": true, "routed_scaling_factor": 1.5,
            "swiglu_limit": 10.0, "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
            "rope_theta": 10000, "compress_rope_theta": 160000,
            "rope_scaling": {"type": "yarn", "factor": 16, "original_max_position_embeddings": 65536,
                             "beta_fast": 32, "beta_slow": 1},
            "rms_norm_eps": 1e-6, "hidden_act": "silu", "tie_word_embeddings": false,
            "max_position_embeddings": 1048576, "bos_token_id": 0, "eos_token_id": 1,
            "num_nextn_predict_layers": 1
        })
    };
    if let Some(base) = name.strip_suffix(DSPARK) {
        let mut j = config(base)?;
        let layers = j["num_hidden_layers"].as_u64().unwrap_or(0) as usize;
        let o = j.as_object_mut().expect("an object");
        o.insert("dspark_block_size".into(), json!(5));
        let taps: Vec<usize> = (layers.saturating_sub(3)..layers).collect();
        o.insert("dspark_target_layer_ids".into(), json!(taps));
        o.insert("dspark_noise_token_id".into(), json!(2));
        return Ok(j);
    }
    Ok(match name {
        "deepseek-v4-flash" => real(43),
        "deepseek-v4-flash-12l" => real(12),
        "deepseek-v4-tiny" => {
            let mut j = real(5);
            let o = j.as_object_mut().expect("an object");
            for (k, v) in [
                ("vocab_size", json!(512)),
                ("hidden_size", json!(64)),
                ("compress_ratios", json!([0, 0, 4, 128, 4])),
                ("num_attention_heads", json!(4)),
                ("head_dim", json!(64)),
                ("qk_rope_head_dim", json!(16)),
                ("q_lora_rank", json!(32)),
                ("o_groups", json!(2)),
                ("o_lora_rank", json!(16)),
                ("sliding_window", json!(32)),
                ("index_n_heads", json!(16)),
                ("index_head_dim", json!(32)),
                ("index_topk", json!(16)),
                ("n_routed_experts", json!(16)),
                ("num_experts_per_tok", json!(4)),
                ("moe_intermediate_size", json!(32)),
            ] {
                o.insert(k.into(), v);
            }
            j
        }
        _ => bail!(
            "unknown deepseek_v4 geometry '{name}' (one of {})",
            GEOMETRIES.join(", ")
        ),
    })
}

/// How the release stores a tensor (spec §10.2).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    /// e4m3 with a ue8m0 scale per 128 × 128 block.
    Fp8,
    Bf16,
    /// 4-bit e2m1 with a ue8m0 scale per 32 values (the routed experts).
    Mxfp4,
    F32,
    I64,
}

/// How a tensor's values are made.
#[derive(Clone, Copy, Debug)]
enum Make {
    /// N(0, std²) in the load type.
    Matrix { std: f32 },
    /// f32 values `mean + std·N` (vectors, the mHC mixes).
    Floats { mean: f32, std: f32 },
    /// The hash layers' token → experts table: distinct expert ids per token.
    Table,
}

#[derive(Clone, Copy, Debug)]
struct Tensor {
    rows: usize,
    cols: usize,
    make: Make,
    stored: Stored,
}

/// A plan being filled: the tensors by name.
struct Planner<'a> {
    c: &'a DeepseekV4Config,
    t: HashMap<String, Tensor>,
}

// Linear maps N(0, 1/fan_in): unit-scale outputs from unit-scale (normalised) inputs.
fn mat(cols: usize) -> Make {
    Make::Matrix {
        std: 1.0 / (cols as f32).sqrt(),
    }
}

// Weighted RMSNorm gammas (no 1 + w).
const GAMMA: Make = Make::Floats {
    mean: 1.0,
    std: 0.02,
};

impl Planner<'_> {
    fn add(&mut self, name: String, rows: usize, cols: usize, make: Make, stored: Stored) {
        let t = Tensor {
            rows,
            cols,
            make,
            stored,
        };
        self.t.insert(name, t);
    }

    /// An mHC module: the mixes see an RMS-normalised [S·H] row (logits of unit scale); bases
    /// and scales as the fixtures' (spread Sinkhorn inputs, no saturated sigmoid).
    fn hc(&mut self, p: &str, rows: usize, n_scale: usize) {
        let sh = self.c.hc * self.c.hidden;
        let f = |mean, std| Make::Floats { mean, std };
        let std = 1.0 / (sh as f32).sqrt();
        self.add(format!("{p}_fn"), rows, sh, f(0.0, std), Stored::F32);
        self.add(format!("{p}_base"), 1, rows, f(0.0, 0.5), Stored::F32);
        self.add(format!("{p}_scale"), 1, n_scale, f(1.0, 0.2), Stored::F32);
    }

    /// A layer's tensors under `p` (`layers.<i>`, or `mtp.0` for the MTP block).
    fn layer(&mut self, p: &str, kind: Attn, routing: Routing) {
        let c = self.c;
        let (h, s) = (c.hidden, c.hc);
        let f = |mean, std| Make::Floats { mean, std };
        self.hc(&format!("{p}.hc_attn"), (2 + s) * s, 3);
        self.hc(&format!("{p}.hc_ffn"), (2 + s) * s, 3);
        let (nh, hd, qr) = (c.n_head, c.head_dim, c.q_rank);
        let (g, r) = (c.o_groups, c.o_rank);
        self.add(format!("{p}.attn_norm.weight"), 1, h, GAMMA, Stored::Bf16);
        self.add(format!("{p}.ffn_norm.weight"), 1, h, GAMMA, Stored::Bf16);
        let a = format!("{p}.attn");
        // Sinks of unit scale: a share of the softmax, never all of it.
        self.add(format!("{a}.attn_sink"), 1, nh, f(0.0, 1.0), Stored::F32);
        self.add(format!("{a}.wq_a.weight"), qr, h, mat(h), Stored::Fp8);
        self.add(format!("{a}.q_norm.weight"), 1, qr, GAMMA, Stored::Bf16);
        self.add(
            format!("{a}.wq_b.weight"),
            nh * hd,
            qr,
            mat(qr),
            Stored::Fp8,
        );
        self.add(format!("{a}.wkv.weight"), hd, h, mat(h), Stored::Fp8);
        self.add(format!("{a}.kv_norm.weight"), 1, hd, GAMMA, Stored::Bf16);
        let gw = nh * hd / g;
        self.add(format!("{a}.wo_a.weight"), g * r, gw, mat(gw), Stored::Fp8);
        self.add(
            format!("{a}.wo_b.weight"),
            h,
            g * r,
            mat(g * r),
            Stored::Fp8,
        );
        let mut comp = |p: &str, width: usize, m: usize, overlap: bool| {
            let half = if overlap { 2 * width } else { width };
            self.add(format!("{p}.wkv.weight"), half, h, mat(h), Stored::Bf16);
            self.add(format!("{p}.wgate.weight"), half, h, mat(h), Stored::Bf16);
            self.add(format!("{p}.ape"), m, half, f(0.0, 0.5), Stored::F32);
            self.add(format!("{p}.norm.weight"), 1, width, GAMMA, Stored::Bf16);
        };
        match kind {
            Attn::Sliding => {}
            Attn::Hca => comp(&format!("{a}.compressor"), hd, c.hca_rate, false),
            Attn::Csa => {
                comp(&format!("{a}.compressor"), hd, c.csa_rate, true);
                let x = format!("{a}.indexer");
                comp(&format!("{x}.compressor"), c.idx_dim, c.csa_rate, true);
                let (ni, di) = (c.idx_heads, c.idx_dim);
                self.add(
                    format!("{x}.wq_b.weight"),
                    ni * di,
                    qr,
                    mat(qr),
                    Stored::Fp8,
                );
                self.add(
                    format!("{x}.weights_proj.weight"),
                    ni,
                    h,
                    mat(h),
                    Stored::Bf16,
                );
            }
        }
        let e = format!("{p}.ffn");
        let (ne, ff) = (c.n_expert, c.n_ff);
        self.add(format!("{e}.gate.weight"), ne, h, mat(h), Stored::Bf16);
        // The correction bias (selection only; the release has it on hash layers too).
        self.add(format!("{e}.gate.bias"), 1, ne, f(0.0, 0.3), Stored::F32);
        if routing == Routing::Hash {
            let name = format!("{e}.gate.tid2eid");
            self.add(name, c.n_vocab, c.top_k, Make::Table, Stored::I64);
        }
        for x in 0..ne {
            let w = format!("{e}.experts.{x}");
            self.add(format!("{w}.w1.weight"), ff, h, mat(h), Stored::Mxfp4);
            self.add(format!("{w}.w3.weight"), ff, h, mat(h), Stored::Mxfp4);
            self.add(format!("{w}.w2.weight"), h, ff, mat(ff), Stored::Mxfp4);
        }
        let w = format!("{e}.shared_experts");
        self.add(format!("{w}.w1.weight"), ff, h, mat(h), Stored::Fp8);
        self.add(format!("{w}.w3.weight"), ff, h, mat(h), Stored::Fp8);
        self.add(format!("{w}.w2.weight"), h, ff, mat(ff), Stored::Fp8);
    }
}

impl Planner<'_> {
    /// DeepSeek-V4-Flash-DSpark's drafter into `t`: `stages` sliding, top-k routed blocks under
    /// `mtp.<s>` and, under `mtp.0`, the projection of the three taps, the Markov and
    /// confidence heads, its hc_head and norm.
    fn dspark(c: &DeepseekV4Config, stages: usize, t: &mut HashMap<String, Tensor>) {
        let mut p = Planner {
            c,
            t: std::mem::take(t),
        };
        let (h, s, v, rk) = (c.hidden, c.hc, c.n_vocab, DSPARK_RANK);
        for i in 0..stages {
            p.layer(&format!("mtp.{i}"), Attn::Sliding, Routing::TopK);
        }
        p.hc("mtp.0.hc_head", s, 1);
        p.add(
            "mtp.0.main_proj.weight".into(),
            h,
            3 * h,
            mat(3 * h),
            Stored::Fp8,
        );
        for n in ["main_norm", "norm"] {
            p.add(format!("mtp.0.{n}.weight"), 1, h, GAMMA, Stored::Bf16);
        }
        let m = "mtp.0.markov_head";
        let unit = Make::Matrix { std: 1.0 };
        p.add(format!("{m}.markov_w1.weight"), v, rk, unit, Stored::Bf16);
        let w2 = Make::Matrix {
            std: 0.5 / (rk as f32).sqrt(),
        };
        p.add(format!("{m}.markov_w2.weight"), v, rk, w2, Stored::Bf16);
        let f = |mean, std| Make::Floats { mean, std };
        let cp = "mtp.0.confidence_head.proj";
        let std = 1.0 / ((h + rk) as f32).sqrt();
        p.add(format!("{cp}.weight"), 1, h + rk, f(0.0, std), Stored::F32);
        p.add(format!("{cp}.bias"), 1, 1, f(0.0, 0.1), Stored::F32);
        *t = p.t;
    }
}

/// The release checkpoint's tensors of a config; with `mtp`, its MTP block too (spec §11: a
/// sliding, top-k routed layer under `mtp.0` with its projections, norms and hc_head).
fn plan(c: &DeepseekV4Config, mtp: bool) -> HashMap<String, Tensor> {
    let mut p = Planner {
        c,
        t: HashMap::new(),
    };
    let (h, s) = (c.hidden, c.hc);
    p.add(
        "embed.weight".into(),
        c.n_vocab,
        h,
        Make::Matrix { std: 1.0 },
        Stored::Bf16,
    );
    p.add("head.weight".into(), c.n_vocab, h, mat(h), Stored::Bf16);
    p.add("norm.weight".into(), 1, h, GAMMA, Stored::Bf16);
    p.hc("hc_head", s, 1);
    for (i, (&kind, &routing)) in c.attn.iter().zip(&c.routing).enumerate() {
        p.layer(&format!("layers.{i}"), kind, routing);
    }
    if mtp {
        for w in ["e_proj", "h_proj"] {
            p.add(format!("mtp.0.{w}.weight"), h, h, mat(h), Stored::Fp8);
        }
        for n in ["enorm", "hnorm", "norm"] {
            p.add(format!("mtp.0.{n}.weight"), 1, h, GAMMA, Stored::Bf16);
        }
        p.hc("mtp.0.hc_head", s, 1);
        p.layer("mtp.0", Attn::Sliding, Routing::TopK);
    }
    p.t
}

/// A token's `k` distinct experts of `n`, from the table's stream `key`.
fn hash_experts(key: u64, token: u64, k: usize, n: usize) -> Vec<u64> {
    let mut out = Vec::with_capacity(k);
    let mut j = 0u64;
    while out.len() < k {
        let v = crate::synth::normal(key, token * 1_000_003 + j).to_bits() as u64;
        let x = (v.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % n as u64;
        if !out.contains(&x) {
            out.push(x);
        }
        j += 1;
    }
    out
}

fn generate(
    name: &str,
    t: &Tensor,
    qtype: GgmlType,
    seed: u64,
    threads: usize,
) -> Result<HostWeight> {
    let key = tensor_key(seed, name);
    let (rows, cols) = (t.rows, t.cols);
    let (ty, mean, std) = match t.make {
        Make::Matrix { std } => (load_type(qtype, cols), 0.0, std),
        Make::Floats { mean, std } => (GgmlType::F32, mean, std),
        Make::Table => bail!("{name}: a table, not values"),
    };
    crate::synth::normal_weight(name, ty, rows, cols, (mean, std), key, threads)
}

impl<B: Backend> DeepseekV4Model<B> {
    /// The geometry `name` with random weights (matrices in `qtype`), deterministic from `seed`.
    pub fn synth(backend: Arc<B>, name: &str, qtype: GgmlType, seed: u64) -> Result<Self> {
        Self::synth_placed(backend, name, qtype, seed, None)
    }

    /// [`Self::synth`] with the routed experts of `host`'s layers in host memory.
    pub fn synth_placed(
        backend: Arc<B>,
        name: &str,
        qtype: GgmlType,
        seed: u64,
        host: Option<HostExperts>,
    ) -> Result<Self> {
        let j = config(name)?;
        let cfg = DeepseekV4Config::from_json(&j)?;
        let dspark = DsparkConfig::from_json(&j, cfg.attn.len(), cfg.n_vocab)?;
        let stages = if dspark.is_some() { DSPARK_STAGES } else { 0 };
        let mut plan = plan(&cfg, dspark.is_none());
        if stages > 0 {
            Planner::dspark(&cfg, stages, &mut plan);
        }
        let plan = Arc::new(plan);
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let n_expert = cfg.n_expert;
        let get = move |n: &str| -> Option<HostWeight> {
            let t = plan.get(n)?;
            let r = if let Make::Table = t.make {
                let key = tensor_key(seed, n);
                let bytes = (0..t.rows as u64)
                    .flat_map(|tok| hash_experts(key, tok, t.cols, n_expert))
                    .flat_map(|x| (x as i64).to_le_bytes())
                    .collect();
                HostWeight::owned(n, GgmlType::I64, t.rows, t.cols, bytes)
            } else {
                generate(n, t, qtype, seed, threads)
            };
            match r.with_context(|| format!("synthesizing {n}")) {
                Ok(w) => Some(w),
                Err(e) => {
                    eprintln!("{e:#}");
                    None
                }
            }
        };
        let src = WeightSource::synthetic(Arc::new(get), seed).with_host_experts(host);
        // The MTP block too, or DSpark (generated: either binds whatever path `--mtp` names).
        let mtp = dspark.is_none().then_some(super::mtp::MtpFrom {
            src: &src,
            gguf: false,
            source: None,
        });
        let m = Self::load(
            backend,
            &src,
            &src,
            false,
            cfg,
            mtp,
            dspark.map(|d| (d, stages)),
        )?;
        m.set_dspark_p_min(0.0);
        Ok(m)
    }
}

/// How the weights are held, for [`weight_bytes`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    /// Matrices in a GGML type (`synth:GEOMETRY:TYPE`, `--quant TYPE`); f32 vectors, the f32
    /// mHC mixes and u32 hash tables, as loaded.
    Quant(GgmlType),
    /// The release's files: FP8 with its block scales, MXFP4 experts, BF16, F32, I64.
    Release,
    /// The release as the loader holds it now: FP8 decoded to BF16, MXFP4 to Q8_0.
    ReleaseLoaded,
}

/// Parameters of a config (the MTP block left out).
pub fn parameters(c: &DeepseekV4Config) -> u64 {
    plan(c, false)
        .values()
        .map(|t| (t.rows * t.cols) as u64)
        .sum()
}

/// Bytes of a config's weights held as `st`.
pub fn weight_bytes(c: &DeepseekV4Config, st: Storage) -> u64 {
    plan(c, false).values().map(|t| tensor_bytes(t, st)).sum()
}

/// Bytes of one tensor of the plan held as `st`.
fn tensor_bytes(t: &Tensor, st: Storage) -> u64 {
    let (r, k) = (t.rows as u64, t.cols as u64);
    let n = r * k;
    let ty_bytes = |ty: GgmlType| r * ty.row_bytes(k).unwrap_or(4 * k);
    match (st, t.stored) {
        (_, Stored::F32) => 4 * n,
        (Storage::Release, Stored::I64) => 8 * n,
        (_, Stored::I64) => 4 * n,
        (Storage::Quant(q), _) => ty_bytes(load_type(q, t.cols)),
        (Storage::Release, Stored::Fp8) => n + r.div_ceil(128) * k.div_ceil(128),
        (Storage::Release, Stored::Mxfp4) => n / 2 + n / 32,
        (_, Stored::Bf16) | (Storage::ReleaseLoaded, Stored::Fp8) => 2 * n,
        (Storage::ReleaseLoaded, Stored::Mxfp4) => ty_bytes(GgmlType::Q8_0),
    }
}

/// The loaded bytes of geometry `name` in `qtype` (`synth:NAME:TYPE`, with its MTP block or
/// DSpark stages), per MoE layer's routed experts and the rest: what the experts placement
/// plans with.
pub fn sizes(name: &str, qtype: GgmlType) -> Result<Sizes> {
    let j = config(name)?;
    let cfg = DeepseekV4Config::from_json(&j)?;
    let dspark = DsparkConfig::from_json(&j, cfg.attn.len(), cfg.n_vocab)?;
    let mut plan = plan(&cfg, dspark.is_none());
    if dspark.is_some() {
        Planner::dspark(&cfg, DSPARK_STAGES, &mut plan);
    }
    let st = Storage::Quant(qtype);
    Ok(Sizes::from_tensors(
        plan.iter().map(|(n, t)| (n.as_str(), tensor_bytes(t, st))),
    ))
}

/// Rows a forward evaluates at once in the plan (the raw rings hold this many more).
pub const PLAN_BATCH: usize = 512;

/// A sequence's state at `n_ctx` positions: (windows, compressed K=V entries, indexer keys) in
/// bytes, as the state kinds store them (windows a raw f32 ring, entries f32).
pub fn state_bytes(c: &DeepseekV4Config, n_ctx: usize) -> [u64; 3] {
    let (layout, per_layer, _) = build_layout(c, false);
    let mut out = [0u64; 3];
    for ents in per_layer {
        for (k, e) in ents.iter().enumerate() {
            if let Some(e) = e {
                out[k] += layout.layers[*e].bytes(n_ctx, PLAN_BATCH, KvType::F32);
            }
        }
    }
    out
}

/// One H200's memory as the brief's plan counts it (141 GB; the card reports 139.8 GiB).
pub const H200_BYTES: u64 = 141_000_000_000;

/// The memory plan of a config as a markdown table: weights per storage, the per-sequence
/// state at 128K and 1M positions, and what fits on one and two H200s.
pub fn memory_plan(c: &DeepseekV4Config) -> String {
    let gb = |b: u64| format!("{:.1} GB", b as f64 / 1e9);
    let mut s = format!(
        "{:.1}B parameters ({} layers); per-sequence state (f32 entries, {}-row batches):\n\n\
         | context | windows | compressed entries | indexer keys | total |\n|---:|---:|---:|---:|---:|\n",
        parameters(c) as f64 / 1e9,
        c.attn.len(),
        PLAN_BATCH
    );
    let ctxs = [(131_072usize, "128K"), (1_048_576, "1M")];
    let mut state = Vec::new();
    for (n, label) in ctxs {
        let b = state_bytes(c, n);
        let total: u64 = b.iter().sum();
        state.push(total);
        s += &format!(
            "| {label} | {} | {} | {} | {} |\n",
            gb(b[0]),
            gb(b[1]),
            gb(b[2]),
            gb(total)
        );
    }
    s += "\n| weights | bytes | + 1 seq. at 128K | + 1 seq. at 1M | one H200 (141 GB) | two H200s |\n\
          |---|---:|---:|---:|---|---|\n";
    let fits = |w: u64, cards: u64| {
        let room = (cards * H200_BYTES).saturating_sub(w);
        if room == 0 {
            "no".to_string()
        } else {
            let at = |st: u64| room / st.max(1);
            format!(
                "yes: {} seq. at 128K or {} at 1M",
                at(state[0]),
                at(state[1])
            )
        }
    };
    let rows = [
        ("release files (FP8 + MXFP4 experts)", Storage::Release),
        (
            "release as loaded now (FP8 → BF16, MXFP4 → Q8_0)",
            Storage::ReleaseLoaded,
        ),
        ("Q8_0", Storage::Quant(GgmlType::Q8_0)),
        (
            "Q4_0 (Q4_K: the same 4.5 bits)",
            Storage::Quant(GgmlType::Q4_0),
        ),
        (
            "Q3_K (no CUDA kernel for it yet)",
            Storage::Quant(GgmlType::Q3_K),
        ),
    ];
    for (label, st) in rows {
        let w = weight_bytes(c, st);
        s += &format!(
            "| {label} | {} | {} | {} | {} | {} |\n",
            gb(w),
            gb(w + state[0]),
            gb(w + state[1]),
            fits(w, 1),
            fits(w, 2)
        );
    }
    s
}
