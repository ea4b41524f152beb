//! One weight source over GGUF files and Hugging Face safetensors checkpoints (F32/F16/BF16,
//! sharded, 3-D expert tensors), memory-mapped: a model asks for tensors by name and gets
//! [`HostWeight`]s that point into the maps (no copy), or, with a load-time type (`--quant`),
//! converted in memory one tensor at a time, so a BF16 checkpoint is served quantized without
//! a separate conversion step.
//!
//! The load-time policy follows llama.cpp's converter (`convert_hf_to_gguf.py --outtype`): the
//! matrices a model multiplies with become the type when their rows are whole blocks of it, else
//! F16; vectors stay as they are; the matrices a model asks for exact become F32 (e.g. Gemma 4's
//! router and per-layer projection, which `llama-quantize` keeps in F32). Already quantized
//! tensors are used as they are.

use crate::placement::{HostExperts, LoadSpec};
use anyhow::{anyhow, bail, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use vela_compute::HostWeight;
use vela_formats::gguf::GgufFile;
use vela_formats::quant::GgmlType;
use vela_formats::safetensors::Checkpoint;

enum Kind {
    Gguf(Arc<GgufFile>),
    /// A checkpoint whose text-model tensors are named `prefix + name` (`lm_head.weight`
    /// without the prefix).
    Hf {
        cp: Arc<Checkpoint>,
        prefix: String,
    },
    /// Generated on request (HF names without a prefix; `seed` for generated tables).
    Synthetic {
        get: SynthGet,
        seed: u64,
    },
}

/// A generated source's tensor by name.
pub type SynthGet = Arc<dyn Fn(&str) -> Option<HostWeight> + Send + Sync>;

/// Where a model's weights come from.
pub struct WeightSource {
    kind: Kind,
    quant: Option<GgmlType>,
    /// Layers whose routed experts stay in host memory ([`crate::placement`]).
    host_experts: Option<HostExperts>,
    /// Progress of the load-time conversion (with a load-time type).
    conversion: Option<Conversion>,
}

/// The load-time conversion's progress: a bar on a terminal, one line at the end.
struct Conversion {
    bar: Option<indicatif::ProgressBar>,
    /// Source bytes converted so far.
    done: std::sync::atomic::AtomicU64,
    t0: std::time::Instant,
}

/// Whether `ty` is a float type a load-time type converts from.
fn is_float(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16)
}

/// The type a float matrix of `cols` columns becomes at load time with `quant` (whole blocks of
/// `quant`, else F16, as llama.cpp's converter falls back).
pub fn load_type(quant: GgmlType, cols: usize) -> GgmlType {
    if cols.is_multiple_of(quant.block_size()) {
        quant
    } else {
        GgmlType::F16
    }
}

/// Bytes of tensors once loaded with `quant`: `(type, cols, rows, stored bytes)` each; float
/// matrices converted as [`WeightSource::matrix`] does (an estimate for the memory check: a few
/// matrices a model keeps exact are counted converted).
pub fn loaded_bytes(
    tensors: impl Iterator<Item = (GgmlType, usize, usize, u64)>,
    quant: Option<GgmlType>,
) -> u64 {
    tensors
        .map(|(ty, cols, rows, stored)| match quant {
            Some(q) if is_float(ty) && rows > 1 => load_type(q, cols)
                .row_bytes(cols as u64)
                .map_or(stored, |b| b * rows as u64),
            _ => stored,
        })
        .sum()
}

/// A Hugging Face text checkpoint directory: its `config.json` and the weight source over its
/// safetensors, as `spec` loads them, with the text model's prefix found from the embedding
/// (`model.language_model.` or `model.`); `what` names the expected model in the error.
pub fn open_hf_text(
    dir: &std::path::Path,
    spec: &LoadSpec,
    what: &str,
) -> Result<(serde_json::Value, WeightSource)> {
    let cpath = dir.join("config.json");
    let text = std::fs::read_to_string(&cpath)
        .map_err(|e| anyhow!("cannot read {}: {e}", cpath.display()))?;
    let j: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| anyhow!("{} is not valid JSON: {e}", cpath.display()))?;
    let cp = Arc::new(Checkpoint::open(dir)?);
    let prefix = if cp.get("model.language_model.embed_tokens.weight").is_some() {
        "model.language_model."
    } else if cp.get("model.embed_tokens.weight").is_some() {
        "model."
    } else {
        bail!("checkpoint has no model.embed_tokens.weight (is this a {what} checkpoint?)");
    };
    Ok((j, WeightSource::hf(cp, prefix).with_spec(spec)))
}

