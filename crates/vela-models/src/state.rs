//! Sequence state as the model declares it: one [`LayerState`] per layer, gathered in a
//! [`StateLayout`]. The engine asks the layout, never the architecture, what a sequence costs and
//! what it can undo: its memory for a context ([`StateLayout::bytes`]), how many trailing
//! positions can be dropped without a checkpoint ([`StateLayout::rollback_limit`]), and so which
//! earlier positions a cached sequence can return to.
//!
//! Kinds and how each one rolls back:
//!
//! | kind | kept per sequence | drop the last n positions |
//! |---|---|---|
//! | [`LayerState::Kv`], no window | K/V rows of every position | always (later writes overwrite) |
//! | [`LayerState::Kv`], window w | a ring of w + max_batch slots | n ≤ max_batch (the ring's slack) |
//! | [`LayerState::Shared`] | nothing (reads another layer's K/V) | always |
//! | [`LayerState::Blocks`] | one row per `ratio` positions, raw rows of the open block | n ≤ max_batch (raw rows kept in a ring of 2·ratio + max_batch) |
//! | [`LayerState::Recurrent`] | a fixed-size state every position updates | n ≤ `snapshots` (per-position copies) |
//!
//! Anything beyond the limit goes through a checkpoint (`ModelState::checkpoint` / `restore`),
//! which every kind supports.

use anyhow::{bail, Result};
use vela_compute::{Backend, KvLayerSpec, KvType};

mod store;
pub(crate) use store::store_ring;
pub use store::{BlocksMut, ExtraExport, ExtraLayerExport, ExtraSnapshot, ExtraState};

/// What one layer keeps for a sequence.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LayerState {
    /// K and V rows per position. With a window only the last `w` positions are read and the
    /// cache is a ring of `w + max_batch` slots.
    Kv {
        n_head_kv: usize,
        head_dim_k: usize,
        head_dim_v: usize,
        window: Option<usize>,
    },
    /// Reads the K/V of an earlier layer (KV sharing) and keeps nothing itself.
    Shared { from: usize },
    /// One row of `width` per complete block of `ratio` positions (compressed or latent K/V,
    /// pooled index keys; `ratio` 1: a row per position); the raw rows (`raw_width`) of the
    /// block still open wait in a ring of `2·ratio + max_batch` slots (the block before it too:
    /// overlapping compressors pool it again). Stored as f32.
    Blocks {
        width: usize,
        ratio: usize,
        raw_width: usize,
    },
    /// A fixed-size state (a convolution tail and a recurrent matrix) that every position
    /// updates: `floats` f32 values, plus `snapshots` per-position copies for rollback.
    Recurrent { floats: usize, snapshots: usize },
}

impl LayerState {
    /// A full-attention or sliding-window K/V layer.
    pub fn kv(
        n_head_kv: usize,
        head_dim_k: usize,
        head_dim_v: usize,
        window: Option<usize>,
    ) -> Self {
        LayerState::Kv {
            n_head_kv,
            head_dim_k,
            head_dim_v,
            window,
        }
    }

    /// Trailing positions this layer can drop without a checkpoint (`usize::MAX`: any number).
    pub fn rollback_limit(&self, max_batch: usize) -> usize {
        match *self {
            LayerState::Kv { window: None, .. } | LayerState::Shared { .. } => usize::MAX,
            LayerState::Kv {
                window: Some(_), ..
            }
            | LayerState::Blocks { .. } => max_batch,
            LayerState::Recurrent { snapshots, .. } => snapshots,
        }
    }

    /// Bytes this layer keeps for a context of `n_ctx` positions evaluated `max_batch` at a time,
    /// with K/V stored as `kv`.
    pub fn bytes(&self, n_ctx: usize, max_batch: usize, kv: KvType) -> u64 {
        let e = kv.bytes() as u64;
        match *self {
            LayerState::Kv {
                n_head_kv,
                head_dim_k,
                head_dim_v,
                window,
            } => {
                let slots = vela_compute::ring_capacity(window, n_ctx, max_batch) as u64;
                slots * (n_head_kv * (head_dim_k + head_dim_v)) as u64 * e
            }
            // The backend keeps a one-element placeholder layer.
            LayerState::Shared { .. } => 2 * e,
            LayerState::Blocks {
                width,
                ratio,
                raw_width,
            } => {
                let rows = n_ctx.div_ceil(ratio.max(1)) as u64;
                let raw = (2 * ratio.max(1) + max_batch).min(n_ctx.max(1)) as u64;
                (rows * width as u64 + raw * raw_width as u64) * 4
            }
            LayerState::Recurrent { floats, snapshots } => (floats * 4 * (1 + snapshots)) as u64,
        }
    }
}

/// The state a model declares for one sequence: one entry per layer (and per extra module that
/// keeps state, such as an MTP layer).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateLayout {
    pub layers: Vec<LayerState>,
}

impl StateLayout {
    pub fn new(layers: Vec<LayerState>) -> Self {
        StateLayout { layers }
    }

    /// Bytes of the whole state for a context of `n_ctx` positions evaluated `max_batch` at a time.
    pub fn bytes(&self, n_ctx: usize, max_batch: usize, kv: KvType) -> u64 {
        self.layers
            .iter()
            .map(|l| l.bytes(n_ctx, max_batch, kv))
            .sum()
    }

