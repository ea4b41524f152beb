//! Weight upload (`upload_weight_impl`, `write_weight_rows_impl`) and its progress: an `indicatif` bar on a terminal, one
//! summary line otherwise; and the embedding gather of uploaded weights (`get_rows_impl`).

use crate::backend::CudaBackend;
use crate::device::Arg;
use crate::weight::{supported, CudaBuf, CudaWeight};
use anyhow::{anyhow, bail, Context, Result};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Instant;
use vela_formats::quant::GgmlType;

/// Zero bytes allocated after every weight: the staged matvec kernels read whole 16-byte words,
/// up to 15 bytes past the end of a row (see `mv32` in matvec.cu).
const WEIGHT_PAD: usize = 64;

struct State {
    bar: Option<ProgressBar>,
    total: u64,
    done: u64,
    t0: Instant,
}

/// Progress of one model's upload (between [`Upload::begin`] and [`Upload::end`]).
#[derive(Default)]
pub(crate) struct Upload(Mutex<Option<State>>);

impl Upload {
    pub(crate) fn begin(&self, total: u64, label: &str) {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template(
                    "{msg} [{bar:30}] {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            b.set_message(format!("uploading weights to {label}"));
            b
        });
        if let Ok(mut s) = self.0.lock() {
            *s = Some(State {
                bar,
                total,
                done: 0,
                t0: Instant::now(),
            });
        }
    }

    pub(crate) fn add(&self, n: u64) {
        if let Ok(mut s) = self.0.lock() {
            if let Some(st) = s.as_mut() {
                st.done += n;
                if let Some(b) = &st.bar {
                    b.set_position(st.done.min(st.total));
                }
            }
        }
    }

    /// Finish the bar; returns (bytes uploaded, seconds).
    pub(crate) fn end(&self) -> Option<(u64, f64)> {
        let st = self.0.lock().ok()?.take()?;
        if let Some(b) = &st.bar {
            b.finish_and_clear();
        }
        Some((st.done, st.t0.elapsed().as_secs_f64()))
    }
}

impl CudaBackend {
    /// Upload one weight matrix (repacked into split rows where that applies).
    pub(crate) fn upload_weight_impl(&self, w: &vela_compute::HostWeight) -> Result<CudaWeight> {
        let row_bytes = check(w)?;
        let split = split_repack(w.ty, w.cols).is_some();
        // Split Q6_K rows are padded to 16 bytes (`row_stride` in kernels/quant.cu).
        let stride = if split && w.ty == GgmlType::Q6_K {
            row_bytes.next_multiple_of(16)
        } else {
            row_bytes
        };
        let data = self
            .dev
            .stream
            .alloc_zeros::<u8>(stride * w.rows + WEIGHT_PAD)
            .with_context(|| format!("allocating tensor '{}'", w.name))?;
        let mut cw = CudaWeight {
            data,
            ty: w.ty,
            rows: w.rows,
            cols: w.cols,
            row_bytes: stride,
            split,
        };
        self.fill_rows(&mut cw, 0, w)?;
        Ok(cw)
    }

    /// See `Backend::write_weight_rows`.
    pub(crate) fn write_weight_rows_impl(
        &self,
        dst: &mut CudaWeight,
        row0: usize,
        w: &vela_compute::HostWeight,
    ) -> Result<()> {
        check(w)?;
        if w.ty != dst.ty || w.cols != dst.cols || row0 + w.rows > dst.rows {
            bail!(
                "tensor '{}': {} rows of {} {} do not fit rows {row0}.. of a {}×{} {} weight",
                w.name,
                w.rows,
                w.cols,
                w.ty,
                dst.rows,
                dst.cols,
                dst.ty
            );
        }
        self.fill_rows(dst, row0, w)
    }

