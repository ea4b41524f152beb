//! `vela synth` for the `glm5_next` geometries (`super::synth`): the GGUF llama.cpp 0c1e570's
//! converter (`conversion/glm.py` `Glm5NextModel`, the MTP block included as block `n` with its
//! `nextn.*` tensors, `nextn_predict_layers`) would write from the
//! checkpoint [`Glm5Model::synth`](super::Glm5Model::synth) generates, followed by
//! `llama-quantize` for a quantized type; the inverse of `super::gguf`.
//!
//! **Values.** Every GGUF tensor is made of the element values the in-memory source generates
//! for the checkpoint tensors it comes from, with the converter's rewrites (docs/glm5-spec.md
//! §10): `kv_b_proj` split per head into `attn_k_b` = W^k_hᵀ `{dn, r, nh}` and `attn_v_b` = W^v_h
//! `{r, dv, nh}`, `ssm_a = −exp(A_log)`, the conv kernels as `{Kc, 1, nk·dk, 1}`, the routed
//! experts stacked (`ffn_{gate,up,down}_exps`), `dt_bias` as `ssm_dt.bias`; the MTP block's
//! `eh_proj`, `enorm`, `hnorm`, `shared_head.norm` as `blk.n.nextn.{eh_proj, enorm, hnorm,
//! shared_head_norm}`, its MLA layer and MoE under the trunk's names.
//!
//! **Types.** `f32`, `f16`, `bf16`: the converter at that `--outtype`: F32 for 1-D tensors, norms,
//! names not ending in `.weight`, `ffn_gate_inp`, `ssm_conv1d_*`, `indexer.proj` and what
//! `Glm5NextModel.tensor_force_quant` keeps exact (`hc_*`, `indexer_compressor_*`, `ssm_a`,
//! `ssm_dt`, `exp_probs_b`). Another type: the converter at `f32`, then `llama-quantize` with its
//! rules for `glm5-next` (`llama-quant.cpp`): the indexer, `ssm_{f,g}_{a,b}`, `ssm_beta`,
//! `attn_kv_a_mqa`, `attn_k_b`, `attn_v_b` and the mHC tensors stay F32; `attn_q_a` / `attn_q_b`
//! and `nextn.eh_proj` Q8_0; `output` Q6_K (Q8_0 for a Q8_0 file or rows not a multiple of 256); the `_S`/`_M` layer
//! rules; rows not a multiple of the block fall back. Tensor order: the converter's (checkpoint
//! names sorted) for float files, llama-quantize's (by layer, then name) for the others.
//!
//! **Not the converter's.** The tokenizer ([`tokenizer_metadata`]: GLM's own is not among
//! llama.cpp's vocabulary files): for the real geometries a GLM stand-in (`super::vocab`:
//! llama.cpp's `ggml-vocab-qwen35.gguf` BPE ranks, GLM's 36 added tokens at 154,820.., GLM's
//! special tokens, pre-tokenizer `glm4`, the GLM-4.7-Flash chat template) padded to 154,880 with
//! `[PAD<i>]`, when found; else, and for `glm5-tiny`, the fixtures' synthetic vocabulary (`<t{i}>`,
//! pre-tokenizer `glm4`, BOS 0, EOS 1); `general.name`.

use super::synth::{config, plan, Tensor};
use super::vocab;
use super::{Glm5Config, Indexer, Mixer};
use crate::qwen4exp::synth_gguf::rules::{quantize_types_with, size_label};
use crate::qwen4exp::synth_gguf::{write_tensor, Fill};
use crate::synth::{
    find_tokenizer, normal, tensor_key, tokenizer_metadata as padded, Progress, QuantScheme,
    SynthOptions,
};
use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value as Json;
use std::collections::HashMap;
use std::path::Path;
use vela_formats::gguf::{GgufFile, Value};
use vela_formats::gguf_write::GgufWriter;
use vela_formats::quant::GgmlType;

const ARCH: &str = "glm5-next";

