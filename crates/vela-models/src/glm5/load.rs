//! Loading `glm5_next` weights from an HF checkpoint directory (docs/glm5-spec.md §10): the
//! release's names under `model.language_model.` (the vision tower is not read), `lm_head` at
//! the top. At load: KDA's q/k/v projections and kernels stacked; a_h folded into the bounded
//! decay gate; `kv_b_proj` split into the per-head absorbed matrices W^k_hᵀ and W^v_h; the
//! indexer's `wk` centred (its LayerNorm then is an RMSNorm plus bias); the per-expert tensors
//! stacked into the 3-D expert layout. The same from llama.cpp's GGUF conversion (gguf.rs): the
//! names mapped, `kv_b_proj` taken as the converter's per-head `attn_k_b` / `attn_v_b`, a_h as
//! `−ssm_a`, the stacked experts as they are.

use super::ffn::{Ffn, Mlp, Moe};
use super::kda::Kda;
use super::mla::{Indexer as DsaIndexer, Mla};
use super::*;
use crate::blocks::experts::{stack_per_expert, ExpertTensors, Experts};
use crate::placement::LoadSpec;
use crate::weights::{stack, WeightSource};
use anyhow::anyhow;
use std::path::Path;
use vela_compute::{Activation, HostWeight};
use vela_formats::quant::GgmlType;

pub(super) struct Loader<'a, B: Backend> {
    be: &'a B,
    src: &'a WeightSource,
    /// A llama.cpp GGUF (its own tensor names, gguf.rs).
    gguf: bool,
    /// Weight bytes one token reads (experts at their active share).
    bytes: u64,
}

/// An f32 matrix built at load.
fn owned(name: &str, rows: usize, cols: usize, data: &[f32]) -> Result<HostWeight> {
    let bytes = data.iter().flat_map(|v| v.to_le_bytes()).collect();
    HostWeight::owned(name, GgmlType::F32, rows, cols, bytes)
}

impl<'a, B: Backend> Loader<'a, B> {
    /// The source's name of a release-named tensor.
    fn name(&self, name: &str) -> Result<String> {
        if !self.gguf {
            return Ok(name.to_string());
        }
        super::gguf::gguf_name(name).ok_or_else(|| anyhow!("{name}: no GGUF counterpart"))
    }
    /// A matrix in its load type (`exact`: F32), shape-checked.
    fn host_as(&self, name: &str, rows: usize, cols: usize, exact: bool) -> Result<HostWeight> {
        let n = self.name(name)?;
        let w = self.src.matrix(&n, exact)?;
        if w.rows != rows || w.cols != cols {
            bail!("{n}: [{}, {}], expected [{rows}, {cols}]", w.rows, w.cols);
        }
        Ok(w)
    }
    pub(super) fn host(&self, name: &str, rows: usize, cols: usize) -> Result<HostWeight> {
        self.host_as(name, rows, cols, false)
    }
    pub(super) fn upload(&mut self, w: &HostWeight, share: f64) -> Result<B::Weight> {
        self.bytes += (w.bytes().len() as f64 * share) as u64;
        self.be.upload_weight(w)
    }
    fn matrix(&mut self, name: &str, rows: usize, cols: usize) -> Result<B::Weight> {
        let w = self.host(name, rows, cols)?;
        self.upload(&w, 1.0)
    }
    /// A matrix's values as f32, shape-checked (for the matrices rewritten at load).
    fn floats2(&self, name: &str, rows: usize, cols: usize) -> Result<Vec<f32>> {
        self.floats(name, rows * cols)
    }
    /// Whether the source has a release-named tensor.
    pub(super) fn has(&self, name: &str) -> Result<bool> {
        Ok(self.src.has(&self.name(name)?))
    }
    fn floats(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let n = self.name(name)?;
        let w = self
            .src
            .get(&n)
            .ok_or_else(|| anyhow!("missing tensor {n}"))?;
        let v = w.to_f32()?;
        if v.len() != len {
            bail!("{n}: {} values, expected {len}", v.len());
        }
        Ok(v)
    }
    pub(super) fn vector(&self, name: &str, len: usize) -> Result<B::Vector> {
        self.be.upload_vector(&self.floats(name, len)?)
    }

    fn hc(&mut self, p: &str, c: &Glm5Config) -> Result<Hc<B>> {
        let (s, h) = (c.hc, c.hidden);
        let rows = (2 + s) * s;
        let mix = self.host_as(&format!("{p}_fn"), rows, s * h, true)?;
        let sc = self.floats(&format!("{p}_scale"), 3)?;
        Ok(Hc {
            mix: self.upload(&mix, 1.0)?,
            base: self.vector(&format!("{p}_base"), rows)?,
            scale: [sc[0], sc[1], sc[2]],
        })
    }

