//! Real-shape Gemma 4 check: the 31B layer geometry (hidden 5,376, FFN 21,504, 32 heads, sliding
//! 16 KV × 256 with a 1,024 window, full k_eq_v 4 KV × 512) in 6 layers, BF16 sharded safetensors,
//! a 2,048-token prompt crossing the window, vs transformers 5.23 at the checked positions.
//!
//! Data: `scripts/gen-gemma4-realshape.py` → `$VELA_CACHE/golden/gemma4-realshape/` (BF16
//! checkpoint 5.9 GB + its F32 GGUF conversion 12.4 GB). Opt-in: runs only with
//! `VELA_REALSHAPE=1` (then skipped when the data is absent unless `VELA_REQUIRE_DATA=1`). Two checks, serialized (each holds the model):
//!
//! * the tight one: the F32 GGUF of the same (bf16-valued) weights, read in place, against
//!   transformers in pure f32 (`logits_plain.f32`): argmax equal and NMSE ≤ 1e-6 at every
//!   checked position (every 64th, around the window edge, the last 8);
//! * the BF16 HF checkpoint through the safetensors loader with vela's default BF16 kernels,
//!   which round activations to bf16 (ggml's convention): load memory and the distance to
//!   transformers (pure f32, and with bf16-rounded Linear inputs) are printed and loosely
//!   bounded. bf16 rounding is discontinuous and this model amplifies it (pure f32 vs rounded
//!   transformers: NMSE 3.4e-5, argmax 41/42; the same rounded transformers at batch 1 vs batch
//!   2048 already differ by ~1e-5 at position 0), so 1e-6 is not a meaningful bound there.
//!
//! Minutes on 2 cores; prints times and the process's peak RSS.

mod common;
use common::*;
use std::sync::Arc;
use std::sync::Mutex;
use std::time::Instant;
use vela_compute::cpu::CpuBackend;
use vela_compute::KvType;
use vela_formats::gguf::GgufFile;
use vela_formats::testdata;
use vela_models::gemma4::{load_gguf_gemma4, Gemma4Model, LayerKind};

/// One real-shape model in memory at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// `VmHWM` / `RssAnon` of this process (kB), from /proc (Linux).
fn memory_kb() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let get = |k: &str| {
        s.lines()
            .find(|l| l.starts_with(k))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (get("VmHWM:"), get("RssAnon:"))
}

struct Data {
    dir: std::path::PathBuf,
    tokens: Vec<u32>,
    checked: Vec<u32>,
}

/// The real-shape check is opt-in (`VELA_REALSHAPE=1`): its data takes ~11 minutes and 18 GB
/// of disk to generate and the test ~10 minutes on 2 cores. With the variable set, missing data
/// is an error under `VELA_REQUIRE_DATA=1` like every other fixture.
fn data() -> Option<Data> {
    if std::env::var("VELA_REALSHAPE").as_deref() != Ok("1") {
        eprintln!("SKIP real-shape Gemma 4 check: set VELA_REALSHAPE=1 (docs/testing.md)");
        return None;
    }
    let dir = testdata::require(
        testdata::golden_dir()
            .join("gemma4-realshape")
            .join("logits_plain.f32"),
    )?
    .parent()
    .unwrap()
    .to_path_buf();
    let j = tokens_json(&dir);
    let ids = |k: &str| ids(&j, k);
    Some(Data {
        tokens: ids("tokens"),
        checked: ids("checked"),
        dir,
    })
}

/// The geometry is the one the script promises.
fn check_geometry(m: &Gemma4Model<CpuBackend>, d: &Data) {
    let c = &m.cfg;
    assert_eq!((c.n_embd, c.n_head, c.n_layer), (5376, 32, 6));
    let (l0, l5) = (&c.layers[0], &c.layers[5]);
    assert_eq!(
        (l0.kind, l0.head_dim, l0.n_head_kv, l0.n_ff),
        (LayerKind::Sliding, 256, 16, 21504)
    );
    assert_eq!(
        (l5.kind, l5.head_dim, l5.n_head_kv, l5.k_eq_v),
        (LayerKind::Full, 512, 4, true)
    );
    assert_eq!(c.sliding_window, 1024);
    assert!(d.tokens.len() >= 2048);
}

