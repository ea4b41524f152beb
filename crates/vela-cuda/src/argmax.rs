//! Device argmax: `argmax_rows` (launch, wait, copy back the ids) and the pipelined form for
//! greedy decoding, `argmax_start` / `argmax_finish`.
//!
//! Pipelining: `argmax_start` records the argmax into the decode step (`argmax_final_io` also
//! writes the id and the next position into the device `io` buffer the next step reads), launches
//! the step's graph and queues an asynchronous copy of the id into a pinned host slot followed by
//! an event, then returns a ticket without waiting. The engine records and launches the next step
//! (`decode_step_begin_chained`: no upload, the token is already on the device) while the GPU
//! runs this one, and only then waits for the ticket. The host's forward, recording and graph
//! launch (~90–130 µs per step on the H200, `GraphStats::replay_host_ns`) then overlap the GPU
//! instead of leaving it idle. Same kernels, same graph, same ids as the plain path.

use crate::backend::CudaBackend;
use crate::device::Arg;
use crate::weight::CudaBuf;
use anyhow::{anyhow, bail, Result};
use cudarc::driver::{CudaEvent, CudaSlice, PinnedHostSlice};
use vela_compute::ARGMAX_TICKETS;

/// Pinned host slots and events of the outstanding `argmax_start` tickets.
pub(crate) struct Pipe {
    /// Pipelining on (default; `set_pipeline(false)` off: then `decode_step_begin_chained`
    /// refuses and every step waits for the previous id).
    pub on: bool,
    /// Slot `t % ARGMAX_TICKETS` of ticket `t`: its id on the host and the event after its copy
    /// (allocated at the first ticket).
    slots: Vec<(PinnedHostSlice<u32>, CudaEvent)>,
    /// The next ticket.
    next: u64,
}

impl Default for Pipe {
    fn default() -> Self {
        Pipe {
            on: true,
            slots: Vec::new(),
            next: 0,
        }
    }
}

impl CudaBackend {
    /// Launch the argmax of `n_rows` rows of `width` into the argmax output (`io`: the one-row
    /// form that also hands the id to the next step); returns the output buffer's lock.
    fn launch_argmax(
        &self,
        x: &CudaBuf,
        n_rows: usize,
        width: usize,
        io: bool,
    ) -> std::sync::MutexGuard<'_, (CudaSlice<u32>, CudaSlice<f32>)> {
        assert!(x.len() >= n_rows * width, "argmax: buffer too small");
        let mut guard = self.argmax_out.lock().unwrap_or_else(|e| e.into_inner());
        let (out, cand) = &mut *guard;
        if out.len() < n_rows {
            *out = self
                .dev
                .stream
                .alloc_zeros::<u32>(n_rows.next_power_of_two())
                .expect("CUDA alloc of argmax output");
        }
        // ARGMAX_CHUNK (elementwise.cu) elements per candidate.
        let chunks = width.div_ceil(1024);
        let n_cand = n_rows * chunks;
        if cand.len() < 2 * n_cand {
            *cand = self
                .dev
                .stream
                .alloc_zeros::<f32>((2 * n_cand).next_power_of_two())
                .expect("CUDA alloc of argmax candidates");
        }
        let (cv, ci) = (self.ptr(&*cand), self.ptr(&*cand) + 4 * n_cand as u64);
        let args = [
            Arg::P(self.ptr(x)),
            Arg::I(width as i32),
            Arg::P(cv),
            Arg::P(ci),
        ];
        self.launch("argmax_part", (chunks as u32, n_rows as u32, 1), 256, &args);
        let mut args = vec![
            Arg::P(cv),
            Arg::P(ci),
            Arg::I(chunks as i32),
            Arg::P(self.ptr(&*out)),
        ];
        let threads = (chunks.div_ceil(32) * 32).clamp(32, 1024) as u32;
        if io {
            args.push(Arg::P(self.io_ptr));
            self.launch("argmax_final_io", (1, 1, 1), threads, &args);
        } else {
            self.launch("argmax_final", (n_rows as u32, 1, 1), threads, &args);
        }
        guard
    }

    /// See `Backend::argmax_rows`.
    pub(crate) fn argmax_rows_device(&self, x: &CudaBuf, n_rows: usize, width: usize) -> Vec<u32> {
        if n_rows == 0 || width == 0 {
            return vec![0; n_rows];
        }
        let guard = self.launch_argmax(x, n_rows, width, false);
        self.flush_recording();
        let mut ids = vec![0u32; n_rows];
        self.dev
            .stream
            .memcpy_dtoh(&guard.0.slice(0..n_rows), &mut ids)
            .expect("CUDA download of argmax");
        self.dev.wait().expect("CUDA synchronize");
        ids
    }

    /// See `Backend::argmax_start`.
    pub(crate) fn argmax_start_device(&self, x: &CudaBuf, width: usize) -> Option<u64> {
        if width == 0 {
            return None;
        }
        let mut pipe = self.pipe.lock().unwrap_or_else(|e| e.into_inner());
        if pipe.slots.is_empty() {
            for _ in 0..ARGMAX_TICKETS {
                // SAFETY: the slot is written by a device copy before it is read (argmax_finish
                // waits for the copy's event first).
                let slot = unsafe {
                    self.dev
                        .stream
                        .context()
                        .alloc_pinned_with_flags::<u32>(1, 0)
                };
                let ev = self.dev.stream.context().new_event(None);
                match (slot, ev) {
                    (Ok(s), Ok(e)) => pipe.slots.push((s, e)),
                    _ => {
                        pipe.slots.clear();
                        return None;
                    }
                }
            }
        }
        // The id goes to the next step only when this argmax is part of a recorded step (whose
        // position is known); otherwise `io` is not the next step's.
        let chain = self
            .recording_pos()
            .filter(|&(_, key)| key != 0)
            .map(|(p, key)| (p + 1, key));
        let guard = self.launch_argmax(x, 1, width, true);
        self.flush_recording();
        let ticket = pipe.next;
        let (slot, ev) = &mut pipe.slots[(ticket % ARGMAX_TICKETS) as usize];
        self.dev
            .stream
            .memcpy_dtoh(&guard.0.slice(0..1), slot)
            .expect("CUDA download of argmax");
        ev.record(&self.dev.stream).expect("CUDA event record");
        drop(guard);
        pipe.next += 1;
        self.set_chain(chain.filter(|_| pipe.on));
        Some(ticket)
    }

    /// See `Backend::argmax_finish`.
    pub(crate) fn argmax_finish_device(&self, ticket: u64) -> Result<u32> {
        let pipe = self.pipe.lock().unwrap_or_else(|e| e.into_inner());
        if ticket >= pipe.next || ticket + ARGMAX_TICKETS < pipe.next || pipe.slots.is_empty() {
            bail!(
                "argmax ticket {ticket} is not outstanding (next {}, at most {ARGMAX_TICKETS})",
                pipe.next
            );
        }
        let (slot, ev) = &pipe.slots[(ticket % ARGMAX_TICKETS) as usize];
        self.dev
            .host_waits
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        ev.synchronize()
            .map_err(|e| anyhow!("waiting for the decode step: {e:?}"))?;
        let ids = slot
            .as_slice()
            .map_err(|e| anyhow!("reading the argmax back: {e:?}"))?;
        Ok(ids[0])
    }

    /// Pipelined greedy decoding on or off (default on; tests compare both).
    pub fn set_pipeline(&self, on: bool) {
        self.drop_parked();
        self.flush_recording();
        self.set_chain(None);
        self.pipe.lock().unwrap_or_else(|e| e.into_inner()).on = on;
    }
}
