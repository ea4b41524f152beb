//! Loading `deepseek_v4` weights from a checkpoint directory (docs/deepseekv4-spec.md §10):
//! the release's names and storage (FP8 / MXFP4 decoded by the weight source) or what
//! transformers' `save_pretrained` writes (a `model.` prefix and a few other names); the
//! per-expert matrices stacked into the 3-D expert layout, each expert's gate and up rows
//! together; a compressor's value and gate projections stacked into one product.

use super::mtp::MtpFrom;
use super::*;
use crate::blocks::experts::{ExpertTensors, Experts};
use crate::placement::LoadSpec;
use crate::weights::{stack, WeightSource};
use anyhow::{anyhow, Context};
use serde_json::Value;
use std::path::Path;
use vela_compute::HostWeight;
use vela_formats::quant::GgmlType;
use vela_formats::safetensors::Checkpoint;

/// The `save_pretrained` spelling of a release name, where it differs.
fn hf_alias(name: &str) -> Option<String> {
    if name == "embed.weight" {
        return Some("embed_tokens.weight".into());
    }
    if let Some(k) = name.strip_prefix("hc_head_") {
        return Some(format!("hc_head.hc_{k}"));
    }
    name.strip_suffix(".attn.kv_norm.weight")
        .map(|l| format!("{l}.attn.norm.weight"))
}

/// The source and name holding a release-named tensor: the name, its alias, the name outside
/// the prefix. A generated source has the release names only (and `has` would generate the
/// tensor once more).
fn locate<'a>(
    src: &'a WeightSource,
    top: &'a WeightSource,
    gguf: bool,
    name: &str,
) -> Result<(&'a WeightSource, String)> {
    if src.synthetic_seed().is_some() {
        return Ok((src, name.to_string()));
    }
    let alias = if gguf {
        super::gguf::gguf_name(name)
    } else {
        hf_alias(name)
    };
    [
        (src, Some(name.to_string())),
        (src, alias),
        (top, Some(name.to_string())),
    ]
    .into_iter()
    .find_map(|(s, n)| n.filter(|n| s.has(n)).map(|n| (s, n)))
    .ok_or_else(|| anyhow!("missing tensor {name}"))
}

pub(super) struct Loader<'a, B: Backend> {
    pub(super) be: &'a B,
    pub(super) src: &'a WeightSource,
    /// The same checkpoint without the text model's prefix (`head.weight`).
    pub(super) top: &'a WeightSource,
    /// A llama.cpp GGUF (its own tensor names, stacked experts).
    pub(super) gguf: bool,
    pub(super) bytes: u64,
}

impl<'a, B: Backend> Loader<'a, B> {
    /// The source and name holding a release-named tensor.
    pub(super) fn locate(&self, name: &str) -> Result<(&'a WeightSource, String)> {
        locate(self.src, self.top, self.gguf, name)
    }
    pub(super) fn get(&self, name: &str) -> Result<HostWeight> {
        let (s, n) = self.locate(name)?;
        s.get(&n).ok_or_else(|| anyhow!("missing tensor {name}"))
    }
    /// A matrix in its load type (`exact`: F32).
    pub(super) fn host(&self, name: &str, exact: bool) -> Result<HostWeight> {
        let (s, n) = self.locate(name)?;
        s.matrix(&n, exact)
    }
    pub(super) fn upload(&mut self, w: &HostWeight, share: f64) -> Result<B::Weight> {
        self.bytes += (w.bytes().len() as f64 * share) as u64;
        self.be.upload_weight(w)
    }
    pub(super) fn matrix(&mut self, name: &str) -> Result<B::Weight> {
        let w = self.host(name, false)?;
        self.upload(&w, 1.0)
    }
    pub(super) fn floats(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let v = self.get(name)?.to_f32()?;
        if v.len() != len {
            bail!("{name}: {} values, expected {len}", v.len());
        }
        Ok(v)
    }
    pub(super) fn vector(&self, name: &str, len: usize) -> Result<B::Vector> {
        self.be.upload_vector(&self.floats(name, len)?)
    }
    fn ints(&self, name: &str) -> Result<Vec<u32>> {
        let w = self.get(name)?;
        let v: Vec<i64> = match w.ty {
            GgmlType::I64 => w
                .bytes()
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
                .collect(),
            GgmlType::I32 => w
                .bytes()
                .chunks_exact(4)
                .map(|b| i32::from_le_bytes(b.try_into().expect("4 bytes")) as i64)
                .collect(),
            t => bail!("{name}: integer tensor expected, found {}", t.name()),
        };
        v.into_iter()
            .map(|x| u32::try_from(x).map_err(|_| anyhow!("{name}: value {x} out of range")))
            .collect()
    }