/// Types `--quant` accepts.
pub const LOAD_TYPES: &[GgmlType] = &[
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q8_0,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
];

/// Parse a `--quant` value (`q8_0`, `q4_k`, `f16`, ...).
pub fn parse_load_type(s: &str) -> Result<GgmlType> {
    LOAD_TYPES
        .iter()
        .copied()
        .find(|t| t.name().eq_ignore_ascii_case(s))
        .ok_or_else(|| {
            let names: Vec<&str> = LOAD_TYPES.iter().map(|t| t.name()).collect();
            anyhow!("unknown --quant '{s}' (one of {})", names.join(", "))
        })
}

impl WeightSource {
    pub fn gguf(g: Arc<GgufFile>) -> Self {
        WeightSource {
            kind: Kind::Gguf(g),
            quant: None,
            host_experts: None,
            conversion: None,
        }
    }

    pub fn hf(cp: Arc<Checkpoint>, prefix: &str) -> Self {
        WeightSource {
            kind: Kind::Hf {
                cp,
                prefix: prefix.to_string(),
            },
            quant: None,
            host_experts: None,
            conversion: None,
        }
    }

    /// Tensors generated by `get` (named as an HF checkpoint's without the prefix), already in
    /// their load types.
    pub fn synthetic(get: SynthGet, seed: u64) -> Self {
        WeightSource {
            kind: Kind::Synthetic { get, seed },
            quant: None,
            host_experts: None,
            conversion: None,
        }
    }

    /// The seed of a generated source (tables too large to materialise are generated row by
    /// row from it).
    pub fn synthetic_seed(&self) -> Option<u64> {
        match &self.kind {
            Kind::Synthetic { seed, .. } => Some(*seed),
            _ => None,
        }
    }

    /// Load as `spec` says: its load-time type ([`Self::with_quant`]) and experts placement.
    pub fn with_spec(self, spec: &LoadSpec) -> Self {
        self.with_quant(spec.quant)
            .with_host_experts(spec.host_experts.clone())
    }

    /// Keep the routed experts of `host`'s layers in host memory ([`crate::placement`]).
    pub fn with_host_experts(mut self, host: Option<HostExperts>) -> Self {
        self.host_experts = host;
        self
    }

    /// The host-memory experts of the plan, if any ([`crate::blocks::experts::Experts::place`]).
    pub fn host_experts(&self) -> Option<&HostExperts> {
        self.host_experts.as_ref()
    }

    /// Convert float matrices to `quant` at load time (`None`: use them as stored).
    pub fn with_quant(mut self, quant: Option<GgmlType>) -> Self {
        self.quant = quant;
        self.conversion = quant.map(|q| {
            use std::io::IsTerminal;
            let total = self.float_matrix_bytes();
            let bar = (std::io::stderr().is_terminal() && total > 0).then(|| {
                let b = indicatif::ProgressBar::with_draw_target(
                    Some(total),
                    indicatif::ProgressDrawTarget::stderr(),
                );
                b.set_style(
                    indicatif::ProgressStyle::with_template(
                        "{msg} [{bar:30}] {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec}",
                    )
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
                );
                b.set_message(format!("converting weights to {}", q.name()));
                b
            });
            Conversion {
                bar,
                done: std::sync::atomic::AtomicU64::new(0),
                t0: std::time::Instant::now(),
            }
        });
        self
    }

    /// Stored bytes of the source's float tensors of more than one row (what a load-time type
    /// converts, about).
    fn float_matrix_bytes(&self) -> u64 {
        let sizes: Vec<(GgmlType, usize, u64)> = match &self.kind {
            Kind::Gguf(g) => g
                .tensors
                .iter()
                .map(|t| (t.ty, t.n_rows(), t.size))
                .collect(),
            Kind::Hf { cp, .. } => cp
                .files
                .iter()
                .flat_map(|f| f.tensors.values())
                .map(|e| {
                    let ty = e.dtype.ggml();
                    let rows = e.shape.iter().rev().skip(1).product();
                    (ty, rows, (e.end - e.start) as u64)
                })
                .collect(),
            Kind::Synthetic { .. } => Vec::new(),
        };
        sizes
            .into_iter()
            .filter(|&(ty, rows, _)| is_float(ty) && rows > 1)
            .map(|x| x.2)
            .sum()
    }