    /// Trailing positions every layer can drop without a checkpoint (`usize::MAX`: any number).
    pub fn rollback_limit(&self, max_batch: usize) -> usize {
        self.layers
            .iter()
            .map(|l| l.rollback_limit(max_batch))
            .min()
            .unwrap_or(usize::MAX)
    }

    /// The K/V storage the backend allocates ([`vela_compute::Backend::new_kv`]): one entry per
    /// layer; layers that keep no K/V get a one-element placeholder so layer indices match.
    pub fn kv_specs(&self, n_ctx: usize, max_batch: usize) -> Vec<KvLayerSpec> {
        self.layers
            .iter()
            .map(|l| match *l {
                LayerState::Kv {
                    n_head_kv,
                    head_dim_k,
                    head_dim_v,
                    window,
                } => KvLayerSpec {
                    n_head_kv,
                    head_dim_k,
                    head_dim_v,
                    capacity: vela_compute::ring_capacity(window, n_ctx, max_batch),
                    window,
                },
                _ => KvLayerSpec {
                    n_head_kv: 1,
                    head_dim_k: 1,
                    head_dim_v: 1,
                    capacity: 1,
                    window: None,
                },
            })
            .collect()
    }
}

/// Run a recurrent op over rows `0..n` of a forward at positions `k..k + n` so that entry `ent`
/// (a [`LayerState::Recurrent`] with `snapshots` copies) holds the state after each of its last
/// `snapshots` positions: the rows before those in one call, then one call per row, each
/// starting from a copy of the previous position's state. `step(first_row, rows, state)`. The
/// results do not depend on the split (recurrent ops are split-invariant).
pub(crate) fn segments<B: Backend>(
    be: &B,
    extra: &mut ExtraState<B>,
    (ent, snapshots): (usize, usize),
    k: usize,
    n: usize,
    step: &mut dyn FnMut(usize, usize, &mut B::Buf),
) -> Result<()> {
    let bulk = n - n.min(snapshots);
    if bulk > 0 {
        extra.copy_recurrent(be, ent, k, k + bulk)?;
        step(0, bulk, extra.recurrent_mut(ent, k + bulk)?);
    }
    for j in bulk..n {
        extra.copy_recurrent(be, ent, k + j, k + j + 1)?;
        step(j, 1, extra.recurrent_mut(ent, k + j + 1)?);
    }
    Ok(())
}

/// Allocate the backend cache of `layout` for `n_ctx` positions evaluated `max_batch` at a time.
pub fn alloc_kv<B: Backend>(
    be: &B,
    layout: &StateLayout,
    n_ctx: usize,
    max_batch: usize,
    kv: KvType,
) -> Result<B::Kv> {
    if n_ctx == 0 || max_batch == 0 {
        bail!("context size and batch size must be positive");
    }
    be.new_kv(&layout.kv_specs(n_ctx, max_batch), kv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rollback_limits_follow_the_most_restrictive_layer() {
        let full = LayerState::kv(2, 64, 64, None);
        let sliding = LayerState::kv(2, 64, 64, Some(512));
        let rec = LayerState::Recurrent {
            floats: 3 * 128 + 16 * 128 * 128,
            snapshots: 5,
        };
        let l = StateLayout::new(vec![full.clone(), LayerState::Shared { from: 0 }]);
        assert_eq!(l.rollback_limit(64), usize::MAX);
        let l = StateLayout::new(vec![full.clone(), sliding]);
        assert_eq!(l.rollback_limit(64), 64);
        let l = StateLayout::new(vec![full, rec]);
        assert_eq!(l.rollback_limit(64), 5);
        assert_eq!(StateLayout::default().rollback_limit(1), usize::MAX);
    }

    #[test]
    fn bytes_of_each_kind() {
        let kv = KvType::F16;
        // 8 heads × (64 + 64) × 2 bytes per slot.
        assert_eq!(
            LayerState::kv(8, 64, 64, None).bytes(100, 16, kv),
            100 * 8 * 128 * 2
        );
        assert_eq!(
            LayerState::kv(8, 64, 64, Some(32)).bytes(100, 16, kv),
            48 * 8 * 128 * 2
        );
        // A window wider than the context is capped by it.
        assert_eq!(
            LayerState::kv(8, 64, 64, Some(4096)).bytes(100, 16, kv),
            100 * 8 * 128 * 2
        );
        let b = LayerState::Blocks {
            width: 512,
            ratio: 4,
            raw_width: 1024,
        };
        assert_eq!(b.bytes(10, 2, kv), (3 * 512 + 10 * 1024) * 4);
        let r = LayerState::Recurrent {
            floats: 1000,
            snapshots: 3,
        };
        assert_eq!(r.bytes(1 << 20, 512, kv), 16_000);
        let l = StateLayout::new(vec![LayerState::kv(1, 2, 2, None), r]);
        assert_eq!(l.bytes(10, 1, KvType::F32), 10 * 4 * 4 + 16_000);
    }

    #[test]
    fn kv_specs_keep_layer_indices() {
        let l = StateLayout::new(vec![
            LayerState::kv(2, 4, 4, Some(8)),
            LayerState::Shared { from: 0 },
            LayerState::kv(2, 4, 6, None),
        ]);
        let s = l.kv_specs(100, 4);
        assert_eq!(s.len(), 3);
        assert_eq!((s[0].capacity, s[0].window), (12, Some(8)));
        assert_eq!((s[1].capacity, s[1].n_head_kv), (1, 1));
        assert_eq!((s[2].capacity, s[2].head_dim_v), (100, 6));
    }
}
