//! `vela synth` for the `qwen4_exp` geometries (`super::synth`): the GGUF llama.cpp 0c1e570's
//! converter (`convert_hf_to_gguf.py`, `conversion/qwen4exp.py`) would write from the HF checkpoint
//! [`Qwen4ExpModel::synth`](super::Qwen4ExpModel::synth) generates in memory, followed by
//! `llama-quantize` for a quantized type, so llama.cpp and vela can run the same file.
//!
//! **Values.** Every GGUF tensor is made of the element values the in-memory source generates for
//! the HF tensors it comes from, with the converter's transformations applied (docs/qwen4exp-spec.md
//! §10): value heads reordered from grouped to tiled order (V rows of `attn_qkv`, rows of
//! `attn_gate`/`ssm_alpha`/`ssm_beta`, `ssm_a`, `ssm_dt.bias`, V channels of `ssm_conv1d`,
//! columns of `ssm_out`), `ssm_a = −exp(A_log)`, +1 on the (1+w) norms, conv kernels squeezed to
//! `[C, K]`, the indexer projection split into `indexer.{q,k}_proj`, the experts stacked, the
//! n-gram table concatenated into `per_layer_token_embd` (padded rows included) with the hash
//! constants as metadata arrays. `attn_q` stays HF's per-head [q | gate] interleave (llama.cpp
//! splits it with views). The MTP layer is not exported (`no_mtp`). With `f32`, vela's logits on
//! the file equal those of the in-memory model (`tests/qwen4exp_synth_gguf.rs`).
//!
//! **Types.** `f32`, `f16`, `bf16`: the converter with that `--outtype` (F32 for 1-D tensors,
//! norms, `ffn_gate_inp`, `ffn_gate_inp_shexp`, `ssm_conv1d`, `ssm_a`, `ssm_dt.bias`). Any other
//! type: the converter at `--outtype f32`, then `llama-quantize` with its default rules for that
//! file type: quantized are 2-D+ `*weight` tensors except norms, `ffn_gate_inp`, `ssm_conv1d` and
//! `indexer.{q,k}_proj`; `output` Q6_K (Q8_0 for a row not a multiple of 256 or a Q8_0 file);
//! `per_layer_token_embd` the file's type like `token_embd`; with exactly 8 experts (the tiny
//! geometries) `attn_k`, `attn_v` and `attn_qkv` Q8_0; the `_S`/`_M` k-quant layer rules; rows not
//! a multiple of the block fall back (Q4_K → Q5_0, …, else F16; `ple_conv1d` becomes F16). The
//! tensor order is the converter's (HF names sorted) for float files and llama-quantize's (by
//! layer, then name) for quantized ones.
//!
//! **Not the converter's.** The tokenizer: the one given (`SynthOptions::tokenizer`), else for
//! the real geometries llama.cpp's `ggml-vocab-qwen35.gguf` padded to 248,320 tokens (what
//! `--model synth:` tokenizes with) when `find_tokenizer` finds it, else a synthetic vocabulary
//! (`<t{i}>`, the fixtures' own, plus the one-entry merges list llama.cpp's BPE loader needs);
//! `general.name`. `attention.compress_ratios` is 0 on every layer, as the converter writes it
//! whenever transformers ≥ 5.23 is importable (llama.cpp then runs dense attention on the QSA
//! layers); `compress_ratios` writes the indexer's ratio instead (the converter without
//! transformers; llama.cpp then runs its own QSA selection).
//!
//! The real n-gram table (51B parameters, 204 GB as F32) cannot be written: a table above
//! [`MAX_TABLE_BYTES`] is refused (`qwen3.8-flash-next-12l-smallple` has a 0.5B-parameter one).

pub(crate) mod rules;

use super::synth::{config, plan, vector_len, vector_make, Make, Plan};
use super::{Mixer, Qwen4ExpConfig};
use crate::synth::{
    find_tokenizer, normal, tensor_key, tokenizer_metadata, Progress, QuantScheme, SynthOptions,
};
use anyhow::{anyhow, bail, Context, Result};
use rules::{converter_type, quantize_types, size_label, synthetic_tokenizer};
use serde_json::Value as Json;
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;
use vela_formats::gguf::{GgufFile, Value};
use vela_formats::gguf_write::{GgufWriter, TensorSpec};
use vela_formats::quant::GgmlType;

