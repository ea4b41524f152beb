//! In-memory GGUF images (tensor directory + data, no metadata) for weights that do not come
//! from a GGUF file: HF checkpoints and per-expert slices of 3-D expert tensors. The image is
//! allocated once at its final size (no growth reallocations) and filled tensor by tensor, so
//! the peak is the image itself plus whatever source the caller still has mapped.

use anyhow::Result;
use vela_formats::gguf::GgufFile;
use vela_formats::quant::GgmlType;

/// A tensor for [`build_image`]: name, GGUF dims (`ne0` first), type, bytes.
pub(super) type ImageTensor<'a> = (String, Vec<u64>, GgmlType, &'a [u8]);

/// A tensor's directory entry for [`layout`]: name, GGUF dims, type, byte length.
pub(super) type TensorSlot = (String, Vec<u64>, GgmlType, usize);

const ALIGN: usize = 32;

/// A zero-filled image holding the directory of `tensors`, and each tensor's absolute byte
/// offset in it (the caller copies the data in, then calls [`GgufFile::from_bytes`]).
pub(super) fn layout(tensors: &[TensorSlot]) -> (Vec<u8>, Vec<usize>) {
    let mut head = Vec::new();
    head.extend_from_slice(b"GGUF");
    head.extend_from_slice(&3u32.to_le_bytes());
    head.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
    head.extend_from_slice(&0u64.to_le_bytes());
    let mut rel = Vec::with_capacity(tensors.len());
    let mut off = 0usize;
    for (name, dims, ty, len) in tensors {
        head.extend_from_slice(&(name.len() as u64).to_le_bytes());
        head.extend_from_slice(name.as_bytes());
        head.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims {
            head.extend_from_slice(&d.to_le_bytes());
        }
        head.extend_from_slice(&ty.id().to_le_bytes());
        head.extend_from_slice(&(off as u64).to_le_bytes());
        rel.push(off);
        off += len.div_ceil(ALIGN) * ALIGN;
    }
    let data = head.len().div_ceil(ALIGN) * ALIGN;
    // `vec![0; n]` is a zeroed allocation: pages are only committed as the data is copied in.
    let mut buf = vec![0u8; data + off];
    buf[..head.len()].copy_from_slice(&head);
    (buf, rel.into_iter().map(|r| data + r).collect())
}

/// An image holding copies of `tensors`.
pub(super) fn build_image(tensors: &[ImageTensor]) -> Result<GgufFile> {
    let slots: Vec<TensorSlot> = tensors
        .iter()
        .map(|(n, d, t, b)| (n.clone(), d.clone(), *t, b.len()))
        .collect();
    let (mut buf, offs) = layout(&slots);
    for ((_, _, _, bytes), off) in tensors.iter().zip(offs) {
        buf[off..off + bytes.len()].copy_from_slice(bytes);
    }
    GgufFile::from_bytes(buf)
}
