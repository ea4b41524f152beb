//! L2 prefetch of the decode products' weights (default 4 MiB per product, 2 MiB in steps under
//! 1 GiB of weights; `VELA_CUDA_L2PF=<MiB>`, 0: off).
//!
//! In a decode step the memory system idles while the short dependent kernels between two
//! products run (norms, RoPE + store, attention, its combine, the activation), and each product
//! holds fewer bytes in flight than the bandwidth needs at its start. A captured step
//! (graph.rs) therefore gets a side branch at every product: once product `i` finishes, a
//! `prefetch_l2` kernel on a second stream asks L2 for the first `most` bytes of the next
//! product's weights, while the main stream runs the kernels in between. The prefetch only moves
//! cache lines (it reads and writes nothing a kernel sees), so results are unchanged; the side
//! stream joins the main one at the end of the step. Uncaptured launches never prefetch.
//!
//! Measured on the H200 (session 14, tg128, two calls each; `docs/cuda-history-3.md`, fifteenth
//! slice):
//! Llama-3-8B Q4_0 4 MiB 537.3 / 537.8 / 537.4 / 539.3 / 540.1 / 540.2 vs 517.4 / 521.2 / 520.8
//! / 519.6 / 521.4 / 521.1 t/s without (+3.5 %); Qwen2.5-0.5B Q4_K_M 4 MiB 1,456 / 1,456 /
//! 1,459 / 1,458 vs 1,426 / 1,427 / 1,426 / 1,428 (+2.2 %; 2 MiB +3 %); Gemma 4 12B unchanged.
//! More is slower (8B: 8 MiB 531.7, 16 MiB 502.3, 48 MiB 460.0), and so are prefetching past the
//! next product (8B 16 MiB 506.9; 0.5B 4 MiB 1,293), a budget per kernel in the gap (8B 533.1)
//! and bulk prefetch (`cp.async.bulk.prefetch.L2` from one-warp blocks: 8B 4 MiB 508.7, 16 MiB
//! 314.2).
//!
//! Session 15 (sixteenth slice): steps whose products read under 128 MiB in all (SmolLM2-135M)
//! get no side branch (`STEP_MIN_MIB`); prefetching only before the small or only before the
//! large products, and other grid sizes, were slower on the 8B.

use crate::graph::{Launch, Recorder};
use crate::CudaBackend;
use anyhow::{anyhow, Result};
use cudarc::driver::{CudaEvent, CudaStream, LaunchConfig, PushKernelArg};
use std::sync::Arc;

/// `prefetch_l2`'s grid: blocks of 256 threads, one per `PF_BYTES_PER_BLOCK` (8 lines of 128
/// bytes per thread) up to `PF_MAX_BLOCKS`.
const PF_BYTES_PER_BLOCK: u64 = 256 * 128 * 8;
const PF_MAX_BLOCKS: u64 = 64;

/// What each product's prefetch asks for: at most `most` bytes (0: no prefetch) of the next
/// product's weights, and only when they total at least `min` bytes; steps whose products read
/// less than `step_min` bytes in all get no prefetch (see [`step_budget`]).
#[derive(Clone, Copy, Default, Debug, PartialEq)]
pub(crate) struct PfBudget {
    pub most: u64,
    pub min: u64,
    pub step_min: u64,
    /// Steps whose weights total less than this prefetch at most `small_most` per product
    /// (see [`step_budget`]).
    pub small_step: u64,
    pub small_most: u64,
}

/// Default of `PfBudget::step_min` (`VELA_CUDA_L2PF_STEP_MIN`, MiB): SmolLM2-135M (about 90 MB
/// of weights per token) decodes faster without the side branch: tg128 1,668 / 1,673 / 1,671
/// with it vs 1,719 / 1,716 / 1,721 without (real model, suite of session 15, 3 rounds; the
/// synth geometry 1,674 / 1,675 vs 1,707 / 1,704), while Qwen2.5-0.5B (about 390 MB) gains
/// (1,457 / 1,456 / 1,453 vs 1,415 / 1,417 / 1,414) and Gemma 3 270M is unchanged.
const STEP_MIN_MIB: u64 = 128;

