//! GGML quantized block formats: the type table, scalar reference dequantizers and quantizers.
//!
//! Everything here is the slow, obviously-correct *reference*; optimized kernels live in
//! `vela-compute` and are tested against these functions.

mod dequant;
pub mod fp8;
mod kquant;
mod quantize;
mod types;

pub use dequant::{check_supported, dequantize, SUPPORTED_TYPES};
pub use quantize::{dequantize_q8_1_block, quantize, quantize_q8_0, quantize_q8_1, quantize_q8_k};
pub use types::{GgmlType, QK_K};