/// Tokens of llama.cpp's `ggml-vocab-qwen35.gguf` (the real geometries' tokenizer).
const QWEN35_VOCAB: usize = 151_936;

/// Whether `name` is a `glm5_next` geometry (written by [`write`]).
pub fn is_geometry(name: &str) -> bool {
    super::synth::is_geometry(name)
}

/// One GGUF tensor: name, shape (GGML order), where the converter emits it (the sorted
/// checkpoint name, then its index among that name's outputs), its checkpoint tensors, values.
struct Out {
    name: String,
    dims: Vec<u64>,
    order: (String, usize),
    hf: Vec<String>,
    fill: Fill,
}

/// The values of a checkpoint tensor, as `super::synth` makes them.
#[derive(Clone, Copy)]
struct Gen {
    key: u64,
    mean: f32,
    std: f32,
    cols: usize,
}

impl Gen {
    fn at(&self, j: u64) -> f32 {
        self.mean + self.std * normal(self.key, j)
    }
    fn row(&self, r: u64, out: &mut [f32]) {
        let base = r * self.cols as u64;
        for (c, x) in out.iter_mut().enumerate() {
            *x = self.at(base + c as u64);
        }
    }
}

struct Builder<'a> {
    c: &'a Glm5Config,
    plan: &'a HashMap<String, Tensor>,
    seed: u64,
    out: Vec<Out>,
}

