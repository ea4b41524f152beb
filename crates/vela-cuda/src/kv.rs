//! KV cache storage of the CUDA backend: per-layer K/V rings in device memory and the
//! checkpoint / restore / clone operations (device-to-device copies).

use crate::attn::ATT_MAXD_BIG;
use crate::backend::CudaBackend;
use crate::kv_pages::{KvStore, ROW_MARGIN};
use anyhow::{bail, Result};
use cudarc::driver::CudaSlice;
use vela_compute::{KvLayerSpec, KvType};

pub(crate) struct KvLayer {
    pub(crate) spec: KvLayerSpec,
    pub(crate) k: KvStore,
    pub(crate) v: KvStore,
}

impl KvLayer {
    /// Bytes of a K and a V row (all heads of one position).
    fn row_bytes(&self, eb: usize) -> (usize, usize) {
        let h = self.spec.n_head_kv * eb;
        (h * self.spec.head_dim_k, h * self.spec.head_dim_v)
    }

    /// Slots the kernels may touch while the sequence holds positions `0..n_past`: its rows,
    /// a margin for lengths rounded up, at most the ring's capacity.
    fn slots_in_use(&self, n_past: usize) -> usize {
        if n_past == 0 {
            0
        } else {
            (n_past + ROW_MARGIN).min(self.spec.capacity)
        }
    }

    fn reserve(&mut self, eb: usize, n_past: usize) -> Result<()> {
        let (wk, wv) = self.row_bytes(eb);
        let slots = self.slots_in_use(n_past);
        self.k.reserve(slots * wk)?;
        self.v.reserve(slots * wv)
    }
}

/// Per-layer K/V rings in device memory (f32, f16 or bf16 elements), held by use where the
/// device has virtual memory management ([`KvStore`]).
pub struct CudaKv {
    pub(crate) layers: Vec<KvLayer>,
    pub(crate) ty: KvType,
}

/// Saved sliding-window slots: (layer, first position, K rows, V rows), on the device.
pub struct CudaKvSnapshot {
    pub(crate) saved: Vec<(usize, usize, CudaSlice<u8>, CudaSlice<u8>)>,
}

pub(crate) fn kv_elem_bytes(ty: KvType) -> usize {
    ty.bytes()
}

/// Kernel name suffix of a KV element type (`attention_f16`, `kv_store_bf16`, ...).
pub(crate) fn kv_suffix(ty: KvType) -> &'static str {
    match ty {
        KvType::F32 => "f32",
        KvType::F16 => "f16",
        KvType::Bf16 => "bf16",
    }
}

impl CudaBackend {
    pub(crate) fn kv_new_impl(&self, layers: &[KvLayerSpec], ty: KvType) -> Result<CudaKv> {
        let eb = kv_elem_bytes(ty);
        let mut out = Vec::with_capacity(layers.len());
        for spec in layers {
            if spec.head_dim_k > ATT_MAXD_BIG || spec.head_dim_v > ATT_MAXD_BIG {
                bail!(
                    "head dimension above {ATT_MAXD_BIG} is not supported by the CUDA attention kernels"
                );
            }
            let nk = spec.capacity * spec.n_head_kv * spec.head_dim_k * eb;
            let nv = spec.capacity * spec.n_head_kv * spec.head_dim_v * eb;
            let (st, dev) = (&self.dev.stream, self.dev.ctx.cu_device());
            out.push(KvLayer {
                spec: spec.clone(),
                k: KvStore::new(st, dev, nk, self.kv_page)?,
                v: KvStore::new(st, dev, nv, self.kv_page)?,
            });
        }
        Ok(CudaKv { layers: out, ty })
    }

    /// [`vela_compute::Backend::kv_reserve`]: map the pages positions `0..n_past` use.
    pub(crate) fn kv_reserve_impl(&self, kv: &mut CudaKv, n_past: usize) -> Result<()> {
        let eb = kv_elem_bytes(kv.ty);
        kv.layers.iter_mut().try_for_each(|l| l.reserve(eb, n_past))
    }

