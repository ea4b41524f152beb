//! A K/V cache's rows as bytes, for the prefix cache's files: [`crate::Backend::kv_export`]
//! and [`crate::Backend::kv_import`]. Rows are listed by position, so a cache of another
//! capacity (another context size or batch size) can take them back: position p goes to slot
//! p % capacity of whichever cache imports it.

use crate::{KvLayerSpec, KvType};
use anyhow::{bail, Result};
use std::ops::{Deref, Range};
use std::sync::Arc;

/// Every layer's rows of the positions a cache holds for a sequence of `n_past` positions.
#[derive(Clone, Debug, PartialEq)]
pub struct KvExport {
    pub ty: KvType,
    pub n_past: usize,
    pub layers: Vec<KvLayerExport>,
}

/// One layer's K and V rows of positions `first..n_past` (in the cache's element type, little
/// endian), `k_row` and `v_row` bytes each.
#[derive(Clone, Debug, PartialEq)]
pub struct KvLayerExport {
    pub first: usize,
    pub k_row: usize,
    pub v_row: usize,
    pub k: KvBytes,
    pub v: KvBytes,
}

/// A layer's rows as bytes: owned (a cache's export) or a range of a shared buffer (a saved
/// file mapped into memory, imported without a copy).
#[derive(Clone)]
pub enum KvBytes {
    Owned(Vec<u8>),
    Shared(Arc<dyn AsRef<[u8]> + Send + Sync>, Range<usize>),
}

impl Deref for KvBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            KvBytes::Owned(v) => v,
            KvBytes::Shared(b, r) => &(**b).as_ref()[r.clone()],
        }
    }
}

impl From<Vec<u8>> for KvBytes {
    fn from(v: Vec<u8>) -> Self {
        KvBytes::Owned(v)
    }
}

impl PartialEq for KvBytes {
    fn eq(&self, o: &Self) -> bool {
        **self == **o
    }
}

impl std::fmt::Debug for KvBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KvBytes({} bytes)", self.len())
    }
}

impl KvExport {
    /// Bytes of row data.
    pub fn bytes(&self) -> usize {
        self.layers.iter().map(|l| l.k.len() + l.v.len()).sum()
    }
}

/// The positions a layer of this spec holds after `n_past` positions: all of them for a full
/// layer, the last `capacity` for a ring. A full layer smaller than the sequence is a
/// placeholder (a layer whose state lives elsewhere) and holds none.
pub fn held_from(spec: &KvLayerSpec, n_past: usize) -> usize {
    match spec.window {
        None if n_past > spec.capacity => n_past,
        None => 0,
        Some(_) => n_past.saturating_sub(spec.capacity),
    }
}

/// Row bytes of K and V of a layer of this spec.
pub fn row_bytes(spec: &KvLayerSpec, ty: KvType) -> (usize, usize) {
    (
        spec.n_head_kv * spec.head_dim_k * ty.bytes(),
        spec.n_head_kv * spec.head_dim_v * ty.bytes(),
    )
}

/// Contiguous runs of positions `first..n_past` in a ring of `capacity` slots: (index of the
/// first position of the run within `first..`, its slot, the run's length).
pub fn slot_runs(first: usize, n_past: usize, capacity: usize) -> Vec<(usize, usize, usize)> {
    let mut runs = Vec::new();
    let mut p = first;
    while p < n_past {
        let slot = p % capacity;
        let len = (capacity - slot).min(n_past - p);
        runs.push((p - first, slot, len));
        p += len;
    }
    runs
}

/// Check an export against the cache that imports it (same element type, layers and row
/// widths; full layers must hold every position) and say, per layer, which positions it takes:
/// `first..n_past` of the export, at least the ring's last `capacity`.
pub fn import_plan(e: &KvExport, specs: &[&KvLayerSpec], ty: KvType) -> Result<Vec<usize>> {
    if e.ty != ty {
        bail!("the saved cache holds {:?} values, this one {:?}", e.ty, ty);
    }
    if e.layers.len() != specs.len() {
        bail!(
            "the saved cache has {} layers, this one {}",
            e.layers.len(),
            specs.len()
        );
    }
    let mut from = Vec::with_capacity(specs.len());
    for (i, (l, spec)) in e.layers.iter().zip(specs).enumerate() {
        let (kr, vr) = row_bytes(spec, ty);
        let n = e.n_past.saturating_sub(l.first);
        if l.k_row != kr || l.v_row != vr || l.k.len() != n * kr || l.v.len() != n * vr {
            bail!("layer {i}: the saved rows do not match this cache's layout");
        }
        if l.first > e.n_past {
            bail!("layer {i}: first position past the sequence");
        }
        let keep = l.first.max(e.n_past.saturating_sub(spec.capacity));
        match spec.window {
            None if l.first != held_from(spec, e.n_past) => {
                bail!(
                    "layer {i}: {} positions do not fit a context of {}",
                    e.n_past,
                    spec.capacity
                )
            }
            Some(w) if l.first > e.n_past.saturating_sub(w) => {
                bail!("layer {i}: the saved window is incomplete")
            }
            _ => {}
        }
        from.push(keep);
    }
    Ok(from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_wrap_around_the_ring() {
        assert_eq!(slot_runs(0, 5, 8), vec![(0, 0, 5)]);
        assert_eq!(slot_runs(6, 11, 8), vec![(0, 6, 2), (2, 0, 3)]);
        assert_eq!(slot_runs(3, 3, 8), vec![]);
        assert_eq!(slot_runs(0, 16, 8), vec![(0, 0, 8), (8, 0, 8)]);
    }
}