/// Tokens of llama.cpp's `ggml-vocab-qwen35.gguf` (the real geometries' default tokenizer).
const QWEN35_VOCAB: usize = 151_936;

/// The largest n-gram table (as written) this will write.
pub const MAX_TABLE_BYTES: u64 = 4 << 30;

/// Whether `name` is a `qwen4_exp` geometry (written by [`write`]).
pub fn is_geometry(name: &str) -> bool {
    super::synth::GEOMETRIES.contains(&name)
}

/// Row `r` of a GGUF tensor as f32, into `out` (one row, `dims[0]` values).
pub(crate) type Fill = Box<dyn Fn(u64, &mut [f32]) + Send + Sync>;

/// One GGUF tensor: its name and shape (GGML order), where the converter emits it (the sorted HF
/// name it is written at, then its index among that name's outputs), the in-memory source's
/// tensors it is made of, and its values.
struct Out {
    name: String,
    dims: Vec<u64>,
    order: (String, usize),
    hf: Vec<String>,
    fill: Fill,
}

/// The values of an HF tensor: element `j` is `mean + std·N(key, j)`, as `super::synth` makes it.
#[derive(Clone, Copy)]
struct Gen {
    key: u64,
    mean: f32,
    std: f32,
    cols: usize,
}

impl Gen {
    fn row(&self, r: u64, out: &mut [f32]) {
        let base = r * self.cols as u64;
        for (c, x) in out.iter_mut().enumerate() {
            *x = self.mean + self.std * normal(self.key, base + c as u64);
        }
    }
}

/// Grouped → tiled value heads of width `hd` (new head `u·Hk + g` is old head `g·r + u`): the
/// old index of new index `i`.
fn v_perm(c: &Qwen4ExpConfig, hd: usize) -> impl Fn(u64) -> u64 + Send + Sync + Copy {
    let (nk, r, hd) = (c.n_k as u64, (c.n_v / c.n_k) as u64, hd as u64);
    move |i| {
        let (head, w) = (i / hd, i % hd);
        ((head % nk) * r + head / nk) * hd + w
    }
}

struct Builder<'a> {
    c: &'a Qwen4ExpConfig,
    plan: &'a Plan,
    seed: u64,
    out: Vec<Out>,
}

