//! `vela synth` for the `glm5_next` geometries (`vela_models::glm5::synth_gguf`): vela's logits
//! on the written GGUF (llama.cpp's layout: per-head absorbed `attn_k_b` / `attn_v_b`,
//! −exp(A_log), stacked experts; the MTP block's `nextn.*`) equal those of the in-memory model of
//! the same geometry, types and seed, and so do the MTP block's drafts; the metadata and tensor
//! directory equal what llama.cpp's converter wrote for the `mtp` fixture (glm5-tiny's shapes
//! with the block); quantized files are the f32 file quantized; and
//! llama.cpp's own logits on the file (scripts/llama_oracle.py) are close to vela's.

mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_compute::KvType;
use vela_formats::gguf::GgufFile;
use vela_formats::quant::GgmlType;
use vela_formats::testdata;
use vela_models::glm5::{synth_gguf, Glm5Model};
use vela_models::synth::{QuantScheme, SynthOptions};
use vela_models::LanguageModel;

const SEED: u64 = 7;
const NV: usize = 512;

/// 74 tokens: 18 complete pools of 4 (more than the indexer's 8) and an open pool of 2.
fn prompt() -> Vec<u32> {
    (0..74).map(|i| (i * 131 + 17) % 500).collect()
}

fn write(ty: GgmlType, tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!(
        "vela-glm5gguf-{}-{tag}-{}.gguf",
        std::process::id(),
        ty.name()
    ));
    let s = QuantScheme::Mostly(ty);
    let o = SynthOptions::default();
    synth_gguf::write("glm5-tiny", s, SEED, &p, &o, &mut |_, _| {}).unwrap();
    p
}

fn logits(m: Arc<dyn LanguageModel>, toks: &[u32]) -> Vec<f32> {
    let mut st = m.new_state(128, toks.len(), KvType::F32).unwrap();
    let pos: Vec<u32> = (0..toks.len() as u32).collect();
    st.forward(toks, &pos, 0).unwrap()
}

/// The MTP block's logits of 3 greedy drafts after all but the last of `toks` (the block bound
/// before the prompt, so the target's forward keeps its cache).
fn drafts(m: Arc<dyn LanguageModel>, path: &Path, toks: &[u32]) -> Vec<f32> {
    let mut head = m.load_mtp(&m.discover_mtp(path).unwrap()).unwrap();
    let n = toks.len() - 1;
    let mut st = m.new_state(128, n, KvType::F32).unwrap();
    let pos: Vec<u32> = (0..n as u32).collect();
    st.forward(&toks[..n], &pos, 0).unwrap();
    let mut out = Vec::new();
    head.draft(&mut *st, toks[n], n, 3, &mut |lg| {
        let t = argmax(&lg) as u32;
        out.extend(lg);
        Ok(t)
    })
    .unwrap();
    out
}

fn gguf_model(path: &Path) -> Arc<dyn LanguageModel> {
    let g = Arc::new(GgufFile::open(path).unwrap());
    let be = Arc::new(CpuBackend::new(2));
    Arc::new(Glm5Model::load_gguf(be, g, &Default::default()).unwrap())
}

/// The in-memory model with the file's per-tensor types.
fn synth_model(ty: GgmlType, seed: u64) -> Arc<dyn LanguageModel> {
    let types = synth_gguf::hf_types("glm5-tiny", QuantScheme::Mostly(ty)).unwrap();
    let be = Arc::new(CpuBackend::new(2));
    Arc::new(Glm5Model::synth_typed(be, "glm5-tiny", ty, seed, &types).unwrap())
}

/// Worst per-position NMSE of `a` against `b`.
fn worst(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.chunks(NV)
        .zip(b.chunks(NV))
        .map(|(x, y)| nmse(x, y))
        .fold(0.0, f64::max)
}

