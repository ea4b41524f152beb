//! Measurement for the persistent-kernel design (docs/cuda.md): what one grid-wide barrier
//! (`grid_barrier` in kernels/common.cu) costs inside a resident grid, against one dependent
//! launch in a captured graph with programmatic dependent launch, the way decode steps run, and
//! against one counter edge (`flag_chain_link`: the next kernel launched early waits on a counter
//! the previous one's blocks release, not on the whole grid's completion).

use crate::graph::Launch;
use crate::{Arg, CudaBackend};
use anyhow::{anyhow, bail, Context, Result};
use cudarc::driver::sys;
use std::time::Instant;

/// Result of [`CudaBackend::sync_cost`], in microseconds.
#[derive(Clone, Copy, Debug)]
pub struct SyncCost {
    /// Blocks of the grid (resident at once) and threads per block.
    pub blocks: u32,
    pub threads: u32,
    /// One grid barrier: the difference of a kernel with 2n and one with n barriers, per barrier.
    pub barrier_us: f64,
    /// One dependent launch of the same grid in a replayed graph of n launches.
    pub launch_us: f64,
    /// One launch of the same grid in a replayed graph of n + 1 launches chained by counter
    /// edges (one reset launch, then n links).
    pub flag_us: f64,
}

impl CudaBackend {
    /// Time `n` grid barriers and `n` dependent launches of a grid of `blocks_per_sm` blocks of
    /// `threads` per SM (best of `reps` runs each). Fails if a barrier lets a block through early
    /// (`grid_barrier_test` counts that) or if the grid cannot be resident at once.
    pub fn sync_cost(
        &self,
        blocks_per_sm: u32,
        threads: u32,
        n: u32,
        reps: u32,
    ) -> Result<SyncCost> {
        let sms = self.sm_count()?;
        let f = self
            .funcs
            .get("grid_barrier_test")
            .ok_or_else(|| anyhow!("grid_barrier_test is not loaded"))?;
        let fit = f
            .occupancy_max_active_blocks_per_multiprocessor(threads, 0, None)
            .map_err(|e| anyhow!("occupancy query: {e:?}"))?;
        if blocks_per_sm > fit {
            bail!("{blocks_per_sm} blocks of {threads} threads per SM do not fit ({fit} do)");
        }
        let blocks = sms * blocks_per_sm;
        let s = &self.stream;
        let bar = s.alloc_zeros::<u32>(2).context("alloc")?;
        let flags = s.alloc_zeros::<u32>(blocks as usize).context("alloc")?;
        let err = s.alloc_zeros::<u32>(1).context("alloc")?;
        let x = s.alloc_zeros::<u32>(blocks as usize).context("alloc")?;
        let (pb, pf, pe, px) = (
            self.ptr(&bar),
            self.ptr(&flags),
            self.ptr(&err),
            self.ptr(&x),
        );
        let barrier_run = |phases: u32| -> Result<f64> {
            let mut best = f64::MAX;
            for _ in 0..reps {
                self.synchronize()?;
                let t = Instant::now();
                let args = [Arg::P(pb), Arg::P(pf), Arg::P(pe), Arg::I(phases as i32)];
                self.launch_now("grid_barrier_test", (blocks, 1, 1), threads, &args)?;
                self.synchronize()?;
                best = best.min(t.elapsed().as_secs_f64());
            }
            Ok(best)
        };
        let t1 = barrier_run(n)?;
        let t2 = barrier_run(2 * n)?;
        let mut e = [0u32; 1];
        s.memcpy_dtoh(&err, &mut e).context("read back")?;
        if e[0] != 0 {
            bail!("grid barrier let {} block reads through early", e[0]);
        }
        let link = |name: &str, grid: u32, args: Vec<Arg>| Launch {
            name: name.into(),
            grid: (grid, 1, 1),
            block: threads,
            args,
            weights: Vec::new(),
        };
        let ops: Vec<Launch> = (0..n)
            .map(|_| link("launch_chain_link", blocks, vec![Arg::P(px)]))
            .collect();
        let launch = self.graph_time(&ops, reps)?;
        self.check_counts(&x, blocks, reps * n, "launch chain")?;
        // Counter edges: a reset, then n links on their own x.
        let cnt = s.alloc_zeros::<u32>(n as usize + 1).context("alloc")?;
        let x2 = s.alloc_zeros::<u32>(blocks as usize).context("alloc")?;
        let (pc, px2) = (self.ptr(&cnt), self.ptr(&x2));
        let mut ops = vec![link(
            "flag_chain_reset",
            1,
            vec![Arg::P(pc), Arg::I(n as i32)],
        )];
        for k in 1..=n {
            let args = vec![
                Arg::P(px2),
                Arg::P(pc),
                Arg::I(k as i32),
                Arg::I(n as i32),
                Arg::P(pe),
            ];
            ops.push(link("flag_chain_link", blocks, args));
        }
        let flag = self.graph_time(&ops, reps)?;
        s.memcpy_dtoh(&err, &mut e).context("read back")?;
        if e[0] != 0 {
            bail!(
                "counter chain: {} block(s) ran before their predecessor",
                e[0]
            );
        }
        self.check_counts(&x2, blocks, reps * n, "counter chain")?;
        Ok(SyncCost {
            blocks,
            threads,
            barrier_us: (t2 - t1) / n as f64 * 1e6,
            launch_us: launch / n as f64 * 1e6,
            flag_us: flag / (n + 1) as f64 * 1e6,
        })
    }

