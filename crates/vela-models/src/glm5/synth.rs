//! GLM 5.3 Flash at real size without a file: the checkpoint's tensors (the release names of
//! docs/glm5-spec.md §10 without `model.language_model.`) generated in memory as the loader asks
//! for them, deterministic from the seed (`crate::synth`'s generator), matrices directly in the
//! load type; and the memory plan of a geometry (weights per storage type, per-sequence state at
//! a context length, what fits one and two H200s).
//!
//! Geometries: `glm5-flash` (the real config: spec §1 "real (Flash)", shared/notes/next-archs.md
//! §3; 45 layers), `glm5-flash-12l` (its first 12 layers: 3 dense, 9 KDA, 3 MLA) and `glm5-tiny`
//! (the shapes of scripts/gen-glm5-fixtures.py's `flash_mini`: 8 layers, 1 dense, 16 experts).
//! Each carries the release's MTP block after its layers (`num_nextn_predict_layers` 1: spec §9,
//! `layers.{n}.*`), generated with the rest and loaded with the model as its drafter.
//!
//! **Values** (width-independent scales, so every geometry's activations keep unit scale): linear
//! maps N(0, 1/fan_in) on normalised inputs, the embedding N(0, 1), RMSNorm gammas 1 + N(0, 0.02²);
//! mHC as DeepSeek V4's synth (mixes N(0, 1/(S·H)), bases N(0, 0.5²), scales 1 + N(0, 0.2²));
//! KDA convolution taps N(0, 0.5²) (4 taps: unit output), `A_log` N(0, 0.5²) and `dt_bias`
//! N(−3, 1) (decays mostly between e^−2.5 and nearly 1 per token; HF's init leans slow too),
//! the indexer's LayerNorm bias N(0, 0.1²) and pool position bias N(0, 0.5²), the router's
//! selection bias N(0, 0.3²).

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
pub const GEOMETRIES: &[&str] = &["glm5-flash", "glm5-flash-12l", "glm5-tiny"];

/// Whether `name` is one of [`GEOMETRIES`].
pub fn is_geometry(name: &str) -> bool {
    GEOMETRIES.contains(&name)
}