/// vela's logits on the GGUF against the in-memory model with the file's types: the same bits
/// for f32 and the quantized types (the same weights in the same types: llama-quantize keeps the
/// absorbed MLA matrices in f32, as the checkpoint path builds them), in exact matmul mode
/// (`VELA_MATMUL=f32`) and in the default one; BF16 / F16 files hold `attn_k_b` / `attn_v_b` in
/// that type where the checkpoint path expands `kv_b_proj` to f32: the same values, the same
/// bits in exact mode; in the default mode those two products round their activations to F16
/// (BF16) in the file only, which the random router's small top-k gaps amplify (7.7e-5 for
/// BF16, 1.2e-2 for F16).
#[test]
fn gguf_logits_equal_the_in_memory_model() {
    let toks = prompt();
    // (type, worst NMSE in exact mode, in the default mode)
    for (ty, exact_bound, bound) in [
        (GgmlType::F32, 0.0, 0.0),
        (GgmlType::Q8_0, 0.0, 0.0),
        (GgmlType::Q4_0, 0.0, 0.0),
        (GgmlType::BF16, 0.0, 1e-3),
        (GgmlType::F16, 0.0, 0.1),
    ] {
        let mut got = [0.0; 2];
        for (k, exact) in [true, false].into_iter().enumerate() {
            vela_compute::cpu::matmul::exact::set_thread_override(Some(exact));
            let path = write(ty, if exact { "ex" } else { "df" });
            let file = logits(gguf_model(&path), &toks);
            let file_mtp = drafts(gguf_model(&path), &path, &toks);
            std::fs::remove_file(&path).unwrap();
            let mem = logits(synth_model(ty, SEED), &toks);
            let mem_mtp = drafts(synth_model(ty, SEED), &path, &toks);
            vela_compute::cpu::matmul::exact::set_thread_override(None);
            // The MTP block's drafts: the same bits where the trunk's are.
            if exact_bound == 0.0 && (bound == 0.0 || exact) {
                assert!(file_mtp == mem_mtp, "{}: MTP drafts", ty.name());
            }
            assert_eq!(file.len(), toks.len() * NV);
            assert!(file.iter().all(|x| x.is_finite()));
            got[k] = worst(&file, &mem);
            if ty == GgmlType::F32 && exact {
                // The comparison can fail: another seed's weights are far away.
                let other = logits(synth_model(ty, SEED + 1), &toks);
                assert!(worst(&file, &other) > 0.1);
            }
        }
        eprintln!(
            "{}: worst NMSE file vs memory {:.2e} (exact mode), {:.2e} (default)",
            ty.name(),
            got[0],
            got[1]
        );
        assert!(got[0] <= exact_bound, "{}: exact mode", ty.name());
        assert!(got[1] <= bound, "{}: default mode", ty.name());
    }
}

/// A quantized file is the f32 file quantized tensor by tensor (llama-quantize on the
/// converter's f32 output): every tensor's bytes equal its f32 values quantized to its type.
#[test]
fn quantized_files_are_the_f32_file_quantized() {
    let f32_path = write(GgmlType::F32, "q");
    let full = GgufFile::open(&f32_path).unwrap();
    for ty in [GgmlType::Q8_0, GgmlType::Q4_0, GgmlType::Q4_K] {
        let path = write(ty, "q");
        let q = GgufFile::open(&path).unwrap();
        assert_eq!(q.tensors.len(), full.tensors.len());
        let mut kinds = std::collections::BTreeMap::new();
        for t in &q.tensors {
            let f = full.tensor(&t.name).unwrap();
            let n = f.dims.iter().rposition(|&x| x != 1).map_or(1, |i| i + 1);
            assert_eq!(
                (&f.dims[..n], f.ty),
                (&t.dims[..], GgmlType::F32),
                "{}",
                t.name
            );
            let vals: Vec<f32> = full
                .tensor_data(f)
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                .collect();
            let mut want = vec![0u8; t.size as usize];
            let rb = t.ty.row_bytes(t.dims[0]).unwrap() as usize;
            for (row, out) in vals.chunks(t.dims[0] as usize).zip(want.chunks_mut(rb)) {
                vela_formats::quant::quantize(t.ty, row, out).unwrap();
            }
            assert!(
                q.tensor_data(t) == want.as_slice(),
                "{} {}",
                ty.name(),
                t.name
            );
            *kinds.entry(t.ty.name()).or_insert(0) += 1;
        }
        eprintln!("{}: types {kinds:?}", ty.name());
        // The indexer, KDA gates, absorbed MLA matrices, mHC tensors and vectors stay F32,
        // attn_q_a / attn_q_b go to Q8_0, the output to Q6_K's fallback (64 columns) Q8_0.
        let ty_of = |n: &str| q.tensor(n).unwrap().ty;
        assert_eq!(ty_of("blk.3.attn_k_b.weight"), GgmlType::F32);
        assert_eq!(ty_of("blk.3.indexer.attn_q_b.weight"), GgmlType::F32);
        assert_eq!(ty_of("blk.0.ssm_f_b.weight"), GgmlType::F32);
        assert_eq!(ty_of("blk.3.attn_q_b.weight"), GgmlType::Q8_0);
        assert_eq!(ty_of("output.weight"), GgmlType::Q8_0);
        assert_ne!(ty_of("blk.1.ffn_gate_exps.weight"), GgmlType::F32);
        std::fs::remove_file(&path).unwrap();
    }
    std::fs::remove_file(&f32_path).unwrap();
}

