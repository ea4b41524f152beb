//! The weights the CUDA backend multiplies: [`CudaWeight`] (a matrix uploaded in its GGUF block
//! layout or in split rows), the kernel-name suffix and activation kind of each supported type.

use cudarc::driver::CudaSlice;
use vela_formats::quant::GgmlType;

/// An f32 activation buffer.
pub type CudaBuf = CudaSlice<f32>;

/// How a weight type's matmul reads activations.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum ActKind {
    Q8,
    Q8K,
    Float,
}

/// Kernel-name suffix and activation kind of the supported weight types.
pub(crate) fn type_info(ty: GgmlType) -> Option<(&'static str, ActKind)> {
    use GgmlType as G;
    Some(match ty {
        G::Q4_0 => ("q4_0", ActKind::Q8),
        G::Q4_1 => ("q4_1", ActKind::Q8),
        G::Q5_0 => ("q5_0", ActKind::Q8),
        G::Q5_1 => ("q5_1", ActKind::Q8),
        G::Q8_0 => ("q8_0", ActKind::Q8),
        G::Q4_K => ("q4_k", ActKind::Q8K),
        G::Q5_K => ("q5_k", ActKind::Q8K),
        G::Q6_K => ("q6_k", ActKind::Q8K),
        G::F32 => ("f32", ActKind::Float),
        G::F16 => ("f16", ActKind::Float),
        _ => return None,
    })
}

/// Kernel-name suffix of a type's split-row layout (see `CudaWeight`).
fn split_suffix(ty: GgmlType) -> Option<&'static str> {
    match ty {
        GgmlType::Q4_0 => Some("q4_0s"),
        GgmlType::Q4_K => Some("q4_ks"),
        GgmlType::Q6_K => Some("q6_ks"),
        _ => None,
    }
}

/// Whether the CUDA backend can multiply (and embed from) weights of type `ty`.
pub fn supported(ty: GgmlType) -> bool {
    type_info(ty).is_some()
}

/// A weight matrix uploaded once, in its GGUF block layout, or for Q4_0 (rows of a multiple of
/// 256 elements), Q4_K and Q6_K (rows padded to 16 bytes) in split rows (`split`: the 4-bit
/// quants of each 32-element (sub-)block in one aligned 16-byte word, the scales after them; the
/// same row size but for Q6_K's padding; see `repack_q4_0` and `BK<112>` in kernels/quant.cu).
/// `row_bytes` is the stride between rows as uploaded.
pub struct CudaWeight {
    pub(crate) data: CudaSlice<u8>,
    pub(crate) ty: GgmlType,
    pub(crate) rows: usize,
    pub(crate) cols: usize,
    pub(crate) row_bytes: usize,
    pub(crate) split: bool,
}

impl CudaWeight {
    /// Whether the weight was repacked into split rows at upload.
    pub fn is_split_rows(&self) -> bool {
        self.split
    }

    /// Kernel-name suffix and activation kind (`q4_0s` for split rows).
    pub(crate) fn info(&self) -> (&'static str, ActKind) {
        let (suffix, kind) = type_info(self.ty).expect("checked at upload");
        if self.split {
            return (split_suffix(self.ty).unwrap_or(suffix), kind);
        }
        (suffix, kind)
    }
}
