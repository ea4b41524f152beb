//! The CPU backend's K/V storage: per-layer rings of f32, f16 or bf16 values, their snapshots,
//! and zeroed allocations that report failure instead of aborting.

use super::simd;
use crate::{KvLayerSpec, KvType};
use anyhow::{bail, Result};
use half::{bf16, f16};

pub(super) enum KvData {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
}

/// Types whose all-zero bit pattern is the value 0.0 (so a zeroed allocation is a valid vector).
trait ZeroBits: Copy {}
impl ZeroBits for f32 {}
impl ZeroBits for f16 {}
impl ZeroBits for bf16 {}

/// `vec![0; n]` that reports an allocation failure as an error instead of aborting. Zeroed pages
/// come from the allocator (calloc), so untouched parts of a large cache cost no memory.
fn zeroed_vec<T: ZeroBits>(n: usize) -> Result<Vec<T>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<T>(n).map_err(|_| {
        anyhow::anyhow!("a KV cache of {n} values is larger than the address space")
    })?;
    // SAFETY: `layout` has a non-zero size (n > 0, T is a 2- or 4-byte float).
    let p = unsafe { std::alloc::alloc_zeroed(layout) } as *mut T;
    if p.is_null() {
        bail!(
            "could not allocate {:.2} GiB of host memory for the KV cache: use a smaller --ctx \
             (or --kv-type f16)",
            layout.size() as f64 / (1u64 << 30) as f64
        );
    }
    // SAFETY: `p` was allocated by the global allocator with the layout of `[T; n]`, and every
    // element is initialized: all-zero bits are 0.0 for every `ZeroBits` type.
    Ok(unsafe { Vec::from_raw_parts(p, n, n) })
}

/// Available host memory (`MemAvailable` of /proc/meminfo) in bytes; None where unknown.
pub(super) fn host_memory_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

impl KvData {
    /// A zeroed cache of `n` values, or an error when the allocator refuses (a huge `--ctx` must
    /// not abort the process; `vec![0; n]` would).
    pub(super) fn new(ty: KvType, n: usize) -> Result<KvData> {
        Ok(match ty {
            KvType::F32 => KvData::F32(zeroed_vec(n)?),
            KvType::F16 => KvData::F16(zeroed_vec(n)?),
            KvType::Bf16 => KvData::Bf16(zeroed_vec(n)?),
        })
    }
    pub(super) fn write(&mut self, off: usize, src: &[f32]) {
        match self {
            KvData::F32(d) => d[off..off + src.len()].copy_from_slice(src),
            KvData::F16(d) => simd::f32_to_f16(src, &mut d[off..off + src.len()]),
            KvData::Bf16(d) => simd::f32_to_bf16(src, &mut d[off..off + src.len()]),
        }
    }
    pub(super) fn clone_range(&self, off: usize, n: usize) -> KvData {
        match self {
            KvData::F32(d) => KvData::F32(d[off..off + n].to_vec()),
            KvData::F16(d) => KvData::F16(d[off..off + n].to_vec()),
            KvData::Bf16(d) => KvData::Bf16(d[off..off + n].to_vec()),
        }
    }
    pub(super) fn copy_from(&mut self, off: usize, src: &KvData) {
        match (self, src) {
            (KvData::F32(d), KvData::F32(s)) => d[off..off + s.len()].copy_from_slice(s),
            (KvData::F16(d), KvData::F16(s)) => d[off..off + s.len()].copy_from_slice(s),
            (KvData::Bf16(d), KvData::Bf16(s)) => d[off..off + s.len()].copy_from_slice(s),
            _ => unreachable!("snapshot type matches cache type"),
        }
    }
    /// Values `off..off + n` as little-endian bytes, appended to `out`.
    pub(super) fn read_bytes(&self, off: usize, n: usize, out: &mut Vec<u8>) {
        match self {
            KvData::F32(d) => d[off..off + n]
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            KvData::F16(d) => d[off..off + n]
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_bits().to_le_bytes())),
            KvData::Bf16(d) => d[off..off + n]
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_bits().to_le_bytes())),
        }
    }
    /// Overwrite values from `off` with little-endian `bytes` of this element type.
    pub(super) fn write_bytes(&mut self, off: usize, bytes: &[u8]) {
        match self {
            KvData::F32(d) => {
                for (x, b) in d[off..].iter_mut().zip(bytes.chunks_exact(4)) {
                    *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }
            KvData::F16(d) => {
                for (x, b) in d[off..].iter_mut().zip(bytes.chunks_exact(2)) {
                    *x = f16::from_bits(u16::from_le_bytes([b[0], b[1]]));
                }
            }
            KvData::Bf16(d) => {
                for (x, b) in d[off..].iter_mut().zip(bytes.chunks_exact(2)) {
                    *x = bf16::from_bits(u16::from_le_bytes([b[0], b[1]]));
                }
            }
        }
    }
    pub(super) fn ty(&self) -> KvType {
        match self {
            KvData::F32(_) => KvType::F32,
            KvData::F16(_) => KvType::F16,
            KvData::Bf16(_) => KvType::Bf16,
        }
    }
    pub(super) fn bytes(&self) -> usize {
        match self {
            KvData::F32(d) => d.len() * 4,
            KvData::F16(d) => d.len() * 2,
            KvData::Bf16(d) => d.len() * 2,
        }
    }
    pub(super) fn deep_clone(&self) -> KvData {
        match self {
            KvData::F32(d) => KvData::F32(d.clone()),
            KvData::F16(d) => KvData::F16(d.clone()),
            KvData::Bf16(d) => KvData::Bf16(d.clone()),
        }
    }
}

pub(super) struct KvLayer {
    pub(super) spec: KvLayerSpec,
    pub(super) k: KvData,
    pub(super) v: KvData,
}

/// Per-layer K/V rings.
pub struct CpuKv {
    pub(super) layers: Vec<KvLayer>,
}

/// Saved sliding-window slots: (layer, first position, K rows, V rows).
pub struct CpuKvSnapshot {
    pub(super) saved: Vec<(usize, usize, KvData, KvData)>,
}

pub(super) fn concat(parts: Vec<KvData>) -> KvData {
    let mut it = parts.into_iter();
    let Some(first) = it.next() else {
        return KvData::F32(Vec::new());
    };
    match first {
        KvData::F32(mut v) => {
            for p in it {
                if let KvData::F32(x) = p {
                    v.extend_from_slice(&x)
                }
            }
            KvData::F32(v)
        }
        KvData::F16(mut v) => {
            for p in it {
                if let KvData::F16(x) = p {
                    v.extend_from_slice(&x)
                }
            }
            KvData::F16(v)
        }
        KvData::Bf16(mut v) => {
            for p in it {
                if let KvData::Bf16(x) = p {
                    v.extend_from_slice(&x)
                }
            }
            KvData::Bf16(v)
        }
    }
}

impl KvData {
    pub(super) fn len_elems(&self) -> usize {
        match self {
            KvData::F32(d) => d.len(),
            KvData::F16(d) => d.len(),
            KvData::Bf16(d) => d.len(),
        }
    }
    pub(super) fn slice(&self, off: usize, n: usize) -> KvData {
        self.clone_range(off, n)
    }
}
