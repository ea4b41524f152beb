//! Decode steps as CUDA graphs.
//!
//! Between [`vela_compute::Backend::decode_step_begin`] and `decode_step_end` the backend does
//! not launch kernels: it records every launch (kernel name, grid, block, argument values). The
//! token id and the position of the step are uploaded once, at `begin`, into a small device
//! buffer (`io`), and every kernel that needs them (`get_rows`, `rope`, `kv_store`, `attention`)
//! reads them from there, so a step's launch list does not depend on the position.
//!
//! At `end` the list is compared with the lists of the graphs captured before: equal lists (the
//! same buffers, shapes and scalars) replay the cached graph with one `cuGraphLaunch`. Anything
//! that changed (another sequence state, a reallocated scratch buffer, a different cache) simply
//! gives a new list, which is captured (stream capture of the same launches) and cached. If
//! capture or instantiation fails, the recorded launches run one by one, so a step never fails
//! because of graphs. `VELA_CUDA_GRAPH=0` (or [`CudaBackend::set_graphs`]) turns recording off:
//! ops launch immediately as without this module.

use crate::{kernels, Arg, CudaBackend};
use anyhow::{anyhow, Result};
use cudarc::driver::sys;
use cudarc::driver::CudaGraph;
use cudarc::driver::{LaunchConfig, PushKernelArg};
use std::sync::atomic::Ordering;

/// Most captured graphs kept (one per live sequence state, typically).
const MAX_GRAPHS: usize = 8;

/// One recorded kernel launch.
#[derive(Clone, PartialEq, Debug)]
pub(crate) struct Launch {
    pub name: String,
    pub grid: (u32, u32, u32),
    pub block: u32,
    pub args: Vec<Arg>,
    /// Device ranges (address, bytes) of the weights a product launch reads (empty for other
    /// kernels): what the L2 prefetch asks for (l2pf.rs).
    pub weights: Vec<(u64, u64)>,
}

/// Recording state of the current decode step and the cache of captured graphs.
#[derive(Default)]
pub(crate) struct Recorder {
    /// A step is being recorded.
    pub active: bool,
    /// Token id and position of the step (also in the device `io` buffer).
    pub token: u32,
    pub pos: u32,
    pub ops: Vec<Launch>,
    /// Captured steps: the launch list and its graph (`None`: capture failed, run plainly).
    pub cache: Vec<(Vec<Launch>, Option<CudaGraph>)>,
    /// Statistics: graph replays, captures, plain (uncaptured) step runs.
    pub replays: u64,
    pub captures: u64,
    pub plain: u64,
    /// When the current step began (`step_begin`), and over the replayed steps: host time from
    /// there to the return of `cuGraphLaunch` (the model's forward on the host, recording,
    /// matching, the launch), and the launches they recorded.
    pub began: Option<std::time::Instant>,
    pub replay_host_ns: u64,
    pub replay_launches: u64,
    /// The position and sequence key whose token the last recorded `argmax_start` left in `io`
    /// (with the position itself): a `step_begin_chained` of exactly this sequence and position
    /// may read both from there. Cleared by every upload into `io`.
    pub chain: Option<(u32, u64)>,
    /// The sequence (`key`) of the step being recorded, and a recorded step not launched yet:
    /// (position, key, launches), see `step_prepare`.
    pub key: u64,
    pub parked: Option<(u32, u64, Vec<Launch>)>,
    /// A `step_prepare` recording was flushed (something in the step cannot be recorded): its
    /// remaining launches are dropped, not run, until `step_park` / `step_discard`.
    pub prepare_aborted: bool,
    /// The active recording is a `step_prepare` one, and the scratch generation it began in.
    pub preparing: bool,
    pub park_gen: u64,
    /// Steps launched from a parked recording.
    pub prepared: u64,
    /// L2 prefetch of each product's weights in captured steps (l2pf.rs): its budget, and the
    /// side stream that runs it.
    pub l2pf: crate::l2pf::PfBudget,
    pub side: Option<std::sync::Arc<cudarc::driver::CudaStream>>,
}