    pub(super) fn hc(&mut self, p: &str, rows: usize, width: usize) -> Result<Hc<B>> {
        let mix = self.host(&format!("{p}_fn"), true)?;
        if mix.rows != rows || mix.cols != width {
            bail!(
                "{p}_fn: [{}, {}], expected [{rows}, {width}]",
                mix.rows,
                mix.cols
            );
        }
        let sc = self.get(&format!("{p}_scale"))?.to_f32()?;
        let scale = match sc.as_slice() {
            [a] => [*a, 0.0, 0.0],
            [a, b, c] => [*a, *b, *c],
            _ => bail!("{p}_scale: {} values", sc.len()),
        };
        Ok(Hc {
            mix: self.upload(&mix, 1.0)?,
            base: self.vector(&format!("{p}_base"), rows)?,
            scale,
        })
    }

    fn compressor(
        &mut self,
        p: &str,
        width: usize,
        m: usize,
        overlap: bool,
        entry: usize,
    ) -> Result<Compressor<B>> {
        let half = if overlap { 2 * width } else { width };
        let kv = self.host(&format!("{p}.wkv.weight"), false)?;
        let gate = self.host(&format!("{p}.wgate.weight"), false)?;
        if kv.rows != half || gate.rows != half {
            bail!(
                "{p}: projections of {} / {} rows, expected {half}",
                kv.rows,
                gate.rows
            );
        }
        let proj = stack(&format!("{p}.wkv+wgate"), &[kv, gate])?;
        Ok(Compressor {
            proj: self.upload(&proj, 1.0)?,
            ape: self.vector(&format!("{p}.ape"), m * half)?,
            norm: self.vector(&format!("{p}.norm.weight"), width)?,
            width,
            overlap,
            entry,
        })
    }

    /// A layer's tensors under `p` (`layers.<i>` in release names, `mtp.0` for the MTP block);
    /// `blk`: its GGUF block index (a GGUF's stacked experts).
    pub(super) fn layer(
        &mut self,
        p: &str,
        blk: usize,
        (kind, routing): (Attn, Routing),
        c: &DeepseekV4Config,
        ents: [Option<usize>; 3],
    ) -> Result<Layer<B>> {
        let (s, h) = (c.hc, c.hidden);
        Ok(Layer {
            attn_hc: self.hc(&format!("{p}.hc_attn"), (2 + s) * s, s * h)?,
            ffn_hc: self.hc(&format!("{p}.hc_ffn"), (2 + s) * s, s * h)?,
            attn_norm: self.vector(&format!("{p}.attn_norm.weight"), h)?,
            ffn_norm: self.vector(&format!("{p}.ffn_norm.weight"), h)?,
            attn: self.attention(&format!("{p}.attn"), kind, c, ents)?,
            moe: self.moe(&format!("{p}.ffn"), blk, routing, c)?,
        })
    }

