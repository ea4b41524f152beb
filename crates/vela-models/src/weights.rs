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

use anyhow::{anyhow, Result};
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
}

/// Where a model's weights come from.
pub struct WeightSource {
    kind: Kind,
    quant: Option<GgmlType>,
    /// Progress of the load-time conversion (with a load-time type).
    conversion: Option<Conversion>,
}

/// The load-time conversion's progress: a bar on a terminal, one line at the end.
struct Conversion {
    bar: Option<indicatif::ProgressBar>,
    /// Source bytes converted so far.
    done: std::cell::Cell<u64>,
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
            conversion: None,
        }
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
                done: std::cell::Cell::new(0),
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
            Kind::Hf { .. } => None,
        }
    }

    /// A tensor as stored, by the source's own name (GGUF names, or HF text-model names
    /// without the prefix); `None` if absent.
    pub fn get(&self, name: &str) -> Option<HostWeight> {
        match &self.kind {
            Kind::Gguf(g) => HostWeight::from_gguf(g, name),
            Kind::Hf { cp, prefix } => HostWeight::from_safetensors(cp, &format!("{prefix}{name}"))
                .or_else(|| {
                    // The head and the MTP layer sit outside the text model's prefix.
                    (name == "lm_head.weight" || name.starts_with("mtp."))
                        .then(|| HostWeight::from_safetensors(cp, name))
                        .flatten()
                }),
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
        if ty == w.ty || !is_float(w.ty) {
            return Ok(w);
        }
        let out = w.convert(ty)?;
        if let Some(c) = &self.conversion {
            c.done.set(c.done.get() + w.bytes().len() as u64);
            if let Some(b) = &c.bar {
                b.set_position(c.done.get());
            }
        }
        Ok(out)
    }
}

impl Drop for WeightSource {
    fn drop(&mut self) {
        if let (Some(c), Some(q)) = (&self.conversion, self.quant) {
            if let Some(b) = &c.bar {
                b.finish_and_clear();
            }
            if c.done.get() > 0 {
                eprintln!(
                    "converted {:.2} GiB of float weights to {} in {:.1} s",
                    c.done.get() as f64 / (1u64 << 30) as f64,
                    q.name(),
                    c.t0.elapsed().as_secs_f64()
                );
            }
        }
    }
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