/// The config.json of a geometry (the release's keys, `text_config` nested).
pub fn config(name: &str) -> Result<Value> {
    let text = |layers: usize| {
        let kinds: Vec<&str> = (0..layers)
            .map(|i| match i % 4 {
                3 => "indexed_attention",
                _ => "linear_attention",
            })
            .collect();
        let mlp: Vec<&str> = (0..layers)
            .map(|i| if i < 3 { "dense" } else { "sparse" })
            .collect();
        let mut t = json!({
            "model_type": "glm5_next_text", "vocab_size": 154880, "hidden_size": 4096,
            "num_hidden_layers": layers, "layer_types": kinds, "mlp_layer_types": mlp,
            "first_k_dense_replace": 3,
            "linear_attn_config": {"num_heads": 64, "head_dim": 128, "short_conv_kernel_size": 4,
                                   "gate_lower_bound": -5.0},
            "num_attention_heads": 64, "num_key_value_heads": 64, "mla_use_nope": true,
            "qk_nope_head_dim": 256, "qk_rope_head_dim": 0, "v_head_dim": 256,
            "q_lora_rank": 1536, "kv_lora_rank": 512,
            "index_n_heads": 32, "index_head_dim": 128, "index_topk": 2048, "index_kpool": 4,
            "index_kpool_always_select_tail": true, "index_topk_freq": 1
        });
        let rest = json!({
            "intermediate_size": 12288, "moe_intermediate_size": 2048, "n_routed_experts": 288,
            "num_experts_per_tok": 8, "n_shared_experts": 1, "n_group": 1, "topk_group": 1,
            "norm_topk_prob": true, "routed_scaling_factor": 2.5, "scoring_func": "sigmoid",
            "topk_method": "noaux_tc", "swiglu_limit": 10.0,
            "hc_mult": 4, "hc_sinkhorn_iters": 20, "hc_eps": 1e-6,
            "rms_norm_eps": 1e-5, "hidden_act": "silu", "attention_bias": false,
            "tie_word_embeddings": false, "max_position_embeddings": 1048576,
            "num_nextn_predict_layers": 1, "pad_token_id": 154820
        });
        let o = t.as_object_mut().expect("an object");
        o.extend(rest.as_object().expect("an object").clone());
        t
    };
    let t = match name {
        "glm5-flash" => text(45),
        "glm5-flash-12l" => text(12),
        "glm5-tiny" => {
            let mut t = text(8);
            let o = t.as_object_mut().expect("an object");
            let mlp: Vec<&str> = (0..8)
                .map(|i| if i < 1 { "dense" } else { "sparse" })
                .collect();
            for (k, v) in [
                ("vocab_size", json!(512)),
                ("hidden_size", json!(64)),
                ("mlp_layer_types", json!(mlp)),
                ("first_k_dense_replace", json!(1)),
                ("indexer_types", json!(vec!["full"; 8])),
                (
                    "linear_attn_config",
                    json!({"num_heads": 4, "head_dim": 16, "short_conv_kernel_size": 4,
                           "gate_lower_bound": -5.0}),
                ),
                ("num_attention_heads", json!(4)),
                ("num_key_value_heads", json!(4)),
                ("qk_nope_head_dim", json!(16)),
                ("v_head_dim", json!(16)),
                ("q_lora_rank", json!(32)),
                ("kv_lora_rank", json!(16)),
                ("index_n_heads", json!(16)),
                ("index_head_dim", json!(16)),
                ("index_topk", json!(32)),
                ("intermediate_size", json!(96)),
                ("moe_intermediate_size", json!(32)),
                ("n_routed_experts", json!(16)),
                ("num_experts_per_tok", json!(4)),
                ("pad_token_id", Value::Null),
                ("bos_token_id", json!(0)),
                ("eos_token_id", json!(1)),
            ] {
                o.insert(k.into(), v);
            }
            t
        }
        _ => bail!(
            "unknown glm5_next geometry '{name}' (one of {})",
            GEOMETRIES.join(", ")
        ),
    };
    Ok(json!({
        "architectures": ["Glm5NextForConditionalGeneration"], "model_type": "glm5_next",
        "text_config": t
    }))
}

/// How a tensor's values are made and held.
#[derive(Clone, Copy, Debug)]
pub(super) enum Make {
    /// N(0, std²), in the load type.
    Matrix { std: f32 },
    /// N(0, std²), held as f32: the loader keeps it exact (mHC mixes, the router) or rewrites it
    /// at load (`kv_b_proj`, the decay gate `f_b`, the indexer's `wk`).
    Exact { std: f32 },
    /// f32 values `mean + std·N` (vectors, conv taps).
    Floats { mean: f32, std: f32 },
}

/// One checkpoint tensor: `rows × cols` values (element `r·cols + c` of the generator's stream).
#[derive(Clone, Copy, Debug)]
pub(super) struct Tensor {
    pub rows: usize,
    pub cols: usize,
    pub make: Make,
}

impl Tensor {
    /// Mean and standard deviation of the values.
    pub(super) fn moments(&self) -> (f32, f32) {
        match self.make {
            Make::Matrix { std } | Make::Exact { std } => (0.0, std),
            Make::Floats { mean, std } => (mean, std),
        }
    }

    /// The type the in-memory model holds it in for matrices of `qtype`.
    fn load_type(&self, qtype: GgmlType) -> GgmlType {
        match self.make {
            Make::Matrix { .. } => load_type(qtype, self.cols),
            _ => GgmlType::F32,
        }
    }

    fn bytes(&self, ty: GgmlType) -> u64 {
        let k = self.cols as u64;
        self.rows as u64 * ty.row_bytes(k).unwrap_or(4 * k)
    }
}

