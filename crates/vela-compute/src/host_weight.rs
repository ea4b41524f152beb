//! [`HostWeight`]: a weight matrix on the host, read in place from a mapped GGUF or safetensors
//! file or held in memory, before a backend uploads it.

use anyhow::Result;
use std::sync::Arc;
use vela_formats::gguf::GgufFile;
use vela_formats::quant::GgmlType;
use vela_formats::safetensors::Checkpoint;

/// Where a weight's bytes live on the host before the backend takes them: in place in a mapped
/// GGUF or safetensors file, or in memory (a weight quantized at load).
#[derive(Clone)]
enum Storage {
    Gguf(Arc<GgufFile>),
    /// A checkpoint and the index of the shard holding the tensor.
    Safetensors(Arc<Checkpoint>, usize),
    Owned(Arc<Vec<u8>>),
}

/// Bytes of a row of `cols` elements of `ty` (an error if the row is not whole blocks).
fn row_bytes(ty: GgmlType, cols: usize) -> Result<usize> {
    ty.row_bytes(cols as u64)
        .map(|b| b as usize)
        .ok_or_else(|| anyhow::anyhow!("{cols} elements are not whole {} blocks", ty.name()))
}

/// A weight matrix on the host: `rows` rows of `cols` elements of type `ty` (row-major, each row
/// a whole number of the type's blocks), used in place where it lies.
#[derive(Clone)]
pub struct HostWeight {
    pub name: String,
    pub ty: GgmlType,
    /// Number of rows (product of all but the first GGUF dimension, all but the last PyTorch one).
    pub rows: usize,
    /// Elements per row (GGUF `ne0`).
    pub cols: usize,
    /// An embedding table or output head: multiplied for a few rows per step (or gathered), so a
    /// backend keeps it as stored instead of repacking it for batched products. Set by
    /// [`HostWeight::from_gguf`] for llama.cpp's names (`token_embd.weight`, `output.weight`),
    /// by the model otherwise ([`HostWeight::as_head`]).
    pub head: bool,
    storage: Storage,
    /// Byte range of the data in the storage, resolved once (bytes() is on the matmul hot path).
    range: std::ops::Range<usize>,
}

impl HostWeight {
    /// Look up a tensor by name; `None` if absent.
    pub fn from_gguf(file: &Arc<GgufFile>, name: &str) -> Option<HostWeight> {
        let t = file.tensor(name)?;
        Some(HostWeight {
            name: name.to_string(),
            ty: t.ty,
            rows: t.n_rows(),
            cols: t.ne0(),
            head: matches!(name, "token_embd.weight" | "output.weight"),
            storage: Storage::Gguf(file.clone()),
            range: {
                let start = (file.data_offset + t.offset) as usize;
                start..start + t.size as usize
            },
        })
    }

    /// Look up a tensor of a safetensors checkpoint (F32, F16 or BF16; a PyTorch `[out, in]`
    /// matrix has `cols = in`; a 3-D `[E, out, in]` tensor is `E·out` rows); `None` if absent.
    pub fn from_safetensors(cp: &Arc<Checkpoint>, name: &str) -> Option<HostWeight> {
        let (shard, e) = cp.locate(name)?;
        let ty = e.dtype.ggml();
        let cols = e.shape.last().copied().unwrap_or(1);
        let rows = e.shape.iter().rev().skip(1).product();
        Some(HostWeight {
            name: name.to_string(),
            ty,
            rows,
            cols,
            head: false,
            storage: Storage::Safetensors(cp.clone(), shard),
            range: e.start..e.end,
        })
    }

    /// A weight held in memory (`data`: `rows` rows of `cols` elements of `ty`).
    pub fn owned(
        name: &str,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        data: Vec<u8>,
    ) -> Result<Self> {
        let want = rows * row_bytes(ty, cols)?;
        if data.len() != want {
            anyhow::bail!(
                "weight {name}: {} bytes for [{rows}, {cols}] of {}, expected {want}",
                data.len(),
                ty.name()
            );
        }
        Ok(HostWeight {
            name: name.to_string(),
            ty,
            rows,
            cols,
            head: false,
            range: 0..data.len(),
            storage: Storage::Owned(Arc::new(data)),
        })
    }

    /// The tensor's bytes, in place.
    pub fn bytes(&self) -> &[u8] {
        let all: &[u8] = match &self.storage {
            Storage::Gguf(f) => f.bytes(),
            Storage::Safetensors(cp, shard) => cp.files[*shard].bytes(),
            Storage::Owned(v) => v,
        };
        &all[self.range.clone()]
    }

