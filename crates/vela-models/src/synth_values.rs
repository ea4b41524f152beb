//! Generated tensors' values by rows: [`quantize_rows`] fills and quantizes rows in parallel,
//! [`normal_weight`] makes a whole `mean + std·N` weight (the architectures' in-memory synth).

use super::normal;
use anyhow::{anyhow, Result};
use vela_compute::HostWeight;
use vela_formats::quant::{quantize, GgmlType};

/// Whole rows of a `ty` tensor with `cols` values each into `out`, row `r0 + i` from
/// `fill(r0 + i, values)`, the rows split over `threads`.
pub(crate) fn quantize_rows(
    ty: GgmlType,
    cols: usize,
    r0: u64,
    threads: usize,
    out: &mut [u8],
    fill: &(dyn Fn(u64, &mut [f32]) + Sync),
) -> Result<()> {
    let rb = ty
        .row_bytes(cols as u64)
        .ok_or_else(|| anyhow!("{} rows of {cols} values", ty.name()))? as usize;
    let rows = out.len() / rb.max(1);
    let per = rows.div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| -> Result<()> {
        let mut handles = Vec::new();
        for (ti, part) in out.chunks_mut(per * rb).enumerate() {
            handles.push(s.spawn(move || -> Result<()> {
                let mut vals = vec![0f32; cols];
                for (k, orow) in part.chunks_mut(rb).enumerate() {
                    fill(r0 + (ti * per + k) as u64, &mut vals);
                    quantize(ty, &vals, orow)?;
                }
                Ok(())
            }));
        }
        for h in handles {
            h.join()
                .map_err(|_| anyhow!("a synth worker thread panicked"))??;
        }
        Ok(())
    })
}

/// `rows × cols` values `mean + std·N` of stream `key` in type `ty` (value `r·cols + c` of the
/// stream at row r, column c); tensors of 8M values or more split their rows over `threads`
/// (smaller ones, e.g. one expert, come in parallel from the loader).
pub(crate) fn normal_weight(
    name: &str,
    ty: GgmlType,
    rows: usize,
    cols: usize,
    (mean, std): (f32, f32),
    key: u64,
    threads: usize,
) -> Result<HostWeight> {
    let rb = ty
        .row_bytes(cols as u64)
        .ok_or_else(|| anyhow!("{name}: {} rows of {cols}", ty.name()))? as usize;
    let mut data = vec![0u8; rows * rb];
    let threads = if rows * cols < 1 << 23 { 1 } else { threads };
    quantize_rows(ty, cols, 0, threads, &mut data, &|r, v| {
        for (c, x) in v.iter_mut().enumerate() {
            *x = mean + std * normal(key, r * cols as u64 + c as u64);
        }
    })?;
    HostWeight::owned(name, ty, rows, cols, data)
}
