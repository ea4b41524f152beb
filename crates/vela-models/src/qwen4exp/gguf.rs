//! `qwen4exp` GGUF files as llama.cpp 0c1e570's converter writes them (docs/qwen4exp-spec.md
//! §10): llama.cpp tensor names, value heads in tiled order, −exp(A_log) and the (1+w) offsets
//! applied, the experts stacked, the indexer projection split, the n-gram table as
//! `per_layer_token_embd` with the hash constants in the metadata.

use super::load::Loader;
use super::*;
use crate::blocks::experts::{ExpertTensors, Experts};
use crate::placement::LoadSpec;
use crate::weights::WeightSource;
use anyhow::{anyhow, Context};
use vela_formats::gguf::GgufFile;

fn key_u(g: &GgufFile, k: &str) -> Result<usize> {
    Ok(g.arch_u64(k)? as usize)
}

fn key_array_u(g: &GgufFile, k: &str) -> Result<Vec<u64>> {
    g.get_array(&format!("qwen4exp.{k}"))?
        .iter()
        .map(|v| v.as_i64().map(|x| x as u64))
        .collect::<Option<Vec<u64>>>()
        .ok_or_else(|| anyhow!("qwen4exp.{k} is not an array of integers"))
}

impl Qwen4ExpConfig {
    pub fn from_gguf(g: &GgufFile) -> Result<Self> {
        let arch = g.architecture()?;
        if arch != "qwen4exp" {
            bail!(
                "GGUF architecture '{}' is not qwen4exp",
                arch.escape_debug()
            );
        }
        let n_layer = key_u(g, "block_count")?;
        let recurrent: Vec<bool> = g
            .get_array("qwen4exp.attention.recurrent_layers")?
            .iter()
            .map(|v| v.as_bool())
            .collect::<Option<_>>()
            .ok_or_else(|| {
                anyhow!("qwen4exp.attention.recurrent_layers is not an array of booleans")
            })?;
        if recurrent.len() != n_layer {
            bail!(
                "qwen4exp.attention.recurrent_layers has {} entries for {n_layer} layers",
                recurrent.len()
            );
        }
        let mixers: Vec<Mixer> = recurrent
            .iter()
            .map(|&r| if r { Mixer::Gdn } else { Mixer::Qsa })
            .collect();
        // The converter writes zeros here whenever transformers ≥ 5.23 renamed the layer type
        // it tests for (spec §10); every qwen4_exp config uses 4.
        let ratios = key_array_u(g, "attention.compress_ratios").unwrap_or_default();
        let idx_block = match ratios.iter().copied().find(|&r| r > 0) {
            Some(r) => r as usize,
            None => 4,
        };
        let budget = key_u(g, "attention.indexer.top_k")?;
        let hidden = key_u(g, "embedding_length")?;
        let n_v = key_u(g, "ssm.time_step_rank")?;
        let inner = key_u(g, "ssm.inner_size")?;
        let ple = match g.get("qwen4exp.ple.layers") {
            Some(_) => {
                let layers: Vec<usize> = key_array_u(g, "ple.layers")?
                    .iter()
                    .map(|&x| x as usize)
                    .collect();
                let ngram = key_u(g, "ple.ngram_size")?;
                let hpn = key_u(g, "ple.heads_per_ngram")?;
                let width = key_u(g, "embedding_length_per_layer_input")?;
                Some(PleConfig {
                    layers,
                    dim: width * (ngram - 1) * hpn,
                    conv_k: key_u(g, "ple.conv_kernel")?,
                    ngram,
                    heads_per_ngram: hpn,
                    eos: key_u(g, "ple.eos_token_id")? as u32,
                })
            }
            None => None,
        };
        if let Some(p) = &ple {
            if p.layers.len() != 1
                || p.layers
                    .iter()
                    .any(|&l| l >= n_layer || mixers[l] != Mixer::Gdn)
            {
                bail!("qwen4exp.ple.layers: one linear-attention layer expected");
            }
        }
        let head_dim = key_u(g, "attention.key_length")?;
        let cfg = Qwen4ExpConfig {
            n_vocab: g
                .tensor("token_embd.weight")
                .map(|t| t.n_rows())
                .ok_or_else(|| anyhow!("missing tensor token_embd.weight"))?,
            hidden,
            mixers,
            eps: g.get_f64("qwen4exp.attention.layer_norm_rms_epsilon")? as f32,
            // The converter supports the sigmoid gate only (qwen4exp.py).
            gate_sigmoid: true,
            tie_embeddings: g.tensor("output.weight").is_none(),
            streams: key_u(g, "hyper_connection.count")?,
            lowrank: key_u(g, "hyper_connection.low_rank")?,
            conv_k: key_u(g, "ssm.conv_kernel")?,
            n_k: key_u(g, "ssm.group_count")?,
            n_v,
            dk: key_u(g, "ssm.state_size")?,
            dv: inner / n_v.max(1),
            tiled_heads: true,
            n_head: key_u(g, "attention.head_count")?,
            n_head_kv: key_u(g, "attention.head_count_kv")?,
            head_dim,
            n_rot: key_u(g, "rope.dimension_count")?,
            rope_theta: g.get_f64("qwen4exp.rope.freq_base")? as f32,
            rope_divisors: None,
            rope_attn_factor: 1.0,
            idx_heads: key_u(g, "attention.indexer.head_count")?,
            idx_dim: key_u(g, "attention.indexer.key_length")?,
            idx_block,
            idx_blocks: budget / idx_block,
            n_expert: key_u(g, "expert_count")?,
            top_k: key_u(g, "expert_used_count")?,
            n_ff_exp: key_u(g, "expert_feed_forward_length")?,
            n_ff_shared: key_u(g, "expert_shared_feed_forward_length")?,
            // The converter assumes renormalised routing (spec §10).
            norm_topk: true,
            ple,
        };
        if cfg.n_v == 0 || !cfg.n_v.is_multiple_of(cfg.n_k.max(1)) || cfg.n_rot > cfg.idx_dim {
            bail!("qwen4exp: inconsistent head counts in the metadata");
        }
        Ok(cfg)
    }
}