    /// Map the pages a write of `layer` at `positions` needs, where the caller did not reserve
    /// them first ([`vela_compute::Backend::kv_reserve`] comes before every forward; a test of
    /// one op may not call it). Running out of memory here is a panic: reserving first is
    /// where it is an error.
    pub(crate) fn kv_ensure(&self, kv: &mut CudaKv, layer: usize, positions: &[u32]) {
        let Some(&last) = positions.iter().max() else {
            return;
        };
        let eb = kv_elem_bytes(kv.ty);
        if let Err(e) = kv.layers[layer].reserve(eb, last as usize + 1) {
            panic!("{e:#}");
        }
    }

    /// [`vela_compute::Backend::kv_release`]: unmap the pages no position below `n_past` uses.
    pub(crate) fn kv_release_impl(&self, kv: &mut CudaKv, n_past: usize) {
        let eb = kv_elem_bytes(kv.ty);
        // Only the layers whose ring has not wrapped (one that has holds live positions in
        // every slot), and only when a page would go: rollbacks within a page cost nothing.
        let keep = |l: &KvLayer| {
            let (wk, wv) = l.row_bytes(eb);
            let slots = l.slots_in_use(n_past);
            (slots * wk, slots * wv)
        };
        let frees = |l: &KvLayer| {
            let (k, v) = keep(l);
            n_past < l.spec.capacity && (l.k.would_release(k) || l.v.would_release(v))
        };
        if !kv.layers.iter().any(frees) {
            return;
        }
        self.flush_recording();
        for l in &mut kv.layers {
            if frees(l) {
                let (k, v) = keep(l);
                l.k.release(k);
                l.v.release(v);
            }
        }
    }

    /// [`vela_compute::Backend::kv_bytes`]: device memory the cache holds.
    pub(crate) fn kv_bytes_impl(&self, kv: &CudaKv) -> usize {
        kv.layers.iter().map(|l| l.k.bytes() + l.v.bytes()).sum()
    }

    pub(crate) fn kv_checkpoint_impl(&self, kv: &CudaKv, n_past: usize) -> CudaKvSnapshot {
        self.flush_recording();
        let eb = kv_elem_bytes(kv.ty);
        let mut saved = Vec::new();
        for (li, l) in kv.layers.iter().enumerate() {
            if l.spec.window.is_none() || n_past == 0 {
                continue;
            }
            let first = vela_compute::window_start(n_past - 1, l.spec.window);
            let wk = l.spec.n_head_kv * l.spec.head_dim_k * eb;
            let wv = l.spec.n_head_kv * l.spec.head_dim_v * eb;
            let n = n_past - first;
            let mut ks = self
                .dev
                .stream
                .alloc_zeros::<u8>((n * wk).max(1))
                .expect("CUDA alloc");
            let mut vs = self
                .dev
                .stream
                .alloc_zeros::<u8>((n * wv).max(1))
                .expect("CUDA alloc");
            // Slot by slot: the window may wrap around the ring.
            for (i, p) in (first..n_past).enumerate() {
                let s = p % l.spec.capacity;
                self.copy_bytes(l.k.buf(), s * wk, &mut ks, i * wk, wk);
                self.copy_bytes(l.v.buf(), s * wv, &mut vs, i * wv, wv);
            }
            saved.push((li, first, ks, vs));
        }
        CudaKvSnapshot { saved }
    }

    pub(crate) fn kv_restore_impl(&self, kv: &mut CudaKv, snap: &CudaKvSnapshot) {
        self.flush_recording();
        let eb = kv_elem_bytes(kv.ty);
        for (li, first, ks, vs) in &snap.saved {
            let l = &mut kv.layers[*li];
            let wk = l.spec.n_head_kv * l.spec.head_dim_k * eb;
            let wv = l.spec.n_head_kv * l.spec.head_dim_v * eb;
            let n = ks.len().checked_div(wk).unwrap_or(0);
            for i in 0..n {
                let s = (first + i) % l.spec.capacity;
                let (k, v) = (&mut l.k, &mut l.v);
                if wk > 0 {
                    self.dev
                        .stream
                        .memcpy_dtod(
                            &ks.slice(i * wk..(i + 1) * wk),
                            &mut k.buf_mut().slice_mut(s * wk..(s + 1) * wk),
                        )
                        .expect("CUDA copy");
                }
                if wv > 0 {
                    self.dev
                        .stream
                        .memcpy_dtod(
                            &vs.slice(i * wv..(i + 1) * wv),
                            &mut v.buf_mut().slice_mut(s * wv..(s + 1) * wv),
                        )
                        .expect("CUDA copy");
                }
            }
        }
    }

