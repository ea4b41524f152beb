//! Storage of one layer's K or V rows, held by use: a virtual address range for the layer's
//! whole capacity, with physical pages mapped as the sequence grows and unmapped when it
//! shrinks (CUDA virtual memory management). The address, which kernels and recorded steps
//! take, never changes, so no kernel needs a block table. A device without virtual memory
//! management gets one allocation of the whole capacity.

use anyhow::{anyhow, Result};
use cudarc::driver::{sys, CudaSlice, CudaStream, DevicePtr};
use std::mem::ManuallyDrop;
use std::sync::Arc;

/// Rows mapped beyond the last position a forward uses: kernels that round a length up (the
/// prefill attention's products read to a multiple of 8) stay inside mapped memory.
pub(crate) const ROW_MARGIN: usize = 256;

pub(crate) struct KvStore {
    /// A view of the whole range: kernels take its address, copies slice it.
    view: ManuallyDrop<CudaSlice<u8>>,
    /// Its device address.
    base: u64,
    pages: Option<Pages>,
}

struct Pages {
    /// Bytes of one page (the device's allocation granularity).
    gran: usize,
    /// Bytes of the reserved address range.
    reserved: usize,
    /// The physical allocation mapped at `[i * gran, (i + 1) * gran)`, for each `i`.
    handles: Vec<sys::CUmemGenericAllocationHandle>,
    dev: sys::CUdevice,
}

fn check(r: sys::CUresult, what: &str) -> Result<()> {
    r.result().map_err(|e| anyhow!("CUDA {what}: {e:?}"))
}

fn device_location(dev: sys::CUdevice) -> sys::CUmemLocation {
    // SAFETY: a plain C struct; all-zero is a valid value that the fields below complete.
    let mut loc: sys::CUmemLocation = unsafe { std::mem::zeroed() };
    loc.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    loc.id = dev;
    loc
}

fn page_prop(dev: sys::CUdevice) -> sys::CUmemAllocationProp {
    // SAFETY: as above.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location = device_location(dev);
    prop
}

/// The page size for K/V storage on `dev`, or `None` where the device (or driver) has no
/// virtual memory management.
pub(crate) fn page_bytes(dev: sys::CUdevice) -> Option<usize> {
    let mut supported = 0i32;
    let attr = sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED;
    // SAFETY: out-pointers to locals.
    unsafe { sys::cuDeviceGetAttribute(&mut supported, attr, dev) }
        .result()
        .ok()?;
    if supported == 0 {
        return None;
    }
    let mut gran = 0usize;
    let prop = page_prop(dev);
    let opt = sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM;
    // SAFETY: as above.
    unsafe { sys::cuMemGetAllocationGranularity(&mut gran, &prop, opt) }
        .result()
        .ok()?;
    (gran > 0).then_some(gran)
}

impl KvStore {
    /// `len` bytes of storage: an empty reserved range when `page` is given (memory comes with
    /// [`KvStore::reserve`]), else one zeroed allocation.
    pub(crate) fn new(
        stream: &Arc<CudaStream>,
        dev: sys::CUdevice,
        len: usize,
        page: Option<usize>,
    ) -> Result<Self> {
        let len = len.max(1);
        let Some(gran) = page else {
            let view = stream.alloc_zeros::<u8>(len).map_err(|e| {
                vela_compute::OutOfMemory(format!(
                    "could not allocate {:.2} GiB of GPU memory for the KV cache ({e:?})",
                    len as f64 / (1u64 << 30) as f64
                ))
            })?;
            let view = ManuallyDrop::new(view);
            let base = view.device_ptr(stream).0;
            return Ok(Self {
                view,
                base,
                pages: None,
            });
        };
        stream.context().bind_to_thread()?;
        let reserved = len.next_multiple_of(gran);
        let mut base: sys::CUdeviceptr = 0;
        // SAFETY: out-pointer to a local; the range is freed in `drop`.
        check(
            unsafe { sys::cuMemAddressReserve(&mut base, reserved, gran, 0, 0) },
            "address reservation for the K/V cache",
        )?;
        // SAFETY: the range is ours until `drop`, which leaks this view instead of freeing it.
        let view = ManuallyDrop::new(unsafe { stream.upgrade_device_ptr::<u8>(base, len) });
        let pages = Pages {
            gran,
            reserved,
            handles: Vec::new(),
            dev,
        };
        Ok(Self {
            view,
            base,
            pages: Some(pages),
        })
    }

    /// Device address of the first byte.
    pub(crate) fn ptr(&self) -> u64 {
        self.base
    }

    pub(crate) fn buf(&self) -> &CudaSlice<u8> {
        &self.view
    }

    pub(crate) fn buf_mut(&mut self) -> &mut CudaSlice<u8> {
        &mut self.view
    }

    /// Bytes of device memory held.
    pub(crate) fn bytes(&self) -> usize {
        match &self.pages {
            Some(p) => p.handles.len() * p.gran,
            None => self.view.len(),
        }
    }