/// Logits of the checked positions (`[checked, vocab]`), prompt fed in chunks of 512.
fn run_checked(m: &Gemma4Model<CpuBackend>, d: &Data) -> Vec<f32> {
    let nv = m.cfg.n_vocab;
    let chunk = 512;
    let mut st = m.new_state(d.tokens.len(), chunk, KvType::F32).unwrap();
    let mut out = Vec::with_capacity(d.checked.len() * nv);
    for (ci, part) in d.tokens.chunks(chunk).enumerate() {
        let base = ci * chunk;
        let pos: Vec<u32> = (0..part.len()).map(|i| (base + i) as u32).collect();
        let lg = m.forward(&mut st, part, &pos, 0).unwrap();
        for &p in d.checked.iter() {
            let p = p as usize;
            if p >= base && p < base + part.len() {
                out.extend_from_slice(&lg[(p - base) * nv..(p - base + 1) * nv]);
            }
        }
    }
    out
}

/// (worst per-position NMSE, its position, positions with equal argmax).
fn compare(ours: &[f32], reference: &[f32], checked: &[u32], nv: usize) -> (f64, u32, usize) {
    assert_eq!(ours.len(), reference.len());
    let mut worst = (0f64, 0u32);
    let mut same = 0;
    for (i, &p) in checked.iter().enumerate() {
        let (a, b) = (&ours[i * nv..][..nv], &reference[i * nv..][..nv]);
        let e = nmse(a, b);
        if e > worst.0 {
            worst = (e, p);
        }
        same += usize::from(argmax(a) == argmax(b));
    }
    (worst.0, worst.1, same)
}

#[test]
fn realshape_f32_gguf_matches_transformers() {
    let Some(d) = data() else { return };
    let Some(path) = testdata::require(d.dir.join("model-f32.gguf")) else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let t0 = Instant::now();
    let g = Arc::new(GgufFile::open(&path).unwrap());
    let m = load_gguf_gemma4(Arc::new(CpuBackend::new(2)), g).unwrap();
    check_geometry(&m, &d);
    let ours = run_checked(&m, &d);
    let secs = t0.elapsed().as_secs_f64();
    let reference = f32s(&d.dir.join("logits_plain.f32"));
    let nv = m.cfg.n_vocab;
    let (worst, at, same) = compare(&ours, &reference, &d.checked, nv);
    let (hwm, anon) = memory_kb();
    eprintln!(
        "realshape F32 GGUF: {} tokens, {} checked positions vs transformers f32: NMSE total \
         {:.3e}, worst {worst:.3e} at position {at}, argmax {same}/{}; {secs:.0}s, VmHWM {} MB \
         (mostly the mapped file), RssAnon {} MB",
        d.tokens.len(),
        d.checked.len(),
        nmse(&ours, &reference),
        d.checked.len(),
        hwm / 1024,
        anon / 1024
    );
    assert_eq!(
        same,
        d.checked.len(),
        "argmax differs at some checked position"
    );
    assert!(worst <= 1e-6, "position {at}: NMSE {worst:.3e}");
}

#[test]
fn realshape_bf16_checkpoint_loads_and_tracks_transformers() {
    let Some(d) = data() else { return };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let t0 = Instant::now();
    let m = Gemma4Model::load_hf(Arc::new(CpuBackend::new(2)), &d.dir).unwrap();
    let (hwm_load, anon_load) = memory_kb();
    let t_load = t0.elapsed().as_secs_f64();
    check_geometry(&m, &d);
    let t1 = Instant::now();
    let ours = run_checked(&m, &d);
    let t_fwd = t1.elapsed().as_secs_f64();
    let nv = m.cfg.n_vocab;
    let plain = f32s(&d.dir.join("logits_plain.f32"));
    let rounded = f32s(&d.dir.join("logits.f32"));
    let (w_p, at_p, same_p) = compare(&ours, &plain, &d.checked, nv);
    let (w_r, at_r, same_r) = compare(&ours, &rounded, &d.checked, nv);
    let (e_p, e_r) = (nmse(&ours, &plain), nmse(&ours, &rounded));
    eprintln!(
        "realshape BF16 HF checkpoint: load {t_load:.0}s (VmHWM {} MB, RssAnon {} MB), forward \
         {t_fwd:.0}s; vs transformers f32: NMSE total {e_p:.3e}, worst {w_p:.3e} at {at_p}, \
         argmax {same_p}/{n}; vs transformers with bf16-rounded Linear inputs: total {e_r:.3e}, \
         worst {w_r:.3e} at {at_r}, argmax {same_r}/{n}",
        hwm_load / 1024,
        anon_load / 1024,
        n = d.checked.len()
    );
    assert!(e_p <= 1e-3, "BF16 path vs transformers f32: NMSE {e_p:.3e}");
    assert!(
        same_p * 10 >= d.checked.len() * 9,
        "argmax agreement {same_p}"
    );
}
