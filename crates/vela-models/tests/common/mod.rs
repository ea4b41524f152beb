//! Helpers shared by the Gemma 4 integration tests (each test file uses a subset).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use vela_compute::cpu::CpuBackend;
use vela_compute::KvType;
use vela_models::gemma4::Gemma4Model;

pub mod mtp;

/// The tiny random Gemma 4 fixtures of `scripts/gen-gemma4-fixtures.py`.
pub const FIXTURES: &[&str] = &[
    "dense_keqv",
    "ple_kvshare",
    "realdims_12b",
    "moe",
    "moe_swa_softcap",
];

/// `$VELA_CACHE/golden/gemma4/<name>/` (None when absent, unless `VELA_REQUIRE_DATA=1`).
pub fn fixture(name: &str) -> Option<PathBuf> {
    golden_fixture("gemma4", name, "logits.f32")
}

/// `$VELA_CACHE/golden/<set>/<name>/` if it holds `file` (None when absent, unless
/// `VELA_REQUIRE_DATA=1`).
pub fn golden_fixture(set: &str, name: &str, file: &str) -> Option<PathBuf> {
    vela_formats::testdata::require(
        vela_formats::testdata::golden_dir()
            .join(set)
            .join(name)
            .join(file),
    )
    .map(|p| p.parent().unwrap().to_path_buf())
}

/// The fixture `name`'s Q8_0 GGUF (`model-q8_0.gguf`) loaded on the CPU with its directory;
/// None when the fixture or the file is absent (said on stderr).
pub fn q8_0_model(name: &str) -> Option<(PathBuf, std::sync::Arc<Gemma4Model<CpuBackend>>)> {
    use std::sync::Arc;
    let dir = fixture(name)?;
    let path = dir.join("model-q8_0.gguf");
    if !path.exists() {
        eprintln!("{name}: no model-q8_0.gguf, skipped");
        return None;
    }
    let g = Arc::new(vela_formats::gguf::GgufFile::open(&path).unwrap());
    let be = Arc::new(CpuBackend::new(2));
    let m = vela_models::gemma4::load_gguf_gemma4(be, g).unwrap();
    Some((dir, Arc::new(m)))
}

/// The fixture's `tokens.json`.
pub fn tokens_json(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("tokens.json")).unwrap()).unwrap()
}

/// The token-id array `key` of a `tokens.json`.
pub fn ids(j: &serde_json::Value, key: &str) -> Vec<u32> {
    j[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

/// A fixture's `prompts.json` (the qwen4_exp and deepseek_v4 generators).
pub fn prompts(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("prompts.json")).unwrap()).unwrap()
}

/// A JSON array of token ids.
pub fn id_list(v: &serde_json::Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// A little-endian f32 file.
pub fn f32s(path: &Path) -> Vec<f32> {
    std::fs::read(path)
        .unwrap()
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Σ(a−b)² / Σb² in f64 (`b` is the reference).
pub fn nmse(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
    let den: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
    num / den
}

/// Index of the first maximum.
pub fn argmax(v: &[f32]) -> usize {
    v.iter()
        .enumerate()
        .fold(
            (0, f32::NEG_INFINITY),
            |m, (i, &x)| if x > m.1 { (i, x) } else { m },
        )
        .0
}

/// A tensor for [`write_safetensors`]: name, dtype, shape, little-endian bytes.
pub type RawTensor<'a> = (String, &'a str, Vec<usize>, Vec<u8>);

/// Write `tensors` as one safetensors file.
pub fn write_safetensors(path: &Path, tensors: &[RawTensor]) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dt, shape, bytes) in tensors {
        let begin = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            name.clone(),
            serde_json::json!({"dtype": dt, "shape": shape, "data_offsets": [begin, data.len()]}),
        );
    }
    let h = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&data);
    std::fs::write(path, out).unwrap();
}

/// Every position's logits of `tokens`, evaluated `chunk` tokens at a time (F32 KV, 64 ctx).
pub fn run_chunked(m: &Gemma4Model<CpuBackend>, tokens: &[u32], chunk: usize) -> Vec<f32> {
    let mut st = m.new_state(64, chunk, KvType::F32).unwrap();
    let mut out = Vec::new();
    for (ci, c) in tokens.chunks(chunk).enumerate() {
        let pos: Vec<u32> = (0..c.len()).map(|i| (ci * chunk + i) as u32).collect();
        out.extend(m.forward(&mut st, c, &pos, 0).unwrap());
    }
    out
}