    fn kda(&mut self, p: &str, c: &Glm5Config) -> Result<Kda<B>> {
        let (h, nk, dk, kc) = (c.hidden, c.kda_heads, c.kda_dim, c.conv_k);
        let w = nk * dk;
        let proj = ["q", "k", "v"]
            .iter()
            .map(|x| self.host(&format!("{p}.{x}_proj.weight"), w, h))
            .collect::<Result<Vec<_>>>()?;
        let qkv = stack(&format!("{p}.qkv_proj"), &proj)?;
        let mut conv = Vec::with_capacity(3 * w * kc);
        for x in ["q", "k", "v"] {
            conv.extend(self.floats(&format!("{p}.{x}_conv1d.weight"), w * kc)?);
        }
        // a_h = exp(A_log); the converter stores −exp(A_log).
        let a_log = self.floats(&format!("{p}.A_log"), nk)?;
        let a: Vec<f32> = match self.gguf {
            false => a_log.iter().map(|v| v.exp()).collect(),
            true => a_log.iter().map(|v| -v).collect(),
        };
        let mut dt_bias = self.floats(&format!("{p}.dt_bias"), w)?;
        let f_b_name = format!("{p}.f_b_proj.weight");
        let f_b = match c.lower_bound {
            Some(_) => {
                // a_h·(f_b(f_a x) + dt_bias): a_h into the rows of head h.
                let mut v = self.floats2(&f_b_name, w, dk)?;
                for (r, row) in v.chunks_exact_mut(dk).enumerate() {
                    row.iter_mut().for_each(|x| *x *= a[r / dk]);
                    dt_bias[r] *= a[r / dk];
                }
                let fb = owned(&f_b_name, w, dk, &v)?;
                self.upload(&fb, 1.0)?
            }
            None => self.matrix(&f_b_name, w, dk)?,
        };
        let neg_a: Vec<f32> = (0..w).map(|r| -a[r / dk]).collect();
        Ok(Kda {
            qkv: self.upload(&qkv, 1.0)?,
            conv: self.be.upload_vector(&conv)?,
            f_a: self.matrix(&format!("{p}.f_a_proj.weight"), dk, h)?,
            f_b,
            dt_bias: self.be.upload_vector(&dt_bias)?,
            neg_a: self.be.upload_vector(&neg_a)?,
            b: self.matrix(&format!("{p}.b_proj.weight"), nk, h)?,
            g_a: self.matrix(&format!("{p}.g_a_proj.weight"), dk, h)?,
            g_b: self.matrix(&format!("{p}.g_b_proj.weight"), w, dk)?,
            o_norm: self.vector(&format!("{p}.o_norm.weight"), dk)?,
            o: self.matrix(&format!("{p}.o_proj.weight"), h, w)?,
        })
    }

    pub(super) fn mla(&mut self, p: &str, c: &Glm5Config, full: bool) -> Result<Mla<B>> {
        let (h, nh, dn, dv, r) = (c.hidden, c.n_head, c.nope_dim, c.v_dim, c.kv_rank);
        let (k_abs, v_abs) = if self.gguf {
            // The converter's split: attn_k_b {dn, r, nh} (W^k_hᵀ per head), attn_v_b
            // {r, dv, nh} (W^v_h), the same layouts; F32 under a load-time type, as built
            // from a checkpoint.
            (
                self.host_as(&format!("{p}.k_b_proj.weight"), nh * r, dn, true)?,
                self.host_as(&format!("{p}.v_b_proj.weight"), nh * dv, r, true)?,
            )
        } else {
            // kv_b_proj [nh·(dn+dv), r]: per head W^k_h (dn rows) then W^v_h (dv rows).
            let kvb_name = format!("{p}.kv_b_proj.weight");
            let kvb = self.floats2(&kvb_name, nh * (dn + dv), r)?;
            let mut k_abs = vec![0f32; nh * r * dn];
            let mut v_abs = Vec::with_capacity(nh * dv * r);
            for hd in 0..nh {
                let base = hd * (dn + dv) * r;
                for i in 0..dn {
                    for j in 0..r {
                        k_abs[(hd * r + j) * dn + i] = kvb[base + i * r + j];
                    }
                }
                v_abs.extend_from_slice(&kvb[base + dn * r..base + (dn + dv) * r]);
            }
            (
                owned(&format!("{kvb_name} (k, absorbed)"), nh * r, dn, &k_abs)?,
                owned(&format!("{kvb_name} (v)"), nh * dv, r, &v_abs)?,
            )
        };
        let indexer = if full {
            Some(self.indexer(&format!("{p}.indexer"), c)?)
        } else {
            None
        };
        Ok(Mla {
            q_a: self.matrix(&format!("{p}.q_a_proj.weight"), c.q_rank, h)?,
            q_norm: self.vector(&format!("{p}.q_a_layernorm.weight"), c.q_rank)?,
            q_b: self.matrix(&format!("{p}.q_b_proj.weight"), nh * dn, c.q_rank)?,
            kv_a: self.matrix(&format!("{p}.kv_a_proj_with_mqa.weight"), r, h)?,
            kv_norm: self.vector(&format!("{p}.kv_a_layernorm.weight"), r)?,
            k_abs: self.upload(&k_abs, 1.0)?,
            v_abs: self.upload(&v_abs, 1.0)?,
            o: self.matrix(&format!("{p}.o_proj.weight"), h, nh * dv)?,
            indexer,
        })
    }