    fn attention(
        &mut self,
        p: &str,
        kind: Attn,
        c: &DeepseekV4Config,
        ents: [Option<usize>; 3],
    ) -> Result<Attention<B>> {
        let (comp, indexer) = match kind {
            Attn::Sliding => (None, None),
            Attn::Hca => {
                let e = ents[1].ok_or_else(|| anyhow!("{p}: no compressor entry"))?;
                let cp =
                    self.compressor(&format!("{p}.compressor"), c.head_dim, c.hca_rate, false, e)?;
                (Some(cp), None)
            }
            Attn::Csa => {
                let (e, ie) = ents[1]
                    .zip(ents[2])
                    .ok_or_else(|| anyhow!("{p}: no entries"))?;
                let cp =
                    self.compressor(&format!("{p}.compressor"), c.head_dim, c.csa_rate, true, e)?;
                let q = format!("{p}.indexer");
                let ix = Indexer {
                    wq: self.matrix(&format!("{q}.wq_b.weight"))?,
                    weights: self.matrix(&format!("{q}.weights_proj.weight"))?,
                    comp: self.compressor(
                        &format!("{q}.compressor"),
                        c.idx_dim,
                        c.csa_rate,
                        true,
                        ie,
                    )?,
                };
                (Some(cp), Some(ix))
            }
        };
        let wo_a = self.host(&format!("{p}.wo_a.weight"), false)?;
        let gw = c.n_head * c.head_dim / c.o_groups;
        if wo_a.rows != c.o_groups * c.o_rank || wo_a.cols != gw {
            bail!(
                "{p}.wo_a: [{}, {}], expected [{}, {gw}]",
                wo_a.rows,
                wo_a.cols,
                c.o_groups * c.o_rank
            );
        }
        Ok(Attention {
            kind,
            wq_a: self.matrix(&format!("{p}.wq_a.weight"))?,
            q_norm: self.vector(&format!("{p}.q_norm.weight"), c.q_rank)?,
            wq_b: self.matrix(&format!("{p}.wq_b.weight"))?,
            wkv: self.matrix(&format!("{p}.wkv.weight"))?,
            kv_norm: self.vector(&format!("{p}.kv_norm.weight"), c.head_dim)?,
            sinks: self.vector(&format!("{p}.attn_sink"), c.n_head)?,
            wo_a: self.upload(&wo_a, 1.0)?,
            wo_b: self.matrix(&format!("{p}.wo_b.weight"))?,
            comp,
            indexer,
            window: ents[0].ok_or_else(|| anyhow!("{p}: no window entry"))?,
        })
    }

    fn moe(
        &mut self,
        p: &str,
        blk: usize,
        routing: Routing,
        c: &DeepseekV4Config,
    ) -> Result<Moe<B>> {
        let e = c.n_expert;
        let share = c.top_k as f64 / e as f64;
        let tensors = if self.gguf {
            // The converter's stacked expert tensors, gate and up apart.
            let m = |w: &str| -> Result<HostWeight> {
                let n = format!("blk.{blk}.ffn_{w}_exps.weight");
                let t = self.src.matrix(&n, false)?;
                if t.rows % e != 0 {
                    bail!("{n}: {} rows for {e} experts", t.rows);
                }
                Ok(t)
            };
            vec![m("gate")?, m("up")?, m("down")?]
        } else {
            // The experts read (decoded, converted or generated) on every core: 256 × 3
            // matrices per layer.
            let threads = std::thread::available_parallelism()
                .map_or(1, |n| n.get())
                .min(e);
            let per = e.div_ceil(threads);
            let (src, top, gguf) = (self.src, self.top, self.gguf);
            let parts: Vec<Result<Vec<[HostWeight; 3]>>> = std::thread::scope(|sc| {
                let hs: Vec<_> = (0..threads)
                    .map(|t| {
                        sc.spawn(move || {
                            (t * per..((t + 1) * per).min(e))
                                .map(|x| {
                                    let m = |w: &str| {
                                        let n = format!("{p}.experts.{x}.{w}.weight");
                                        let (s, n) = locate(src, top, gguf, &n)?;
                                        s.matrix(&n, false)
                                    };
                                    Ok([m("w1")?, m("w3")?, m("w2")?])
                                })
                                .collect()
                        })
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(anyhow!("{p}: an expert-loading thread panicked"))
                        })
                    })
                    .collect()
            });
            let mut gu = Vec::with_capacity(2 * e);
            let mut down = Vec::with_capacity(e);
            for part in parts {
                for [g, u, d] in part? {
                    gu.push(g);
                    gu.push(u);
                    down.push(d);
                }
            }
            let gu = stack(&format!("{p}.experts.gate_up"), &gu)?;
            let down = stack(&format!("{p}.experts.down"), &down)?;
            vec![gu, down]
        };
        let t = match &tensors[..] {
            [g, u, d] => ExpertTensors::Split(g, u, d),
            [gu, d] => ExpertTensors::Fused(gu, d),
            _ => unreachable!("two or three expert tensors"),
        };
        // The trunk's layers only: the MTP block and DSpark stages (`mtp.*`) stay on the device.
        let host = self.src.host_experts().filter(|_| !p.starts_with("mtp."));
        let (n_ff, act) = (c.n_ff, Activation::SiluLimit(c.swiglu_limit));
        let experts = Experts::place(blk, host, t, |w| self.upload(w, share), n_ff, act)?;
        let (bias, table) = match routing {
            Routing::TopK => (Some(self.vector(&format!("{p}.gate.bias"), e)?), None),
            Routing::Hash => {
                let t = self.ints(&format!("{p}.gate.tid2eid"))?;
                if t.len() != c.n_vocab * c.top_k || t.iter().any(|&x| x as usize >= e) {
                    bail!(
                        "{p}.gate.tid2eid: expected [{}, {}] expert ids below {e}",
                        c.n_vocab,
                        c.top_k
                    );
                }
                let mut ids = self.be.alloc_ids(t.len());
                self.be.write_ids(&mut ids, &t);
                (None, Some(std::sync::Mutex::new(ids)))
            }
        };
        Ok(Moe {
            router: self.matrix(&format!("{p}.gate.weight"))?,
            bias,
            table,
            experts,
            sh_gate: self.matrix(&format!("{p}.shared_experts.w1.weight"))?,
            sh_up: self.matrix(&format!("{p}.shared_experts.w3.weight"))?,
            sh_down: self.matrix(&format!("{p}.shared_experts.w2.weight"))?,
        })
    }
}

