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
        let sms = self
            .stream
            .context()
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| anyhow!("querying the SM count: {e:?}"))? as u32;
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
