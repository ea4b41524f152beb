//! The CPU backend's K/V storage: per-layer rings of f32, f16 or bf16 values kept in blocks of
//! [`BLOCK_SLOTS`] slots that exist only once reserved (paged: a sequence holds memory for the
//! positions it has, not for its whole context), their snapshots, and allocations that report
//! failure instead of aborting.

use super::simd;
use crate::{KvLayerSpec, KvType};
use anyhow::Result;
use half::{bf16, f16};

/// Slots (positions) per block of storage.
pub(super) const BLOCK_SLOTS: usize = 64;

/// Types whose all-zero bit pattern is the value 0.0 (so a zeroed allocation is a valid vector).
pub(super) trait Elem: Copy + Send + Sync + 'static {
    const ZERO: Self;
}
impl Elem for f32 {
    const ZERO: f32 = 0.0;
}
impl Elem for f16 {
    const ZERO: f16 = f16::ZERO;
}
impl Elem for bf16 {
    const ZERO: bf16 = bf16::ZERO;
}

/// `vec![0; n]` that reports an allocation failure as an error instead of aborting. Zeroed pages
/// come from the allocator (calloc), so untouched parts of a large block cost no memory.
fn zeroed_vec<T: Elem>(n: usize) -> Result<Vec<T>> {
    if n == 0 {
        return Ok(Vec::new());
    }
    let layout = std::alloc::Layout::array::<T>(n).map_err(|_| {
        anyhow::anyhow!("a KV cache of {n} values is larger than the address space")
    })?;
    // SAFETY: `layout` has a non-zero size (n > 0, T is a 2- or 4-byte float).
    let p = unsafe { std::alloc::alloc_zeroed(layout) } as *mut T;
    if p.is_null() {
        return Err(crate::OutOfMemory(format!(
            "could not allocate {:.2} GiB of host memory for the KV cache: use a smaller --ctx \
             (or --kv-type f16)",
            layout.size() as f64 / (1u64 << 30) as f64
        ))
        .into());
    }
    // SAFETY: `p` was allocated by the global allocator with the layout of `[T; n]`, and every
    // element is initialized: all-zero bits are 0.0 for every `Elem` type.
    Ok(unsafe { Vec::from_raw_parts(p, n, n) })
}

/// Available host memory (`MemAvailable` of /proc/meminfo) in bytes; None where unknown.
pub(super) fn host_memory_available() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = s.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// One layer's K or V ring of `slots` slots × `row` values, addressed by value offset
/// (`slot * row + i`), stored in blocks of [`BLOCK_SLOTS`] slots. A block is allocated by
/// [`Pages::reserve`] (or, for the few writes that do not follow one, by the write itself) and
/// freed by [`Pages::release`]; reading a block that does not exist gives zeros.
pub(super) struct Pages<T> {
    row: usize,
    slots: usize,
    blocks: Vec<Option<Box<[T]>>>,
    /// Values in the allocated blocks.
    held: usize,
    /// Zeros (one row, at most 65,536 values): what a missing block reads as.
    zero: Box<[T]>,
}

impl<T: Elem> Pages<T> {
    pub(super) fn new(slots: usize, row: usize) -> Self {
        Pages {
            row,
            slots,
            blocks: (0..slots.div_ceil(BLOCK_SLOTS)).map(|_| None).collect(),
            held: 0,
            zero: vec![T::ZERO; row.min(1 << 16)].into_boxed_slice(),
        }
    }

    /// A ring holding `data` (`slots * row` values), every block allocated.
    #[cfg(test)]
    pub(super) fn from_values(row: usize, data: &[T]) -> Self {
        let mut p = Pages::new(data.len() / row, row);
        p.reserve(p.slots).unwrap();
        p.write_with(0, data.len(), |dst, i| {
            dst.copy_from_slice(&data[i..i + dst.len()])
        });
        p
    }

    fn block_values(&self, b: usize) -> usize {
        BLOCK_SLOTS.min(self.slots - b * BLOCK_SLOTS) * self.row
    }

