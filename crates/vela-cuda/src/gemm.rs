//! Prefill products on tensor cores: dequantize the weight to f16 (in row chunks, into a
//! scratch buffer), convert the activations to f16 once, multiply with cuBLAS (f32 accumulation,
//! f32 output). Used for quantized and float weights when a batch has at least
//! [`crate::DEFAULT_GEMM_MIN`] tokens and cuBLAS can be loaded; smaller batches (decode,
//! speculative verification) keep the integer kernels.
//!
//! Numerics: weights are the GGUF dequantized values rounded once to f16, activations rounded to
//! f16 (11-bit significand, finer than the 8-bit blocks of the integer path), products summed in
//! f32 by the tensor cores.

use crate::backend::CudaBackend;
use crate::cublas::Cublas;
use crate::device::Arg;
use crate::matmul::check_product;
use crate::weight::{type_info, CudaBuf, CudaWeight};
use anyhow::{anyhow, Result};
use cudarc::driver::CudaSlice;
/// Most f16 weight elements dequantized per chunk (64 Mi elements = 128 MiB of scratch).
const CHUNK_ELEMS: usize = 64 << 20;

/// cuBLAS (loaded on first use) and the f16 scratch buffers.
#[derive(Default)]
pub(crate) struct GemmState {
    /// `None` until first use; then the handle or the reason it is unavailable.
    pub(crate) cublas: Option<std::result::Result<Cublas, String>>,
    wh: Option<CudaSlice<u16>>,
    xh: Option<CudaSlice<u16>>,
    /// Scratch of the cuBLAS prefill attention (attn_gemm.rs).
    pub(crate) att: Option<CudaSlice<u8>>,
    /// Override of [`CHUNK_ELEMS`] (tests).
    chunk: Option<usize>,
}

impl CudaBackend {
    /// Dequantize at most `elems` weight elements per cuBLAS call (tests; default 64 Mi).
    pub fn set_gemm_chunk_elems(&self, elems: usize) {
        self.drop_parked();
        self.gemm.lock().unwrap_or_else(|e| e.into_inner()).chunk = Some(elems.max(1));
    }

    /// Whether cuBLAS is loaded (loading it now if needed) and the prefill path is on.
    pub fn gemm_available(&self) -> bool {
        self.use_gemm(usize::MAX, &[])
    }

    /// Whether a one-token product may go to cuBLAS (`set_gemm_min(1)`), which runs outside any
    /// recording (no step can be recorded ahead then).
    pub(crate) fn one_token_gemm(&self) -> bool {
        let min = self.tune.gemm_min();
        min != 0 && min <= 1
    }

    /// Whether a product of `n` tokens with these weights goes to cuBLAS (loading it on first
    /// use; a load failure is reported once and the integer kernels are used from then on).
    pub(crate) fn use_gemm(&self, n: usize, ws: &[&CudaWeight]) -> bool {
        let min = self.tune.gemm_min();
        if min == 0 || n < min || self.tune.exact() {
            return false;
        }
        if ws
            .iter()
            .all(|w| crate::matmul::mmq_applies(self.arch(), w.info().0, n))
        {
            return false;
        }
        if ws
            .iter()
            .any(|w| w.cols % 8 != 0 || type_info(w.ty).is_none())
        {
            return false;
        }
        let mut g = self.gemm.lock().unwrap_or_else(|e| e.into_inner());
        if g.cublas.is_none() {
            let r = self
                .dev
                .ctx
                .bind_to_thread()
                .map_err(|e| anyhow!("binding the CUDA context: {e:?}"))
                .and_then(|_| Cublas::new(self.dev.stream.cu_stream() as *mut _));
            match &r {
                Err(e) => eprintln!(
                    "vela-cuda: cuBLAS unavailable, prefill uses the integer kernels: {e:#}"
                ),
                Ok(c) if self.prof.is_on() || self.tune.debug => {
                    eprintln!(
                        "vela-cuda: prefill products on tensor cores with {}",
                        c.path
                    )
                }
                Ok(_) => {}
            }
            g.cublas = Some(r.map_err(|e| format!("{e:#}")));
        }
        matches!(g.cublas, Some(Ok(_)))
    }