    /// The device's multiprocessor count.
    fn sm_count(&self) -> Result<u32> {
        let n = self
            .stream
            .context()
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| anyhow!("querying the SM count: {e:?}"))?;
        Ok(n as u32)
    }

    /// Best wall time of `reps` replays of the graph of `ops` (captured once).
    fn graph_time(&self, ops: &[Launch], reps: u32) -> Result<f64> {
        let graph = self.capture(ops, None)?;
        let mut best = f64::MAX;
        for _ in 0..reps {
            self.synchronize()?;
            let t = Instant::now();
            graph.launch().map_err(|e| anyhow!("graph launch: {e:?}"))?;
            self.synchronize()?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        Ok(best)
    }

    /// Every block's count in `x` equals `want`.
    fn check_counts(
        &self,
        x: &cudarc::driver::CudaSlice<u32>,
        blocks: u32,
        want: u32,
        what: &str,
    ) -> Result<()> {
        let mut xs = vec![0u32; blocks as usize];
        self.stream.memcpy_dtoh(x, &mut xs).context("read back")?;
        if xs.iter().any(|&v| v != want) {
            bail!(
                "{what}: a block counted {:?}, expected {want}",
                xs.iter().min()
            );
        }
        Ok(())
    }
}

/// Result of [`CudaBackend::overlap_probe`].
#[derive(Clone, Copy, Debug)]
pub struct OverlapProbe {
    /// Blocks (one per SM) and threads per block.
    pub blocks: u32,
    pub threads: u32,
    /// Best time per layer in microseconds.
    pub layer_us: f64,
    /// Weight bytes per layer.
    pub layer_bytes: u64,
}

impl CudaBackend {
    /// Run `overlap_probe` (kernels/elementwise.cu): `layers` decode-shaped layers of width `d`,
    /// `qkv` Q/K/V rows and `ff` FFN rows, 4-bit weights, one resident block of `threads` per
    /// SM, `pf` weight bytes per block and phase copied ahead of each edge (best of `reps`).
    /// What a persistent decode kernel whose phases meet at counter edges could reach. `flags`
    /// takes parts out for the decomposition (bits): 1 the edges (the weight stream alone), 2
    /// the weight rows (the edges and input reads alone), 4 the per-phase input pass. Fails if
    /// a block found a producer's stamp missing after an edge.
    #[allow(clippy::too_many_arguments)]
    pub fn overlap_probe(
        &self,
        d: u32,
        qkv: u32,
        ff: u32,
        layers: u32,
        threads: u32,
        pf: u32,
        flags: u32,
        reps: u32,
    ) -> Result<OverlapProbe> {
        if self.arch < 80 {
            // (cp.async and the 96 KiB of dynamic shared memory.)
            bail!("overlap probe: needs sm_80 or newer");
        }
        let sms = self.sm_count()?;
        if !d.is_multiple_of(32)
            || !ff.is_multiple_of(32)
            || d.max(ff) > 16384
            || pf > crate::kernels::OVERLAP_PF_MAX
        {
            bail!("overlap probe: d {d} / ff {ff} / pf {pf} out of range");
        }
        if threads < sms || !threads.is_multiple_of(32) || threads > 1024 {
            bail!("overlap probe: {threads} threads (a multiple of 32, at least {sms})");
        }
        self.probe_layers(
            "overlap_probe",
            (d, qkv, ff, layers),
            threads,
            &[Arg::I(pf as i32), Arg::I(flags as i32)],
            reps,
        )
    }

