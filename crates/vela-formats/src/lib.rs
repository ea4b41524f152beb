//! Formats layer: everything that turns bytes on disk into typed model data and text into token ids.
//!
//! Nothing here computes a forward pass; higher layers (`vela-compute`, `vela-models`) build on it.

pub mod gguf;
pub mod gguf_write;
pub mod quant;
pub mod safetensors;
pub mod testdata;
