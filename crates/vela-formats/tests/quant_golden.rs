//! Bit-exact golden tests of the reference dequantizers/quantizers against gguf-py 0.19.0
//! (`gguf.quants`), produced by `scripts/gen-quant-golden.py`:
//!
//! * `tests/data/quant_random.{json,bin}` (committed): random blocks of every supported type,
//!   and gguf-py quantizer output for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/BF16/F16;
//! * `$VELA_CACHE/golden/quant/` (generated): slices of real tensors of the three real models.
//!
//! Values are compared as f32 *bits*. NaN rule: where the reference is NaN the result must be a
//! NaN too, with any payload (hardware f16 -> f32 conversion quiets signalling NaNs, software
//! conversion need not); every other value, including -0.0 and infinities, must match exactly.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use vela_formats::gguf::GgufFile;
use vela_formats::quant::{dequantize, quantize, GgmlType, SUPPORTED_TYPES};
use vela_formats::testdata;

struct Manifest {
    cases: Vec<Value>,
    blob: Vec<u8>,
}

fn load(manifest: &Path) -> Manifest {
    let text = std::fs::read_to_string(manifest).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    let blob_name = v["blob"].as_str().unwrap();
    let blob = std::fs::read(manifest.with_file_name(blob_name)).unwrap();
    Manifest {
        cases: v["cases"].as_array().unwrap().clone(),
        blob,
    }
}

impl Manifest {
    fn range(&self, case: &Value, key: &str) -> &[u8] {
        let r = case[key]
            .as_array()
            .unwrap_or_else(|| panic!("case without {key}: {case}"));
        let (off, len) = (
            r[0].as_u64().unwrap() as usize,
            r[1].as_u64().unwrap() as usize,
        );
        &self.blob[off..off + len]
    }
}

fn type_by_name(name: &str) -> GgmlType {
    (0..64)
        .filter_map(GgmlType::from_id)
        .find(|t| t.name() == name)
        .unwrap_or_else(|| panic!("unknown type name {name}"))
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Compare bit patterns; returns the number of NaNs matched. Panics with the first mismatch.
fn assert_bits_eq(what: &str, got: &[f32], want: &[f32]) -> usize {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut nans = 0;
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        if w.is_nan() {
            assert!(
                g.is_nan(),
                "{what}[{i}]: got {g} ({:#010x}), want NaN",
                g.to_bits()
            );
            nans += 1;
        } else {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{what}[{i}]: got {g:e} ({:#010x}), want {w:e} ({:#010x})",
                g.to_bits(),
                w.to_bits()
            );
        }
    }
    nans
}

fn committed_manifest() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/quant_random.json")
}

#[test]
fn random_blocks_dequantize_bit_exact_for_every_supported_type() {
    let m = load(&committed_manifest());
    let mut seen = BTreeMap::new();
    let mut nans = 0;
    for case in m.cases.iter().filter(|c| c["kind"] == "dequant") {
        let name = case["name"].as_str().unwrap();
        let ty = type_by_name(case["type"].as_str().unwrap());
        let n = case["n"].as_u64().unwrap() as usize;
        let raw = m.range(case, "raw");
        let want = f32s(m.range(case, "f32"));
        assert_eq!(want.len(), n);
        let mut got = vec![f32::NAN; n];
        dequantize(ty, raw, &mut got).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        nans += assert_bits_eq(name, &got, &want);
        *seen.entry(ty.name()).or_insert(0) += n / ty.block_size();
    }
    eprintln!("random blocks checked per type: {seen:?} ({nans} NaNs)");
    for ty in SUPPORTED_TYPES {
        assert!(seen.contains_key(ty.name()), "no random golden for {ty}");
    }
    // The F16/BF16 random bit patterns must have exercised the NaN rule.
    assert!(nans > 0);
}