    /// Run probe kernel `name` (`overlap_probe`, `stream_probe`: one block of `threads` per SM)
    /// on `layers` decode-shaped layers of `geom` = (d, qkv, ff) with zero 4-bit weights, the
    /// kernel's own trailing arguments `tail` after the common ones; best of `reps`. Fails if a
    /// block of that size does not fit or found a producer's stamp missing after an edge.
    fn probe_layers(
        &self,
        name: &str,
        geom: (u32, u32, u32, u32),
        threads: u32,
        tail: &[Arg],
        reps: u32,
    ) -> Result<OverlapProbe> {
        let (d, qkv, ff, layers) = geom;
        let sms = self.sm_count()?;
        let f = self
            .funcs
            .get(name)
            .ok_or_else(|| anyhow!("{name} is not loaded"))?;
        let smem = crate::kernels::dyn_smem(name) as usize;
        let fit = f
            .occupancy_max_active_blocks_per_multiprocessor(threads, smem, None)
            .map_err(|e| anyhow!("occupancy query: {e:?}"))?;
        if fit < 1 {
            bail!("{name}: a block of {threads} threads and {smem} bytes does not fit on an SM");
        }
        let (d64, qkv64, ff64) = (d as u64, qkv as u64, ff as u64);
        let layer_bytes = (qkv64 + d64 + 2 * ff64) * d64 / 2 + d64 * ff64 / 2;
        let s = &self.stream;
        let w = s
            .alloc_zeros::<u8>((layer_bytes * layers as u64) as usize)
            .context("alloc")?;
        let act_len = (4 * d + qkv + 2 * ff) as usize;
        let act_host: Vec<f32> = (0..act_len)
            .map(|i| ((i % 17) as f32 - 8.0) * 0.1)
            .collect();
        let act = s.clone_htod(&act_host).context("upload")?;
        let mut cnt = s.alloc_zeros::<u32>(5 * layers as usize).context("alloc")?;
        let mut stamp = s.alloc_zeros::<u32>(sms as usize).context("alloc")?;
        let err = s.alloc_zeros::<u32>(1).context("alloc")?;
        let mut best = f64::MAX;
        for _ in 0..reps {
            s.memset_zeros(&mut cnt).context("memset")?;
            s.memset_zeros(&mut stamp).context("memset")?;
            self.synchronize()?;
            let t = Instant::now();
            let mut args = vec![
                Arg::P(self.ptr(&w)),
                Arg::P(self.ptr(&act)),
                Arg::P(self.ptr(&cnt)),
                Arg::P(self.ptr(&stamp)),
                Arg::P(self.ptr(&err)),
                Arg::I(layers as i32),
                Arg::I(d as i32),
                Arg::I(qkv as i32),
                Arg::I(ff as i32),
            ];
            args.extend_from_slice(tail);
            self.launch_now(name, (sms, 1, 1), threads, &args)?;
            self.synchronize()?;
            best = best.min(t.elapsed().as_secs_f64());
        }
        let mut e = [0u32; 1];
        s.memcpy_dtoh(&err, &mut e).context("read back")?;
        if e[0] != 0 {
            bail!("{name}: {} stamp(s) missing after an edge", e[0]);
        }
        Ok(OverlapProbe {
            blocks: sms,
            threads,
            layer_us: best / layers as f64 * 1e6,
            layer_bytes,
        })
    }
}

impl CudaBackend {
    /// Run `stream_probe` (kernels/elementwise.cu): `overlap_probe`'s layers with the weights
    /// streamed through a ring of shared-memory slots by a producer warp that runs ahead of the
    /// edges (cp.async.bulk + mbarriers; sm_90), `consumers` computing warps per block, one block
    /// per SM (best of `reps`). `flags` as `overlap_probe`'s. Fails if a wait timed out (the
    /// kernel traps) or a block found a producer's stamp missing after an edge.
    #[allow(clippy::too_many_arguments)]
    pub fn stream_probe(
        &self,
        d: u32,
        qkv: u32,
        ff: u32,
        layers: u32,
        consumers: u32,
        flags: u32,
        reps: u32,
    ) -> Result<OverlapProbe> {
        if self.arch < 90 {
            bail!("stream probe: needs sm_90 (cp.async.bulk, mbarrier transactions)");
        }
        let sms = self.sm_count()?;
        let slot = crate::kernels::STREAM_RING / crate::kernels::STREAM_STAGES;
        if !d.is_multiple_of(32) || !ff.is_multiple_of(32) || d.max(ff) > 16384 || ff / 2 > slot {
            bail!("stream probe: d {d} / ff {ff} out of range");
        }
        let threads = 32 * (consumers + 1);
        if consumers == 0 || threads > 1024 || 32 * consumers < sms {
            bail!("stream probe: {consumers} consumer warps (at least {sms} threads, at most 31)");
        }
        // Tries before a wait gives up (well under a second each).
        let tail = [Arg::I(flags as i32), Arg::L(1 << 22)];
        self.probe_layers("stream_probe", (d, qkv, ff, layers), threads, &tail, reps)
    }
}