/// The metadata and tensor directory equal those llama.cpp's converter wrote for the `mtp`
/// fixture (scripts/gen-glm5-fixtures.py: glm5-tiny's shapes, its f32 checkpoint with an MTP
/// block): every key in order with its value (the name aside; the fixture's synthetic
/// vocabulary is glm5-tiny's), every tensor's name, shape and type in order.
#[test]
fn directory_equals_the_converters() {
    let Some(dir) = golden_fixture("glm5", "mtp", "model-f32.gguf") else {
        return;
    };
    let want = GgufFile::open(dir.join("model-f32.gguf")).unwrap();
    let path = write(GgmlType::F32, "dir");
    let got = GgufFile::open(&path).unwrap();
    let keys = |g: &GgufFile| -> Vec<String> {
        let k = g.key_order.iter().filter(|k| *k != "general.name");
        k.cloned().collect()
    };
    assert_eq!(keys(&got), keys(&want));
    for k in keys(&want) {
        assert_eq!(got.get(&k), want.get(&k), "{k}");
    }
    let dir_of = |g: &GgufFile| -> Vec<(String, Vec<u64>, GgmlType)> {
        g.tensors
            .iter()
            .map(|t| (t.name.clone(), t.dims.clone(), t.ty))
            .collect()
    };
    assert_eq!(dir_of(&got), dir_of(&want));
    std::fs::remove_file(&path).unwrap();
}

/// llama.cpp's logits on `path` at every position of `toks` (scripts/llama_oracle.py, CPU,
/// F32 caches), or `None` when libllama or python3 with numpy is missing.
fn llama_cpp_logits(path: &Path, toks: &[u32]) -> Option<Vec<f32>> {
    let lib = testdata::cache_dir().join("llama.cpp-avx2/bin/libllama.so");
    testdata::require(&lib)?;
    let scripts = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts");
    let out = path.with_extension("llama.f32");
    let ids: Vec<String> = toks.iter().map(u32::to_string).collect();
    let code = format!(
        "import sys; sys.path.insert(0, sys.argv[1]); import llama_oracle as lo\n\
         a = lo.eval_logits(sys.argv[2], [{}], all_positions=True, kv_f32=True)\n\
         a.astype('<f4').tofile(sys.argv[3])",
        ids.join(",")
    );
    let o = std::process::Command::new("python3")
        .args(["-c", &code])
        .arg(&scripts)
        .arg(path)
        .arg(&out)
        .output();
    match o {
        Ok(o) if o.status.success() => {
            let v = f32s(&out);
            std::fs::remove_file(&out).unwrap();
            Some(v)
        }
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            if err.contains("No module named 'numpy'") && !testdata::data_required() {
                eprintln!("SKIP: numpy not installed");
                return None;
            }
            panic!("llama.cpp on {}: {err}", path.display());
        }
        Err(e) => {
            assert!(!testdata::data_required(), "python3: {e}");
            eprintln!("SKIP: python3 not runnable: {e}");
            None
        }
    }
}