/// A plan being filled: the tensors by name.
struct Planner<'a> {
    c: &'a Glm5Config,
    t: HashMap<String, Tensor>,
}

impl Planner<'_> {
    fn add(&mut self, name: String, rows: usize, cols: usize, make: Make) {
        self.t.insert(name, Tensor { rows, cols, make });
    }
    fn mat(&mut self, name: String, rows: usize, cols: usize) {
        let std = 1.0 / (cols as f32).sqrt();
        self.add(name, rows, cols, Make::Matrix { std });
    }
    fn exact(&mut self, name: String, rows: usize, cols: usize) {
        let std = 1.0 / (cols as f32).sqrt();
        self.add(name, rows, cols, Make::Exact { std });
    }
    fn floats(&mut self, name: String, rows: usize, cols: usize, mean: f32, std: f32) {
        self.add(name, rows, cols, Make::Floats { mean, std });
    }
    /// An RMSNorm gamma (plain, no 1 + w).
    fn gamma(&mut self, name: String, len: usize) {
        self.floats(name, 1, len, 1.0, 0.02);
    }

    /// An mHC module: the mixes see an RMS-normalised [S·H] row.
    fn hc(&mut self, p: &str) {
        let (s, h) = (self.c.hc, self.c.hidden);
        let rows = (2 + s) * s;
        self.exact(format!("{p}_fn"), rows, s * h);
        self.floats(format!("{p}_base"), 1, rows, 0.0, 0.5);
        self.floats(format!("{p}_scale"), 1, 3, 1.0, 0.2);
    }

    fn kda(&mut self, a: &str) {
        let c = self.c;
        let (h, nk, dk, w) = (c.hidden, c.kda_heads, c.kda_dim, c.kda_heads * c.kda_dim);
        for x in ["q", "k", "v"] {
            self.mat(format!("{a}.{x}_proj.weight"), w, h);
            self.floats(format!("{a}.{x}_conv1d.weight"), w, c.conv_k, 0.0, 0.5);
        }
        self.mat(format!("{a}.f_a_proj.weight"), dk, h);
        match c.lower_bound {
            // a_h is folded into f_b at load.
            Some(_) => self.exact(format!("{a}.f_b_proj.weight"), w, dk),
            None => self.mat(format!("{a}.f_b_proj.weight"), w, dk),
        }
        self.floats(format!("{a}.dt_bias"), 1, w, -3.0, 1.0);
        self.floats(format!("{a}.A_log"), 1, nk, 0.0, 0.5);
        self.mat(format!("{a}.b_proj.weight"), nk, h);
        self.mat(format!("{a}.g_a_proj.weight"), dk, h);
        self.mat(format!("{a}.g_b_proj.weight"), w, dk);
        self.gamma(format!("{a}.o_norm.weight"), dk);
        self.mat(format!("{a}.o_proj.weight"), h, w);
    }

    fn mla(&mut self, a: &str, full: bool) {
        let c = self.c;
        let (h, nh, dn, dv, qr, r) = (c.hidden, c.n_head, c.nope_dim, c.v_dim, c.q_rank, c.kv_rank);
        self.mat(format!("{a}.q_a_proj.weight"), qr, h);
        self.gamma(format!("{a}.q_a_layernorm.weight"), qr);
        self.mat(format!("{a}.q_b_proj.weight"), nh * dn, qr);
        self.mat(format!("{a}.kv_a_proj_with_mqa.weight"), r, h);
        self.gamma(format!("{a}.kv_a_layernorm.weight"), r);
        self.exact(format!("{a}.kv_b_proj.weight"), nh * (dn + dv), r);
        self.mat(format!("{a}.o_proj.weight"), h, nh * dv);
        if full {
            let x = format!("{a}.indexer");
            let (ni, di) = (c.idx_heads, c.idx_dim);
            self.mat(format!("{x}.wq_b.weight"), ni * di, qr);
            // Centred at load (its LayerNorm becomes an RMSNorm plus bias).
            self.exact(format!("{x}.wk.weight"), di, h);
            self.gamma(format!("{x}.k_norm.weight"), di);
            self.floats(format!("{x}.k_norm.bias"), 1, di, 0.0, 0.1);
            self.mat(format!("{x}.weights_proj.weight"), ni, h);
            self.mat(format!("{x}.index_kpool_compress_gate"), di, h);
            self.floats(
                format!("{x}.index_kpool_compress_ape"),
                c.idx_pool,
                di,
                0.0,
                0.5,
            );
        }
    }

    fn mlp(&mut self, p: &str, width: usize) {
        let h = self.c.hidden;
        self.mat(format!("{p}.gate_proj.weight"), width, h);
        self.mat(format!("{p}.up_proj.weight"), width, h);
        self.mat(format!("{p}.down_proj.weight"), h, width);
    }

    fn moe(&mut self, p: &str) {
        let c = self.c;
        let (h, e, i) = (c.hidden, c.n_expert, c.n_ff_exp);
        self.exact(format!("{p}.gate.weight"), e, h);
        self.floats(format!("{p}.gate.e_score_correction_bias"), 1, e, 0.0, 0.3);
        for x in 0..e {
            self.mlp(&format!("{p}.experts.{x}"), i);
        }
        self.mlp(&format!("{p}.shared_experts"), i * c.n_shared);
    }

    /// The MTP block after the layers (spec §9): `eh_proj` over the normalised
    /// [embedding; hidden], its norms, an MLA layer with its own indexer and MoE (no mHC).
    fn mtp_block(&mut self) {
        let (n, h) = (self.c.mixers.len(), self.c.hidden);
        let l = format!("layers.{n}");
        self.mat(format!("{l}.eh_proj.weight"), h, 2 * h);
        for g in ["enorm", "hnorm", "shared_head.norm"] {
            self.gamma(format!("{l}.{g}.weight"), h);
        }
        self.block(&l, Mixer::Mla, true, false);
    }

    /// A decoder layer's mixer and FFN with its norms (the mHC modules apart).
    fn block(&mut self, p: &str, mixer: Mixer, full: bool, dense: bool) {
        let h = self.c.hidden;
        self.gamma(format!("{p}.input_layernorm.weight"), h);
        self.gamma(format!("{p}.post_attention_layernorm.weight"), h);
        let a = format!("{p}.self_attn");
        match mixer {
            Mixer::Kda => self.kda(&a),
            Mixer::Mla => self.mla(&a, full),
        }
        match dense {
            true => self.mlp(&format!("{p}.mlp"), self.c.n_ff),
            false => self.moe(&format!("{p}.mlp")),
        }
    }
}