    /// `w`'s rows into `dst` from row `row0` on, repacked as the upload does.
    fn fill_rows(
        &self,
        dst: &mut CudaWeight,
        row0: usize,
        w: &vela_compute::HostWeight,
    ) -> Result<()> {
        let row_bytes = check(w)?;
        let n = row_bytes * w.rows;
        let bytes = &w.bytes()[..n];
        let at = row0 * dst.row_bytes;
        if let Some((kernel, per_row)) = split_repack(w.ty, w.cols) {
            // Upload as is, then repack on the device into split rows.
            let mut raw = self
                .dev
                .stream
                .alloc_zeros::<u8>(n)
                .with_context(|| format!("allocating tensor '{}'", w.name))?;
            self.dev
                .stream
                .memcpy_htod(bytes, &mut raw)
                .with_context(|| format!("uploading tensor '{}'", w.name))?;
            let threads = w.rows * per_row;
            let args = [
                Arg::P(self.ptr(&raw)),
                Arg::P(self.ptr(&dst.data) + at as u64),
                Arg::I(w.rows as i32),
                Arg::I((w.cols / w.ty.block_size()) as i32),
            ];
            self.dev
                .launch_now(kernel, (threads.div_ceil(256) as u32, 1, 1), 256, &args)
                .with_context(|| format!("repacking tensor '{}'", w.name))?;
            // The matvecs load their first weights before waiting for the previous kernel
            // (MV_RESUME in kernels/matvec.cu): no kernel launched later may overlap this one.
            self.dev
                .stream
                .synchronize()
                .with_context(|| format!("repacking tensor '{}'", w.name))?;
        } else {
            self.dev
                .stream
                .memcpy_htod(bytes, &mut dst.data.slice_mut(at..at + n))
                .with_context(|| format!("uploading tensor '{}'", w.name))?;
        }
        self.upload.add(n as u64);
        Ok(())
    }
}

/// A weight's bytes per row, after checking the backend can multiply it.
fn check(w: &vela_compute::HostWeight) -> Result<usize> {
    if !supported(w.ty) {
        bail!(
            "tensor '{}' has type {} which the CUDA backend cannot multiply",
            w.name,
            w.ty
        );
    }
    let bs = w.ty.block_size();
    if !w.cols.is_multiple_of(bs) {
        bail!(
            "tensor '{}': {} columns are not a multiple of {bs}",
            w.name,
            w.cols
        );
    }
    let row_bytes =
        w.ty.row_bytes(w.cols as u64)
            .ok_or_else(|| anyhow!("tensor '{}': bad row size", w.name))? as usize;
    if w.bytes().len() < row_bytes * w.rows {
        bail!("tensor '{}' data is shorter than its shape", w.name);
    }
    Ok(row_bytes)
}

impl CudaBackend {
    /// See `Backend::get_rows`: the embedding rows of `ids` (dequantized, times `scale`) into
    /// `out`.
    pub(crate) fn get_rows_impl(
        &self,
        w: &CudaWeight,
        ids: &[u32],
        scale: f32,
        out: &mut CudaBuf,
    ) -> Result<()> {
        // A recorded decode step reads its token from the device `io` buffer (a chained step's
        // token, `DEVICE_TOKEN`, is an argmax over the vocabulary, in range).
        let recorded = self.recorded_token(ids);
        let on_device = recorded.is_some() && ids == [vela_compute::DEVICE_TOKEN];
        if let Some(&id) = ids.iter().find(|&&id| id as usize >= w.rows && !on_device) {
            bail!(
                "token id {id} is out of range (vocabulary has {} entries)",
                w.rows
            );
        }
        if ids.is_empty() {
            return Ok(());
        }
        if out.len() < ids.len() * w.cols {
            bail!("get_rows: output buffer too small");
        }
        let (suffix, _) = w.info();
        let d_ids = match recorded {
            Some(p) => (p, None),
            None => {
                let d = self.dev.stream.clone_htod(ids)?;
                (self.ptr(&d), Some(d))
            }
        };
        let args = [
            Arg::P(self.ptr(&w.data)),
            Arg::P(d_ids.0),
            Arg::I(w.cols as i32),
            Arg::L(w.row_bytes as i64),
            Arg::F(scale),
            Arg::P(self.ptr(out)),
        ];
        self.launch(
            &format!("get_rows_{suffix}"),
            (ids.len() as u32, 1, 1),
            256,
            &args,
        );
        Ok(())
    }
}

/// Whether rows of `cols` elements of type `ty` are held in split rows (Q4_0: rows of a
/// multiple of 8 blocks, 16-byte aligned; Q4_K; Q6_K, rows padded to 16 bytes), and the repack
/// kernel's name and threads per row (one per 32-element (sub-)block).
fn split_repack(ty: GgmlType, cols: usize) -> Option<(&'static str, usize)> {
    match ty {
        GgmlType::Q4_0 if (cols / 32).is_multiple_of(8) => Some(("repack_q4_0", cols / 32)),
        GgmlType::Q4_K => Some(("repack_q4_k", cols / 32)),
        GgmlType::Q6_K => Some(("repack_q6_k", cols / 32)),
        _ => None,
    }
}