    pub fn quant(&self) -> Option<GgmlType> {
        self.quant
    }

    /// The GGUF file, for a GGUF source.
    pub fn gguf_file(&self) -> Option<&Arc<GgufFile>> {
        match &self.kind {
            Kind::Gguf(g) => Some(g),
            Kind::Hf { .. } | Kind::Synthetic { .. } => None,
        }
    }

    /// A tensor as stored, by the source's own name (GGUF names, or HF text-model names
    /// without the prefix); `None` if absent.
    pub fn get(&self, name: &str) -> Option<HostWeight> {
        match &self.kind {
            Kind::Gguf(g) => HostWeight::from_gguf(g, name).map(ggml_mxfp4),
            Kind::Hf { cp, prefix } => microscaled(cp, &format!("{prefix}{name}"))
                .or_else(|| HostWeight::from_safetensors(cp, &format!("{prefix}{name}")))
                .or_else(|| {
                    // The head and the MTP layer sit outside the text model's prefix.
                    (name == "lm_head.weight" || name.starts_with("mtp."))
                        .then(|| HostWeight::from_safetensors(cp, name))
                        .flatten()
                }),
            Kind::Synthetic { get, .. } => get(name),
        }
    }

    pub fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    /// A matrix to multiply with, converted to the load-time type (F32 when `exact`; see the
    /// module docs); as stored without one; an error if absent.
    pub fn matrix(&self, name: &str, exact: bool) -> Result<HostWeight> {
        let w = self
            .get(name)
            .ok_or_else(|| anyhow!("missing tensor {name}"))?;
        let ty = match self.quant {
            Some(_) if exact => GgmlType::F32,
            Some(q) => load_type(q, w.cols),
            None => w.ty,
        };
        // FP8 / MXFP4 storage is float data too, decoded to BF16 / Q8_0 (converted like floats).
        if ty == w.ty || !(is_float(w.ty) || self.microscaled(name)) {
            return Ok(w);
        }
        let out = w.convert(ty)?;
        if let Some(c) = &self.conversion {
            let done = c.done.fetch_add(w.bytes().len() as u64, Ordering::Relaxed)
                + w.bytes().len() as u64;
            if let Some(b) = &c.bar {
                b.set_position(done);
            }
        }
        Ok(out)
    }
}

impl WeightSource {
    /// Whether `name` is stored as FP8 or MXFP4 (with a `.scale`, decoded by [`microscaled`]; or
    /// GGML's MXFP4 blocks, by [`ggml_mxfp4`]).
    fn microscaled(&self, name: &str) -> bool {
        match &self.kind {
            Kind::Hf { cp, prefix } => {
                let full = format!("{prefix}{name}");
                cp.get(&full).is_some() && microscaled(cp, &full).is_some()
            }
            Kind::Gguf(g) => g.tensor(name).is_some_and(|t| t.ty == GgmlType::MXFP4),
            Kind::Synthetic { .. } => false,
        }
    }
}

/// A GGUF tensor of GGML's MXFP4 type (llama.cpp's DeepSeek V4 experts) decoded exactly, as
/// Q8_0 (f32 for a block scale outside f16); any other tensor as it is. A malformed one is
/// reported on stderr and left as stored (refused wherever a matrix is needed).
fn ggml_mxfp4(w: HostWeight) -> HostWeight {
    use vela_formats::quant::fp8;
    if w.ty != GgmlType::MXFP4 {
        return w;
    }
    let r = fp8::ggml_mxfp4_to_q8_0(w.bytes()).and_then(|q| match q {
        Some(q) => HostWeight::owned(&w.name, GgmlType::Q8_0, w.rows, w.cols, q),
        None => {
            let f: Vec<u8> = fp8::dequant_ggml_mxfp4(w.bytes())?
                .iter()
                .flat_map(|x| x.to_le_bytes())
                .collect();
            HostWeight::owned(&w.name, GgmlType::F32, w.rows, w.cols, f)
        }
    });
    match r {
        Ok(d) => d.as_head(w.head),
        Err(e) => {
            eprintln!("warning: {}: {e:#}", w.name);
            w
        }
    }
}