/// The checkpoint's tensors of a config, its MTP block included when it has one.
pub(super) fn plan(c: &Glm5Config) -> HashMap<String, Tensor> {
    let mut p = Planner {
        c,
        t: HashMap::new(),
    };
    let (v, h) = (c.n_vocab, c.hidden);
    p.add(
        "embed_tokens.weight".into(),
        v,
        h,
        Make::Matrix { std: 1.0 },
    );
    if !c.tie_embeddings {
        p.mat("lm_head.weight".into(), v, h);
    }
    p.gamma("norm.weight".into(), h);
    for (i, &mixer) in c.mixers.iter().enumerate() {
        let l = format!("layers.{i}");
        p.hc(&format!("{l}.hc_attn"));
        p.hc(&format!("{l}.hc_ffn"));
        p.block(&l, mixer, c.indexers[i] == Indexer::Full, c.dense[i]);
    }
    if c.nextn > 0 {
        p.mtp_block();
    }
    p.t
}

impl<B: Backend> Glm5Model<B> {
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
        Self::generate(backend, &config(name)?, qtype, seed, host, HashMap::new())
    }

    /// [`Self::synth`] with the types of `types` for the tensors it names: with
    /// `synth_gguf::hf_types` the types of the GGUF `vela synth` writes for the geometry.
    pub fn synth_typed(
        backend: Arc<B>,
        name: &str,
        qtype: GgmlType,
        seed: u64,
        types: &HashMap<String, GgmlType>,
    ) -> Result<Self> {
        Self::generate(backend, &config(name)?, qtype, seed, None, types.clone())
    }

    fn generate(
        backend: Arc<B>,
        j: &Value,
        qtype: GgmlType,
        seed: u64,
        host: Option<HostExperts>,
        types: HashMap<String, GgmlType>,
    ) -> Result<Self> {
        let cfg = Glm5Config::from_json(j)?;
        let plan = Arc::new(plan(&cfg));
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let get = move |n: &str| -> Option<HostWeight> {
            let t = plan.get(n)?;
            let ty = types.get(n).copied().unwrap_or_else(|| t.load_type(qtype));
            let key = tensor_key(seed, n);
            let w = crate::synth::normal_weight(n, ty, t.rows, t.cols, t.moments(), key, threads);
            match w.with_context(|| format!("synthesizing {n}")) {
                Ok(w) => Some(w),
                Err(e) => {
                    eprintln!("{e:#}");
                    None
                }
            }
        };
        let src = WeightSource::synthetic(Arc::new(get), seed).with_host_experts(host);
        Self::load(backend, &src, false, cfg, None)
    }
}

