//! GGML quantized block formats: the type table and scalar reference dequantizers.

mod types;
pub use types::{GgmlType, QK_K};