    fn indexer(&mut self, p: &str, c: &Glm5Config) -> Result<DsaIndexer<B>> {
        let (h, ni, di, m) = (c.hidden, c.idx_heads, c.idx_dim, c.idx_pool);
        // Centre the keys: row i of wk minus the mean of the rows, so x·wk'ᵀ = k − mean(k).
        let wk_name = format!("{p}.wk.weight");
        let mut wk = self.floats2(&wk_name, di, h)?;
        let mut mean = vec![0f64; h];
        for row in wk.chunks_exact(h) {
            row.iter().zip(&mut mean).for_each(|(x, m)| *m += *x as f64);
        }
        mean.iter_mut().for_each(|m| *m /= di as f64);
        for row in wk.chunks_exact_mut(h) {
            row.iter_mut()
                .zip(&mean)
                .for_each(|(x, m)| *x = (*x as f64 - m) as f32);
        }
        let wk = owned(&format!("{wk_name} (centred)"), di, h, &wk)?;
        Ok(DsaIndexer {
            wq: self.matrix(&format!("{p}.wq_b.weight"), ni * di, c.q_rank)?,
            wk: self.upload(&wk, 1.0)?,
            k_norm: self.vector(&format!("{p}.k_norm.weight"), di)?,
            k_bias: self.vector(&format!("{p}.k_norm.bias"), di)?,
            weights: self.matrix(&format!("{p}.weights_proj.weight"), ni, h)?,
            gate: self.matrix(&format!("{p}.index_kpool_compress_gate"), di, h)?,
            ape: self.vector(&format!("{p}.index_kpool_compress_ape"), m * di)?,
        })
    }

    fn mlp(&mut self, p: &str, c: &Glm5Config, width: usize) -> Result<Mlp<B>> {
        let h = c.hidden;
        Ok(Mlp {
            gate: self.matrix(&format!("{p}.gate_proj.weight"), width, h)?,
            up: self.matrix(&format!("{p}.up_proj.weight"), width, h)?,
            down: self.matrix(&format!("{p}.down_proj.weight"), h, width)?,
            width,
        })
    }

    pub(super) fn moe(&mut self, p: &str, layer: usize, c: &Glm5Config) -> Result<Moe<B>> {
        let (e, h, i) = (c.n_expert, c.hidden, c.n_ff_exp);
        let share = c.top_k as f64 / e as f64;
        let src = self.src;
        let stacked = |w: &str, rows: usize, cols: usize| -> Result<HostWeight> {
            let n = format!("blk.{layer}.ffn_{w}_exps.weight");
            let t = src.matrix(&n, false)?;
            if t.rows != e * rows || t.cols != cols {
                bail!(
                    "{n}: [{}, {}], expected {e} experts of [{rows}, {cols}]",
                    t.rows,
                    t.cols
                );
            }
            Ok(t)
        };
        let tensors = if self.gguf {
            // The converter's stacked expert tensors, gate and up apart.
            vec![
                stacked("gate", i, h)?,
                stacked("up", i, h)?,
                stacked("down", h, i)?,
            ]
        } else {
            let (gu, down) = stack_per_expert(&format!("{p}.experts"), e, |x| {
                let m = |w: &str, rows, cols| -> Result<HostWeight> {
                    let n = format!("{p}.experts.{x}.{w}.weight");
                    let t = src.matrix(&n, false)?;
                    if t.rows != rows || t.cols != cols {
                        bail!("{n}: [{}, {}], expected [{rows}, {cols}]", t.rows, t.cols);
                    }
                    Ok(t)
                };
                Ok([
                    m("gate_proj", i, h)?,
                    m("up_proj", i, h)?,
                    m("down_proj", h, i)?,
                ])
            })?;
            vec![gu, down]
        };
        let t = match &tensors[..] {
            [g, u, d] => ExpertTensors::Split(g, u, d),
            [gu, d] => ExpertTensors::Fused(gu, d),
            _ => unreachable!("two or three expert tensors"),
        };
        let router = self.host_as(&format!("{p}.gate.weight"), e, h, true)?;
        Ok(Moe {
            router: self.upload(&router, 1.0)?,
            bias: self.vector(&format!("{p}.gate.e_score_correction_bias"), e)?,
            experts: Experts::place(
                layer,
                self.src.host_experts(),
                t,
                |w| self.upload(w, share),
                i,
                Activation::SiluLimit(c.swiglu_limit),
            )?,
            shared: self.mlp(&format!("{p}.shared_experts"), c, i * c.n_shared)?,
        })
    }
}