/// Parameters of a config (the MTP block left out).
pub fn parameters(c: &Glm5Config) -> u64 {
    let mtp = format!("layers.{}.", c.mixers.len());
    plan(c)
        .iter()
        .filter(|(n, _)| !n.starts_with(&mtp))
        .map(|(_, t)| (t.rows * t.cols) as u64)
        .sum()
}

/// Parameters one token reads: all but the routed experts, and `top_k` of those per MoE layer.
pub fn active_parameters(c: &Glm5Config) -> u64 {
    let per_expert = (3 * c.hidden * c.n_ff_exp) as u64;
    let moe = c.dense.iter().filter(|&&d| !d).count() as u64;
    parameters(c) - moe * (c.n_expert - c.top_k) as u64 * per_expert
}

/// Parameters of the release's MTP block (spec §9: `eh_proj`, `enorm`, `hnorm`, an MLA layer with
/// a full indexer and MoE without mHC, `shared_head_norm`).
pub fn mtp_parameters(c: &Glm5Config) -> u64 {
    let mut p = Planner {
        c,
        t: HashMap::new(),
    };
    p.mtp_block();
    p.t.values().map(|t| (t.rows * t.cols) as u64).sum()
}

/// Bytes of a config's weights as the in-memory model holds them with matrices in `qtype`
/// (`synth:GEOMETRY:TYPE`, or a checkpoint with `--quant TYPE`): the tensors it keeps or
/// rewrites in f32 counted as f32.
pub fn weight_bytes(c: &Glm5Config, qtype: GgmlType) -> u64 {
    plan(c).values().map(|t| t.bytes(t.load_type(qtype))).sum()
}

/// The loaded bytes of geometry `name` in `qtype` (`synth:NAME:TYPE`) per MoE layer's routed
/// experts and the rest: what the experts placement plans with.
pub fn sizes(name: &str, qtype: GgmlType) -> Result<Sizes> {
    let cfg = Glm5Config::from_json(&config(name)?)?;
    let plan = plan(&cfg);
    Ok(Sizes::from_tensors(
        plan.iter()
            .map(|(n, t)| (n.as_str(), t.bytes(t.load_type(qtype)))),
    ))
}

/// Rows a forward evaluates at once in the plan (the indexer's raw rows hold this many more).
pub const PLAN_BATCH: usize = 512;

