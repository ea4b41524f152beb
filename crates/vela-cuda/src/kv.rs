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
