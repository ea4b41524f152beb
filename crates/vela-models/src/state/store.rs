//! Storage of the state kinds the backend's K/V cache does not hold ([`LayerState::Recurrent`]
//! and [`LayerState::Blocks`]), with the same capabilities as the cache: checkpoint, restore,
//! fork, and rollback within [`LayerState::rollback_limit`] without any copy.
//!
//! - **Recurrent**: `snapshots + 1` slots; the state after the first `k` positions of the
//!   sequence lives in slot `k % (snapshots + 1)`, and slot `k = 0` holds zeros once a forward
//!   starts at position 0 ([`ExtraState::begin`]). A step at positions `k..k+n` reads
//!   [`ExtraState::recurrent`]`(layer, k)` and writes the slots of `k+1..=k+n` (at least the
//!   last one; every one it can, so that speculative verification can keep any prefix). Dropping
//!   up to `snapshots` trailing positions is then free: the slot of the kept length still holds
//!   its state.
//! - **Blocks**: `rows` holds one row per complete block of `ratio` positions (block `b` in row
//!   `b`, written once the block completes); `raw` is a ring of `2·ratio + max_batch` raw rows
//!   (position `p` in slot `p % raw_slots`), from which the open block is pooled. Dropping up to
//!   `max_batch` positions keeps the raw rows of the new open block in the ring.
//!
//! Values are f32 on the backend. Checkpoints copy to host memory: a recurrent layer's current
//! slot and a blocks layer's raw ring (complete block rows are append-only, as full K/V is).

use super::{LayerState, StateLayout};
use anyhow::{bail, Result};
use vela_compute::Backend;

/// One layer's storage.
enum Store<B: Backend> {
    /// The layer keeps nothing here (K/V layers live in the backend cache).
    None,
    Recurrent {
        slots: Vec<B::Buf>,
        floats: usize,
    },
    Blocks {
        rows: B::Buf,
        raw: B::Buf,
        width: usize,
        ratio: usize,
        raw_width: usize,
        n_rows: usize,
        raw_slots: usize,
    },
}

/// The recurrent and block storage of one sequence, allocated from its [`StateLayout`].
pub struct ExtraState<B: Backend> {
    layers: Vec<Store<B>>,
    /// Zeros as long as the largest recurrent state (the state before position 0).
    zeros: Option<B::Buf>,
}

/// A checkpoint of an [`ExtraState`] (host copies; see the module docs).
pub struct ExtraSnapshot {
    n_past: usize,
    /// Per layer: the recurrent slot of `n_past`, or the blocks layer's raw ring.
    saved: Vec<Option<Vec<f32>>>,
}

impl ExtraSnapshot {
    /// Bytes copied out of the state.
    pub fn bytes(&self) -> usize {
        self.saved.iter().flatten().map(|v| v.len() * 4).sum()
    }
}

/// An [`ExtraState`]'s contents for a sequence of `n_past` positions (the prefix cache's
/// files): per layer, what it needs to go on from there and to roll back as the original could.
#[derive(Clone, Debug, PartialEq)]
pub struct ExtraExport {
    pub n_past: usize,
    pub layers: Vec<ExtraLayerExport>,
}

#[derive(Clone, Debug, PartialEq)]
pub enum ExtraLayerExport {
    None,
    /// Every slot, in slot order (the state after k positions is slot k % slots).
    Recurrent {
        slots: Vec<Vec<f32>>,
    },
    /// The rows of the complete blocks, and the raw rows of positions `raw_first..n_past` by
    /// position.
    Blocks {
        rows: Vec<f32>,
        raw_first: usize,
        raw: Vec<f32>,
    },
}

impl ExtraExport {
    /// Bytes of values.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|l| match l {
                ExtraLayerExport::None => 0,
                ExtraLayerExport::Recurrent { slots } => slots.iter().map(|s| s.len() * 4).sum(),
                ExtraLayerExport::Blocks { rows, raw, .. } => (rows.len() + raw.len()) * 4,
            })
            .sum()
    }
}

/// A blocks layer's buffers (see the module docs).
pub struct BlocksMut<'a, B: Backend> {
    /// `[n_blocks, width]`: row `b` = block `b` (positions `b·ratio..(b+1)·ratio`).
    pub rows: &'a mut B::Buf,
    /// `[raw_slots, raw_width]`: position `p` in slot `p % raw_slots`.
    pub raw: &'a mut B::Buf,
    pub raw_slots: usize,
}