    /// [`vela_compute::Backend::kv_export`]: the rows copied to the host by runs of slots.
    pub(crate) fn kv_export_impl(&self, kv: &CudaKv, n_past: usize) -> vela_compute::KvExport {
        use vela_compute::kv_export::{held_from, row_bytes, slot_runs};
        self.flush_recording();
        let layers = kv
            .layers
            .iter()
            .map(|l| {
                let first = held_from(&l.spec, n_past);
                let (wk, wv) = row_bytes(&l.spec, kv.ty);
                let n = n_past - first;
                let (mut k, mut v) = (vec![0u8; n * wk], vec![0u8; n * wv]);
                for (i, slot, len) in slot_runs(first, n_past, l.spec.capacity) {
                    let st = &self.dev.stream;
                    if wk > 0 {
                        st.memcpy_dtoh(
                            &l.k.buf().slice(slot * wk..(slot + len) * wk),
                            &mut k[i * wk..(i + len) * wk],
                        )
                        .expect("CUDA copy of K rows to the host");
                    }
                    if wv > 0 {
                        st.memcpy_dtoh(
                            &l.v.buf().slice(slot * wv..(slot + len) * wv),
                            &mut v[i * wv..(i + len) * wv],
                        )
                        .expect("CUDA copy of V rows to the host");
                    }
                }
                vela_compute::KvLayerExport {
                    first,
                    k_row: wk,
                    v_row: wv,
                    k: k.into(),
                    v: v.into(),
                }
            })
            .collect();
        vela_compute::KvExport {
            ty: kv.ty,
            n_past,
            layers,
        }
    }

    /// [`vela_compute::Backend::kv_import`].
    pub(crate) fn kv_import_impl(&self, kv: &mut CudaKv, e: &vela_compute::KvExport) -> Result<()> {
        use vela_compute::kv_export::{import_plan, row_bytes, slot_runs};
        self.flush_recording();
        let specs: Vec<&KvLayerSpec> = kv.layers.iter().map(|l| &l.spec).collect();
        let from = import_plan(e, &specs, kv.ty)?;
        self.kv_reserve_impl(kv, e.n_past)?;
        for ((l, x), keep) in kv.layers.iter_mut().zip(&e.layers).zip(from) {
            let (wk, wv) = row_bytes(&l.spec, kv.ty);
            let skip = keep - x.first;
            for (i, slot, len) in slot_runs(keep, e.n_past, l.spec.capacity) {
                let r = skip + i;
                let st = &self.dev.stream;
                if wk > 0 {
                    st.memcpy_htod(
                        &x.k[r * wk..(r + len) * wk],
                        &mut l.k.buf_mut().slice_mut(slot * wk..(slot + len) * wk),
                    )?;
                }
                if wv > 0 {
                    st.memcpy_htod(
                        &x.v[r * wv..(r + len) * wv],
                        &mut l.v.buf_mut().slice_mut(slot * wv..(slot + len) * wv),
                    )?;
                }
            }
        }
        Ok(())
    }

    pub(crate) fn kv_clone_impl(&self, kv: &CudaKv) -> Result<CudaKv> {
        self.flush_recording();
        let layers = kv
            .layers
            .iter()
            .map(|l| {
                Ok(KvLayer {
                    spec: l.spec.clone(),
                    k: l.k.try_clone()?,
                    v: l.v.try_clone()?,
                })
            })
            .collect::<Result<_>>()?;
        Ok(CudaKv { layers, ty: kv.ty })
    }
}