impl Builder<'_> {
    /// The generator of HF matrix `hf` and its (rows, cols).
    fn matrix_gen(&self, hf: &str) -> Result<(Gen, usize, usize)> {
        match self.plan.shapes.get(hf) {
            Some(&(rows, cols, Make::Matrix { std })) => Ok((
                Gen {
                    key: tensor_key(self.seed, hf),
                    mean: 0.0,
                    std,
                    cols,
                },
                rows,
                cols,
            )),
            _ => bail!("{hf}: not a matrix of the geometry"),
        }
    }

    /// The values of HF vector `hf` (norm, gate parameter or conv kernel).
    fn vector(&self, hf: &str) -> Result<Vec<f32>> {
        let (Some(Make::Floats { mean, std }), Some(len)) =
            (vector_make(hf), vector_len(self.c, hf))
        else {
            bail!("{hf}: not a vector of the geometry")
        };
        let g = Gen {
            key: tensor_key(self.seed, hf),
            mean,
            std,
            cols: len,
        };
        let mut v = vec![0f32; len];
        g.row(0, &mut v);
        Ok(v)
    }

    fn push(&mut self, name: String, dims: &[usize], at: &str, sub: usize, fill: Fill) {
        // The converter walks the checkpoint's names sorted: `lm_head` before `model.*`.
        let key = if at == "lm_head.weight" {
            at.to_string()
        } else {
            format!("model.{at}")
        };
        self.out.push(Out {
            name,
            dims: dims.iter().map(|&d| d as u64).collect(),
            order: (key, sub),
            hf: vec![at.to_string()],
            fill,
        });
    }

    /// HF matrix `hf` as GGUF `name`, GGUF row `r` taken from HF row `rows(r)`.
    fn matrix_rows(
        &mut self,
        hf: &str,
        name: String,
        rows: impl Fn(u64) -> u64 + Send + Sync + 'static,
    ) -> Result<()> {
        let (g, nr, nc) = self.matrix_gen(hf)?;
        self.push(
            name,
            &[nc, nr],
            hf,
            0,
            Box::new(move |r, out| g.row(rows(r), out)),
        );
        Ok(())
    }

    fn matrix(&mut self, hf: &str, name: String) -> Result<()> {
        self.matrix_rows(hf, name, |r| r)
    }

    /// A vector as a 1-D tensor, transformed by `f`.
    fn vec1(&mut self, hf: &str, name: String, f: impl Fn(f32) -> f32) -> Result<()> {
        let v: Vec<f32> = self.vector(hf)?.into_iter().map(f).collect();
        let n = v.len();
        self.push(
            name,
            &[n],
            hf,
            0,
            Box::new(move |_, out| out.copy_from_slice(&v)),
        );
        Ok(())
    }

    /// A (1+w) norm: the converter writes 1 + w.
    fn norm(&mut self, hf: &str, name: String) -> Result<()> {
        self.vec1(hf, name, |w| 1.0 + w)
    }

    /// A depthwise conv kernel `[C, 1, K]` as `[K, C]` (rows = channels), channel `r` of the
    /// file from channel `chan(r)`.
    fn conv(&mut self, hf: &str, name: String, k: usize, chan: impl Fn(u64) -> u64) -> Result<()> {
        let v = self.vector(hf)?;
        let n = v.len() / k;
        let mut p = vec![0f32; v.len()];
        for (r, row) in p.chunks_mut(k).enumerate() {
            let o = chan(r as u64) as usize * k;
            row.copy_from_slice(&v[o..o + k]);
        }
        self.push(
            name,
            &[k, n],
            hf,
            0,
            Box::new(move |r, out| {
                let o = r as usize * k;
                out.copy_from_slice(&p[o..o + k]);
            }),
        );
        Ok(())
    }

    /// A hyper-connection module (`hc` = `attn_hyper_connection`, … → `g` = `hc_attn`, …).
    fn hc(&mut self, hf: &str, g: &str, inject: bool) -> Result<()> {
        if inject {
            self.matrix(
                &format!("{hf}.block_inject_weight.weight"),
                format!("{g}_inject.weight"),
            )?;
        }
        self.norm(&format!("{hf}.hc_norm.weight"), format!("{g}_norm.weight"))?;
        self.matrix(
            &format!("{hf}.input_mix_weight_down.weight"),
            format!("{g}_down.weight"),
        )?;
        self.matrix(
            &format!("{hf}.input_mix_weight_up.weight"),
            format!("{g}_up.weight"),
        )
    }

    fn gdn(&mut self, p: &str, b: &str) -> Result<()> {
        let c = self.c;
        let a = format!("{p}.linear_attn");
        let heads = v_perm(c, 1);
        let reorder = |v: Vec<f32>| -> Vec<f32> {
            (0..v.len() as u64).map(|i| v[heads(i) as usize]).collect()
        };
        let a_log = reorder(self.vector(&format!("{a}.A_log"))?);
        let neg_a: Vec<f32> = a_log.iter().map(|x| -x.exp()).collect();
        let n_v = c.n_v;
        let at = format!("{a}.A_log");
        self.push(
            format!("{b}.ssm_a"),
            &[n_v],
            &at,
            0,
            Box::new(move |_, out| out.copy_from_slice(&neg_a)),
        );
        let qk = (2 * c.n_k * c.dk) as u64;
        let vp = v_perm(c, c.dv);
        let chan = move |r: u64| if r < qk { r } else { qk + vp(r - qk) };
        self.conv(
            &format!("{a}.conv1d.weight"),
            format!("{b}.ssm_conv1d.weight"),
            c.conv_k,
            chan,
        )?;
        let dt = reorder(self.vector(&format!("{a}.dt_bias"))?);
        let at = format!("{a}.dt_bias");
        self.push(
            format!("{b}.ssm_dt.bias"),
            &[n_v],
            &at,
            0,
            Box::new(move |_, out| out.copy_from_slice(&dt)),
        );
        self.matrix_rows(
            &format!("{a}.in_proj_a.weight"),
            format!("{b}.ssm_alpha.weight"),
            heads,
        )?;
        self.matrix_rows(
            &format!("{a}.in_proj_b.weight"),
            format!("{b}.ssm_beta.weight"),
            heads,
        )?;
        self.matrix_rows(
            &format!("{a}.in_proj_qkv.weight"),
            format!("{b}.attn_qkv.weight"),
            chan,
        )?;
        self.matrix_rows(
            &format!("{a}.in_proj_z.weight"),
            format!("{b}.attn_gate.weight"),
            vp,
        )?;
        self.vec1(
            &format!("{a}.norm.weight"),
            format!("{b}.ssm_norm.weight"),
            |w| w,
        )?;
        // out_proj: the value heads are its columns.
        let hf = format!("{a}.out_proj.weight");
        let (g, nr, nc) = self.matrix_gen(&hf)?;
        self.push(
            format!("{b}.ssm_out.weight"),
            &[nc, nr],
            &hf,
            0,
            Box::new(move |r, out| {
                let mut row = vec![0f32; out.len()];
                g.row(r, &mut row);
                for (i, x) in out.iter_mut().enumerate() {
                    *x = row[vp(i as u64) as usize];
                }
            }),
        );
        Ok(())
    }

    fn qsa(&mut self, p: &str, b: &str) -> Result<()> {
        let c = self.c;
        let a = format!("{p}.self_attn");
        let hf = format!("{a}.indexer.index_qk_proj.weight");
        let (g, _, nc) = self.matrix_gen(&hf)?;
        let nq = (c.idx_heads * c.idx_dim) as u64;
        self.push(
            format!("{b}.indexer.q_proj.weight"),
            &[nc, nq as usize],
            &hf,
            0,
            Box::new(move |r, out| g.row(r, out)),
        );
        self.push(
            format!("{b}.indexer.k_proj.weight"),
            &[nc, c.idx_dim],
            &hf,
            1,
            Box::new(move |r, out| g.row(nq + r, out)),
        );
        self.norm(
            &format!("{a}.indexer.k_layernorm.weight"),
            format!("{b}.indexer.k_norm.weight"),
        )?;
        self.norm(
            &format!("{a}.indexer.q_layernorm.weight"),
            format!("{b}.indexer.q_norm.weight"),
        )?;
        self.norm(
            &format!("{a}.k_norm.weight"),
            format!("{b}.attn_k_norm.weight"),
        )?;
        self.matrix(&format!("{a}.k_proj.weight"), format!("{b}.attn_k.weight"))?;
        self.matrix(
            &format!("{a}.o_proj.weight"),
            format!("{b}.attn_output.weight"),
        )?;
        self.norm(
            &format!("{a}.q_norm.weight"),
            format!("{b}.attn_q_norm.weight"),
        )?;
        self.matrix(&format!("{a}.q_proj.weight"), format!("{b}.attn_q.weight"))?;
        self.matrix(&format!("{a}.v_proj.weight"), format!("{b}.attn_v.weight"))
    }

    fn moe(&mut self, p: &str, b: &str) -> Result<()> {
        let c = self.c;
        let e = format!("{p}.mlp");
        for (sub, w) in ["down", "gate", "up"].into_iter().enumerate() {
            let names: Vec<String> = (0..c.n_expert)
                .map(|x| format!("{e}.experts.{x}.{w}_proj.weight"))
                .collect();
            let gens = names
                .iter()
                .map(|n| Ok(self.matrix_gen(n)?.0))
                .collect::<Result<Vec<Gen>>>()?;
            let (rows, cols) = if w == "down" {
                (c.hidden, c.n_ff_exp)
            } else {
                (c.n_ff_exp, c.hidden)
            };
            let per = rows as u64;
            self.push(
                format!("{b}.ffn_{w}_exps.weight"),
                &[cols, rows, c.n_expert],
                &format!("{e}.experts"),
                sub,
                Box::new(move |r, out| gens[(r / per) as usize].row(r % per, out)),
            );
            if let Some(o) = self.out.last_mut() {
                o.hf = names;
            }
        }
        self.matrix(
            &format!("{e}.gate.weight"),
            format!("{b}.ffn_gate_inp.weight"),
        )?;
        for w in ["down", "gate", "up"] {
            self.matrix(
                &format!("{e}.shared_expert.{w}_proj.weight"),
                format!("{b}.ffn_{w}_shexp.weight"),
            )?;
        }
        self.matrix(
            &format!("{e}.shared_expert_gate.weight"),
            format!("{b}.ffn_gate_inp_shexp.weight"),
        )
    }

    /// The PLE module of layer `p` (its hash constants go to the metadata).
    fn ple(&mut self, p: &str, b: &str, rows: usize) -> Result<()> {
        let c = self.c;
        let pc = c.ple.as_ref().ok_or_else(|| anyhow!("no PLE config"))?;
        let e = format!("{p}.ple");
        self.conv(
            &format!("{e}.conv1d.weight"),
            format!("{b}.ple_conv1d.weight"),
            pc.conv_k,
            |r| r,
        )?;
        self.matrix(
            &format!("{e}.key_proj.weight"),
            format!("{b}.ple_key.weight"),
        )?;
        for n in ["conv", "key", "query"] {
            self.norm(
                &format!("{e}.norm_{n}.weight"),
                format!("{b}.ple_norm_{n}.weight"),
            )?;
        }
        // The table as `NgramTable::synthetic` generates it: N(0, 1) rows of `w` values.
        let t = format!("{e}.ple_embedding.ngram_embedding");
        let key = tensor_key(self.seed, &t);
        let w = pc.dim / pc.n_heads();
        self.push(
            "per_layer_token_embd.weight".into(),
            &[w, rows],
            &t,
            0,
            Box::new(move |r, out| {
                for (j, x) in out.iter_mut().enumerate() {
                    *x = normal(key, r * w as u64 + j as u64);
                }
            }),
        );
        self.matrix(
            &format!("{e}.value_proj.weight"),
            format!("{b}.ple_value.weight"),
        )
    }
}

