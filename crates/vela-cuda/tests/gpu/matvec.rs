//! Opt-in one-token product variants against the defaults they would replace.

use super::*;

/// `mv_q4_0s_r2s` (split-row Q4_0, two rows per warp, the activations staged in shared memory;
/// `set_mv_xsmem`) equals `mv_q4_0s_r2` bit for bit: the 8B's down product (4,096 x 14,336), its
/// o product (4,096 x 4,096), a row count that leaves a partial block (2,050 x 1,024), and a row
/// longer than the staging buffer holds (16,416 columns: the default kernel runs).
#[test]
fn staged_activations_equal_default() {
    let Some(g) = gpu() else { return };
    let cpu = CpuBackend::new(0);
    let mut rng = Rng(0x5eed_0a57);
    for (rows, cols) in [
        (4096usize, 14336usize),
        (4096, 4096),
        (2050, 1024),
        (2048, 16416),
    ] {
        let (w, _) = upload_random(&g, &cpu, GgmlType::Q4_0, rows, cols, &mut rng);
        let x = up(&g, &rng.vec(cols));
        let mut outs = Vec::new();
        let mut kernels = Vec::new();
        for on in [false, true] {
            g.set_mv_xsmem(on);
            let mut y = g.alloc(rows);
            g.set_profiling(true);
            g.profile_take();
            g.matmul(&w, &x, 1, &mut y);
            let names: Vec<String> = g
                .profile_take()
                .into_keys()
                .filter(|k| k.starts_with("mv_"))
                .collect();
            g.set_profiling(false);
            kernels.push(names);
            outs.push(down(&g, &y, rows));
        }
        g.set_mv_xsmem(false);
        let staged = kernels[1].iter().any(|k| k == "mv_q4_0s_r2s");
        assert_eq!(
            staged,
            cols <= 512 * 32,
            "{rows}x{cols}: kernels {kernels:?}"
        );
        check(
            &format!("mv_q4_0s_r2s {rows}x{cols} == mv_q4_0s_r2"),
            &outs[1],
            &outs[0],
            0.0,
        );
    }
}
