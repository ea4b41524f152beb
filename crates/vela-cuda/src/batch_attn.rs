//! `Backend::rope_store_attend_batch`: one layer's RoPE + K/V store and attention for the decode
//! rows of several sequences, each op one launch over all rows. The kernels take a table with
//! each row's K and V cache bases (`KVT_ROW` in common.cu) instead of one cache; a row's
//! results are what the per-sequence calls compute, up to the split-K attention's partition
//! (the number of parts follows the row count).

use crate::backend::CudaBackend;
use crate::kv::CudaKv;
use crate::weight::CudaBuf;
use cudarc::driver::CudaSlice;
use std::sync::atomic::{AtomicU64, Ordering};
use vela_compute::{AttnParams, RopeParams};

/// Layers run through [`CudaBackend::rope_store_attend_batch_impl`] so far (all backends).
pub static BATCHED_LAYERS: AtomicU64 = AtomicU64::new(0);

impl CudaBackend {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rope_store_attend_batch_impl(
        &self,
        q: &mut CudaBuf,
        k: &mut CudaBuf,
        v: &mut CudaBuf,
        kvs: &mut [&mut CudaKv],
        layer: usize,
        positions: &[&[u32]],
        rope: &RopeParams,
        norms: Option<(&CudaSlice<f32>, &CudaSlice<f32>, f32)>,
        p: &AttnParams,
        out: &mut CudaBuf,
    ) -> bool {
        let Some(first) = kvs.first() else {
            return false;
        };
        let spec = &first.layers[layer].spec;
        // The fused per-head RoPE + store kernel (the only store that reads the table), and one
        // cache type and layer shape for every sequence (the kernels take one capacity).
        let same = kvs.iter().all(|kv| {
            let s = &kv.layers[layer].spec;
            kv.ty == first.ty
                && s.capacity == spec.capacity
                && s.n_head_kv == spec.n_head_kv
                && s.head_dim_k == spec.head_dim_k
                && s.head_dim_v == spec.head_dim_v
                && s.window == spec.window
        });
        if !same
            || positions.len() != kvs.len()
            || rope.n_rot == 0
            || spec.head_dim_k != p.head_dim_k
        {
            return false;
        }
        // The table of every layer at once, so that a step uploads it at most once (and not at
        // all while the batch's sequences stay the same): a host-to-device copy may wait for
        // the stream, which per layer would stall the launches.
        let n_layer = first.layers.len();
        if kvs.iter().any(|kv| kv.layers.len() != n_layer) {
            return false;
        }
        let n_rows: usize = positions.iter().map(|p| p.len()).sum();
        if n_rows == 0 {
            return true;
        }
        for (kv, pos) in kvs.iter_mut().zip(positions) {
            self.kv_ensure(kv, layer, pos);
        }
        let mut tab = Vec::with_capacity(2 * n_rows * n_layer);
        for li in 0..n_layer {
            for (kv, pos) in kvs.iter().zip(positions) {
                let l = &kv.layers[li];
                for _ in 0..pos.len() {
                    tab.push(l.k.ptr());
                    tab.push(l.v.ptr());
                }
            }
        }
        let rows: Vec<u32> = positions.concat();
        let kvt = self.kv_table(&tab) + (layer * 2 * n_rows * 8) as u64;
        let kv0 = &mut *kvs[0];
        let (nh, nkv, hd) = (p.n_head, p.n_head_kv, p.head_dim_k);
        match norms {
            Some((qn, kn, eps)) => self.norm_rope_qk_store_impl(
                q,
                k,
                v,
                kv0,
                layer,
                nh,
                nkv,
                hd,
                &rows,
                rope,
                (qn, kn, None, eps),
                kvt,
            ),
            None => {
                self.rope_qk_store_impl(q, k, v, kv0, layer, nh, nkv, hd, &rows, rope, None, kvt)
            }
        }
        self.attention_impl(q, kv0, layer, &rows, p, out, None, kvt);
        BATCHED_LAYERS.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Device address of `tab` (`[layer][row][2]` K and V bases), uploaded unless the scratch
    /// table already holds it.
    fn kv_table(&self, tab: &[u64]) -> u64 {
        let mut sc = self.scratch();
        if sc.kvt_host != tab {
            if sc.kvt.len() < tab.len() {
                self.flush_recording();
                sc.kvt = self
                    .dev
                    .stream
                    .alloc_zeros::<u64>(tab.len().next_power_of_two())
                    .expect("CUDA alloc of the K/V table");
            }
            let n = tab.len();
            self.dev
                .stream
                .memcpy_htod(tab, &mut sc.kvt.slice_mut(0..n))
                .expect("CUDA upload of the K/V table");
            sc.kvt_host = tab.to_vec();
        }
        self.ptr(&sc.kvt)
    }
}
