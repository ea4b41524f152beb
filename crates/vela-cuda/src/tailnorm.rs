//! Tail norm (opt-in: `VELA_CUDA_TAIL_NORM=1`): the pre-norm that follows a single-weight decode
//! product whose output is its residual (`norm_matmul_many` after the o and down projections)
//! runs in that product's last block (`mv_*_n` / `mv_*_r2n`, matvec.cu) instead of as a
//! `norm_q8*_regs` launch: one dependent launch fewer per norm. The fusion is made while a decode
//! step is recorded, on the recorded launch list: the product is the last launch recorded, so it
//! is renamed and given the norm's arguments. Bit-equal to the separate launch by construction
//! (matvec.cu).

use crate::{ActKind, Arg, CudaBackend};
use std::sync::atomic::Ordering;

/// Products that have a tail-norm version (every single-weight one-token product, one and two
/// rows per warp; not the opt-in `_u2` k-quant kernels).
const TAIL_NORM_KERNELS: &[&str] = &[
    "mv_q4_0",
    "mv_q4_0_r2",
    "mv_q4_0s",
    "mv_q4_0s_r2",
    "mv_q4_1",
    "mv_q4_1_r2",
    "mv_q5_0",
    "mv_q5_0_r2",
    "mv_q5_1",
    "mv_q5_1_r2",
    "mv_q8_0",
    "mv_q8_0_r2",
    "mv_q4_k",
    "mv_q4_k_r2",
    "mv_q5_k",
    "mv_q5_k_r2",
    "mv_q6_k",
    "mv_q6_k_r2",
    "mv_q4_ks",
    "mv_q4_ks_r2",
    "mv_q6_ks",
    "mv_q6_ks_r2",
];

/// The widest row `norm_q8*_regs` (and so the tail norm) takes.
const TAIL_NORM_MAX_WIDTH: usize = 8192;

/// The tail-norm kernel's name for a recorded product kernel, if it has one.
pub(crate) fn tail_norm_name(product: &str) -> Option<String> {
    if !TAIL_NORM_KERNELS.contains(&product) {
        return None;
    }
    Some(if product.ends_with("_r2") {
        format!("{product}n")
    } else {
        format!("{product}_n")
    })
}

impl CudaBackend {
    /// With the tail norm on and a decode step being recorded whose last launch is a one-grid-row
    /// product writing `y`: fold the one-row norm with `norm_args` (`norm_q8*_regs`'s: x, y, w,
    /// h, act, width, eps) for a `kind` product into that launch and return true (the caller then
    /// launches nothing). Else false.
    pub(crate) fn tail_norm_fuse(
        &self,
        y: u64,
        norm_args: &[Arg],
        kind: ActKind,
        width: usize,
    ) -> bool {
        if !self.tail_norm.load(Ordering::Relaxed) || width > TAIL_NORM_MAX_WIDTH {
            return false;
        }
        let k = match kind {
            ActKind::Q8 => 0,
            ActKind::Q8K if width.is_multiple_of(256) => 1,
            _ => return false,
        };
        let [x, res, w, h, act, wd, eps] = norm_args else {
            return false;
        };
        if *res != Arg::P(y) {
            return false;
        }
        let cnt = self.ptr(&self.norm_cnt);
        let mut r = self.recorder();
        if !r.active {
            return false;
        }
        let Some(last) = r.ops.last_mut() else {
            return false;
        };
        let Some(name) = tail_norm_name(&last.name) else {
            return false;
        };
        if last.args.len() != 6 || last.args[2] != Arg::P(y) || last.grid.1 != 1 || last.grid.2 != 1
        {
            return false;
        }
        last.args
            .extend([*x, *w, *h, *act, *wd, *eps, Arg::I(k), Arg::P(cnt)]);
        last.name = name;
        r.tail_norms += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::tail_norm_name;

    #[test]
    fn tail_norm_names_are_kernels() {
        assert_eq!(
            tail_norm_name("mv_q4_0s_r2").as_deref(),
            Some("mv_q4_0s_r2n")
        );
        assert_eq!(tail_norm_name("mv_q6_ks").as_deref(), Some("mv_q6_ks_n"));
        assert_eq!(tail_norm_name("mv_q4_k_u2"), None);
        assert_eq!(tail_norm_name("mv_q4_0s_x3_r2"), None);
        // Every tail-norm kernel is one the backend loads.
        let names: Vec<&str> = crate::kernels::KERNEL_NAMES
            .iter()
            .flat_map(|(_, k)| k.iter().copied())
            .collect();
        for p in super::TAIL_NORM_KERNELS {
            let n = tail_norm_name(p).unwrap();
            assert!(names.contains(&n.as_str()), "{n} is not in KERNEL_NAMES");
            assert!(names.contains(p), "{p} is not in KERNEL_NAMES");
        }
    }
}
