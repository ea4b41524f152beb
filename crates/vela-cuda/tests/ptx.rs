//! Compiles every kernel group to PTX for `compute_90` with NVRTC alone (no GPU, no driver).
//!
//! NVRTC is located like the backend does (`VELA_NVRTC_LIB`, then standard names, see
//! `vela_cuda::nvrtc::candidates`). Without it the test is skipped with a message, unless
//! `VELA_REQUIRE_DATA=1`, in which case a missing NVRTC fails. `pip install
//! nvidia-cuda-nvrtc-cu12` provides it: `VELA_NVRTC_LIB=<site-packages>/nvidia/cuda_nvrtc/lib/libnvrtc.so.12`.
//! `VELA_PTX_DUMP=<dir>` also writes each group's PTX there.

use vela_cuda::kernels::{source, GROUPS};
use vela_cuda::nvrtc::{Nvrtc, Target};

#[test]
fn every_kernel_group_compiles_to_ptx() {
    let nvrtc = match Nvrtc::get() {
        Ok(n) => n,
        Err(e) => {
            if vela_formats::testdata::data_required() {
                panic!("VELA_REQUIRE_DATA=1 but NVRTC is unavailable: {e:#}");
            }
            eprintln!("SKIP every_kernel_group_compiles_to_ptx: {e:#}");
            return;
        }
    };
    let (ma, mi) = nvrtc.version().unwrap();
    eprintln!("NVRTC {ma}.{mi} from {}", nvrtc.path);
    let mut failures = Vec::new();
    for (name, src) in GROUPS {
        match nvrtc.compile(&source(src), &format!("{name}.cu"), Target::Ptx(90)) {
            Ok(ptx) => {
                let text = String::from_utf8_lossy(&ptx);
                assert!(
                    text.contains(".target sm_90"),
                    "{name}: unexpected PTX target"
                );
                // Every extern "C" kernel of the source must be in the PTX.
                for line in src.lines() {
                    let Some(rest) = line.split("__global__ void ").nth(1) else {
                        continue;
                    };
                    let Some(k) = rest.split('(').next() else {
                        continue;
                    };
                    if k.contains("##") || k == "NAME" || !line.contains("extern \"C\"") {
                        continue;
                    }
                    assert!(
                        text.contains(&format!(".entry {k}(")),
                        "{name}: kernel {k} missing"
                    );
                }
                // ...and every kernel the backend launches from this group.
                let launched = vela_cuda::KERNEL_NAMES.iter().find(|(g, _)| g == name);
                for k in launched.map(|(_, ks)| *ks).unwrap_or(&[]) {
                    assert!(
                        text.contains(&format!(".entry {k}(")),
                        "{name}: kernel {k} missing"
                    );
                }
                eprintln!("{name}: {} bytes of PTX", ptx.len());
                // `VELA_PTX_DUMP=<dir>`: the PTX of each group as <dir>/<group>.ptx (to read
                // registers and spills with `ptxas -arch=sm_90 -v`, e.g. from PyPI's
                // nvidia-cuda-nvcc-cu12).
                if let Some(dir) = std::env::var_os("VELA_PTX_DUMP") {
                    let path = std::path::Path::new(&dir).join(format!("{name}.ptx"));
                    std::fs::write(&path, &ptx).unwrap();
                }
            }
            Err(e) => failures.push(format!("{e:#}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