    /// The blocks a range of values spans: (block, offset in it, values, offset in the range).
    /// An iterator, not a list: `kv_store` writes every token's row of every layer through it.
    fn segments(&self, off: usize, n: usize) -> impl Iterator<Item = (usize, usize, usize, usize)> {
        let (bv, row, slots) = (BLOCK_SLOTS * self.row, self.row, self.slots);
        let mut done = 0;
        std::iter::from_fn(move || {
            if done >= n {
                return None;
            }
            let at = off + done;
            let (b, i) = (at / bv, at % bv);
            let block = BLOCK_SLOTS.min(slots - b * BLOCK_SLOTS) * row;
            let take = (n - done).min(block - i);
            let seg = (b, i, take, done);
            done += take;
            Some(seg)
        })
    }

    /// Allocate the blocks of slots `0..min(slots, capacity)`.
    pub(super) fn reserve(&mut self, slots: usize) -> Result<()> {
        let nb = slots.min(self.slots).div_ceil(BLOCK_SLOTS);
        for b in 0..nb {
            if self.blocks[b].is_none() {
                self.blocks[b] = Some(zeroed_vec(self.block_values(b))?.into_boxed_slice());
                self.held += self.block_values(b);
            }
        }
        Ok(())
    }

    /// Free the blocks whose slots all lie at or after `keep` (a ring that has wrapped keeps
    /// everything: callers pass `keep` ≥ capacity then).
    pub(super) fn release(&mut self, keep: usize) {
        for b in keep.div_ceil(BLOCK_SLOTS)..self.blocks.len() {
            if self.blocks[b].take().is_some() {
                self.held -= self.block_values(b);
            }
        }
    }

    /// Values `at..at + len` of slot `slot`'s row (`len` ≤ the row).
    #[inline]
    pub(super) fn get(&self, slot: usize, at: usize, len: usize) -> &[T] {
        match &self.blocks[slot / BLOCK_SLOTS] {
            Some(x) => &x[(slot % BLOCK_SLOTS) * self.row + at..][..len],
            None => &self.zero[..len],
        }
    }

    /// Call `f(dst, i)` for each block's part of values `off..off + n` (`i`: offset in the
    /// range), allocating missing blocks.
    fn write_with(&mut self, off: usize, n: usize, mut f: impl FnMut(&mut [T], usize)) {
        for (b, i, take, at) in self.segments(off, n) {
            if self.blocks[b].is_none() {
                let v = zeroed_vec(self.block_values(b))
                    .unwrap_or_else(|e| panic!("KV block allocation: {e:#}"));
                self.blocks[b] = Some(v.into_boxed_slice());
                self.held += self.block_values(b);
            }
            let blk = self.blocks[b].as_mut().expect("allocated above");
            f(&mut blk[i..i + take], at);
        }
    }

    fn read_with(&self, off: usize, n: usize, mut f: impl FnMut(&[T])) {
        for (b, i, take, _) in self.segments(off, n) {
            match &self.blocks[b] {
                Some(x) => f(&x[i..i + take]),
                None => {
                    let z = vec![T::ZERO; take];
                    f(&z)
                }
            }
        }
    }

    fn values(&self, off: usize, n: usize) -> Vec<T> {
        let mut out = Vec::with_capacity(n);
        self.read_with(off, n, |s| out.extend_from_slice(s));
        out
    }

    fn bytes(&self) -> usize {
        debug_assert_eq!(
            self.held,
            self.blocks.iter().flatten().map(|b| b.len()).sum::<usize>()
        );
        self.held * std::mem::size_of::<T>()
    }
}

impl<T: Elem> Clone for Pages<T> {
    fn clone(&self) -> Self {
        Pages {
            row: self.row,
            slots: self.slots,
            blocks: self.blocks.clone(),
            held: self.held,
            zero: self.zero.clone(),
        }
    }
}

/// A layer's K or V ring in its element type.
pub(super) enum KvData {
    F32(Pages<f32>),
    F16(Pages<f16>),
    Bf16(Pages<bf16>),
}

/// Values copied out of a ring (a checkpoint's saved window).
pub(super) enum Flat {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
}

impl Flat {
    pub(super) fn len(&self) -> usize {
        match self {
            Flat::F32(d) => d.len(),
            Flat::F16(d) => d.len(),
            Flat::Bf16(d) => d.len(),
        }
    }
}