/// A sequence's state at `n_ctx` positions in bytes: (KDA conv tails and matrices with their
/// rollback snapshots, MLA latent rows, indexer pooled keys and raw rows), as vela stores them
/// (f32); the MTP block's latent rows and ring of hiddens count as MLA rows, its pools as
/// indexer rows.
pub fn state_bytes(c: &Glm5Config, n_ctx: usize) -> [u64; 3] {
    let (layout, mut per_layer, mtp) = build_layout(c, c.nextn > 0);
    let mut kinds: Vec<Mixer> = c.mixers.clone();
    if let Some([lat, pools, ring]) = mtp {
        per_layer.push(vec![lat, pools]);
        kinds.push(Mixer::Mla);
        per_layer.push(vec![ring]);
        kinds.push(Mixer::Mla);
    }
    let mut out = [0u64; 3];
    for (entries, kind) in per_layer.iter().zip(kinds) {
        for (k, &e) in entries.iter().enumerate() {
            let col = match kind {
                Mixer::Kda => 0,
                Mixer::Mla => 1 + k,
            };
            out[col] += layout.layers[e].bytes(n_ctx, PLAN_BATCH, KvType::F32);
        }
    }
    out
}

/// One H200's memory as the plan counts it (the card reports 139.8 GiB).
pub const H200_BYTES: u64 = 139 << 30;

/// Device memory per card kept for scratch (the engine's experts planner keeps 3 GiB).
const SCRATCH: u64 = 3 << 30;

fn gib(b: u64) -> String {
    match b {
        b if b < 1 << 30 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
    }
}