impl<B: Backend> DeepseekV4Model<B> {
    /// Load from a checkpoint directory (release or `save_pretrained` layout), converting float
    /// matrices to `quant` when given.
    pub fn load_hf(backend: Arc<B>, dir: &Path, spec: &LoadSpec) -> Result<Self> {
        let cpath = dir.join("config.json");
        let text = std::fs::read_to_string(&cpath)
            .with_context(|| format!("cannot read {}", cpath.display()))?;
        let j: Value = serde_json::from_str(&text)
            .with_context(|| format!("{} is not valid JSON", cpath.display()))?;
        let cfg = DeepseekV4Config::from_json(&j)?;
        let dspark = DsparkConfig::from_json(&j, cfg.attn.len(), cfg.n_vocab)?;
        let cp = Arc::new(Checkpoint::open(dir)?);
        let stages = dspark::count_stages(&|n| cp.get(n).is_some());
        if dspark.is_some() && stages == 0 {
            bail!("config.json has dspark_block_size but the checkpoint has no DSpark stages (mtp.0.attn.*)");
        }
        let prefix = if cp.get("model.embed_tokens.weight").is_some() {
            "model."
        } else if cp.get("embed.weight").is_some() {
            ""
        } else {
            bail!("checkpoint has neither embed.weight nor model.embed_tokens.weight (is this a deepseek_v4 checkpoint?)");
        };
        let src = WeightSource::hf(cp.clone(), prefix).with_spec(spec);
        let top = WeightSource::hf(cp, "").with_quant(spec.quant);
        // The MTP block sits at the checkpoint's root (`mtp.0.*`, the source looks there too).
        let mtp = src.has("mtp.0.e_proj.weight").then(|| MtpFrom {
            src: &src,
            gguf: false,
            source: Some(dir.to_path_buf()),
        });
        let mut m = Self::load(
            backend,
            &src,
            &top,
            false,
            cfg,
            mtp,
            dspark.map(|d| (d, stages)),
        )?;
        m.source = Some(dir.to_path_buf());
        Ok(m)
    }

