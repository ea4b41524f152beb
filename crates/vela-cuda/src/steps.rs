//! The decode-step protocol of [`vela_compute::Backend`] on the CUDA backend: a one-token step is
//! recorded between `decode_step_begin` and `decode_step_end` and run as a CUDA graph
//! (graph.rs); a step may be recorded ahead while the GPU runs the previous one
//! (`decode_step_prepare` / `park` / `launch`), or chained to the previous step's device argmax.

use crate::backend::CudaBackend;
use crate::graph::GraphStats;
use std::sync::atomic::Ordering;

impl CudaBackend {
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

    /// The device `io` buffer's token slot, if a step for `ids` is being recorded (else the
    /// recording, if any, is flushed and `None` returned).
    pub(crate) fn recorded_token(&self, ids: &[u32]) -> Option<u64> {
        let r = self.recorder();
        match &r.batch {
            Some((t, _, p)) if r.active && ids == t => return Some(*p),
            None if r.active && ids == [r.token] => return Some(self.io_ptr),
            _ => {}
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
        match &r.batch {
            Some((t, pos, p)) if r.active && positions == pos => {
                return Some(p + 4 * t.len() as u64)
            }
            None if r.active && positions == [r.pos] => return Some(self.io_ptr + 4),
            _ => {}
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
        if !self.tune.graphs() || token == vela_compute::DEVICE_TOKEN {
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

    /// Start recording a batched step: `tokens` at `positions` (every sequence's rows in turn),
    /// uploaded into `bio` here; the step's ops that take exactly these tokens or positions
    /// read them from there. False when graphs are off.
    pub(crate) fn step_begin_batch(&self, tokens: &[u32], positions: &[u32]) -> bool {
        if !self.tune.graphs() || tokens.is_empty() || tokens.len() != positions.len() {
            return false;
        }
        let began = std::time::Instant::now();
        self.flush_recording();
        let n = tokens.len();
        let ptr = {
            let mut bio = self.bio.lock().unwrap_or_else(|e| e.into_inner());
            if bio.len() < 2 * n {
                *bio = self
                    .dev
                    .stream
                    .alloc_zeros::<u32>((2 * n).next_power_of_two())
                    .expect("CUDA alloc of the batch's tokens and positions");
                self.scratch_moved();
            }
            let both: Vec<u32> = tokens.iter().chain(positions).copied().collect();
            self.dev
                .stream
                .memcpy_htod(&both, &mut bio.slice_mut(0..2 * n))
                .expect("CUDA upload of the batch's tokens and positions");
            self.ptr(&*bio)
        };
        let mut r = self.recorder();
        r.start(0, 0, began);
        r.batch = Some((tokens.to_vec(), positions.to_vec(), ptr));
        true
    }

    /// Start recording a step at `pos` whose token the previous recorded `argmax_start` left in
    /// `io` (`vela_compute::DEVICE_TOKEN` stands for it); false when there is none for `pos`.
    pub(crate) fn step_begin_chained(&self, pos: u32, key: u64) -> bool {
        if !self.tune.graphs() {
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
        if !self.tune.graphs() || key == 0 || self.one_token_gemm() {
            return false;
        }
        let began = std::time::Instant::now();
        self.flush_recording();
        let mut r = self.recorder();
        r.start(vela_compute::DEVICE_TOKEN, pos, began);
        r.key = key;
        r.preparing = true;
        r.park_gen = self.scratch_gen.load(Ordering::Relaxed);
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
        if !self.tune.graphs() {
            return false;
        }
        let began = std::time::Instant::now();
        self.flush_recording();
        let mut r = self.recorder();
        // (A scratch buffer reallocated since the recording: its launches point at freed memory.)
        let gen = self.scratch_gen.load(Ordering::Relaxed);
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
        r.run(&self.dev, ops, self.tune.debug);
        true
    }

    /// The step's token and position into the device `io` buffer (stream-ordered).
    fn upload_io(&self, token: u32, pos: u32) {
        let mut io = self.io.lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = self.dev.stream.memcpy_htod(&[token, pos], &mut *io) {
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
        self.scratch_gen.fetch_add(1, Ordering::Relaxed);
    }

    /// A step with its token known on the host is being recorded (not one recorded ahead, whose
    /// launches may run after later uploads): inputs uploaded now precede its launches.
    pub(crate) fn recording_inputs(&self) -> bool {
        let r = self.recorder();
        r.active && !r.preparing
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
        r.run(&self.dev, ops, self.tune.debug);
    }
}