/// The memory plan of a config as markdown: parameters, the per-sequence state at 8K, 64K and 1M
/// positions, weights per storage type and what fits one and two H200s.
pub fn memory_plan(c: &Glm5Config) -> String {
    let (p, mtp) = (parameters(c), mtp_parameters(c));
    let n = |x: u64| match x {
        x if x >= 1_000_000_000 => format!("{:.1}B", x as f64 / 1e9),
        x => format!("{:.1}M", x as f64 / 1e6),
    };
    let mut s = format!(
        "{} parameters ({} layers), {} active per token; the release's MTP block (generated and \
         held with the model where the geometry has it, as below) adds {}: {}.\n\nPer-sequence state (f32; KDA with its {SNAPSHOTS} rollback snapshots, \
         {PLAN_BATCH}-row batches):\n\n\
         | context | KDA | MLA latent rows | indexer | total |\n|---:|---:|---:|---:|---:|\n",
        n(p),
        c.mixers.len(),
        n(active_parameters(c)),
        n(mtp),
        n(p + mtp),
    );
    let ctxs = [(8192usize, "8K"), (65_536, "64K"), (1_048_576, "1M")];
    let mut state = Vec::new();
    for (n, label) in ctxs {
        let b = state_bytes(c, n);
        let total: u64 = b.iter().sum();
        state.push(total);
        s += &format!(
            "| {label} | {} | {} | {} | {} |\n",
            gib(b[0]),
            gib(b[1]),
            gib(b[2]),
            gib(total)
        );
    }
    s += &format!(
        "\nWeights ({} per H200, less {} of scratch per card):\n\n\
         | weights | total | routed experts | one H200 | two H200s |\n|---|---:|---:|---|---|\n",
        gib(H200_BYTES),
        gib(SCRATCH)
    );
    let fits = |w: u64, cards: u64| {
        let budget = cards * (H200_BYTES - SCRATCH);
        if w <= budget {
            let at = |st: u64| (budget - w) / st.max(1);
            format!(
                "yes: {} seq. at 8K, {} at 64K, {} at 1M",
                at(state[0]),
                at(state[1]),
                at(state[2])
            )
        } else {
            format!("no: {} of experts to host memory", gib(w - budget))
        }
    };
    let mut rows: Vec<(String, u64, u64)> = Vec::new();
    for (label, ty) in [
        ("Q4_0", GgmlType::Q4_0),
        ("Q8_0", GgmlType::Q8_0),
        ("BF16", GgmlType::BF16),
    ] {
        let ex = plan(c)
            .iter()
            .filter(|(n, _)| crate::placement::expert_layer(n).is_some())
            .map(|(_, t)| t.bytes(t.load_type(ty)))
            .sum();
        rows.push((
            format!("{label} (`synth:…:{}`, `--quant`)", label.to_lowercase()),
            weight_bytes(c, ty),
            ex,
        ));
    }
    for (label, scheme) in [("Q4_0", GgmlType::Q4_0), ("Q8_0", GgmlType::Q8_0)] {
        let q = crate::synth::QuantScheme::Mostly(scheme);
        if let Ok((w, ex)) = super::synth_gguf::weight_bytes(c, q) {
            rows.push((format!("llama.cpp GGUF {label} (`vela synth`)"), w, ex));
        }
    }
    for (label, w, ex) in rows {
        s += &format!(
            "| {label} | {} | {} | {} | {} |\n",
            gib(w),
            gib(ex),
            fits(w, 1),
            fits(w, 2)
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use vela_compute::cpu::CpuBackend;

    /// Every position's logits of `toks` in one pass.
    fn logits(m: Arc<dyn crate::LanguageModel>, toks: &[u32]) -> Vec<f32> {
        let mut st = m.new_state(256, toks.len(), KvType::F32).unwrap();
        let pos: Vec<u32> = (0..toks.len() as u32).collect();
        st.forward(toks, &pos, 0).unwrap()
    }

    /// The real layer pattern (45 layers: 34 KDA, 11 MLA, 3 dense) at the tiny widths: the values'
    /// scales keep logits finite, spread and token-dependent through every layer.
    #[test]
    fn deep_stacks_stay_well_scaled() {
        let mut j = config("glm5-flash").unwrap();
        let tiny = config("glm5-tiny").unwrap();
        for (k, v) in tiny["text_config"].as_object().unwrap() {
            let keep = [
                "num_hidden_layers",
                "layer_types",
                "mlp_layer_types",
                "first_k_dense_replace",
                "indexer_types",
            ];
            if !keep.contains(&k.as_str()) {
                j["text_config"][k] = v.clone();
            }
        }
        let be = Arc::new(CpuBackend::new(2));
        let m = Glm5Model::generate(be, &j, GgmlType::F32, 3, None, HashMap::new()).unwrap();
        assert_eq!(m.cfg.mixers.len(), 45);
        let nv = m.cfg.n_vocab;
        let toks: Vec<u32> = (0..48).map(|i| (i * 97 + 11) % 512).collect();
        let l = logits(Arc::new(m), &toks);
        let mut argmax = std::collections::BTreeSet::new();
        for r in l.chunks(nv) {
            assert!(r.iter().all(|x| x.is_finite()));
            let mean = r.iter().sum::<f32>() / nv as f32;
            let sd = (r.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / nv as f32).sqrt();
            assert!((0.2..20.0).contains(&sd), "logit stdev {sd}");
            argmax.insert(
                r.iter()
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(b.1))
                    .unwrap()
                    .0,
            );
        }
        assert!(argmax.len() > 10, "{} distinct argmax", argmax.len());
    }

    #[test]
    fn plans_count_what_the_loader_reads() {
        let c = Glm5Config::from_json(&config("glm5-tiny").unwrap()).unwrap();
        let p = plan(&c);
        // 2 top-level matrices and a norm; per layer 6 mHC tensors, 2 norms; KDA 15, MLA 7 + 7,
        // dense 3, MoE 2 + 3·16 + 3; the MTP block: eh_proj and 3 norms, 2 norms, MLA, MoE.
        let mtp = 4 + 2 + 14 + 53;
        assert_eq!(p.len(), 3 + 8 * 8 + 6 * 15 + 2 * 14 + 3 + 7 * 53 + mtp);
        assert!(config("glm5-nope").is_err() && !is_geometry("glm5-nope"));
    }
}
