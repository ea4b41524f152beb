//! The decode-step recorder and the capture / replay of its launch lists as CUDA graphs.
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
//! because of graphs. `VELA_CUDA_GRAPH=0` (or `CudaBackend::set_graphs`) turns recording off:
//! ops launch immediately as without this module.
//!
//! A batched step (several sequences' rows, `decode_batch_begin`) is recorded the same way: its
//! tokens and positions go to the device buffer `bio` at its begin, and the kernels read them
//! there, so its launch list depends on the batch's composition (row count, K/V table), not on
//! the positions.
//!
//! This module owns the recorder and the capture / replay of a launch list on a [`Device`];
//! the decode-step protocol around it (begin, prepare, park, launch) is in steps.rs.

use crate::device::{Arg, Device};
use crate::l2pf::{self, PfBudget};
use anyhow::{anyhow, Result};
use cudarc::driver::sys;
use cudarc::driver::{CudaGraph, CudaStream};
use std::sync::Arc;

/// Most captured graphs kept (one per live sequence state, typically, and the batched steps of
/// the batch compositions in use).
const MAX_GRAPHS: usize = 16;

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
    /// A batched step is being recorded instead (`step_begin_batch`): its tokens and
    /// positions, uploaded to the device at this address (tokens, then positions).
    pub batch: Option<(Vec<u32>, Vec<u32>, u64)>,
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
    /// The side stream of the L2 prefetch in captured steps (l2pf.rs), created on first use.
    pub side: Option<Arc<CudaStream>>,
}

impl Recorder {
    pub(crate) fn start(&mut self, token: u32, pos: u32, began: std::time::Instant) {
        self.parked = None;
        self.key = 0;
        self.preparing = false;
        self.prepare_aborted = false;
        self.active = true;
        self.batch = None;
        self.token = token;
        self.pos = pos;
        self.began = Some(began);
        self.ops.clear();
    }
}

// SAFETY: the graphs are only launched from the backend under its recorder mutex; CUDA graph
// exec handles may be used from any thread of the owning context.
unsafe impl Send for Recorder {}

/// Counters of `CudaBackend::graph_stats`.
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

impl Recorder {
    /// Replay the cached graph of `ops`, or capture one (or run them plainly); `debug`: say
    /// why a capture failed.
    pub(crate) fn run(&mut self, dev: &Device, ops: Vec<Launch>, debug: bool) {
        if ops.is_empty() {
            return;
        }
        if let Some(i) = self.cache.iter().position(|(o, _)| *o == ops) {
            // Most recently used last.
            let entry = self.cache.remove(i);
            let ok = match &entry.1 {
                Some(g) => g.launch().is_ok(),
                None => false,
            };
            if ok {
                self.replays += 1;
                if let Some(t0) = self.began.take() {
                    self.replay_host_ns += t0.elapsed().as_nanos() as u64;
                    self.replay_launches += ops.len() as u64;
                }
            } else {
                self.plain += 1;
                launch_all(dev, &ops);
            }
            self.cache.push(entry);
            return;
        }
        let budget = l2pf::step_budget(&ops);
        if budget.is_some() && self.side.is_none() {
            // (`None` if that fails: the step is captured without prefetch.)
            self.side = dev.ctx.new_stream().ok();
        }
        let pf = budget.and_then(|b| self.side.as_deref().map(|s| (s, b)));
        let graph = match capture(dev, &ops, pf) {
            Ok(g) => g.launch().is_ok().then_some(g),
            Err(e) => {
                if debug {
                    eprintln!("vela-cuda: graph capture failed, running plainly: {e:#}");
                }
                None
            }
        };
        if graph.is_some() {
            self.captures += 1;
        } else {
            self.plain += 1;
            launch_all(dev, &ops);
        }
        self.cache.push((ops, graph));
        if self.cache.len() > MAX_GRAPHS {
            self.cache.remove(0);
        }
    }
}

fn launch_all(dev: &Device, ops: &[Launch]) {
    for op in ops {
        if let Err(e) = dev.launch_now(&op.name, op.grid, op.block, &op.args) {
            panic!("{e:#}");
        }
    }
}

/// Stream-capture `ops` into an instantiated graph (nothing runs yet); with `pf` (side stream,
/// budget) each product's weights are prefetched into L2 from a side branch (l2pf.rs).
fn capture(dev: &Device, ops: &[Launch], pf: Option<(&CudaStream, PfBudget)>) -> Result<CudaGraph> {
    dev.stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(|e| anyhow!("begin capture: {e:?}"))?;
    let mut res = Ok(());
    let mut events = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        res = dev.launch_now(&op.name, op.grid, op.block, &op.args);
        if let (Ok(()), Some((side, budget))) = (&res, pf) {
            res = l2pf::fork(dev, ops, i, side, budget, &mut events);
        }
        if res.is_err() {
            break;
        }
    }
    if let (Ok(()), Some((side, _))) = (&res, pf) {
        res = l2pf::join(dev, side, &mut events);
    }
    // End the capture in every case, so the stream leaves capture mode.
    let g = dev
        .stream
        .end_capture(sys::CUgraphInstantiate_flags(0))
        .map_err(|e| anyhow!("end capture: {e:?}"));
    res?;
    g?.ok_or_else(|| anyhow!("stream capture produced no graph"))
}