impl KvData {
    /// A ring of `slots` slots × `row` values; no memory is taken until [`KvData::reserve`].
    pub(super) fn new(ty: KvType, slots: usize, row: usize) -> KvData {
        match ty {
            KvType::F32 => KvData::F32(Pages::new(slots, row)),
            KvType::F16 => KvData::F16(Pages::new(slots, row)),
            KvType::Bf16 => KvData::Bf16(Pages::new(slots, row)),
        }
    }
    /// Storage for slots `0..slots` (capped by the capacity), or an error when the allocator
    /// refuses (a huge context must not abort the process).
    pub(super) fn reserve(&mut self, slots: usize) -> Result<()> {
        match self {
            KvData::F32(p) => p.reserve(slots),
            KvData::F16(p) => p.reserve(slots),
            KvData::Bf16(p) => p.reserve(slots),
        }
    }
    pub(super) fn release(&mut self, keep: usize) {
        match self {
            KvData::F32(p) => p.release(keep),
            KvData::F16(p) => p.release(keep),
            KvData::Bf16(p) => p.release(keep),
        }
    }
    pub(super) fn write(&mut self, off: usize, src: &[f32]) {
        match self {
            KvData::F32(p) => p.write_with(off, src.len(), |d, i| {
                d.copy_from_slice(&src[i..i + d.len()])
            }),
            KvData::F16(p) => p.write_with(off, src.len(), |d, i| {
                simd::f32_to_f16(&src[i..i + d.len()], d)
            }),
            KvData::Bf16(p) => p.write_with(off, src.len(), |d, i| {
                simd::f32_to_bf16(&src[i..i + d.len()], d)
            }),
        }
    }
    pub(super) fn clone_range(&self, off: usize, n: usize) -> Flat {
        match self {
            KvData::F32(p) => Flat::F32(p.values(off, n)),
            KvData::F16(p) => Flat::F16(p.values(off, n)),
            KvData::Bf16(p) => Flat::Bf16(p.values(off, n)),
        }
    }
    /// Write `n` values of `src` from its offset `from` at `off`.
    pub(super) fn copy_from(&mut self, off: usize, src: &Flat, from: usize, n: usize) {
        match (self, src) {
            (KvData::F32(p), Flat::F32(s)) => {
                p.write_with(off, n, |d, i| d.copy_from_slice(&s[from + i..][..d.len()]))
            }
            (KvData::F16(p), Flat::F16(s)) => {
                p.write_with(off, n, |d, i| d.copy_from_slice(&s[from + i..][..d.len()]))
            }
            (KvData::Bf16(p), Flat::Bf16(s)) => {
                p.write_with(off, n, |d, i| d.copy_from_slice(&s[from + i..][..d.len()]))
            }
            _ => unreachable!("snapshot type matches cache type"),
        }
    }
    /// Values `off..off + n` as little-endian bytes, appended to `out`.
    pub(super) fn read_bytes(&self, off: usize, n: usize, out: &mut Vec<u8>) {
        match self {
            KvData::F32(p) => p.read_with(off, n, |s| {
                s.iter()
                    .for_each(|x| out.extend_from_slice(&x.to_le_bytes()))
            }),
            KvData::F16(p) => p.read_with(off, n, |s| {
                s.iter()
                    .for_each(|x| out.extend_from_slice(&x.to_bits().to_le_bytes()))
            }),
            KvData::Bf16(p) => p.read_with(off, n, |s| {
                s.iter()
                    .for_each(|x| out.extend_from_slice(&x.to_bits().to_le_bytes()))
            }),
        }
    }
    /// Overwrite values from `off` with little-endian `bytes` of this element type.
    pub(super) fn write_bytes(&mut self, off: usize, bytes: &[u8]) {
        match self {
            KvData::F32(p) => p.write_with(off, bytes.len() / 4, |d, i| {
                for (x, b) in d.iter_mut().zip(bytes[i * 4..].chunks_exact(4)) {
                    *x = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
                }
            }),
            KvData::F16(p) => p.write_with(off, bytes.len() / 2, |d, i| {
                for (x, b) in d.iter_mut().zip(bytes[i * 2..].chunks_exact(2)) {
                    *x = f16::from_bits(u16::from_le_bytes([b[0], b[1]]));
                }
            }),
            KvData::Bf16(p) => p.write_with(off, bytes.len() / 2, |d, i| {
                for (x, b) in d.iter_mut().zip(bytes[i * 2..].chunks_exact(2)) {
                    *x = bf16::from_bits(u16::from_le_bytes([b[0], b[1]]));
                }
            }),
        }
    }
    pub(super) fn ty(&self) -> KvType {
        match self {
            KvData::F32(_) => KvType::F32,
            KvData::F16(_) => KvType::F16,
            KvData::Bf16(_) => KvType::Bf16,
        }
    }
    /// Bytes of the blocks allocated.
    pub(super) fn bytes(&self) -> usize {
        match self {
            KvData::F32(p) => p.bytes(),
            KvData::F16(p) => p.bytes(),
            KvData::Bf16(p) => p.bytes(),
        }
    }
    /// A copy of the allocated blocks.
    pub(super) fn deep_clone(&self) -> KvData {
        match self {
            KvData::F32(p) => KvData::F32(p.clone()),
            KvData::F16(p) => KvData::F16(p.clone()),
            KvData::Bf16(p) => KvData::Bf16(p.clone()),
        }
    }
}