#[test]
fn quantizers_bit_exact_with_gguf_py() {
    let m = load(&committed_manifest());
    let mut checked = vec![];
    for case in m.cases.iter().filter(|c| c["kind"] == "quantize") {
        let name = case["name"].as_str().unwrap();
        let ty = type_by_name(case["type"].as_str().unwrap());
        let x = f32s(m.range(case, "input"));
        let want = m.range(case, "bytes");
        let mut got = vec![0u8; want.len()];
        quantize(ty, &x, &mut got).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        let ts = ty.type_size();
        if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
            let b = i / ts;
            panic!(
                "{name}: first difference at byte {i} (block {b}):\n got  {:?}\n want {:?}",
                &got[b * ts..(b + 1) * ts],
                &want[b * ts..(b + 1) * ts]
            );
        }
        checked.push(ty.name());
    }
    assert_eq!(
        checked,
        ["q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "bf16", "f16"]
    );
}

#[test]
fn real_model_tensor_slices_bit_exact() {
    let Some(manifest) = testdata::require(testdata::golden_dir().join("quant/manifest.json"))
    else {
        return;
    };
    let m = load(&manifest);
    let mut files: BTreeMap<String, Option<GgufFile>> = BTreeMap::new();
    let mut counts: BTreeMap<(String, &str), usize> = BTreeMap::new();
    for case in &m.cases {
        let model = case["model"].as_str().unwrap().to_string();
        let g = files
            .entry(model.clone())
            .or_insert_with(|| testdata::model(&model).map(|p| GgufFile::open(p).unwrap()));
        let Some(g) = g else { continue };
        let tname = case["tensor"].as_str().unwrap();
        let t = g
            .tensor(tname)
            .unwrap_or_else(|| panic!("{model}: no tensor {tname}"));
        assert_eq!(
            t.ty.name(),
            case["type"].as_str().unwrap(),
            "{model}/{tname}"
        );
        let n = case["n"].as_u64().unwrap() as usize;
        let want = f32s(m.range(case, "f32"));
        let nbytes = t.ty.row_bytes(n as u64).unwrap() as usize;
        let mut got = vec![f32::NAN; n];
        dequantize(t.ty, &g.tensor_data(t)[..nbytes], &mut got).unwrap();
        assert_bits_eq(&format!("{model}/{tname}"), &got, &want);
        *counts.entry((model, t.ty.name())).or_insert(0) += 1;
    }
    eprintln!("real tensor slices checked: {counts:?}");
    if files.values().all(Option::is_some) {
        assert!(
            counts.len() >= 13,
            "expected every (model, type) pair: {counts:?}"
        );
    }
}

/// Check quantizer output against llama.cpp's own `quantize_row_*_ref` (from the oracle build,
/// see the generator script) for every quantizer vela implements, including the k-quants gguf-py
/// cannot produce. Returns (type, blocks checked).
fn check_ggml_ref(path: &Path) -> Vec<(&'static str, usize)> {
    let m = load(path);
    let mut report = vec![];
    for case in &m.cases {
        let ty = type_by_name(case["type"].as_str().unwrap());
        let x = f32s(m.range(case, "input"));
        let want = m.range(case, "bytes");
        let mut got = vec![0u8; want.len()];
        quantize(ty, &x, &mut got).unwrap();
        let ts = ty.type_size();
        let bad: Vec<usize> = (0..want.len() / ts)
            .filter(|&b| got[b * ts..(b + 1) * ts] != want[b * ts..(b + 1) * ts])
            .collect();
        assert!(
            bad.is_empty(),
            "{ty}: {} of {} blocks differ: {bad:?}",
            bad.len(),
            want.len() / ts
        );
        report.push((ty.name(), want.len() / ts));
    }
    eprintln!("{}: blocks bit-exact per type {report:?}", path.display());
    assert_eq!(report.len(), 12, "{report:?}");
    report
}

#[test]
fn quantizers_bit_exact_with_llama_cpp_reference() {
    check_ggml_ref(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/quant_ggml_ref.json"));
}

#[test]
fn quantizers_bit_exact_with_llama_cpp_reference_large() {
    let Some(p) = testdata::require(testdata::golden_dir().join("quant/ggml_ref_large.json"))
    else {
        return;
    };
    check_ggml_ref(&p);
}