/// Defaults of `PfBudget::small_step` / `small_most` (`VELA_CUDA_L2PF_SMALL_STEP`,
/// `VELA_CUDA_L2PF_SMALL`, MiB): steps under 1 GiB of weights prefetch at most 2 MiB of each
/// product. H200 tg128 (session 19, call 6): the Qwen2.5-0.5B geometry (about 390 MB per
/// token) 1,580.9 / 1,580.1 t/s with 2 MiB vs 1,562.0 / 1,560.8 with 4 and 1,548.3 / 1,550.3
/// with 8; Llama-3-8B Q4_0 (4.4 GB) 570.1 / 564.9 with 4 vs 556.7 / 557.9 with 2, 560.1 / 559.4
/// with 8 and 547.4 / 547.1 without. As the rule (call 7, three rounds): Qwen2.5-0.5B 1,572.9 /
/// 1,573.5 / 1,572.0 vs 1,560.0 / 1,558.6 / 1,557.7 (`VELA_CUDA_L2PF_SMALL=4`), Gemma 3 270M
/// (246 MB) 1,932.9 / 1,929.8 / 1,927.4 vs 1,926.5 / 1,924.4 / 1,926.0.
const SMALL_STEP_MIB: u64 = 1024;
const SMALL_MOST_MIB: u64 = 2;

/// The prefetch budget of a step of `ops` from its launches' weights in all: none under
/// `budget.step_min` bytes, else `budget` with `most` cut to `small_most` under `small_step`.
pub(crate) fn step_budget(ops: &[Launch], budget: PfBudget) -> Option<PfBudget> {
    let total: u64 = ops.iter().flat_map(|o| o.weights.iter().map(|w| w.1)).sum();
    let mut b = budget;
    if total < b.small_step {
        b.most = b.most.min(b.small_most);
    }
    (total >= b.step_min).then_some(b)
}

impl Recorder {
    /// A recorder with the prefetch budget of `VELA_CUDA_L2PF` (MiB; default 4, 0: off),
    /// `VELA_CUDA_L2PF_MIN` (KiB; default 0: every product; 256 KiB to 1 MiB measured no better
    /// on the SmolLM2 and Qwen2.5-0.5B geometries) and `VELA_CUDA_L2PF_STEP_MIN` (MiB; default
    /// `STEP_MIN_MIB`).
    pub(crate) fn new() -> Self {
        let num = |k: &str, d: u64| {
            std::env::var(k)
                .ok()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(d)
        };
        Recorder {
            l2pf: PfBudget {
                most: num("VELA_CUDA_L2PF", 4) << 20,
                min: num("VELA_CUDA_L2PF_MIN", 0) << 10,
                step_min: num("VELA_CUDA_L2PF_STEP_MIN", STEP_MIN_MIB) << 20,
                small_step: num("VELA_CUDA_L2PF_SMALL_STEP", SMALL_STEP_MIB) << 20,
                small_most: num("VELA_CUDA_L2PF_SMALL", SMALL_MOST_MIB) << 20,
            },
            ..Default::default()
        }
    }
}

impl CudaBackend {
    /// Prefetch at most `mib` MiB of each product's weights in captured decode steps (0: off).
    /// Graphs captured before are dropped.
    pub fn set_l2_prefetch(&self, mib: u64) {
        self.drop_parked();
        self.flush_recording();
        let mut r = self.rec.lock().unwrap_or_else(|e| e.into_inner());
        r.l2pf.most = mib << 20;
        r.cache.clear();
    }

    /// The side stream of the prefetch, when it is on (created on first use; `None` if that
    /// fails, and the step is captured without prefetch).
    pub(crate) fn l2pf_side(&self, r: &mut Recorder) -> Option<Arc<CudaStream>> {
        if r.l2pf.most == 0 {
            return None;
        }
        if r.side.is_none() {
            r.side = self.ctx.new_stream().ok();
        }
        r.side.clone()
    }