impl Builder<'_> {
    fn gen(&self, hf: &str) -> Result<(Gen, usize, usize)> {
        let t = self
            .plan
            .get(hf)
            .ok_or_else(|| anyhow!("{hf}: not a tensor of the geometry"))?;
        let (mean, std) = t.moments();
        let g = Gen {
            key: tensor_key(self.seed, hf),
            mean,
            std,
            cols: t.cols,
        };
        Ok((g, t.rows, t.cols))
    }

    fn push(&mut self, name: String, dims: &[usize], at: &str, sub: usize, fill: Fill) {
        self.push_many(name, dims, at, sub, vec![at.to_string()], fill)
    }

    fn push_many(
        &mut self,
        name: String,
        dims: &[usize],
        at: &str,
        sub: usize,
        hf: Vec<String>,
        fill: Fill,
    ) {
        // The converter walks the checkpoint's names sorted: `lm_head` before `model.*`.
        let key = match at {
            "lm_head.weight" => at.to_string(),
            _ => format!("model.language_model.{at}"),
        };
        self.out.push(Out {
            name,
            dims: dims.iter().map(|&d| d as u64).collect(),
            order: (key, sub),
            hf,
            fill,
        });
    }

    /// A checkpoint tensor as GGUF `name` with the converter's shape for its rank: a matrix
    /// `{cols, rows}`, a vector `{len}` (`rows == 1`), transformed elementwise by `f`.
    fn tensor(&mut self, hf: &str, name: String, f: fn(f32) -> f32) -> Result<()> {
        let (g, rows, cols) = self.gen(hf)?;
        let dims = if rows == 1 {
            vec![cols]
        } else {
            vec![cols, rows]
        };
        let fill: Fill = Box::new(move |r, out| {
            g.row(r, out);
            out.iter_mut().for_each(|x| *x = f(*x));
        });
        self.push(name, &dims, hf, 0, fill);
        Ok(())
    }

    fn plain(&mut self, hf: &str, name: String) -> Result<()> {
        self.tensor(hf, name, |x| x)
    }

    /// A depthwise kernel `[C, 1, K]` as `{K, 1, C, 1}` (the converter's reshape).
    fn conv(&mut self, hf: &str, name: String) -> Result<()> {
        let (g, rows, cols) = self.gen(hf)?;
        let fill: Fill = Box::new(move |r, out| g.row(r, out));
        self.push(name, &[cols, 1, rows, 1], hf, 0, fill);
        Ok(())
    }

    fn hc(&mut self, l: &str, b: &str, which: &str) -> Result<()> {
        let p = format!("{l}.hc_{which}");
        let g = format!("{b}.hc_{which}");
        for part in ["base", "fn", "scale"] {
            self.plain(&format!("{p}_{part}"), format!("{g}_{part}.weight"))?;
        }
        Ok(())
    }

    fn kda(&mut self, a: &str, b: &str) -> Result<()> {
        self.tensor(&format!("{a}.A_log"), format!("{b}.ssm_a"), |x| -x.exp())?;
        self.plain(&format!("{a}.dt_bias"), format!("{b}.ssm_dt.bias"))?;
        for (hf, g) in [
            ("b_proj", "ssm_beta"),
            ("f_a_proj", "ssm_f_a"),
            ("f_b_proj", "ssm_f_b"),
            ("g_a_proj", "ssm_g_a"),
            ("g_b_proj", "ssm_g_b"),
            ("q_proj", "attn_q"),
            ("k_proj", "attn_k"),
            ("v_proj", "attn_v"),
            ("o_norm", "ssm_norm"),
            ("o_proj", "attn_output"),
        ] {
            self.plain(&format!("{a}.{hf}.weight"), format!("{b}.{g}.weight"))?;
        }
        for x in ["q", "k", "v"] {
            self.conv(
                &format!("{a}.{x}_conv1d.weight"),
                format!("{b}.ssm_conv1d_{x}.weight"),
            )?;
        }
        Ok(())
    }

    fn mla(&mut self, a: &str, b: &str, full: bool) -> Result<()> {
        let c = self.c;
        for (hf, g) in [
            ("q_a_proj", "attn_q_a"),
            ("q_a_layernorm", "attn_q_a_norm"),
            ("q_b_proj", "attn_q_b"),
            ("kv_a_proj_with_mqa", "attn_kv_a_mqa"),
            ("kv_a_layernorm", "attn_kv_a_norm"),
            ("o_proj", "attn_output"),
        ] {
            self.plain(&format!("{a}.{hf}.weight"), format!("{b}.{g}.weight"))?;
        }
        // kv_b_proj [nh·(dn+dv), r], per head W^k_h (dn rows) then W^v_h (dv rows).
        let hf = format!("{a}.kv_b_proj.weight");
        let (g, _, _) = self.gen(&hf)?;
        let (nh, dn, dv, r) = (c.n_head, c.nope_dim, c.v_dim, c.kv_rank);
        let per = (dn + dv) as u64;
        // attn_k_b row h·r + j, element i: W^k_h[i, j].
        let k: Fill = Box::new(move |row, out| {
            let (h, j) = (row / r as u64, row % r as u64);
            for (i, x) in out.iter_mut().enumerate() {
                *x = g.at((h * per + i as u64) * r as u64 + j);
            }
        });
        self.push(format!("{b}.attn_k_b.weight"), &[dn, r, nh], &hf, 0, k);
        // attn_v_b row h·dv + d: row dn + d of head h.
        let v: Fill = Box::new(move |row, out| {
            let (h, d) = (row / dv as u64, row % dv as u64);
            g.row(h * per + dn as u64 + d, out)
        });
        self.push(format!("{b}.attn_v_b.weight"), &[r, dv, nh], &hf, 1, v);
        if full {
            let x = format!("{a}.indexer");
            for (hf, g) in [
                ("wq_b.weight", "indexer.attn_q_b.weight"),
                ("wk.weight", "indexer.attn_k.weight"),
                ("k_norm.weight", "indexer.k_norm.weight"),
                ("k_norm.bias", "indexer.k_norm.bias"),
                ("weights_proj.weight", "indexer.proj.weight"),
                ("index_kpool_compress_ape", "indexer_compressor_ape.weight"),
                (
                    "index_kpool_compress_gate",
                    "indexer_compressor_gate.weight",
                ),
            ] {
                self.plain(&format!("{x}.{hf}"), format!("{b}.{g}"))?;
            }
        }
        Ok(())
    }

    fn ffn(&mut self, p: &str, b: &str, dense: bool) -> Result<()> {
        let m = format!("{p}.mlp");
        let sfx = if dense { "" } else { "_shexp" };
        let src = if dense {
            m.clone()
        } else {
            format!("{m}.shared_experts")
        };
        for w in ["gate", "up", "down"] {
            self.plain(
                &format!("{src}.{w}_proj.weight"),
                format!("{b}.ffn_{w}{sfx}.weight"),
            )?;
        }
        if dense {
            return Ok(());
        }
        self.plain(
            &format!("{m}.gate.weight"),
            format!("{b}.ffn_gate_inp.weight"),
        )?;
        self.plain(
            &format!("{m}.gate.e_score_correction_bias"),
            format!("{b}.exp_probs_b.bias"),
        )?;
        // The stacked experts: row x·rows + i is row i of expert x.
        let e = self.c.n_expert;
        for (sub, w) in ["down", "gate", "up"].into_iter().enumerate() {
            let names: Vec<String> = (0..e)
                .map(|x| format!("{m}.experts.{x}.{w}_proj.weight"))
                .collect();
            let gens = names
                .iter()
                .map(|n| self.gen(n))
                .collect::<Result<Vec<_>>>()?;
            let (_, rows, cols) = gens[0];
            let gens: Vec<Gen> = gens.into_iter().map(|g| g.0).collect();
            let fill: Fill =
                Box::new(move |row, out| gens[row as usize / rows].row(row % rows as u64, out));
            let at = format!("{m}.experts");
            let name = format!("{b}.ffn_{w}_exps.weight");
            self.push_many(name, &[cols, rows, e], &at, sub, names, fill);
        }
        Ok(())
    }
}