/// A planned file: the writer (metadata and tensor directory), each tensor's values, and the
/// type of every in-memory source tensor in the file.
struct Planned {
    w: GgufWriter,
    fills: Vec<Fill>,
    hf_types: HashMap<String, GgmlType>,
}

fn prepare(
    geometry: &str,
    scheme: QuantScheme,
    seed: u64,
    opts: &SynthOptions,
    compress_ratios: bool,
) -> Result<Planned> {
    let j = config(geometry)?;
    let c = Qwen4ExpConfig::from_json(&j)?;
    let pl = plan(&c, &j)?;
    let u = |k: &str| -> Result<u64> {
        j.get(k)
            .and_then(Json::as_u64)
            .ok_or_else(|| anyhow!("config: {k}"))
    };
    if c.dk != c.dv {
        bail!("llama.cpp's qwen4exp needs linear_key_head_dim == linear_value_head_dim");
    }
    let mut b = Builder {
        c: &c,
        plan: &pl,
        seed,
        out: Vec::new(),
    };
    if !c.tie_embeddings {
        b.matrix("lm_head.weight", "output.weight".into())?;
    }
    let (g, nr, nc) = b.matrix_gen("embed_tokens.weight")?;
    b.push(
        "token_embd.weight".into(),
        &[nc, nr],
        "embed_tokens.weight",
        0,
        Box::new(move |r, out| g.row(r, out)),
    );
    b.hc("hyper_connection_mixer", "output_hc", false)?;
    // The PLE layer's hash constants and table rows (the heads' total, padded as HF pads it).
    let mut ple_meta = None;
    for (i, m) in c.mixers.iter().enumerate() {
        let (p, bl) = (format!("layers.{i}"), format!("blk.{i}"));
        b.hc(
            &format!("{p}.attn_hyper_connection"),
            &format!("{bl}.hc_attn"),
            true,
        )?;
        match m {
            Mixer::Gdn => b.gdn(&p, &bl)?,
            Mixer::Qsa => b.qsa(&p, &bl)?,
        }
        b.moe(&p, &bl)?;
        b.hc(
            &format!("{p}.mlp_hyper_connection"),
            &format!("{bl}.hc_ffn"),
            true,
        )?;
        if c.ple.as_ref().is_some_and(|pc| pc.layers.contains(&i)) {
            if ple_meta.is_some() {
                bail!("llama.cpp's qwen4exp supports one PLE layer");
            }
            let e = format!("{p}.ple.ple_embedding");
            let ints = |k: &str| {
                pl.ints
                    .get(&format!("{e}.{k}"))
                    .cloned()
                    .ok_or_else(|| anyhow!("{e}.{k}"))
            };
            let (mult, sizes, offsets) = (
                ints("layer_multipliers")?,
                ints("ngram_heads_vocab_sizes")?,
                ints("ngram_heads_offsets")?,
            );
            let div = u("make_ngram_vocab_size_divisible_by")?.max(1);
            let rows = sizes.iter().sum::<u64>().div_ceil(div) * div;
            b.ple(&p, &bl, rows as usize)?;
            ple_meta = Some((i, mult, sizes, offsets));
        }
    }
    let mut out = b.out;
    let label = size_label(out.iter().map(|o| (o.name.as_str(), o.dims.as_slice())));

    // Order and types: the converter's, then llama-quantize's for a quantized type.
    out.sort_by(|a, b| a.order.cmp(&b.order));
    let float = matches!(
        scheme,
        QuantScheme::Mostly(GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
    );
    let types: Vec<GgmlType> = if float {
        out.iter()
            .map(|o| converter_type(&o.name, &o.dims, scheme.base()))
            .collect()
    } else {
        let layer = |n: &str| -> i64 {
            n.strip_prefix("blk.")
                .and_then(|s| s.split('.').next())
                .and_then(|s| s.parse().ok())
                .unwrap_or(-1)
        };
        out.sort_by(|a, b| (layer(&a.name), &a.name).cmp(&(layer(&b.name), &b.name)));
        let list: Vec<(&str, &[u64])> = out
            .iter()
            .map(|o| (o.name.as_str(), o.dims.as_slice()))
            .collect();
        quantize_types(&list, scheme, c.mixers.len(), c.n_expert)
    };
    if let Some(k) = out
        .iter()
        .position(|o| o.name == "per_layer_token_embd.weight")
    {
        let t = types[k];
        let o = &out[k];
        let bytes = t
            .row_bytes(o.dims[0])
            .map_or(u64::MAX, |r| r.saturating_mul(o.dims[1]));
        if bytes > MAX_TABLE_BYTES {
            bail!(
                "{geometry}: its n-gram table is {:.1} GB as {t} ({} rows × {}), above the {} GB \
                 a synthetic GGUF may hold; use a variant with a small table (e.g. \
                 qwen3.8-flash-next-12l-smallple), or the in-memory model (--model synth:{geometry})",
                bytes as f64 / 1e9,
                o.dims[1],
                o.dims[0],
                MAX_TABLE_BYTES >> 30
            );
        }
    }

    // Metadata in the converter's order.
    let mut w = GgufWriter::new();
    let mut kv = |k: &str, v: Value| -> Result<()> {
        let key = if k.starts_with("general.") {
            k.to_string()
        } else {
            format!("qwen4exp.{k}")
        };
        w.add_kv(key, v)
    };
    let u32v = |x: usize| Value::U32(x as u32);
    let i32s = |v: &[u64]| Value::Array(v.iter().map(|&x| Value::I32(x as i32)).collect());
    let u64s = |v: &[u64]| Value::Array(v.iter().map(|&x| Value::U64(x)).collect());
    // The converter's EOS: the last of a list (HF uses the first).
    let eos = match &j["eos_token_id"] {
        Json::Array(a) => a.last().and_then(Json::as_u64),
        v => v.as_u64(),
    }
    .ok_or_else(|| anyhow!("config: eos_token_id"))? as u32;
    let rope = &j["rope_parameters"];
    let mut sections: Vec<u64> = rope["mrope_section"]
        .as_array()
        .map(|a| a.iter().filter_map(Json::as_u64).collect())
        .unwrap_or_else(|| vec![11, 11, 10]);
    sections.resize(4, 0);
    kv("general.architecture", Value::String("qwen4exp".into()))?;
    kv("general.type", Value::String("model".into()))?;
    kv(
        "general.name",
        Value::String(format!("vela synth {geometry} seed {seed}")),
    )?;
    kv("general.size_label", Value::String(label))?;
    kv("block_count", u32v(c.mixers.len()))?;
    kv(
        "context_length",
        Value::U32(u("max_position_embeddings")? as u32),
    )?;
    kv("embedding_length", u32v(c.hidden))?;
    kv("attention.head_count", u32v(c.n_head))?;
    kv("attention.head_count_kv", u32v(c.n_head_kv))?;
    kv("rope.dimension_sections", i32s(&sections))?;
    kv("rope.freq_base", Value::F32(c.rope_theta))?;
    kv("attention.layer_norm_rms_epsilon", Value::F32(c.eps))?;
    kv("expert_count", u32v(c.n_expert))?;
    kv("expert_used_count", u32v(c.top_k))?;
    kv("attention.key_length", u32v(c.head_dim))?;
    kv("attention.value_length", u32v(c.head_dim))?;
    // llama-quantize sets these two anew: they move behind the tokenizer.
    let file_type = Value::U32(scheme.file_type()?);
    if float {
        kv("general.file_type", file_type.clone())?;
    }
    kv("expert_feed_forward_length", u32v(c.n_ff_exp))?;
    kv("expert_shared_feed_forward_length", u32v(c.n_ff_shared))?;
    kv("ssm.conv_kernel", u32v(c.conv_k))?;
    kv("ssm.state_size", u32v(c.dk))?;
    kv("ssm.group_count", u32v(c.n_k))?;
    kv("ssm.time_step_rank", u32v(c.n_v))?;
    kv("ssm.inner_size", u32v(c.n_v * c.dv))?;
    let recurrent = c.mixers.iter().map(|m| Value::Bool(*m == Mixer::Gdn));
    kv(
        "attention.recurrent_layers",
        Value::Array(recurrent.collect()),
    )?;
    kv("full_attention_interval", Value::U32(4))?;
    kv("rope.dimension_count", u32v(c.n_rot))?;
    kv("hyper_connection.count", u32v(c.streams))?;
    kv("hyper_connection.low_rank", u32v(c.lowrank))?;
    kv("attention.indexer.head_count", u32v(c.idx_heads))?;
    kv("attention.indexer.key_length", u32v(c.idx_dim))?;
    kv("attention.indexer.top_k", u32v(c.idx_blocks * c.idx_block))?;
    let ratios: Vec<u64> = c
        .mixers
        .iter()
        .map(|m| match m {
            Mixer::Qsa if compress_ratios => c.idx_block as u64,
            _ => 0,
        })
        .collect();
    kv("attention.compress_ratios", i32s(&ratios))?;
    if let (Some((layer, mult, sizes, offsets)), Some(pc)) = (&ple_meta, &c.ple) {
        kv("ple.layers", i32s(&[*layer as u64]))?;
        kv("ple.ngram_size", u32v(pc.ngram))?;
        kv("ple.heads_per_ngram", u32v(pc.heads_per_ngram))?;
        kv("ple.conv_kernel", u32v(pc.conv_k))?;
        kv("ple.eos_token_id", Value::U32(eos))?;
        kv(
            "embedding_length_per_layer_input",
            u32v(pc.dim / pc.n_heads()),
        )?;
        kv("ple.layer_multipliers", u64s(mult))?;
        kv("ple.head_offsets", u64s(offsets))?;
        kv("ple.head_vocab_sizes", u64s(sizes))?;
    }
    if float {
        kv("general.quantization_version", Value::U32(2))?;
    }
    // The tokenizer: the one given; for the real vocabulary size the one `--model synth:` uses
    // (llama.cpp's ggml-vocab-qwen35.gguf, padded), when it is found; else the synthetic one.
    let src = match &opts.tokenizer {
        Some(p) => Some(p.clone()),
        None if c.n_vocab >= QWEN35_VOCAB => find_tokenizer("ggml-vocab-qwen35.gguf").ok(),
        None => None,
    };
    let tok = match src {
        Some(p) => {
            let g = GgufFile::open(&p)
                .with_context(|| format!("reading the tokenizer of {}", p.display()))?;
            tokenizer_metadata(&g, c.n_vocab)?
        }
        None => synthetic_tokenizer(c.n_vocab, eos),
    };
    for (k, v) in tok {
        w.add_kv(k, v)?;
    }
    if !float {
        w.add_kv("general.quantization_version", Value::U32(2))?;
        w.add_kv("general.file_type", file_type)?;
    }
    let mut fills = Vec::with_capacity(out.len());
    let mut hf_types = HashMap::new();
    for (o, t) in out.into_iter().zip(types) {
        for n in o.hf {
            hf_types.insert(n, t);
        }
        // llama-quantize writes ggml_n_dims dimensions (trailing 1s dropped).
        let mut dims = o.dims;
        while !float && dims.len() > 1 && dims.last() == Some(&1) {
            dims.pop();
        }
        w.add_tensor(o.name, &dims, t)?;
        fills.push(o.fill);
    }
    Ok(Planned { w, fills, hf_types })
}

/// The type every tensor of the in-memory source (`Qwen4ExpModel::synth`'s names) has in the file
/// [`write`] writes: `Qwen4ExpModel::synth_typed` with these loads the file's types and values
/// (up to blocks that the value-head reordering regroups: `ssm_out`'s columns when
/// `linear_value_head_dim` is not a multiple of the block).
pub fn hf_types(geometry: &str, scheme: QuantScheme) -> Result<HashMap<String, GgmlType>> {
    Ok(prepare(geometry, scheme, 0, &SynthOptions::default(), false)?.hf_types)
}

/// The size of the file [`write`] would write (nothing is generated).
pub fn file_size(
    geometry: &str,
    scheme: QuantScheme,
    seed: u64,
    opts: &SynthOptions,
    compress_ratios: bool,
) -> Result<u64> {
    Ok(prepare(geometry, scheme, seed, opts, compress_ratios)?
        .w
        .file_size())
}

/// Write the GGUF of `qwen4_exp` geometry `geometry` (see the module docs), deterministic from
/// `seed` (the same seed as `Qwen4ExpModel::synth`'s gives the same values).
pub fn write(
    geometry: &str,
    scheme: QuantScheme,
    seed: u64,
    out: &Path,
    opts: &SynthOptions,
    compress_ratios: bool,
    progress: Progress,
) -> Result<()> {
    let p = prepare(geometry, scheme, seed, opts, compress_ratios)?;
    let threads = opts
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        .max(1);
    let total = p.w.file_size();
    let mut done = p.w.header_bytes().len() as u64;
    progress(done, total);
    p.w.write_file(out, |i, spec, sink| {
        write_tensor(spec, &p.fills[i], threads, sink, &mut |n| {
            done += n;
            progress(done, total);
        })
    })?;
    progress(total, total);
    Ok(())
}

/// Rows `r0..r0 + n` of a tensor into `data`, `threads` row ranges at a time.
fn generate_rows(
    spec: &TensorSpec,
    fill: &Fill,
    threads: usize,
    r0: usize,
    n: usize,
    data: &mut [u8],
) -> Result<()> {
    let ne0 = spec.ne0();
    let threads = if n * ne0 < 1 << 16 { 1 } else { threads };
    crate::synth::quantize_rows(spec.ty, ne0, r0 as u64, threads, data, &|r, v| fill(r, v))
}

/// Generate, convert and stream one tensor in chunks of rows; the next chunk is generated while
/// one is written.
pub(crate) fn write_tensor(
    spec: &TensorSpec,
    fill: &Fill,
    threads: usize,
    sink: &mut dyn Write,
    advanced: &mut dyn FnMut(u64),
) -> Result<()> {
    let ne0 = spec.ne0();
    let rows = spec.n_rows();
    let rb = spec
        .ty
        .row_bytes(ne0 as u64)
        .ok_or_else(|| anyhow!("{}: rows of {ne0}", spec.name))? as usize;
    let chunk = ((1 << 22) / ne0).clamp(1, rows);
    let (mut cur, mut next) = (vec![0u8; chunk * rb], vec![0u8; chunk * rb]);
    let (mut r0, mut nr) = (0, chunk);
    generate_rows(spec, fill, threads, 0, nr, &mut cur[..nr * rb])?;
    loop {
        let r1 = r0 + nr;
        let n1 = chunk.min(rows - r1);
        let data = &cur[..nr * rb];
        let ahead = &mut next[..n1 * rb];
        std::thread::scope(|s| -> Result<()> {
            let h = (n1 > 0).then(|| s.spawn(|| generate_rows(spec, fill, threads, r1, n1, ahead)));
            let w = sink.write_all(data);
            if let Some(h) = h {
                h.join().map_err(|_| anyhow!("a synth thread panicked"))??;
            }
            Ok(w?)
        })?;
        advanced(data.len() as u64);
        if n1 == 0 {
            return Ok(());
        }
        std::mem::swap(&mut cur, &mut next);
        (r0, nr) = (r1, n1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_heads_go_tiled() {
        let j = config("qwen4exp-tiny").unwrap();
        let c = Qwen4ExpConfig::from_json(&j).unwrap();
        // 2 key heads, 3 value heads each: grouped [g0u0 g0u1 g0u2 g1u0 g1u1 g1u2] → tiled
        // [g0u0 g1u0 g0u1 g1u1 g0u2 g1u2].
        let p = v_perm(&c, 1);
        let got: Vec<u64> = (0..6).map(p).collect();
        assert_eq!(got, [0, 3, 1, 4, 2, 5]);
        let p = v_perm(&c, 16);
        assert_eq!(p(16), 3 * 16);
        assert_eq!(p(16 + 5), 3 * 16 + 5);
    }
}