pub(super) struct KvLayer {
    pub(super) spec: crate::KvLayerSpec,
    pub(super) k: KvData,
    pub(super) v: KvData,
}

impl KvLayer {
    /// Slots of this layer's ring that positions `0..n_past` occupy.
    pub(super) fn slots_for(&self, n_past: usize) -> usize {
        n_past.min(self.spec.capacity)
    }
}

/// Per-layer K/V rings.
pub struct CpuKv {
    pub(super) layers: Vec<KvLayer>,
}

/// Saved sliding-window slots: (layer, first position, K rows, V rows).
pub struct CpuKvSnapshot {
    pub(super) saved: Vec<(usize, usize, Flat, Flat)>,
}

/// Values of several ranges in one [`Flat`].
pub(super) fn concat(parts: Vec<Flat>) -> Flat {
    let mut it = parts.into_iter();
    let Some(first) = it.next() else {
        return Flat::F32(Vec::new());
    };
    match first {
        Flat::F32(mut v) => {
            it.for_each(|p| {
                if let Flat::F32(x) = p {
                    v.extend_from_slice(&x)
                }
            });
            Flat::F32(v)
        }
        Flat::F16(mut v) => {
            it.for_each(|p| {
                if let Flat::F16(x) = p {
                    v.extend_from_slice(&x)
                }
            });
            Flat::F16(v)
        }
        Flat::Bf16(mut v) => {
            it.for_each(|p| {
                if let Flat::Bf16(x) = p {
                    v.extend_from_slice(&x)
                }
            });
            Flat::Bf16(v)
        }
    }
}

/// The K/V operations of [`crate::Backend`] for the CPU backend (each one's contract is the
/// trait method's).
impl CpuKv {
    pub(super) fn new(layers: &[KvLayerSpec], ty: KvType) -> CpuKv {
        let mut out = Vec::with_capacity(layers.len());
        for spec in layers {
            let wk = spec.n_head_kv * spec.head_dim_k;
            let wv = spec.n_head_kv * spec.head_dim_v;
            out.push(KvLayer {
                spec: spec.clone(),
                k: KvData::new(ty, spec.capacity, wk),
                v: KvData::new(ty, spec.capacity, wv),
            });
        }
        CpuKv { layers: out }
    }

    pub(super) fn checkpoint(&self, n_past: usize) -> CpuKvSnapshot {
        let mut saved = Vec::new();
        for (li, l) in self.layers.iter().enumerate() {
            if l.spec.window.is_none() || n_past == 0 {
                continue;
            }
            let first = crate::window_start(n_past - 1, l.spec.window);
            let (wk, wv) = (
                l.spec.n_head_kv * l.spec.head_dim_k,
                l.spec.n_head_kv * l.spec.head_dim_v,
            );
            // Save slot by slot (the window may wrap around the ring).
            let mut ks = Vec::new();
            let mut vs = Vec::new();
            for p in first..n_past {
                let s = p % l.spec.capacity;
                ks.push(l.k.clone_range(s * wk, wk));
                vs.push(l.v.clone_range(s * wv, wv));
            }
            saved.push((li, first, concat(ks), concat(vs)));
        }
        CpuKvSnapshot { saved }
    }