    /// Load a llama.cpp 0c1e570 GGUF conversion (`deepseek4`), converting float matrices to
    /// `quant` when given.
    pub fn load_gguf(
        backend: Arc<B>,
        g: Arc<vela_formats::gguf::GgufFile>,
        spec: &LoadSpec,
    ) -> Result<Self> {
        let quant = spec.quant;
        let cfg = DeepseekV4Config::from_gguf(&g)?;
        // llama.cpp's `--mtp` export of the MTP block, as `mtp-NAME` beside the model.
        let beside = super::mtp::gguf_beside(&g, &cfg)?;
        let msrc = beside
            .as_ref()
            .map(|(mg, _)| WeightSource::gguf(mg.clone()).with_quant(quant));
        let mtp = msrc
            .as_ref()
            .zip(beside.as_ref())
            .map(|(src, (_, path))| MtpFrom {
                src,
                gguf: true,
                source: Some(path.clone()),
            });
        let src = WeightSource::gguf(g.clone()).with_spec(spec);
        let top = WeightSource::gguf(g).with_quant(quant);
        Self::load(backend, &src, &top, true, cfg, mtp, None)
    }

    pub(super) fn load(
        backend: Arc<B>,
        src: &WeightSource,
        top: &WeightSource,
        gguf: bool,
        cfg: DeepseekV4Config,
        mtp: Option<MtpFrom<'_>>,
        dspark: Option<(DsparkConfig, usize)>,
    ) -> Result<Self> {
        if cfg.mlp_bias {
            bail!("deepseek_v4: mlp_bias (biases on the shared expert) is not supported");
        }
        for r in [&cfg.rope_main, &cfg.rope_compress] {
            if r.yarn.as_ref().is_some_and(|y| y.attention_factor != 1.0) {
                bail!("deepseek_v4: a YaRN attention_factor other than 1 is not supported");
            }
        }
        if cfg.hc > 16 {
            bail!("deepseek_v4: at most 16 mHC streams (hc_mult {})", cfg.hc);
        }
        let mut ld = Loader {
            be: &*backend,
            src,
            top,
            gguf,
            bytes: 0,
        };
        let (s, h) = (cfg.hc, cfg.hidden);
        let embd_host = ld.get("embed.weight")?.as_head(true);
        if embd_host.rows != cfg.n_vocab || embd_host.cols != h {
            bail!(
                "embed: [{}, {}], expected [{}, {}]",
                embd_host.rows,
                embd_host.cols,
                cfg.n_vocab,
                h
            );
        }
        let embd = backend.upload_weight(&embd_host)?;
        let head = if cfg.tie_embeddings {
            ld.upload(&embd_host, 1.0)?
        } else {
            let w = ld.host("head.weight", false)?.as_head(true);
            ld.upload(&w, 1.0)?
        };
        let (layout, entries, mtp_ents) = build_layout(&cfg, mtp.is_some());
        let mut layers = Vec::with_capacity(cfg.attn.len());
        for (i, ents) in entries.into_iter().enumerate() {
            let kind = (cfg.attn[i], cfg.routing[i]);
            layers.push(ld.layer(&format!("layers.{i}"), i, kind, &cfg, ents)?);
        }
        let (layout, dspark) = match dspark {
            None => (layout, None),
            Some((dc, n)) => {
                let (layout, ents) = with_stage_windows(&cfg, layout, n);
                (layout, Some(ld.dspark(&cfg, dc, &ents)?))
            }
        };
        let head_hc = ld.hc("hc_head", s, s * h)?;
        let norm = ld.vector("norm.weight", h)?;
        let ones = backend.upload_vector(&vec![1.0; (s * h).max(cfg.head_dim)])?;
        let weight_bytes_per_token = ld.bytes;
        let mtp = match (mtp, mtp_ents) {
            (Some(from), Some(ents)) => Some(super::mtp::Mtp::load(&*backend, from, &cfg, ents)?),
            _ => None,
        };
        Ok(DeepseekV4Model {
            inv_main: inv_freq(&cfg.rope_main, cfg.n_rot),
            inv_comp: inv_freq(&cfg.rope_compress, cfg.n_rot),
            backend,
            embd,
            head,
            head_hc,
            norm,
            layers,
            mtp,
            mtp_on: AtomicBool::new(false),
            ones,
            layout,
            weight_bytes_per_token,
            source: None,
            dspark,
            dspark_on: AtomicBool::new(false),
            dspark_p_min: AtomicU32::new(0.6f32.to_bits()),
            cfg,
        })
    }
}