    /// After capturing `ops[i]`: if it is a product, fork `side` from the main stream and
    /// prefetch there what [`prefetch_plan`] gives.
    pub(crate) fn l2pf_fork(
        &self,
        ops: &[Launch],
        i: usize,
        side: &CudaStream,
        budget: PfBudget,
        events: &mut Vec<CudaEvent>,
    ) -> Result<()> {
        let plan = prefetch_plan(ops, i, budget);
        if plan.is_empty() {
            return Ok(());
        }
        let f = self
            .funcs
            .get("prefetch_l2")
            .ok_or_else(|| anyhow!("CUDA kernel prefetch_l2 is not loaded"))?;
        let ev = self.stream.record_event(None)?;
        side.wait(&ev)?;
        events.push(ev);
        for (p, n, blocks) in plan {
            let cfg = LaunchConfig {
                grid_dim: (blocks, 1, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            };
            let n = n as i64;
            let mut b = side.launch_builder(f);
            b.arg(&p).arg(&n);
            // SAFETY: prefetch_l2(const char*, long long) only issues L2 prefetch hints for
            // [p, p + n), a range inside the weight allocation the product reads.
            unsafe { b.launch(cfg) }.map_err(|e| anyhow!("prefetch_l2 launch: {e:?}"))?;
        }
        Ok(())
    }

    /// Join the side stream into the main one before the capture ends (if it was forked).
    pub(crate) fn l2pf_join(&self, side: &CudaStream, events: &mut Vec<CudaEvent>) -> Result<()> {
        if events.is_empty() {
            return Ok(());
        }
        let ev = side.record_event(None)?;
        self.stream.wait(&ev)?;
        events.push(ev);
        Ok(())
    }
}

/// The `prefetch_l2` launches (address, bytes, blocks) after `ops[i]`: none unless `ops[i]` is a
/// product (has weights) and a later product exists whose weights total at least `budget.min`;
/// else the first `budget.most` bytes of the next product's weights, in the order of its weights.
pub(crate) fn prefetch_plan(ops: &[Launch], i: usize, budget: PfBudget) -> Vec<(u64, u64, u32)> {
    if ops[i].weights.is_empty() {
        return Vec::new();
    }
    let Some(next) = ops[i + 1..].iter().find(|o| !o.weights.is_empty()) else {
        return Vec::new();
    };
    if next.weights.iter().map(|w| w.1).sum::<u64>() < budget.min {
        return Vec::new();
    }
    let mut left = budget.most;
    let mut plan = Vec::new();
    for &(p, bytes) in &next.weights {
        let n = bytes.min(left);
        if n == 0 {
            break;
        }
        left -= n;
        let blocks = n.div_ceil(PF_BYTES_PER_BLOCK).clamp(1, PF_MAX_BLOCKS) as u32;
        plan.push((p, n, blocks));
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(name: &str, weights: &[(u64, u64)]) -> Launch {
        Launch {
            name: name.into(),
            grid: (1, 1, 1),
            block: 128,
            args: Vec::new(),
            weights: weights.to_vec(),
        }
    }

    fn b(most: u64) -> PfBudget {
        PfBudget {
            most,
            ..Default::default()
        }
    }

    #[test]
    fn prefetch_plan_takes_the_next_product_up_to_the_budget() {
        const M: u64 = 1 << 20;
        let ops = [
            op("norm_q8_regs", &[]),
            op(
                "mv_q4_0s_x3_r2",
                &[(0x1000, 3 * M), (0x9000, M), (0xa000, M)],
            ),
            op("rope_store", &[]),
            op("attention_part2_f16", &[]),
            op("mv_q4_0s_r2", &[(0x20000, 20 * M)]),
            op("argmax", &[]),
        ];
        // Not a product, or no product after it: nothing.
        assert!(prefetch_plan(&ops, 0, b(4 * M)).is_empty());
        assert!(prefetch_plan(&ops, 2, b(4 * M)).is_empty());
        assert!(prefetch_plan(&ops, 4, b(4 * M)).is_empty());
        // Q/K/V -> o (past the short kernels), cut at the budget; one block per 256 KiB.
        assert_eq!(prefetch_plan(&ops, 1, b(4 * M)), vec![(0x20000, 4 * M, 16)]);
        // The grid stops at PF_MAX_BLOCKS.
        assert_eq!(
            prefetch_plan(&ops, 1, b(64 * M)),
            vec![(0x20000, 20 * M, PF_MAX_BLOCKS as u32)]
        );
        // Several weights of one launch: in order, until the budget is spent.
        let ops2 = [op("mv_q4_0s_r2", &[(0x1, M)]), ops[1].clone()];
        assert_eq!(
            prefetch_plan(&ops2, 0, b(4 * M)),
            vec![(0x1000, 3 * M, 12), (0x9000, M, 4)]
        );
        assert_eq!(prefetch_plan(&ops2, 0, b(M / 2)), vec![(0x1000, M / 2, 2)]);
        // A tiny range still gets one block.
        assert_eq!(prefetch_plan(&ops2, 0, b(100)), vec![(0x1000, 100, 1)]);
        // `min`: only next products whose weights total at least that much (5 MiB here).
        let at = |min| prefetch_plan(&ops2, 0, PfBudget { min, ..b(M) });
        assert_eq!(at(5 * M), vec![(0x1000, M, 4)]);
        assert!(at(5 * M + 1).is_empty());
        // `step_min`: the step's weights (25 MiB here) decide whether it prefetches at all.
        let step = |step_min| step_budget(&ops, PfBudget { step_min, ..b(M) }).is_some();
        assert!(step(0) && step(25 * M));
        assert!(!step(25 * M + 1));
        // `small_step`: a step under it prefetches at most `small_most` per product.
        let small = |small_step| {
            let budget = PfBudget {
                small_step,
                small_most: 2 * M,
                ..b(4 * M)
            };
            step_budget(&ops, budget).map(|b| b.most)
        };
        assert_eq!(small(25 * M + 1), Some(2 * M));
        assert_eq!(small(25 * M), Some(4 * M));
    }
}