    /// The cuBLAS loaded into `slot` (`GemmState::cublas`), with the backend's context bound to
    /// this thread.
    pub(crate) fn cublas_bound<'a>(
        &self,
        slot: &'a Option<std::result::Result<Cublas, String>>,
    ) -> Result<&'a Cublas> {
        let Some(Ok(cublas)) = slot else {
            return Err(anyhow!("cuBLAS not loaded"));
        };
        self.dev
            .ctx
            .bind_to_thread()
            .map_err(|e| anyhow!("binding the CUDA context: {e:?}"))?;
        Ok(cublas)
    }

    /// `ys[i] = x · ws[i]ᵀ` for `n` tokens with cuBLAS (see the module docs).
    pub(crate) fn matmul_gemm(
        &self,
        ws: &[&CudaWeight],
        x: &CudaBuf,
        n: usize,
        ys: &mut [&mut CudaBuf],
    ) -> Result<()> {
        self.flush_recording();
        let mut g = self.gemm.lock().unwrap_or_else(|e| e.into_inner());
        let g = &mut *g;
        let cublas = self.cublas_bound(&g.cublas)?;
        let mut xcols = usize::MAX;
        for (w, y) in ws.iter().zip(ys.iter_mut()) {
            if w.rows == 0 {
                continue;
            }
            check_product(w, x, y, n);
            // Activations in f16, once per width.
            if xcols != w.cols {
                let need = n * w.cols;
                if g.xh.as_ref().is_none_or(|b| b.len() < need) {
                    g.xh = Some(
                        self.dev
                            .stream
                            .alloc_zeros::<u16>(need.next_power_of_two())?,
                    );
                }
                let xh = self.ptr(g.xh.as_ref().expect("allocated above"));
                let n2 = need / 2;
                let blocks = n2.div_ceil(256).min(65_535) as u32;
                let args = [Arg::P(self.ptr(x)), Arg::P(xh), Arg::L(n2 as i64)];
                self.launch("to_f16", (blocks, 1, 1), 256, &args);
                xcols = w.cols;
            }
            let xh = self.ptr(g.xh.as_ref().expect("allocated above"));
            // The weight in row chunks of at most CHUNK_ELEMS f16 values, a multiple of 128
            // rows when there are several (each chunk's output columns then start 512-byte
            // aligned: at Gemma 4 31B's FFN, 12,483-row chunks left the second one's output
            // 4-byte aligned, and cuBLAS took slower kernels).
            let mut chunk = (g.chunk.unwrap_or(CHUNK_ELEMS) / w.cols).max(1).min(w.rows);
            if chunk < w.rows && chunk >= 128 {
                chunk -= chunk % 128;
            }
            let need = chunk * w.cols;
            if g.wh.as_ref().is_none_or(|b| b.len() < need) {
                g.wh = Some(self.dev.stream.alloc_zeros::<u16>(need)?);
            }
            let wh = self.ptr(g.wh.as_ref().expect("allocated above"));
            let (suffix, _) = w.info();
            let wbase = self.ptr(&w.data);
            let ybase = self.ptr(&**y);
            let mut r0 = 0;
            while r0 < w.rows {
                let rows = chunk.min(w.rows - r0);
                // One thread per 32-element (sub-)block (`deqhb_*`), or per 8 elements where
                // the rows are not whole blocks (float weights).
                let block = w.cols % 32 == 0;
                let per = if block { 32 } else { 8 };
                let blocks = (rows * w.cols / per).div_ceil(256).min(65_535) as u32;
                let args = [
                    Arg::P(wbase + (r0 * w.row_bytes) as u64),
                    Arg::P(wh),
                    Arg::I(rows as i32),
                    Arg::I(w.cols as i32),
                    Arg::L(w.row_bytes as i64),
                ];
                let kernel = format!("{}_{suffix}", if block { "deqhb" } else { "deqh" });
                self.launch(&kernel, (blocks, 1, 1), 256, &args);
                // Output columns r0..r0+rows of every token row (row stride w.rows).
                let t = self.prof.begin(&self.dev);
                cublas.gemm_f16(wh, xh, ybase + 4 * r0 as u64, rows, n, w.cols, w.rows)?;
                self.prof.end(&self.dev, "cublas_gemm_f16", t);
                r0 += rows;
            }
        }
        Ok(())
    }
}
