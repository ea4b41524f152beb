//! An idle sequence gives back its scratch buffers (`ModelState::park`) and comes back exactly:
//! for every architecture, a sequence parked between chunks, forked while parked and evaluated
//! in a batch after parking gives the logits of one never parked, and parking leaves its cache
//! as it was.

mod common;
use common::*;
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_compute::KvType;
use vela_formats::gguf::GgufFile;
use vela_formats::quant::GgmlType;
use vela_formats::testdata;
use vela_models::deepseekv4::DeepseekV4Model;
use vela_models::glm5::Glm5Model;
use vela_models::qwen4exp::Qwen4ExpModel;
use vela_models::{BatchItem, LanguageModel, ModelState, Select};

fn be() -> Arc<CpuBackend> {
    Arc::new(CpuBackend::new(2))
}

/// The models the test runs: the three generated in memory, and the shared decoder and Gemma 4
/// where their files are present.
fn models() -> Vec<(String, Arc<dyn LanguageModel>)> {
    let mut out: Vec<(String, Arc<dyn LanguageModel>)> = vec![
        (
            "qwen4exp".into(),
            Arc::new(Qwen4ExpModel::synth(be(), "qwen4exp-tiny", GgmlType::F32, 1).unwrap()),
        ),
        (
            "deepseekv4".into(),
            Arc::new(DeepseekV4Model::synth(be(), "deepseek-v4-tiny", GgmlType::F32, 1).unwrap()),
        ),
        (
            "glm5".into(),
            Arc::new(Glm5Model::synth(be(), "glm5-tiny", GgmlType::F32, 1).unwrap()),
        ),
    ];
    let files = [
        testdata::model(testdata::SMOLLM2),
        fixture("moe").and_then(|d| testdata::require(d.join("model-f32.gguf"))),
    ];
    for path in files.into_iter().flatten() {
        let g = Arc::new(GgufFile::open(&path).unwrap());
        let m = vela_models::registry::load_gguf_any(be(), g).unwrap();
        out.push((path.display().to_string(), m));
    }
    out
}

fn eval(st: &mut dyn ModelState, from: usize, tokens: &[u32]) -> Vec<f32> {
    let pos: Vec<u32> = (from as u32..(from + tokens.len()) as u32).collect();
    st.forward(tokens, &pos, 0).unwrap()
}

#[test]
fn parked_sequences_continue_exactly() {
    for (name, m) in models() {
        let nv = m.n_vocab();
        let toks: Vec<u32> = (0..30).map(|i| (i * 37 + 5) % nv.min(400) as u32).collect();
        let new = || m.clone().new_state(64, 8, KvType::F32).unwrap();
        // Reference: never parked, evaluated in the same chunks.
        let mut r = new();
        let mut want = eval(&mut *r, 0, &toks[..8]);
        want.extend(eval(&mut *r, 8, &toks[8..16]));
        want.extend(eval(&mut *r, 16, &toks[16..24]));
        let tail = eval(&mut *r, 24, &toks[24..]);

        let mut s = new();
        let mut got = eval(&mut *s, 0, &toks[..8]);
        let bytes = s.kv_bytes();
        s.park();
        s.park();
        assert_eq!(s.kv_bytes(), bytes, "{name}: parking keeps the cache");
        got.extend(eval(&mut *s, 8, &toks[8..16]));
        s.park();
        // A fork of a parked sequence continues as the sequence would.
        let mut f = s.fork().unwrap();
        got.extend(eval(&mut *s, 16, &toks[16..24]));
        assert_eq!(got, want, "{name}: parked between chunks");
        let ft = eval(&mut *f, 16, &toks[16..24]);
        assert_eq!(ft, want[16 * nv..], "{name}: fork of a parked sequence");

        // Parked sequences in a batched step (with another sequence).
        s.park();
        f.park();
        let mut other = new();
        let pos_a: Vec<u32> = (24..30).collect();
        let pos_b: Vec<u32> = (0..6).collect();
        let out = {
            let mut items = [
                BatchItem {
                    state: &mut *s,
                    tokens: &toks[24..],
                    positions: &pos_a,
                    logits_from: 0,
                    select: Select::Logits,
                },
                BatchItem {
                    state: &mut *other,
                    tokens: &toks[..6],
                    positions: &pos_b,
                    logits_from: 0,
                    select: Select::Logits,
                },
            ];
            let out = m.forward_batch(&mut items).unwrap();
            out.into_iter()
                .map(|o| o.into_logits().unwrap())
                .collect::<Vec<_>>()
        };
        let close = |a: &[f32], b: &[f32]| nmse(a, b) < 1e-10;
        assert!(close(&out[0], &tail), "{name}: parked sequence in a batch");
        assert!(close(&out[1], &want[..6 * nv]), "{name}: its batch partner");
    }
}