/// The converter's tensors of a config, in its order.
fn tensors(c: &Glm5Config, seed: u64) -> Result<Vec<Out>> {
    let plan = plan(c);
    let mut b = Builder {
        c,
        plan: &plan,
        seed,
        out: Vec::new(),
    };
    if !c.tie_embeddings {
        b.plain("lm_head.weight", "output.weight".into())?;
    }
    b.plain("embed_tokens.weight", "token_embd.weight".into())?;
    b.plain("norm.weight", "output_norm.weight".into())?;
    for (i, &mixer) in c.mixers.iter().enumerate() {
        let (l, bl) = (format!("layers.{i}"), format!("blk.{i}"));
        b.hc(&l, &bl, "attn")?;
        b.hc(&l, &bl, "ffn")?;
        b.plain(
            &format!("{l}.input_layernorm.weight"),
            format!("{bl}.attn_norm.weight"),
        )?;
        b.plain(
            &format!("{l}.post_attention_layernorm.weight"),
            format!("{bl}.ffn_norm.weight"),
        )?;
        let a = format!("{l}.self_attn");
        match mixer {
            Mixer::Kda => b.kda(&a, &bl)?,
            Mixer::Mla => b.mla(&a, &bl, c.indexers[i] == Indexer::Full)?,
        }
        b.ffn(&l, &bl, c.dense[i])?;
    }
    if c.nextn > 0 {
        let n = c.mixers.len();
        let (l, bl) = (format!("layers.{n}"), format!("blk.{n}"));
        for (hf, g) in [
            ("eh_proj", "nextn.eh_proj"),
            ("enorm", "nextn.enorm"),
            ("hnorm", "nextn.hnorm"),
            ("shared_head.norm", "nextn.shared_head_norm"),
            ("input_layernorm", "attn_norm"),
            ("post_attention_layernorm", "ffn_norm"),
        ] {
            b.plain(&format!("{l}.{hf}.weight"), format!("{bl}.{g}.weight"))?;
        }
        b.mla(&format!("{l}.self_attn"), &bl, true)?;
        b.ffn(&l, &bl, false)?;
    }
    let mut out = b.out;
    if out.len() != expected_count(&plan, c) {
        bail!("glm5 synth: {} GGUF tensors for the plan", out.len());
    }
    out.sort_by(|a, b| a.order.cmp(&b.order));
    Ok(out)
}