/// A matrix stored as FP8 or MXFP4 with an e8m0 `.scale` beside it (DeepSeek V4's release,
/// docs/deepseekv4-spec.md §10), decoded exactly: FP8 to BF16, MXFP4 to Q8_0 (f32 for a block
/// scale outside f16). `None` for any other tensor; a malformed pair is reported on stderr and
/// left to the plain reader (raw `I8` bytes, refused wherever a matrix is needed).
fn microscaled(cp: &Checkpoint, name: &str) -> Option<HostWeight> {
    use vela_formats::quant::fp8;
    use vela_formats::safetensors::Dtype;
    let (e, q) = cp.get(name)?;
    if !matches!(e.dtype, Dtype::F8E4M3 | Dtype::I8) || e.shape.len() != 2 {
        return None;
    }
    let stem = name.strip_suffix(".weight").unwrap_or(name);
    let (se, s) = cp.get(&format!("{stem}.scale"))?;
    if se.dtype != Dtype::F8E8M0 {
        return None;
    }
    let (rows, stored) = (e.shape[0], e.shape[1]);
    let r = match e.dtype {
        Dtype::F8E4M3 => fp8::dequant_fp8(q, rows, stored, s).and_then(|v| {
            let b: Vec<u8> = v
                .iter()
                .flat_map(|x| half::bf16::from_f32(*x).to_le_bytes())
                .collect();
            HostWeight::owned(name, GgmlType::BF16, rows, stored, b)
        }),
        _ => {
            let cols = stored * 2;
            fp8::mxfp4_to_q8_0(q, rows, cols, s).and_then(|b| match b {
                Some(b) => HostWeight::owned(name, GgmlType::Q8_0, rows, cols, b),
                None => {
                    let v = fp8::dequant_mxfp4(q, rows, cols, s)?;
                    let b = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                    HostWeight::owned(name, GgmlType::F32, rows, cols, b)
                }
            })
        }
    };
    match r {
        Ok(w) => Some(w),
        Err(err) => {
            eprintln!("{name}: {err:#}");
            None
        }
    }
}

impl Drop for WeightSource {
    fn drop(&mut self) {
        if let (Some(c), Some(q)) = (&self.conversion, self.quant) {
            if let Some(b) = &c.bar {
                b.finish_and_clear();
            }
            if c.done.load(Ordering::Relaxed) > 0 {
                eprintln!(
                    "converted {:.2} GiB of float weights to {} in {:.1} s",
                    c.done.load(Ordering::Relaxed) as f64 / (1u64 << 30) as f64,
                    q.name(),
                    c.t0.elapsed().as_secs_f64()
                );
            }
        }
    }
}

/// Rows of several weights of one type, stacked into one.
pub fn stack(name: &str, parts: &[HostWeight]) -> Result<HostWeight> {
    let first = parts
        .first()
        .ok_or_else(|| anyhow!("{name}: nothing to stack"))?;
    if parts
        .iter()
        .any(|p| p.ty != first.ty || p.cols != first.cols)
    {
        bail!("{name}: parts differ in type or width");
    }
    let rows = parts.iter().map(|p| p.rows).sum();
    let mut data = Vec::with_capacity(parts.iter().map(|p| p.bytes().len()).sum());
    for p in parts {
        data.extend_from_slice(p.bytes());
    }
    HostWeight::owned(name, first.ty, rows, first.cols, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_types_parse_and_fall_back() {
        assert_eq!(parse_load_type("q8_0").unwrap(), GgmlType::Q8_0);
        assert_eq!(parse_load_type("Q4_K").unwrap(), GgmlType::Q4_K);
        let e = parse_load_type("q3_x").err().unwrap().to_string();
        assert!(e.contains("q3_x") && e.contains("q8_0"), "{e}");
        assert_eq!(load_type(GgmlType::Q8_0, 64), GgmlType::Q8_0);
        assert_eq!(load_type(GgmlType::Q8_0, 80), GgmlType::F16);
        assert_eq!(load_type(GgmlType::Q4_K, 512), GgmlType::Q4_K);
        assert_eq!(load_type(GgmlType::Q4_K, 640), GgmlType::F16);
    }
}