impl<B: Backend> ExtraState<B> {
    /// Storage for every recurrent and blocks layer of `layout`, for `n_ctx` positions evaluated
    /// `max_batch` at a time.
    pub fn new(be: &B, layout: &StateLayout, n_ctx: usize, max_batch: usize) -> Self {
        let mut max_floats = 0;
        let layers = layout
            .layers
            .iter()
            .map(|l| match *l {
                LayerState::Recurrent { floats, snapshots } => {
                    max_floats = max_floats.max(floats);
                    Store::Recurrent {
                        slots: (0..=snapshots).map(|_| be.alloc(floats.max(1))).collect(),
                        floats,
                    }
                }
                LayerState::Blocks {
                    width,
                    ratio,
                    raw_width,
                } => {
                    let ratio = ratio.max(1);
                    let n_rows = n_ctx.div_ceil(ratio);
                    let raw_slots = (2 * ratio + max_batch).min(n_ctx.max(1));
                    Store::Blocks {
                        rows: be.alloc((n_rows * width).max(1)),
                        raw: be.alloc((raw_slots * raw_width).max(1)),
                        width,
                        ratio,
                        raw_width,
                        n_rows,
                        raw_slots,
                    }
                }
                _ => Store::None,
            })
            .collect();
        let zeros = (max_floats > 0).then(|| {
            let mut z = be.alloc(max_floats);
            be.write(&mut z, &vec![0f32; max_floats]);
            z
        });
        ExtraState { layers, zeros }
    }

    /// Whether some layer keeps state here.
    pub fn is_empty(&self) -> bool {
        self.layers.iter().all(|s| matches!(s, Store::None))
    }

    /// Before a forward pass whose first position is `first_pos`: a sequence (re)starting at 0
    /// starts every recurrent layer from zeros.
    pub fn begin(&mut self, be: &B, first_pos: usize) {
        if first_pos != 0 {
            return;
        }
        let Some(z) = &self.zeros else { return };
        for s in &mut self.layers {
            if let Store::Recurrent { slots, floats } = s {
                be.copy_rows(z, 0, 1, *floats, &mut slots[0], 0);
            }
        }
    }

    /// Slot count of a recurrent layer.
    fn recurrent_slots(&self, layer: usize) -> Result<usize> {
        match self.layers.get(layer) {
            Some(Store::Recurrent { slots, .. }) => Ok(slots.len()),
            _ => bail!("layer {layer} keeps no recurrent state"),
        }
    }

    /// The recurrent state of `layer` after the first `k` positions.
    pub fn recurrent(&self, layer: usize, k: usize) -> Result<&B::Buf> {
        let n = self.recurrent_slots(layer)?;
        match &self.layers[layer] {
            Store::Recurrent { slots, .. } => Ok(&slots[k % n]),
            _ => unreachable!("checked above"),
        }
    }

    /// The state after `k` positions of `layer`, for writing (a step writes each position's
    /// state it produces).
    pub fn recurrent_mut(&mut self, layer: usize, k: usize) -> Result<&mut B::Buf> {
        let n = self.recurrent_slots(layer)?;
        match &mut self.layers[layer] {
            Store::Recurrent { slots, .. } => Ok(&mut slots[k % n]),
            _ => unreachable!("checked above"),
        }
    }

    /// Copy the state after `from` positions of a recurrent layer to the slot of `to`
    /// positions (a step then advances it there, keeping the earlier slot for rollback).
    pub fn copy_recurrent(&mut self, be: &B, layer: usize, from: usize, to: usize) -> Result<()> {
        let n = self.recurrent_slots(layer)?;
        let (a, b) = (from % n, to % n);
        if a == b {
            return Ok(());
        }
        match &mut self.layers[layer] {
            Store::Recurrent { slots, floats } => {
                let [src, dst] = slots
                    .get_disjoint_mut([a, b])
                    .expect("distinct slots in range");
                be.copy_rows(src, 0, 1, *floats, dst, 0);
                Ok(())
            }
            _ => unreachable!("checked above"),
        }
    }