    /// Make bytes `0..bytes` (capped at the length) backed by memory; new pages are zeroed
    /// in stream order. Out of memory is an error that leaves the pages mapped so far.
    pub(crate) fn reserve(&mut self, bytes: usize) -> Result<()> {
        let len = self.view.len();
        let Some(p) = &mut self.pages else {
            return Ok(());
        };
        let want = bytes.min(len).div_ceil(p.gran);
        if want <= p.handles.len() {
            return Ok(());
        }
        self.view.stream().context().bind_to_thread()?;
        let base = self.base;
        let first = p.handles.len();
        let prop = page_prop(p.dev);
        let access = sys::CUmemAccessDesc {
            location: device_location(p.dev),
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        while p.handles.len() < want {
            let at = base + (p.handles.len() * p.gran) as u64;
            let mut h: sys::CUmemGenericAllocationHandle = 0;
            // SAFETY: out-pointer to a local; `at..at + gran` lies in our reserved range and is
            // not mapped (pages are mapped in order).
            unsafe {
                if let Err(e) = sys::cuMemCreate(&mut h, p.gran, &prop, 0).result() {
                    let held = p.handles.len() * p.gran;
                    return Err(vela_compute::OutOfMemory(format!(
                        "could not allocate GPU memory for the KV cache ({e:?}; this layer holds \
                         {:.1} MiB): too many sequences or too long a context for this GPU",
                        held as f64 / (1 << 20) as f64
                    ))
                    .into());
                }
                if let Err(e) = check(sys::cuMemMap(at, p.gran, 0, h, 0), "K/V page map") {
                    sys::cuMemRelease(h);
                    return Err(e);
                }
                if let Err(e) = check(sys::cuMemSetAccess(at, p.gran, &access, 1), "K/V access") {
                    sys::cuMemUnmap(at, p.gran);
                    sys::cuMemRelease(h);
                    return Err(e);
                }
            }
            p.handles.push(h);
        }
        let (a, b) = (first * p.gran, (want * p.gran).min(len));
        let stream = self.view.stream().clone();
        stream.memset_zeros(&mut self.view.slice_mut(a..b))?;
        Ok(())
    }

    /// Unmap the pages wholly above byte `keep`, but only when more than one would go: a
    /// sequence that steps back and forth over a page boundary (speculative decoding's
    /// rollbacks) keeps it. Waits for the stream first when anything is unmapped; the caller
    /// ends any step being recorded.
    pub(crate) fn release(&mut self, keep: usize) {
        if !self.would_release(keep) {
            return;
        }
        let Some(p) = &mut self.pages else {
            return;
        };
        let keep_pages = keep.div_ceil(p.gran);
        let stream = self.view.stream();
        if stream.context().bind_to_thread().is_err() || stream.synchronize().is_err() {
            return;
        }
        let base = self.base;
        while p.handles.len() > keep_pages {
            let i = p.handles.len() - 1;
            let at = base + (i * p.gran) as u64;
            // SAFETY: page `i` is mapped at `at` and no queued work uses it (synchronized).
            unsafe {
                sys::cuMemUnmap(at, p.gran);
                sys::cuMemRelease(p.handles[i]);
            }
            p.handles.pop();
        }
    }

    /// Whether [`KvStore::release`] of `keep` would unmap pages.
    pub(crate) fn would_release(&self, keep: usize) -> bool {
        self.pages
            .as_ref()
            .is_some_and(|p| p.handles.len() > keep.div_ceil(p.gran) + 1)
    }

    /// A copy holding the same pages and bytes.
    pub(crate) fn try_clone(&self) -> Result<Self> {
        let stream = self.view.stream().clone();
        let dev = self.pages.as_ref().map_or(0, |p| p.dev);
        let mut out = Self::new(
            &stream,
            dev,
            self.view.len(),
            self.pages.as_ref().map(|p| p.gran),
        )?;
        let n = match &self.pages {
            Some(p) => (p.handles.len() * p.gran).min(self.view.len()),
            None => self.view.len(),
        };
        out.reserve(n)?;
        if n > 0 {
            stream.memcpy_dtod(&self.view.slice(0..n), &mut out.view.slice_mut(0..n))?;
        }
        Ok(out)
    }
}

impl Drop for KvStore {
    fn drop(&mut self) {
        let Some(p) = self.pages.take() else {
            // SAFETY: dropped once, here.
            unsafe { ManuallyDrop::drop(&mut self.view) };
            return;
        };
        // Queued work may still read the pages: unmapping is not ordered on the stream.
        let stream = self.view.stream();
        let _ = stream.context().bind_to_thread();
        let _ = stream.synchronize();
        // SAFETY: taken once, here; leaking the view keeps it from freeing a reserved range.
        let base = unsafe { ManuallyDrop::take(&mut self.view) }.leak();
        // SAFETY: the pages are mapped at these addresses, the range was reserved at `base`.
        unsafe {
            for (i, &h) in p.handles.iter().enumerate() {
                sys::cuMemUnmap(base + (i * p.gran) as u64, p.gran);
                sys::cuMemRelease(h);
            }
            sys::cuMemAddressFree(base, p.reserved);
        }
    }
}
