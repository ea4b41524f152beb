//! The CPU backend: SIMD kernels chosen at run time (AVX-512 / AVX2 / scalar) and a low-latency thread pool.

#[cfg(target_arch = "x86_64")]
mod attn;
pub mod compressed;
pub mod experts;
pub mod fused;
pub mod kit;
mod kvdata;
pub mod matmul;
pub mod ops;
pub mod pool;
pub mod recurrent;
pub mod route;
mod rows;
pub mod simd;
pub mod sparse;
pub use ops::CpuBackend;