impl<B: Backend> Qwen4ExpModel<B> {
    /// Load a llama.cpp `qwen4exp` GGUF, converting float matrices to `quant` when given.
    pub fn load_gguf(backend: Arc<B>, g: Arc<GgufFile>, spec: &LoadSpec) -> Result<Self> {
        let cfg = Qwen4ExpConfig::from_gguf(&g)?;
        let src = WeightSource::gguf(g.clone()).with_spec(spec);
        let mut ld = Loader::new(&*backend, &src);
        let embd_host = src
            .get("token_embd.weight")
            .ok_or_else(|| anyhow!("missing tensor token_embd.weight"))?;
        let embd = backend.upload_weight(&embd_host)?;
        let head = if cfg.tie_embeddings {
            ld.upload(&embd_host, 1.0)?
        } else {
            let w = src.matrix("output.weight", false)?;
            ld.upload(&w, 1.0)?
        };
        let sh = cfg.streams * cfg.hidden;
        let hc = |ld: &mut Loader<B>, p: &str, inject: bool| -> Result<Hc<B>> {
            Ok(Hc {
                norm: ld.vector(&format!("{p}_norm.weight"), sh)?,
                down: ld.matrix(&format!("{p}_down.weight"))?,
                up: ld.matrix(&format!("{p}_up.weight"))?,
                inject: if inject {
                    Some(ld.matrix(&format!("{p}_inject.weight"))?)
                } else {
                    None
                },
            })
        };
        let (layout, entries) = Self::build_layout(&cfg, false);
        let mut layers = Vec::with_capacity(cfg.mixers.len());
        for (i, (m, state)) in cfg.mixers.iter().zip(entries).enumerate() {
            let p = format!("blk.{i}");
            let mixer = match m {
                Mixer::Gdn => Block::Gdn(Gdn {
                    qkv: ld.matrix(&format!("{p}.attn_qkv.weight"))?,
                    z: ld.matrix(&format!("{p}.attn_gate.weight"))?,
                    b: ld.matrix(&format!("{p}.ssm_beta.weight"))?,
                    a: ld.matrix(&format!("{p}.ssm_alpha.weight"))?,
                    conv: ld.vector(
                        &format!("{p}.ssm_conv1d.weight"),
                        cfg.qkv_width() * cfg.conv_k,
                    )?,
                    dt_bias: ld.vector(&format!("{p}.ssm_dt.bias"), cfg.n_v)?,
                    neg_a: ld.vector(&format!("{p}.ssm_a"), cfg.n_v)?,
                    norm: ld.vector(&format!("{p}.ssm_norm.weight"), cfg.dv)?,
                    out: ld.matrix(&format!("{p}.ssm_out.weight"))?,
                }),
                Mixer::Qsa => {
                    let (wq, wgate) = ld.split_q(&format!("{p}.attn_q.weight"), &cfg)?;
                    let (hd, di) = (cfg.head_dim, cfg.idx_dim);
                    Block::Qsa(Qsa {
                        wq,
                        wgate,
                        wk: ld.matrix(&format!("{p}.attn_k.weight"))?,
                        wv: ld.matrix(&format!("{p}.attn_v.weight"))?,
                        wo: ld.matrix(&format!("{p}.attn_output.weight"))?,
                        q_norm: ld.vector(&format!("{p}.attn_q_norm.weight"), hd)?,
                        k_norm: ld.vector(&format!("{p}.attn_k_norm.weight"), hd)?,
                        idx_q: ld.matrix(&format!("{p}.indexer.q_proj.weight"))?,
                        idx_k: ld.matrix(&format!("{p}.indexer.k_proj.weight"))?,
                        idx_q_norm: ld.vector(&format!("{p}.indexer.q_norm.weight"), di)?,
                        idx_k_norm: ld.vector(&format!("{p}.indexer.k_norm.weight"), di)?,
                    })
                }
            };
            let share = cfg.top_k as f64 / cfg.n_expert as f64;
            let moe = Moe {
                router: ld.matrix(&format!("{p}.ffn_gate_inp.weight"))?,
                experts: {
                    let m = |w: &str| src.matrix(&format!("{p}.ffn_{w}_exps.weight"), false);
                    let (g, u, d) = (m("gate")?, m("up")?, m("down")?);
                    Experts::place(
                        i,
                        src.host_experts(),
                        ExpertTensors::Split(&g, &u, &d),
                        |w| ld.upload(w, share),
                        cfg.n_ff_exp,
                        Activation::Silu,
                    )?
                },
                sh_gate: ld.matrix(&format!("{p}.ffn_gate_shexp.weight"))?,
                sh_up: ld.matrix(&format!("{p}.ffn_up_shexp.weight"))?,
                sh_down: ld.matrix(&format!("{p}.ffn_down_shexp.weight"))?,
                sh_scale: ld.matrix(&format!("{p}.ffn_gate_inp_shexp.weight"))?,
            };
            let ple = match cfg.ple.as_ref().filter(|pc| pc.layers.contains(&i)) {
                Some(pc) => {
                    let table = src
                        .get("per_layer_token_embd.weight")
                        .ok_or_else(|| anyhow!("missing tensor per_layer_token_embd.weight"))?;
                    let table = ple::NgramTable::new(
                        vec![table],
                        key_array_u(&g, "ple.layer_multipliers")?,
                        key_array_u(&g, "ple.head_vocab_sizes")?,
                        key_array_u(&g, "ple.head_offsets")?,
                        pc.heads_per_ngram,
                    )
                    .context("the n-gram table")?;
                    Some(Ple {
                        table,
                        key: ld.matrix(&format!("{p}.ple_key.weight"))?,
                        value: ld.matrix(&format!("{p}.ple_value.weight"))?,
                        norm_key: ld.vector(&format!("{p}.ple_norm_key.weight"), sh)?,
                        norm_query: ld.vector(&format!("{p}.ple_norm_query.weight"), sh)?,
                        norm_conv: ld.vector(&format!("{p}.ple_norm_conv.weight"), sh)?,
                        conv: ld.vector(&format!("{p}.ple_conv1d.weight"), sh * pc.conv_k)?,
                    })
                }
                None => None,
            };
            layers.push(Layer {
                attn_hc: hc(&mut ld, &format!("{p}.hc_attn"), true)?,
                mlp_hc: hc(&mut ld, &format!("{p}.hc_ffn"), true)?,
                mixer,
                moe,
                ple,
                state,
            });
        }
        let mixer = hc(&mut ld, "output_hc", false)?;
        let weight_bytes_per_token = ld.bytes;
        let rope_factors = cfg.rope_divisors.clone().map(std::sync::Arc::new);
        Ok(Qwen4ExpModel {
            backend,
            cfg,
            embd,
            head,
            mixer,
            layers,
            mtp: None,
            mtp_on: AtomicBool::new(false),
            source: None,
            layout,
            weight_bytes_per_token,
            rope_factors,
        })
    }
}
