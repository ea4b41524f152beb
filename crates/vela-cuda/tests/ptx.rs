//! Compiles every kernel group to PTX with NVRTC alone (no GPU, no driver): for `compute_90`
//! (the H200), and for the oldest architecture the backend accepts (`compute_61`: dp4a) and
//! `compute_80`, so every architecture guard (tensor cores, cp.async, PDL, acquire/release)
//! compiles on both sides. (`VELA_PTX_ARCHS=90,...` picks others.)
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
    let archs: Vec<u32> = std::env::var("VELA_PTX_ARCHS")
        .ok()
        .map(|v| v.split(',').filter_map(|a| a.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![90, 80, 61]);
    for (arch, (name, src)) in archs
        .iter()
        .flat_map(|&a| GROUPS.iter().map(move |g| (a, g)))
    {
        match nvrtc.compile(&source(src), &format!("{name}.cu"), Target::Ptx(arch)) {
            Ok(ptx) => {
                let text = String::from_utf8_lossy(&ptx);
                assert!(
                    text.contains(&format!(".target sm_{arch}")),
                    "{name}: unexpected PTX target (wanted sm_{arch})"
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
                // ...and every kernel the backend launches from this group, and no other.
                let launched = vela_cuda::KERNEL_NAMES.iter().find(|(g, _)| g == name);
                let launched = launched.map(|(_, ks)| *ks).unwrap_or(&[]);
                for k in launched {
                    assert!(
                        text.contains(&format!(".entry {k}(")),
                        "{name}: kernel {k} missing"
                    );
                }
                for entry in text.split(".entry ").skip(1) {
                    let k = entry.split('(').next().unwrap_or("").trim();
                    assert!(
                        launched.contains(&k),
                        "{name}: kernel {k} is compiled but the backend never launches it"
                    );
                }
                eprintln!("{name}: {} bytes of PTX for sm_{arch}", ptx.len());
                // `VELA_PTX_DUMP=<dir>`: the sm_90 PTX of each group as <dir>/<group>.ptx (to
                // read registers and spills with `ptxas -arch=sm_90 -v`, e.g. from PyPI's
                // nvidia-cuda-nvcc-cu12).
                if let Some(dir) = std::env::var_os("VELA_PTX_DUMP").filter(|_| arch == 90) {
                    let path = std::path::Path::new(&dir).join(format!("{name}.ptx"));
                    std::fs::write(&path, &ptx).unwrap();
                }
            }
            Err(e) => failures.push(format!("sm_{arch}: {e:#}")),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
