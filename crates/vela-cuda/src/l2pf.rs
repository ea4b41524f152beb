//! L2 prefetch of the decode products' weights in captured decode steps.
//!
//! In a decode step the memory system idles while the short dependent kernels between two
//! products run (norms, RoPE + store, attention, its combine, the activation), and each product
//! holds fewer bytes in flight than the bandwidth needs at its start. A captured step
//! (graph.rs) therefore gets a side branch at every product: once product `i` finishes, a
//! `prefetch_l2` kernel on a second stream asks L2 for the first `most` bytes of the next
//! product's weights, while the main stream runs the kernels in between. The prefetch only moves
//! cache lines (it reads and writes nothing a kernel sees), so results are unchanged; the side
//! stream joins the main one at the end of the step. Uncaptured launches never prefetch.
//! Llama-3-8B Q4_0 decode +3.5 %, Qwen2.5-0.5B +2.2 % on the H200; more bytes, prefetching
//! past the next product and bulk prefetch were slower (docs/perf-log.md).

use crate::device::Device;
use crate::graph::Launch;
use anyhow::{anyhow, Result};
use cudarc::driver::{CudaEvent, CudaStream, LaunchConfig, PushKernelArg};

/// `prefetch_l2`'s grid: blocks of 256 threads, one per `PF_BYTES_PER_BLOCK` (8 lines of 128
/// bytes per thread) up to `PF_MAX_BLOCKS`.
const PF_BYTES_PER_BLOCK: u64 = 256 * 128 * 8;
const PF_MAX_BLOCKS: u64 = 64;

/// What each product's prefetch asks for: at most `most` bytes of the next product's weights;
/// steps whose products read less than `step_min` bytes in all get no prefetch, steps under
/// `small_step` at most `small_most` per product (see [`budget_for`]).
#[derive(Clone, Copy, Default, Debug, PartialEq)]
pub(crate) struct PfBudget {
    pub most: u64,
    pub step_min: u64,
    pub small_step: u64,
    pub small_most: u64,
}

/// The budget: 4 MiB per product (8 MiB and more were slower on Llama-3-8B); none in steps under
/// 128 MiB of weights (SmolLM2-135M: 1,670 vs 1,719 tok/s without, docs/perf-log.md); 2 MiB in
/// steps under 1 GiB (Qwen2.5-0.5B: 1,573 vs 1,559 tok/s with 4 MiB, docs/perf-log.md).
const BUDGET: PfBudget = PfBudget {
    most: 4 << 20,
    step_min: 128 << 20,
    small_step: 1024 << 20,
    small_most: 2 << 20,
};

/// The prefetch budget of a step of `ops` (see [`BUDGET`]).
pub(crate) fn step_budget(ops: &[Launch]) -> Option<PfBudget> {
    budget_for(ops, BUDGET)
}

/// The budget of a step of `ops` from its launches' weights in all: none under
/// `budget.step_min` bytes, else `budget` with `most` cut to `small_most` under `small_step`.
fn budget_for(ops: &[Launch], budget: PfBudget) -> Option<PfBudget> {
    let total: u64 = ops.iter().flat_map(|o| o.weights.iter().map(|w| w.1)).sum();
    let mut b = budget;
    if total < b.small_step {
        b.most = b.most.min(b.small_most);
    }
    (total >= b.step_min).then_some(b)
}

/// After capturing `ops[i]`: if it is a product, fork `side` from the main stream and prefetch
/// there what [`prefetch_plan`] gives.
pub(crate) fn fork(
    dev: &Device,
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
    let f = dev.func("prefetch_l2")?;
    let ev = dev.stream.record_event(None)?;
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
pub(crate) fn join(dev: &Device, side: &CudaStream, events: &mut Vec<CudaEvent>) -> Result<()> {
    if events.is_empty() {
        return Ok(());
    }
    let ev = side.record_event(None)?;
    dev.stream.wait(&ev)?;
    events.push(ev);
    Ok(())
}

/// The `prefetch_l2` launches (address, bytes, blocks) after `ops[i]`: none unless `ops[i]` is a
/// product (has weights) and a later product exists; else the first `budget.most` bytes of the
/// next product's weights, in the order of its weights.
pub(crate) fn prefetch_plan(ops: &[Launch], i: usize, budget: PfBudget) -> Vec<(u64, u64, u32)> {
    if ops[i].weights.is_empty() {
        return Vec::new();
    }
    let Some(next) = ops[i + 1..].iter().find(|o| !o.weights.is_empty()) else {
        return Vec::new();
    };
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
        // `step_min`: the step's weights (25 MiB here) decide whether it prefetches at all.
        let step = |step_min| budget_for(&ops, PfBudget { step_min, ..b(M) }).is_some();
        assert!(step(0) && step(25 * M));
        assert!(!step(25 * M + 1));
        // `small_step`: a step under it prefetches at most `small_most` per product.
        let small = |small_step| {
            let budget = PfBudget {
                small_step,
                small_most: 2 * M,
                ..b(4 * M)
            };
            budget_for(&ops, budget).map(|b| b.most)
        };
        assert_eq!(small(25 * M + 1), Some(2 * M));
        assert_eq!(small(25 * M), Some(4 * M));
    }
}