    /// The buffers of a blocks layer.
    pub fn blocks_mut(&mut self, layer: usize) -> Result<BlocksMut<'_, B>> {
        match self.layers.get_mut(layer) {
            Some(Store::Blocks {
                rows,
                raw,
                raw_slots,
                ..
            }) => Ok(BlocksMut {
                rows,
                raw,
                raw_slots: *raw_slots,
            }),
            _ => bail!("layer {layer} keeps no blocks"),
        }
    }

    /// The block rows of a blocks layer, for reading.
    pub fn block_rows(&self, layer: usize) -> Result<&B::Buf> {
        match self.layers.get(layer) {
            Some(Store::Blocks { rows, .. }) => Ok(rows),
            _ => bail!("layer {layer} keeps no blocks"),
        }
    }

    /// The raw ring of a blocks layer and its number of slots, for reading.
    pub fn block_raw(&self, layer: usize) -> Result<(&B::Buf, usize)> {
        match self.layers.get(layer) {
            Some(Store::Blocks { raw, raw_slots, .. }) => Ok((raw, *raw_slots)),
            _ => bail!("layer {layer} keeps no blocks"),
        }
    }

    /// Save what later writes could overwrite in a state holding positions `0..n_past`.
    pub fn checkpoint(&self, be: &B, n_past: usize) -> ExtraSnapshot {
        let saved = self
            .layers
            .iter()
            .map(|s| match s {
                Store::None => None,
                Store::Recurrent { slots, floats } => {
                    let mut v = vec![0f32; *floats];
                    be.read(&slots[n_past % slots.len()], &mut v);
                    Some(v)
                }
                Store::Blocks {
                    raw,
                    raw_width,
                    raw_slots,
                    ..
                } => {
                    let mut v = vec![0f32; raw_slots * raw_width];
                    be.read(raw, &mut v);
                    Some(v)
                }
            })
            .collect();
        ExtraSnapshot { n_past, saved }
    }

    /// Undo every write made since `snap` (positions from its `n_past` on become invalid).
    pub fn restore(&mut self, be: &B, snap: &ExtraSnapshot) -> Result<()> {
        if snap.saved.len() != self.layers.len() {
            bail!("checkpoint belongs to a state of another layout");
        }
        for (s, v) in self.layers.iter_mut().zip(&snap.saved) {
            match (s, v) {
                (Store::None, None) => {}
                (Store::Recurrent { slots, floats }, Some(v)) if v.len() == *floats => {
                    let n = slots.len();
                    be.write(&mut slots[snap.n_past % n], v);
                }
                (
                    Store::Blocks {
                        raw,
                        raw_width,
                        raw_slots,
                        ..
                    },
                    Some(v),
                ) if v.len() == *raw_slots * *raw_width => be.write(raw, v),
                _ => bail!("checkpoint belongs to a state of another layout"),
            }
        }
        Ok(())
    }

    /// The contents for a sequence of `n_past` positions ([`ExtraExport`]).
    pub fn export(&self, be: &B, n_past: usize) -> ExtraExport {
        let layers = self
            .layers
            .iter()
            .map(|s| match s {
                Store::None => ExtraLayerExport::None,
                Store::Recurrent { slots, floats } => ExtraLayerExport::Recurrent {
                    slots: slots
                        .iter()
                        .map(|b| {
                            let mut v = vec![0f32; *floats];
                            be.read(b, &mut v);
                            v
                        })
                        .collect(),
                },
                Store::Blocks {
                    rows,
                    raw,
                    width,
                    ratio,
                    raw_width,
                    raw_slots,
                    ..
                } => {
                    let mut r = vec![0f32; n_past / ratio * width];
                    be.read(rows, &mut r);
                    let mut ring = vec![0f32; raw_slots * raw_width];
                    be.read(raw, &mut ring);
                    let raw_first = n_past.saturating_sub(*raw_slots);
                    let mut out = Vec::with_capacity((n_past - raw_first) * raw_width);
                    for p in raw_first..n_past {
                        let slot = p % raw_slots;
                        out.extend_from_slice(&ring[slot * raw_width..(slot + 1) * raw_width]);
                    }
                    ExtraLayerExport::Blocks {
                        rows: r,
                        raw_first,
                        raw: out,
                    }
                }
            })
            .collect();
        ExtraExport { n_past, layers }
    }

    /// Write an export back (a state of the same layout; another context or batch size may
    /// do when it holds the positions). Checks everything before writing anything.
    pub fn import(&mut self, be: &B, e: &ExtraExport) -> Result<()> {
        if e.layers.len() != self.layers.len() {
            bail!("the saved state has another layout");
        }
        for (i, (s, x)) in self.layers.iter().zip(&e.layers).enumerate() {
            let ok = match (s, x) {
                (Store::None, ExtraLayerExport::None) => true,
                (Store::Recurrent { slots: a, floats }, ExtraLayerExport::Recurrent { slots }) => {
                    a.len() == slots.len() && slots.iter().all(|v| v.len() == *floats)
                }
                (
                    Store::Blocks {
                        width,
                        ratio,
                        raw_width,
                        n_rows,
                        ..
                    },
                    ExtraLayerExport::Blocks {
                        rows,
                        raw_first,
                        raw,
                    },
                ) => {
                    let blocks = e.n_past / ratio;
                    // At least the raw rows of the open block and the one before it.
                    rows.len() == blocks * width
                        && blocks <= *n_rows
                        && *raw_first <= e.n_past.saturating_sub(2 * ratio)
                        && raw.len() == (e.n_past - raw_first) * raw_width
                }
                _ => false,
            };
            if !ok {
                bail!("layer {i}: the saved state does not fit this one");
            }
        }
        for (s, x) in self.layers.iter_mut().zip(&e.layers) {
            match (s, x) {
                (Store::Recurrent { slots: a, .. }, ExtraLayerExport::Recurrent { slots }) => {
                    for (b, v) in a.iter_mut().zip(slots) {
                        be.write(b, v);
                    }
                }
                (
                    Store::Blocks {
                        rows: r,
                        raw: ring,
                        raw_width,
                        raw_slots,
                        ..
                    },
                    ExtraLayerExport::Blocks {
                        rows,
                        raw_first,
                        raw,
                    },
                ) => {
                    if !rows.is_empty() {
                        be.write(r, rows);
                    }
                    let mut v = vec![0f32; *raw_slots * *raw_width];
                    let from = (*raw_first).max(e.n_past.saturating_sub(*raw_slots));
                    for p in from..e.n_past {
                        let (slot, j) = (p % *raw_slots, p - raw_first);
                        v[slot * *raw_width..(slot + 1) * *raw_width]
                            .copy_from_slice(&raw[j * *raw_width..(j + 1) * *raw_width]);
                    }
                    be.write(ring, &v);
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// An independent copy.
    pub fn fork(&self, be: &B) -> Self {
        let copy = |src: &B::Buf, len: usize| {
            let mut d = be.alloc(len.max(1));
            be.copy_rows(src, 0, 1, len, &mut d, 0);
            d
        };
        let layers = self
            .layers
            .iter()
            .map(|s| match s {
                Store::None => Store::None,
                Store::Recurrent { slots, floats } => Store::Recurrent {
                    slots: slots.iter().map(|b| copy(b, *floats)).collect(),
                    floats: *floats,
                },
                Store::Blocks {
                    rows,
                    raw,
                    width,
                    ratio,
                    raw_width,
                    n_rows,
                    raw_slots,
                } => Store::Blocks {
                    rows: copy(rows, n_rows * width),
                    raw: copy(raw, raw_slots * raw_width),
                    width: *width,
                    ratio: *ratio,
                    raw_width: *raw_width,
                    n_rows: *n_rows,
                    raw_slots: *raw_slots,
                },
            })
            .collect();
        let zeros = self.zeros.as_ref().map(|z| {
            let n = self
                .layers
                .iter()
                .map(|s| match s {
                    Store::Recurrent { floats, .. } => *floats,
                    _ => 0,
                })
                .max()
                .unwrap_or(0);
            copy(z, n)
        });
        ExtraState { layers, zeros }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.layers
            .iter()
            .map(|s| match s {
                Store::None => 0,
                Store::Recurrent { slots, floats } => slots.len() * floats * 4,
                Store::Blocks {
                    width,
                    raw_width,
                    n_rows,
                    raw_slots,
                    ..
                } => (n_rows * width + raw_slots * raw_width) * 4,
            })
            .sum()
    }
}

/// Rows `0..n` of `src` (`width` wide) into a ring of `slots` rows at positions `p0..p0 + n`
/// (position p in row p mod slots).
pub(crate) fn store_ring<B: Backend>(
    be: &B,
    src: &B::Buf,
    (n, width): (usize, usize),
    ring: &mut B::Buf,
    slots: usize,
    p0: usize,
) {
    let mut done = 0;
    while done < n {
        let slot = (p0 + done) % slots;
        let run = (slots - slot).min(n - done);
        be.copy_rows(src, done, run, width, ring, slot);
        done += run;
    }
}