impl<B: Backend> Glm5Model<B> {
    /// Load from an HF checkpoint directory, converting float matrices to `quant` when given.
    pub fn load_hf(backend: Arc<B>, dir: &Path, spec: &LoadSpec) -> Result<Self> {
        let (j, src) = crate::weights::open_hf_text(dir, spec, "glm5_next")?;
        let cfg = Glm5Config::from_json(&j)?;
        Self::load(backend, &src, false, cfg, Some(dir.to_path_buf()))
    }

    /// Load a llama.cpp 0c1e570 GGUF conversion (`glm5-next`), converting float matrices to
    /// `spec.quant` when given.
    pub fn load_gguf(
        backend: Arc<B>,
        g: Arc<vela_formats::gguf::GgufFile>,
        spec: &LoadSpec,
    ) -> Result<Self> {
        let cfg = Glm5Config::from_gguf(&g)?;
        let path = g.path().map(Path::to_path_buf);
        let src = WeightSource::gguf(g).with_spec(spec);
        Self::load(backend, &src, true, cfg, path)
    }

    /// The model from `src` (`source`: the file or directory, where its MTP block binds from;
    /// `None`: generated).
    pub(super) fn load(
        backend: Arc<B>,
        src: &WeightSource,
        gguf: bool,
        cfg: Glm5Config,
        source: Option<std::path::PathBuf>,
    ) -> Result<Self> {
        let mut ld = Loader {
            be: &*backend,
            src,
            gguf,
            bytes: 0,
        };
        let (v, h) = (cfg.n_vocab, cfg.hidden);
        let embd_name = ld.name("embed_tokens.weight")?;
        let embd_host = src
            .get(&embd_name)
            .ok_or_else(|| anyhow!("missing tensor {embd_name}"))?
            .as_head(true);
        if embd_host.rows != v || embd_host.cols != h {
            bail!(
                "{embd_name}: [{}, {}], expected [{v}, {h}]",
                embd_host.rows,
                embd_host.cols
            );
        }
        let embd = backend.upload_weight(&embd_host)?;
        let head = if cfg.tie_embeddings {
            ld.upload(&embd_host, 1.0)?
        } else {
            let w = ld.host("lm_head.weight", v, h)?.as_head(true);
            ld.upload(&w, 1.0)?
        };
        let has_mtp = ld.has_mtp(&cfg)?;
        let (layout, entries, mtp_entries) = build_layout(&cfg, has_mtp);
        let mut layers = Vec::with_capacity(cfg.mixers.len());
        for (i, state) in entries.into_iter().enumerate() {
            let p = format!("layers.{i}");
            let a = format!("{p}.self_attn");
            let mixer = match cfg.mixers[i] {
                Mixer::Kda => Block::Kda(ld.kda(&a, &cfg)?),
                Mixer::Mla => Block::Mla(ld.mla(&a, &cfg, cfg.indexers[i] == Indexer::Full)?),
            };
            let ffn = if cfg.dense[i] {
                Ffn::Dense(ld.mlp(&format!("{p}.mlp"), &cfg, cfg.n_ff)?)
            } else {
                Ffn::Moe(ld.moe(&format!("{p}.mlp"), i, &cfg)?)
            };
            layers.push(Layer {
                attn_hc: ld.hc(&format!("{p}.hc_attn"), &cfg)?,
                ffn_hc: ld.hc(&format!("{p}.hc_ffn"), &cfg)?,
                attn_norm: ld.vector(&format!("{p}.input_layernorm.weight"), h)?,
                ffn_norm: ld.vector(&format!("{p}.post_attention_layernorm.weight"), h)?,
                mixer,
                ffn,
                state,
            });
        }
        let norm = ld.vector("norm.weight", h)?;
        let ones = backend.upload_vector(&vec![1.0; cfg.hc * h])?;
        // The block's bytes are not read per target token.
        let weight_bytes_per_token = ld.bytes;
        let mtp = match mtp_entries {
            Some(e) => Some(ld.mtp(&cfg, e, source)?),
            None => None,
        };
        Ok(Glm5Model {
            backend,
            cfg,
            embd,
            head,
            norm,
            layers,
            ones,
            layout,
            weight_bytes_per_token,
            mtp,
            mtp_on: Default::default(),
        })
    }
}