impl Recorder {
    fn start(&mut self, token: u32, pos: u32, began: std::time::Instant) {
        self.parked = None;
        self.key = 0;
        self.preparing = false;
        self.prepare_aborted = false;
        self.active = true;
        self.token = token;
        self.pos = pos;
        self.began = Some(began);
        self.ops.clear();
    }
}

// SAFETY: the graphs are only launched from the backend under its recorder mutex; CUDA graph
// exec handles may be used from any thread of the owning context.
unsafe impl Send for Recorder {}

/// Counters of [`CudaBackend::graph_stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// Steps replayed from a cached graph.
    pub replays: u64,
    /// Steps captured into a new graph.
    pub captures: u64,
    /// Steps run launch by launch (capture failed earlier for the same list).
    pub plain: u64,
    /// Host time of the replayed steps in all, from the step's begin to the return of
    /// `cuGraphLaunch` (the GPU is idle for most of it: the step's token is known only once the
    /// previous step's sample was read back).
    pub replay_host_ns: u64,
    /// Kernel launches recorded by the replayed steps.
    pub replay_launches: u64,
    /// Steps launched from a recording made ahead (`Backend::decode_step_prepare`).
    pub prepared: u64,
}

impl CudaBackend {
    fn recorder(&self) -> std::sync::MutexGuard<'_, Recorder> {
        self.rec.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Enable or disable decode-step graphs (default: on unless `VELA_CUDA_GRAPH=0`).
    pub fn set_graphs(&self, on: bool) {
        self.drop_parked();
        self.flush_recording();
        self.graphs_on
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    /// How many decode steps were replayed, captured or run plainly so far.
    pub fn graph_stats(&self) -> GraphStats {
        let r = self.recorder();
        GraphStats {
            replays: r.replays,
            captures: r.captures,
            plain: r.plain,
            replay_host_ns: r.replay_host_ns,
            replay_launches: r.replay_launches,
            prepared: r.prepared,
        }
    }

    /// Queue a launch: recorded while a step is being recorded, else launched now.
    pub(crate) fn launch(&self, name: &str, grid: (u32, u32, u32), block: u32, args: &[Arg]) {
        self.launch_w(name, grid, block, args, Vec::new());
    }

    /// [`Self::launch`] of a product that reads `weights` (address, bytes).
    pub(crate) fn launch_w(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        args: &[Arg],
        weights: Vec<(u64, u64)>,
    ) {
        {
            let mut r = self.recorder();
            if r.active {
                r.ops.push(Launch {
                    name: name.to_string(),
                    grid,
                    block,
                    args: args.to_vec(),
                    weights,
                });
                return;
            }
            if r.prepare_aborted {
                return;
            }
        }
        let t = self.prof_begin();
        if let Err(e) = self.launch_now(name, grid, block, args) {
            panic!("{e:#}");
        }
        self.prof_end(name, t);
    }

    /// The device `io` buffer's token slot, if a step for `ids` is being recorded (else the
    /// recording, if any, is flushed and `None` returned).
    pub(crate) fn recorded_token(&self, ids: &[u32]) -> Option<u64> {
        let r = self.recorder();
        if r.active && ids == [r.token] {
            return Some(self.io_ptr);
        }
        let active = r.active;
        drop(r);
        if active {
            self.flush_recording();
        }
        None
    }

    /// Like [`Self::recorded_token`] for the position slot.
    pub(crate) fn recorded_pos(&self, positions: &[u32]) -> Option<u64> {
        let r = self.recorder();
        if r.active && positions == [r.pos] {
            return Some(self.io_ptr + 4);
        }
        let active = r.active;
        drop(r);
        if active {
            self.flush_recording();
        }
        None
    }

    /// Start recording a one-token step (see the module docs); false when graphs are off.
    pub(crate) fn step_begin(&self, token: u32, pos: u32, key: u64) -> bool {
        // (`DEVICE_TOKEN` is never a host token: unrecorded, the embedding lookup rejects it.)
        if !self.graphs_on.load(std::sync::atomic::Ordering::Relaxed)
            || token == vela_compute::DEVICE_TOKEN
        {
            return false;
        }
        let began = std::time::Instant::now();
        self.flush_recording();
        self.upload_io(token, pos);
        let mut r = self.recorder();
        r.chain = None;
        r.start(token, pos, began);
        r.key = key;
        true
    }

    /// Start recording a step at `pos` whose token the previous recorded `argmax_start` left in
    /// `io` (`vela_compute::DEVICE_TOKEN` stands for it); false when there is none for `pos`.
    pub(crate) fn step_begin_chained(&self, pos: u32, key: u64) -> bool {
        if !self.graphs_on.load(std::sync::atomic::Ordering::Relaxed) {
            return false;
        }
        let began = std::time::Instant::now();
        self.flush_recording();
        let mut r = self.recorder();
        if r.chain != Some((pos, key)) || key == 0 {
            return false;
        }
        r.chain = None;
        r.start(vela_compute::DEVICE_TOKEN, pos, began);
        r.key = key;
        true
    }

    /// Record a one-token step at `pos` of sequence `key` whose token is not known yet (it
    /// reads it from `io`, `vela_compute::DEVICE_TOKEN` stands for it), to be launched later by
    /// `step_launch` once the token is known; `step_park` ends the recording. The host records
    /// the next step while the GPU still runs this one (and the top-k/sampling that picks the
    /// token), so only the upload and the graph launch remain between the token and the step.
    pub(crate) fn step_prepare(&self, pos: u32, key: u64) -> bool {
        if !self.graphs_on.load(std::sync::atomic::Ordering::Relaxed)
            || !self.prepare_on.load(std::sync::atomic::Ordering::Relaxed)
            || key == 0
            || self.one_token_gemm()
        {
            return false;
        }
        let began = std::time::Instant::now();
        self.flush_recording();
        let mut r = self.recorder();
        r.start(vela_compute::DEVICE_TOKEN, pos, began);
        r.key = key;
        r.preparing = true;
        r.park_gen = self.scratch_gen.load(std::sync::atomic::Ordering::Relaxed);
        true
    }

    /// End the recording `step_prepare` began: its launches wait for `step_launch`.
    pub(crate) fn step_park(&self) {
        let mut r = self.recorder();
        r.prepare_aborted = false;
        if !r.active || !r.preparing {
            return;
        }
        r.preparing = false;
        r.active = false;
        r.began = None;
        let ops = std::mem::take(&mut r.ops);
        r.parked = Some((r.pos, r.key, ops));
    }

    /// Launch the parked step if it is the one of `pos` in sequence `key`, with `token`
    /// (uploaded into `io` with the position); false (and the parked step dropped) otherwise.
    pub(crate) fn step_launch(&self, token: u32, pos: u32, key: u64) -> bool {
        if !self.graphs_on.load(std::sync::atomic::Ordering::Relaxed) {
            return false;
        }
        let began = std::time::Instant::now();
        self.flush_recording();
        let mut r = self.recorder();
        // (A scratch buffer reallocated since the recording: its launches point at freed memory.)
        let gen = self.scratch_gen.load(std::sync::atomic::Ordering::Relaxed);
        let ops = match r.parked.take() {
            Some((p, k, ops)) if p == pos && k == key && key != 0 && r.park_gen == gen => ops,
            _ => return false,
        };
        self.upload_io(token, pos);
        r.chain = None;
        r.token = token;
        r.pos = pos;
        r.began = Some(began);
        r.prepared += 1;
        self.run_ops(&mut r, ops);
        true
    }

    /// The step's token and position into the device `io` buffer (stream-ordered).
    fn upload_io(&self, token: u32, pos: u32) {
        let mut io = self.io.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = self.stream.memcpy_htod(&[token, pos], &mut *io) {
            panic!("CUDA upload of the decode step's token and position: {e:?}");
        }
    }

    /// Drop a parked step (a switch changed what its launches would be).
    pub(crate) fn drop_parked(&self) {
        self.recorder().parked = None;
    }

    /// Drop a `step_prepare` recording in progress, or a parked step, without running it.
    pub(crate) fn step_discard(&self) {
        let mut r = self.recorder();
        if r.active && r.preparing {
            r.active = false;
            r.began = None;
            r.ops.clear();
        }
        r.preparing = false;
        r.prepare_aborted = false;
        r.parked = None;
        r.chain = None;
    }

    /// A scratch buffer that recorded launches point at was reallocated (the old one is freed
    /// in stream order): parked steps recorded before must not run.
    pub(crate) fn scratch_moved(&self) {
        self.scratch_gen
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    /// The position and sequence key of the step being recorded, if one is.
    pub(crate) fn recording_pos(&self) -> Option<(u32, u64)> {
        let r = self.recorder();
        r.active.then_some((r.pos, r.key))
    }

    /// See [`Recorder::chain`].
    pub(crate) fn set_chain(&self, chain: Option<(u32, u64)>) {
        self.recorder().chain = chain;
    }

    /// Run what was recorded since [`Self::step_begin`] (no-op when nothing is recorded).
    pub(crate) fn flush_recording(&self) {
        let mut r = self.recorder();
        if !r.active {
            return;
        }
        r.active = false;
        let ops = std::mem::take(&mut r.ops);
        if r.preparing {
            // A step recorded ahead cannot run now (`io` holds this step's token): drop it and
            // whatever it would still launch.
            r.preparing = false;
            r.prepare_aborted = true;
            r.began = None;
            return;
        }
        self.run_ops(&mut r, ops);
    }

    /// Replay the cached graph of `ops`, or capture one (or run them plainly).
    fn run_ops(&self, r: &mut Recorder, ops: Vec<Launch>) {
        if ops.is_empty() {
            return;
        }
        if let Some(i) = r.cache.iter().position(|(o, _)| *o == ops) {
            // Most recently used last.
            let entry = r.cache.remove(i);
            let ok = match &entry.1 {
                Some(g) => g.launch().is_ok(),
                None => false,
            };
            if ok {
                r.replays += 1;
                if let Some(t0) = r.began.take() {
                    r.replay_host_ns += t0.elapsed().as_nanos() as u64;
                    r.replay_launches += ops.len() as u64;
                }
            } else {
                r.plain += 1;
                self.launch_all(&ops);
            }
            r.cache.push(entry);
            return;
        }
        let budget = crate::l2pf::step_budget(&ops, r.l2pf);
        let pf = budget.and_then(|_| self.l2pf_side(r));
        let graph = match self.capture(&ops, pf.as_deref().zip(budget)) {
            Ok(g) => g.launch().is_ok().then_some(g),
            Err(e) => {
                if std::env::var_os("VELA_CUDA_DEBUG").is_some() {
                    eprintln!("vela-cuda: graph capture failed, running plainly: {e:#}");
                }
                None
            }
        };
        if graph.is_some() {
            r.captures += 1;
        } else {
            r.plain += 1;
            self.launch_all(&ops);
        }
        r.cache.push((ops, graph));
        if r.cache.len() > MAX_GRAPHS {
            r.cache.remove(0);
        }
    }

    fn launch_all(&self, ops: &[Launch]) {
        for op in ops {
            if let Err(e) = self.launch_now(&op.name, op.grid, op.block, &op.args) {
                panic!("{e:#}");
            }
        }
    }

    /// Launch a kernel now (not recorded).
    pub(crate) fn launch_now(
        &self,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        args: &[Arg],
    ) -> Result<()> {
        let f = self
            .funcs
            .get(name)
            .ok_or_else(|| anyhow!("CUDA kernel {name} is not loaded"))?;
        if self.skip.iter().any(|p| name.starts_with(p.as_str())) {
            return Ok(());
        }
        if self.pdl.load(Ordering::Relaxed) {
            return self
                .launch_pdl(f, grid, block, kernels::dyn_smem(name), args)
                .map_err(|e| anyhow!("CUDA launch of {name} failed: {e:?}"));
        }
        let mut b = self.stream.launch_builder(f);
        for a in args {
            match a {
                Arg::P(x) => b.arg(x),
                Arg::I(x) => b.arg(x),
                Arg::L(x) => b.arg(x),
                Arg::F(x) => b.arg(x),
            };
        }
        let cfg = LaunchConfig {
            grid_dim: grid,
            block_dim: (block, 1, 1),
            shared_mem_bytes: kernels::dyn_smem(name),
        };
        // SAFETY: every kernel's parameter list matches `args` (see kernels/*.cu), and the
        // callers size the grids to the buffers they pass.
        unsafe { b.launch(cfg) }
            .map(|_| ())
            .map_err(|e| anyhow!("CUDA launch of {name} failed: {e:?}"))
    }

    /// Launch `f` with programmatic stream serialization (PDL): its blocks may start while the
    /// previous kernel of the stream runs; each kernel waits for it with `griddepcontrol.wait`
    /// before touching its data (`PDL_ENTRY` in kernels/common.cu). Stream capture turns the
    /// attribute into programmatic graph edges, so replayed decode steps overlap the same way.
    pub(crate) fn launch_pdl(
        &self,
        f: &cudarc::driver::CudaFunction,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[Arg],
    ) -> std::result::Result<(), cudarc::driver::DriverError> {
        self.stream.context().bind_to_thread()?;
        // Every argument in its own 8-byte slot (little-endian: 4-byte values at the start).
        let mut slots: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                Arg::P(x) => x,
                Arg::I(x) => x as u32 as u64,
                Arg::L(x) => x as u64,
                Arg::F(x) => x.to_bits() as u64,
            })
            .collect();
        let mut params: Vec<*mut std::ffi::c_void> = slots
            .iter_mut()
            .map(|s| s as *mut u64 as *mut std::ffi::c_void)
            .collect();
        // SAFETY: plain-old-data C structs; all-zero is a valid value of each.
        let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
        attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
        attr.value.programmaticStreamSerializationAllowed = 1;
        let cfg = sys::CUlaunchConfig {
            gridDimX: grid.0,
            gridDimY: grid.1,
            gridDimZ: grid.2,
            blockDimX: block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: smem,
            hStream: self.stream.cu_stream(),
            attrs: &mut attr,
            numAttrs: 1,
        };
        // SAFETY: `params` points at one live slot per kernel parameter, in order, each holding
        // the parameter's value (see `Arg`); the callers size the grids to the buffers passed.
        unsafe {
            sys::cuLaunchKernelEx(
                &cfg,
                f.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()
    }

    /// Stream-capture `ops` into an instantiated graph (nothing runs yet); with `pf` (side
    /// stream, most bytes) each product's weights are prefetched into L2 from a side branch
    /// (l2pf.rs).
    pub(crate) fn capture(
        &self,
        ops: &[Launch],
        pf: Option<(&cudarc::driver::CudaStream, crate::l2pf::PfBudget)>,
    ) -> Result<CudaGraph> {
        self.stream
            .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .map_err(|e| anyhow!("begin capture: {e:?}"))?;
        let mut res = Ok(());
        let mut events = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            res = self.launch_now(&op.name, op.grid, op.block, &op.args);
            if let (Ok(()), Some((side, budget))) = (&res, pf) {
                res = self.l2pf_fork(ops, i, side, budget, &mut events);
            }
            if res.is_err() {
                break;
            }
        }
        if let (Ok(()), Some((side, _))) = (&res, pf) {
            res = self.l2pf_join(side, &mut events);
        }
        // End the capture in every case, so the stream leaves capture mode.
        let g = self
            .stream
            .end_capture(sys::CUgraphInstantiate_flags(0))
            .map_err(|e| anyhow!("end capture: {e:?}"));
        res?;
        g?.ok_or_else(|| anyhow!("stream capture produced no graph"))
    }
}