/// GGUF tensors of a plan: one per checkpoint tensor, but one per routed-expert kind per layer
/// and two for `kv_b_proj` (the MTP block is one more MoE and MLA layer).
fn expected_count(plan: &HashMap<String, Tensor>, c: &Glm5Config) -> usize {
    let experts = plan.keys().filter(|n| n.contains(".experts.")).count();
    let block = c.nextn.min(1);
    let moe = c.dense.iter().filter(|&&d| !d).count() + block;
    let mla = c.mixers.iter().filter(|&&m| m == Mixer::Mla).count() + block;
    plan.len() - experts + 3 * moe + mla
}

/// The type the converter at `--outtype ty` (a float type) gives a tensor.
fn converter_type(name: &str, dims: &[u64], ty: GgmlType) -> GgmlType {
    let exact = [
        "hc_attn_",
        "hc_ffn_",
        "indexer_compressor_",
        "ssm_a",
        "ssm_dt",
        "exp_probs_b",
    ];
    let forced = name.ends_with("_norm.weight")
        || !name.ends_with(".weight")
        || (name.starts_with("blk.") && exact.iter().any(|k| name.contains(k)))
        || [".ffn_gate_inp.weight", ".indexer.proj.weight"]
            .iter()
            .any(|k| name.ends_with(k))
        || name.contains(".ssm_conv1d_");
    if dims.len() <= 1 || forced {
        GgmlType::F32
    } else {
        ty
    }
}

/// llama-quantize's choice for every tensor of an F32 `glm5-next` file (in its order): the
/// shared rules, with the indexer, KDA gate, low-rank MLA and mHC tensors kept F32 and the
/// q_a / q_b products at Q8_0.
fn quantize_types(
    list: &[(&str, &[u64])],
    scheme: QuantScheme,
    n_layer: usize,
    n_expert: usize,
) -> Vec<GgmlType> {
    let kept = [
        "_norm.weight",
        "ffn_gate_inp.weight",
        "ssm_conv1d",
        "hc_",
        "indexer.attn_q_b",
        "indexer.attn_k",
        "indexer.proj",
        "indexer_compressor_gate",
        "indexer_compressor_ape",
        "ssm_f_a.weight",
        "ssm_f_b.weight",
        "ssm_g_a.weight",
        "ssm_g_b.weight",
        "ssm_beta.weight",
        "attn_kv_a_mqa.weight",
        "attn_k_b.weight",
        "attn_v_b.weight",
    ];
    quantize_types_with(
        list,
        scheme,
        (n_layer, n_expert),
        &kept,
        &["attn_q_a", "attn_q_b", "nextn.eh_proj"],
    )
}

/// The file's tensors in its order with their types.
fn typed(c: &Glm5Config, scheme: QuantScheme, seed: u64) -> Result<(Vec<Out>, Vec<GgmlType>)> {
    scheme.file_type()?;
    if c.hc != 4 || c.kda_heads != c.n_head || c.idx_pool < 2 {
        bail!("llama.cpp's glm5-next needs 4 mHC streams, as many KDA as MLA heads, pools > 1");
    }
    let mut out = tensors(c, seed)?;
    let float = matches!(
        scheme,
        QuantScheme::Mostly(GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
    );
    let types = if float {
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
        // llama-quantize's layer count includes the MTP block (`n_layer_all`).
        quantize_types(&list, scheme, c.mixers.len() + c.nextn, c.n_expert)
    };
    Ok((out, types))
}

/// Bytes of the tensors of the file [`write`] writes for a config (total, routed experts).
pub fn weight_bytes(c: &Glm5Config, scheme: QuantScheme) -> Result<(u64, u64)> {
    let (out, types) = typed(c, scheme, 0)?;
    let (mut total, mut experts) = (0, 0);
    for (o, t) in out.iter().zip(types) {
        let b = t.row_bytes(o.dims[0]).unwrap_or(u64::MAX) * o.dims[1..].iter().product::<u64>();
        total += b;
        if o.name.contains("_exps.") {
            experts += b;
        }
    }
    Ok((total, experts))
}

/// The `tokenizer.*` metadata of a geometry's file (see the module docs), or of `src`.
pub fn tokenizer_metadata(n_vocab: usize, src: Option<&Path>) -> Result<Vec<(String, Value)>> {
    // A file given by the caller is used as it is; the default one becomes the GLM stand-in.
    let (src, glm) = match src {
        Some(p) => (Some(p.to_path_buf()), false),
        None if n_vocab >= QWEN35_VOCAB => (find_tokenizer("ggml-vocab-qwen35.gguf").ok(), true),
        None => (None, false),
    };
    if let Some(p) = src {
        let g =
            GgufFile::open(&p).with_context(|| format!("reading the tokenizer {}", p.display()))?;
        let md = padded(&g, n_vocab)?;
        return match glm && n_vocab >= vocab::FIRST_ADDED + vocab::ADDED.len() {
            true => vocab::glm_metadata(md, n_vocab, vocab::find_template()),
            false => Ok(md),
        };
    }
    let s = |x: &str| Value::String(x.into());
    Ok(vec![
        ("tokenizer.ggml.model".into(), s("gpt2")),
        ("tokenizer.ggml.pre".into(), s("glm4")),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array((0..n_vocab).map(|i| s(&format!("<t{i}>"))).collect()),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(vec![Value::I32(1); n_vocab]),
        ),
        (
            "tokenizer.ggml.merges".into(),
            Value::Array(vec![s("<t0> <t1>")]),
        ),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(0)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(1)),
    ])
}

