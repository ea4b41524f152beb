//! KV cache storage of the CUDA backend: per-layer K/V rings in device memory and the
//! checkpoint / restore / clone operations (device-to-device copies).

use crate::attn::ATT_MAXD_BIG;
use crate::backend::CudaBackend;
use anyhow::{bail, Result};
use cudarc::driver::CudaSlice;
use vela_compute::{KvLayerSpec, KvType};

pub(crate) struct KvLayer {
    pub(crate) spec: KvLayerSpec,
    pub(crate) k: CudaSlice<u8>,
    pub(crate) v: CudaSlice<u8>,
}

/// Per-layer K/V rings in device memory (f32 or f16 elements).
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
            out.push(KvLayer {
                spec: spec.clone(),
                k: self.dev.stream.alloc_zeros::<u8>(nk.max(1))?,
                v: self.dev.stream.alloc_zeros::<u8>(nv.max(1))?,
            });
        }
        Ok(CudaKv { layers: out, ty })
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
                self.copy_bytes(&l.k, s * wk, &mut ks, i * wk, wk);
                self.copy_bytes(&l.v, s * wv, &mut vs, i * wv, wv);
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
                            &mut k.slice_mut(s * wk..(s + 1) * wk),
                        )
                        .expect("CUDA copy");
                }
                if wv > 0 {
                    self.dev
                        .stream
                        .memcpy_dtod(
                            &vs.slice(i * wv..(i + 1) * wv),
                            &mut v.slice_mut(s * wv..(s + 1) * wv),
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
                            &l.k.slice(slot * wk..(slot + len) * wk),
                            &mut k[i * wk..(i + len) * wk],
                        )
                        .expect("CUDA copy of K rows to the host");
                    }
                    if wv > 0 {
                        st.memcpy_dtoh(
                            &l.v.slice(slot * wv..(slot + len) * wv),
                            &mut v[i * wv..(i + len) * wv],
                        )
                        .expect("CUDA copy of V rows to the host");
                    }
                }
                vela_compute::KvLayerExport {
                    first,
                    k_row: wk,
                    v_row: wv,
                    k,
                    v,
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
        for ((l, x), keep) in kv.layers.iter_mut().zip(&e.layers).zip(from) {
            let (wk, wv) = row_bytes(&l.spec, kv.ty);
            let skip = keep - x.first;
            for (i, slot, len) in slot_runs(keep, e.n_past, l.spec.capacity) {
                let r = skip + i;
                let st = &self.dev.stream;
                if wk > 0 {
                    st.memcpy_htod(
                        &x.k[r * wk..(r + len) * wk],
                        &mut l.k.slice_mut(slot * wk..(slot + len) * wk),
                    )?;
                }
                if wv > 0 {
                    st.memcpy_htod(
                        &x.v[r * wv..(r + len) * wv],
                        &mut l.v.slice_mut(slot * wv..(slot + len) * wv),
                    )?;
                }
            }
        }
        Ok(())
    }

    pub(crate) fn kv_clone_impl(&self, kv: &CudaKv) -> CudaKv {
        self.flush_recording();
        let layers = kv
            .layers
            .iter()
            .map(|l| {
                let mut k = self
                    .dev
                    .stream
                    .alloc_zeros::<u8>(l.k.len())
                    .expect("CUDA alloc");
                let mut v = self
                    .dev
                    .stream
                    .alloc_zeros::<u8>(l.v.len())
                    .expect("CUDA alloc");
                self.dev
                    .stream
                    .memcpy_dtod(&l.k, &mut k)
                    .expect("CUDA copy");
                self.dev
                    .stream
                    .memcpy_dtod(&l.v, &mut v)
                    .expect("CUDA copy");
                KvLayer {
                    spec: l.spec.clone(),
                    k,
                    v,
                }
            })
            .collect();
        CudaKv { layers, ty: kv.ty }
    }
}