    pub(super) fn restore(&mut self, snap: &CpuKvSnapshot) {
        for (li, first, ks, vs) in &snap.saved {
            let l = &mut self.layers[*li];
            let (wk, wv) = (
                l.spec.n_head_kv * l.spec.head_dim_k,
                l.spec.n_head_kv * l.spec.head_dim_v,
            );
            let n = ks.len() / wk;
            for i in 0..n {
                let s = (first + i) % l.spec.capacity;
                l.k.copy_from(s * wk, ks, i * wk, wk);
                l.v.copy_from(s * wv, vs, i * wv, wv);
            }
        }
    }

    pub(super) fn deep_clone(&self) -> CpuKv {
        CpuKv {
            layers: self
                .layers
                .iter()
                .map(|l| KvLayer {
                    spec: l.spec.clone(),
                    k: l.k.deep_clone(),
                    v: l.v.deep_clone(),
                })
                .collect(),
        }
    }

    pub(super) fn bytes(&self) -> usize {
        self.layers.iter().map(|l| l.k.bytes() + l.v.bytes()).sum()
    }

    pub(super) fn reserve(&mut self, n_past: usize) -> Result<()> {
        for l in &mut self.layers {
            let slots = l.slots_for(n_past);
            l.k.reserve(slots)?;
            l.v.reserve(slots)?;
        }
        Ok(())
    }

    pub(super) fn release(&mut self, n_past: usize) {
        for l in &mut self.layers {
            // A ring that has wrapped holds live positions in every slot.
            if n_past < l.spec.capacity {
                l.k.release(n_past);
                l.v.release(n_past);
            }
        }
    }

    pub(super) fn export(&self, n_past: usize) -> crate::KvExport {
        use crate::kv_export::{held_from, slot_runs};
        let ty = self.layers.first().map_or(KvType::F32, |l| l.k.ty());
        let layers = self
            .layers
            .iter()
            .map(|l| {
                let first = held_from(&l.spec, n_past);
                let (wk, wv) = (
                    l.spec.n_head_kv * l.spec.head_dim_k,
                    l.spec.n_head_kv * l.spec.head_dim_v,
                );
                let (mut k, mut v) = (Vec::new(), Vec::new());
                for (_, slot, len) in slot_runs(first, n_past, l.spec.capacity) {
                    l.k.read_bytes(slot * wk, len * wk, &mut k);
                    l.v.read_bytes(slot * wv, len * wv, &mut v);
                }
                crate::KvLayerExport {
                    first,
                    k_row: wk * ty.bytes(),
                    v_row: wv * ty.bytes(),
                    k: k.into(),
                    v: v.into(),
                }
            })
            .collect();
        crate::KvExport { ty, n_past, layers }
    }

    pub(super) fn import(&mut self, e: &crate::KvExport) -> Result<()> {
        use crate::kv_export::{import_plan, slot_runs};
        let ty = self.layers.first().map_or(e.ty, |l| l.k.ty());
        let specs: Vec<&KvLayerSpec> = self.layers.iter().map(|l| &l.spec).collect();
        let from = import_plan(e, &specs, ty)?;
        self.reserve(e.n_past)?;
        for ((l, x), keep) in self.layers.iter_mut().zip(&e.layers).zip(from) {
            let (wk, wv) = (
                l.spec.n_head_kv * l.spec.head_dim_k,
                l.spec.n_head_kv * l.spec.head_dim_v,
            );
            let skip = keep - x.first;
            for (i, slot, len) in slot_runs(keep, e.n_past, l.spec.capacity) {
                let (r, n) = (skip + i, len);
                l.k.write_bytes(slot * wk, &x.k[r * x.k_row..(r + n) * x.k_row]);
                l.v.write_bytes(slot * wv, &x.v[r * x.v_row..(r + n) * x.v_row]);
            }
        }
        Ok(())
    }
}