    /// Rows `first..first + n` as a weight of their own (no copy): one expert of a 3-D expert
    /// tensor, or a part of a fused projection.
    pub fn row_range(&self, first: usize, n: usize, name: &str) -> Result<HostWeight> {
        if first + n > self.rows {
            anyhow::bail!(
                "{}: rows {first}..{} of {} requested",
                self.name,
                first + n,
                self.rows
            );
        }
        let rb = row_bytes(self.ty, self.cols)?;
        let start = self.range.start + first * rb;
        Ok(HostWeight {
            name: name.to_string(),
            ty: self.ty,
            rows: n,
            cols: self.cols,
            head: self.head,
            storage: self.storage.clone(),
            range: start..start + n * rb,
        })
    }

    /// Columns `first..first + n` of every row as a weight of its own (a copy): one part of a
    /// projection whose inputs were concatenated. Both bounds must fall on whole blocks.
    pub fn col_range(&self, first: usize, n: usize, name: &str) -> Result<HostWeight> {
        if first + n > self.cols {
            anyhow::bail!(
                "{}: columns {first}..{} of {} requested",
                self.name,
                first + n,
                self.cols
            );
        }
        let rb = row_bytes(self.ty, self.cols)?;
        let (skip, take) = (row_bytes(self.ty, first)?, row_bytes(self.ty, n)?);
        let mut data = Vec::with_capacity(self.rows * take);
        for row in self.bytes().chunks_exact(rb) {
            data.extend_from_slice(&row[skip..skip + take]);
        }
        Ok(HostWeight::owned(name, self.ty, self.rows, n, data)?.as_head(self.head))
    }

    /// The weight as f32 (dequantized); for small tensors (norms, biases).
    pub fn to_f32(&self) -> Result<Vec<f32>> {
        let mut out = vec![0f32; self.rows * self.cols];
        vela_formats::quant::dequantize(self.ty, self.bytes(), &mut out)?;
        Ok(out)
    }

    /// The weight converted to `ty` in memory (llama.cpp's reference quantization, row by
    /// row through f32).
    pub fn convert(&self, ty: GgmlType) -> Result<HostWeight> {
        let (rb_in, rb_out) = (row_bytes(self.ty, self.cols)?, row_bytes(ty, self.cols)?);
        let mut out = vec![0u8; self.rows * rb_out];
        let mut row = vec![0f32; self.cols];
        for (src, dst) in self
            .bytes()
            .chunks_exact(rb_in)
            .zip(out.chunks_exact_mut(rb_out))
        {
            vela_formats::quant::dequantize(self.ty, src, &mut row)?;
            vela_formats::quant::quantize(ty, &row, dst)?;
        }
        Ok(HostWeight::owned(&self.name, ty, self.rows, self.cols, out)?.as_head(self.head))
    }

    /// This weight marked as an embedding table or output head (or not): [`HostWeight::head`].
    pub fn as_head(mut self, head: bool) -> Self {
        self.head = head;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn col_range_takes_the_columns_of_every_row() {
        let v: Vec<f32> = (0..2 * 64).map(|i| i as f32 * 0.25 - 7.0).collect();
        let w = HostWeight::owned("w", GgmlType::F32, 2, 64, f32_bytes(&v)).unwrap();
        let right = w.col_range(40, 24, "r").unwrap();
        assert_eq!((right.rows, right.cols), (2, 24));
        let got = right.to_f32().unwrap();
        assert_eq!(&got[..24], &v[40..64]);
        assert_eq!(&got[24..], &v[104..128]);
        // Q8_0: the halves of each row, block by block, as the whole row dequantizes.
        let q = w.convert(GgmlType::Q8_0).unwrap();
        let all = q.to_f32().unwrap();
        let (a, b) = (
            q.col_range(0, 32, "a").unwrap(),
            q.col_range(32, 32, "b").unwrap(),
        );
        let (a, b) = (a.to_f32().unwrap(), b.to_f32().unwrap());
        for r in 0..2 {
            assert_eq!(&a[r * 32..(r + 1) * 32], &all[r * 64..r * 64 + 32]);
            assert_eq!(&b[r * 32..(r + 1) * 32], &all[r * 64 + 32..(r + 1) * 64]);
        }
        assert!(q.col_range(16, 32, "x").is_err(), "not on a block boundary");
        assert!(w.col_range(40, 25, "x").is_err(), "past the row");
    }
}