/// The vocabulary of geometry `name` as a tensor-less GGUF (`--model synth:` tokenizes with it).
pub fn vocabulary(name: &str) -> Result<GgufFile> {
    let c = Glm5Config::from_json(&config(name)?)?;
    let mut w = GgufWriter::new();
    w.add_kv("general.architecture", Value::String(ARCH.into()))?;
    for (k, v) in tokenizer_metadata(c.n_vocab, None)? {
        w.add_kv(k, v)?;
    }
    GgufFile::from_bytes(w.to_bytes(|_, _, _| Ok(()))?)
}

/// A planned file: the writer (metadata and tensor directory) and each tensor's values.
struct Planned {
    w: GgufWriter,
    fills: Vec<Fill>,
}

fn prepare(geometry: &str, scheme: QuantScheme, seed: u64, opts: &SynthOptions) -> Result<Planned> {
    let j = config(geometry)?;
    let t = j.get("text_config").unwrap_or(&j);
    let c = Glm5Config::from_json(&j)?;
    let (out, types) = typed(&c, scheme, seed)?;
    let float = matches!(
        scheme,
        QuantScheme::Mostly(GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
    );
    let n = c.mixers.len();
    // The converter's block count includes the MTP block.
    let blocks = n + c.nextn;
    let lead = c.dense.iter().take_while(|&&d| d).count();
    if c.dense[lead..].iter().any(|&d| d) {
        bail!("llama.cpp's glm5-next has only leading dense layers");
    }
    let u = |k: &str| -> Result<u32> {
        t.get(k)
            .and_then(Json::as_u64)
            .map(|v| v as u32)
            .ok_or_else(|| anyhow!("config: {k}"))
    };
    let label = size_label(out.iter().map(|o| (o.name.as_str(), o.dims.as_slice())));

    // Metadata in the converter's order.
    let mut w = GgufWriter::new();
    let mut kv = |k: &str, v: Value| -> Result<()> {
        let key = match k.starts_with("general.") {
            true => k.to_string(),
            false => format!("{ARCH}.{k}"),
        };
        w.add_kv(key, v)
    };
    let u32v = |x: usize| Value::U32(x as u32);
    kv("general.architecture", Value::String(ARCH.into()))?;
    kv("general.type", Value::String("model".into()))?;
    kv(
        "general.name",
        Value::String(format!("vela synth {geometry} seed {seed}")),
    )?;
    kv("general.size_label", Value::String(label))?;
    kv("block_count", u32v(blocks))?;
    kv("context_length", Value::U32(u("max_position_embeddings")?))?;
    kv("embedding_length", u32v(c.hidden))?;
    kv("feed_forward_length", u32v(c.n_ff))?;
    kv("attention.head_count", u32v(c.n_head))?;
    // One KV head for MLA, none for KDA, padded with MLA for the MTP block.
    let kinds = c
        .mixers
        .iter()
        .map(|&m| Value::I32((m == Mixer::Mla) as i32))
        .chain(std::iter::repeat_n(Value::I32(1), c.nextn));
    kv("attention.head_count_kv", Value::Array(kinds.collect()))?;
    kv("attention.layer_norm_rms_epsilon", Value::F32(c.eps))?;
    kv("expert_count", u32v(c.n_expert))?;
    kv("expert_used_count", u32v(c.top_k))?;
    kv("expert_group_count", u32v(c.n_group))?;
    kv("expert_group_used_count", u32v(c.topk_group))?;
    kv("expert_gating_func", Value::U32(2))?;
    // llama-quantize sets these two anew: they move behind the tokenizer.
    let file_type = Value::U32(scheme.file_type()?);
    if float {
        kv("general.file_type", file_type.clone())?;
    }
    kv("vocab_size", u32v(c.n_vocab))?;
    kv("attention.layer_norm_epsilon", Value::F32(1e-6))?;
    if c.nextn > 0 {
        kv("nextn_predict_layers", u32v(c.nextn))?;
    }
    kv("ssm.conv_kernel", u32v(c.conv_k))?;
    kv("kda.head_dim", u32v(c.kda_dim))?;
    if let Some(lb) = c.lower_bound {
        kv("kda.gate_lower_bound", Value::F32(lb))?;
    }
    kv("attention.q_lora_rank", u32v(c.q_rank))?;
    kv("attention.kv_lora_rank", u32v(c.kv_rank))?;
    kv("rope.dimension_count", Value::U32(0))?;
    kv("attention.key_length", u32v(c.kv_rank))?;
    kv("attention.value_length", u32v(c.kv_rank))?;
    kv("attention.key_length_mla", u32v(c.nope_dim))?;
    kv("attention.value_length_mla", u32v(c.v_dim))?;
    kv("attention.indexer.head_count", u32v(c.idx_heads))?;
    kv("attention.indexer.key_length", u32v(c.idx_dim))?;
    kv("attention.indexer.top_k", u32v(c.idx_topk))?;
    kv("attention.indexer.kpool", u32v(c.idx_pool))?;
    kv("attention.indexer.kpool_select_tail", Value::Bool(true))?;
    // Only from an explicit `indexer_types`, as the converter writes it.
    if t.get("indexer_types").is_some() {
        let full = c.indexers.iter().map(|&i| Value::Bool(i == Indexer::Full));
        kv("attention.indexer.types", Value::Array(full.collect()))?;
    }
    kv("hyper_connection.count", u32v(c.hc))?;
    kv(
        "hyper_connection.sinkhorn_iterations",
        u32v(c.sinkhorn_iters),
    )?;
    kv("hyper_connection.epsilon", Value::F32(c.hc_eps))?;
    kv("leading_dense_block_count", u32v(lead))?;
    kv("expert_feed_forward_length", u32v(c.n_ff_exp))?;
    kv("expert_shared_count", u32v(c.n_shared))?;
    kv("expert_weights_scale", Value::F32(c.routed_scale))?;
    kv("expert_weights_norm", Value::Bool(c.norm_topk))?;
    let clamp = Value::Array(vec![Value::F32(c.swiglu_limit); blocks]);
    kv("swiglu_clamp_exp", clamp.clone())?;
    kv("swiglu_clamp_shexp", clamp)?;
    if float {
        kv("general.quantization_version", Value::U32(2))?;
    }
    for (k, v) in tokenizer_metadata(c.n_vocab, opts.tokenizer.as_deref())? {
        w.add_kv(k, v)?;
    }
    if !float {
        w.add_kv("general.quantization_version", Value::U32(2))?;
        w.add_kv("general.file_type", file_type)?;
    }
    let mut fills = Vec::with_capacity(out.len());
    for (o, t) in out.into_iter().zip(types) {
        // llama-quantize writes ggml_n_dims dimensions (trailing 1s dropped).
        let mut dims = o.dims;
        while !float && dims.len() > 1 && dims.last() == Some(&1) {
            dims.pop();
        }
        w.add_tensor(o.name, &dims, t)?;
        fills.push(o.fill);
    }
    Ok(Planned { w, fills })
}

/// The type every checkpoint tensor (`Glm5Model::synth`'s names) has in the file [`write`]
/// writes: `Glm5Model::synth_typed` with these loads the file's types and values.
pub fn hf_types(geometry: &str, scheme: QuantScheme) -> Result<HashMap<String, GgmlType>> {
    let c = Glm5Config::from_json(&config(geometry)?)?;
    let (out, types) = typed(&c, scheme, 0)?;
    Ok(out
        .into_iter()
        .zip(types)
        .flat_map(|(o, t)| o.hf.into_iter().map(move |n| (n, t)))
        .collect())
}

/// The size of the file [`write`] would write (nothing is generated).
pub fn file_size(
    geometry: &str,
    scheme: QuantScheme,
    seed: u64,
    opts: &SynthOptions,
) -> Result<u64> {
    Ok(prepare(geometry, scheme, seed, opts)?.w.file_size())
}

/// Write the GGUF of `glm5_next` geometry `geometry` (see the module docs), deterministic from
/// `seed` (the same seed as `Glm5Model::synth`'s gives the same values).
pub fn write(
    geometry: &str,
    scheme: QuantScheme,
    seed: u64,
    out: &Path,
    opts: &SynthOptions,
    progress: Progress,
) -> Result<()> {
    let p = prepare(geometry, scheme, seed, opts)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn llama_quantize_rules_for_glm5_next() {
        use GgmlType::*;
        let d = |a: &[u64]| a.to_vec();
        let names = [
            ("output.weight", d(&[4096, 154880])),
            ("token_embd.weight", d(&[4096, 154880])),
            ("blk.0.attn_v.weight", d(&[4096, 8192])),
            ("blk.0.ssm_f_b.weight", d(&[128, 8192])),
            ("blk.0.ssm_conv1d_q.weight", d(&[4, 1, 8192, 1])),
            ("blk.0.hc_attn_fn.weight", d(&[16384, 24])),
            ("blk.3.attn_q_b.weight", d(&[1536, 16384])),
            ("blk.3.indexer.attn_k.weight", d(&[4096, 128])),
            ("blk.3.attn_k_b.weight", d(&[256, 512, 64])),
            ("blk.6.ffn_down_exps.weight", d(&[2048, 4096, 288])),
            ("blk.44.ffn_down_shexp.weight", d(&[2048, 4096])),
            ("blk.3.ffn_gate_inp.weight", d(&[4096, 288])),
        ];
        let list: Vec<(&str, &[u64])> = names.iter().map(|(n, d)| (*n, d.as_slice())).collect();
        let t = quantize_types(&list, QuantScheme::Mostly(Q4_0), 45, 288);
        assert_eq!(
            t,
            [Q6_K, Q4_0, Q4_0, F32, F32, F32, Q8_0, F32, F32, Q4_0, Q4_0, F32]
        );
        let t = quantize_types(&list, QuantScheme::Q4KM, 45, 288);
        // ffn_down of a more-bits layer (the last eighth) Q6_K, of layer 6 not.
        assert_eq!((t[2], t[9], t[10]), (Q6_K, Q4_K, Q6_K));
        // The converter at bf16: the exact and 1-D tensors in F32, the rest BF16.
        let c: Vec<GgmlType> = names
            .iter()
            .map(|(n, d)| converter_type(n, d, BF16))
            .collect();
        assert_eq!(
            c,
            [BF16, BF16, BF16, BF16, F32, F32, BF16, BF16, BF16, BF16, BF16, F32]
        );
        assert_eq!(converter_type("blk.0.ssm_a", &[64], BF16), F32);
        assert_eq!(converter_type("blk.0.ssm_dt.bias", &[8192], BF16), F32);
    }
}