/// llama.cpp reads glm5-tiny's files and computes logits close to vela's on the same file
/// (F32 caches): f32, the same function in a different f32 order (docs/glm5.md, "Numbers");
/// Q8_0, activations quantized to Q8 blocks as ggml does in both: the same to 1e-13 until the
/// first activation that the two f32 orders round to another Q8 step and the router (top-4 of
/// 16 random experts) chooses differently; the recurrent state carries that on.
#[test]
fn llama_cpp_agrees_on_the_file() {
    let toks = prompt();
    // (type, bounds on the median and the worst per-position NMSE)
    for (ty, bound) in [
        (GgmlType::F32, (1e-10, 1e-8)),
        (GgmlType::Q8_0, (1e-2, 0.2)),
    ] {
        let path = write(ty, "llama");
        let Some(theirs) = llama_cpp_logits(&path, &toks) else {
            std::fs::remove_file(&path).unwrap();
            return;
        };
        let ours = logits(gguf_model(&path), &toks);
        std::fs::remove_file(&path).unwrap();
        assert_eq!(theirs.len(), ours.len());
        let mut per: Vec<f64> = ours
            .chunks(NV)
            .zip(theirs.chunks(NV))
            .map(|(a, b)| nmse(a, b))
            .collect();
        // Positions up to the first choice the two round differently.
        let first = per.iter().position(|&e| e > 1e-6).unwrap_or(per.len());
        per.sort_by(f64::total_cmp);
        let (median, worst) = (per[per.len() / 2], per[per.len() - 1]);
        let same = ours
            .chunks(NV)
            .zip(theirs.chunks(NV))
            .filter(|(a, b)| argmax(a) == argmax(b))
            .count();
        eprintln!(
            "{}: per-position NMSE vela vs llama.cpp: median {median:.2e}, worst {worst:.2e}, \
             ≤ 1e-6 up to position {first}; argmax equal at {same}/{}",
            ty.name(),
            toks.len()
        );
        assert!(median <= bound.0 && worst <= bound.1, "{}", ty.name());
        assert!(same >= toks.len() * 9 / 10, "{}", ty.name());
        if ty == GgmlType::F32 {
            assert_eq!(same, toks.len());
        }
    }
}

/// The real geometries' files, planned without writing: glm5-flash-12l at Q4_0 is about 44 GB
/// (3 dense and 9 MoE layers, and the MTP block), the whole model about 183 GB.
#[test]
fn real_geometry_files() {
    let o = SynthOptions::default();
    let q4 = QuantScheme::Mostly(GgmlType::Q4_0);
    let n = synth_gguf::file_size("glm5-flash-12l", q4, 1, &o).unwrap() as f64;
    eprintln!("glm5-flash-12l q4_0: {n:.3e} bytes");
    assert!((42e9..45e9).contains(&n), "{n}");
    let n = synth_gguf::file_size("glm5-flash", q4, 1, &o).unwrap() as f64;
    eprintln!("glm5-flash q4_0: {n:.3e} bytes");
    assert!((180e9..186e9).contains(&n), "{n}");
    let types = synth_gguf::hf_types("glm5-flash-12l", q4).unwrap();
    assert_eq!(types["layers.3.self_attn.kv_b_proj.weight"], GgmlType::F32);
    assert_eq!(
        types["layers.4.mlp.experts.287.down_proj.weight"],
        GgmlType::Q4_0
    );
    assert_eq!(types["lm_head.weight"], GgmlType::Q6_K);
    // llama-quantize keeps the MTP block's input projection at Q8_0.
    assert_eq!(types["layers.12.eh_proj.weight"], GgmlType::Q8_0);
}
