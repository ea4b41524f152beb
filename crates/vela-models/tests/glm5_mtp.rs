//! The `glm5_next` MTP block vs `scripts/glm5_ref.py`'s float64 implementation of
//! docs/glm5-spec.md §9 (`scripts/gen-glm5-fixtures.py` → `$VELA_CACHE/golden/glm5/mtp/`:
//! `flash_mini` with a random block). Neither transformers nor llama.cpp 0c1e570 runs the block,
//! so this checks vela against the spec, not against the release's code. The first draft after
//! every prefix of the 300-token prompt (the block's cache kept by the target's forwards),
//! evaluated token by token and in chunks, with the target's logits unchanged; the block's rows
//! through any chunking bit-identical to one pass; chains of 4 drafts; llama.cpp's GGUF
//! conversion carrying the block (`blk.8.nextn.*`); the block's optional own head and embedding
//! table; which paths bind the block.

mod common;
use common::*;
use std::path::Path;
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_compute::KvType;
use vela_formats::gguf::GgufFile;
use vela_formats::safetensors::SafetensorsFile;
use vela_models::glm5::Glm5Model;
use vela_models::{LanguageModel, MtpHead};

const BOUND: f64 = 1e-8;

fn load(dir: &Path) -> (Arc<dyn LanguageModel>, Box<dyn MtpHead>) {
    let be = Arc::new(CpuBackend::new(2));
    let m = Glm5Model::load_hf(be, dir, &Default::default()).unwrap();
    mtp::bind(Arc::new(m), dir)
}

fn load_gguf(dir: &Path) -> (Arc<dyn LanguageModel>, Box<dyn MtpHead>) {
    let path = dir.join("model-f32.gguf");
    let g = Arc::new(GgufFile::open(&path).unwrap());
    let be = Arc::new(CpuBackend::new(2));
    let m = Glm5Model::load_gguf(be, g, &Default::default()).unwrap();
    mtp::bind(Arc::new(m), &path)
}

#[test]
fn first_draft_after_every_prefix_matches_the_reference() {
    let Some(dir) = golden_fixture("glm5", "mtp", "mtp_rows_long.f32") else {
        return;
    };
    let (m, mut head) = load(&dir);
    // The target's logits against HF's f32 run (flash_mini's), unchanged by the block's cache.
    let files = ("mtp_rows_long.f32", "logits_long.f32");
    mtp::first_drafts_and_target((&m, &mut *head), &dir, files, &[1, 7, 50], BOUND);
}

/// The block's cache rows do not depend on how the prompt was split: a chain of 4 drafts after
/// the whole prompt reads every row, and its logits are the same bits after one pass, after
/// chunks of 7 and 50 and token by token.
#[test]
fn block_rows_through_chunked_prefill_equal_one_pass() {
    let Some(dir) = golden_fixture("glm5", "mtp", "mtp_chain.json") else {
        return;
    };
    let (m, mut head) = load(&dir);
    let long = id_list(&prompts(&dir)["prompts"]["long"]);
    let n = long.len() - 1;
    let mut first: Option<Vec<Vec<f32>>> = None;
    for chunk in [n, 7, 50, 1] {
        let mut st = m
            .clone()
            .new_state(long.len() + 16, chunk, KvType::F32)
            .unwrap();
        mtp::eval(&mut *st, &long[..n], 0, chunk);
        let (_, rows) = mtp::drafts(&mut *head, &mut *st, long[n], n, 4);
        match &first {
            None => first = Some(rows),
            Some(want) => assert!(*want == rows, "chunks of {chunk} differ from one pass"),
        }
    }
}

#[test]
fn chained_drafts_match_the_reference() {
    let Some(dir) = golden_fixture("glm5", "mtp", "mtp_chain.json") else {
        return;
    };
    let (m, mut head) = load(&dir);
    let worst = mtp::chains(&m, &mut *head, &dir, 16, BOUND);
    eprintln!("chains of 4 drafts: greedy tokens equal, worst NMSE {worst:.2e}");
}

/// llama.cpp's conversion with the block (`blk.8.*`, `blk.8.nextn.*`, F32): the reference's
/// rows and chains, and the checkpoint's draft logits to the bit.
#[test]
fn llama_cpp_gguf_with_the_block_matches_the_reference() {
    let Some(dir) = golden_fixture("glm5", "mtp", "model-f32.gguf") else {
        return;
    };
    let (m, mut head) = load_gguf(&dir);
    for chunk in [1usize, 16] {
        let file = "mtp_rows_long.f32";
        let worst = mtp::first_drafts(&m, &mut *head, &dir, file, chunk, BOUND, &mut |_, _| {});
        eprintln!("GGUF, chunks of {chunk}: worst first-draft NMSE {worst:.2e} over 299 rows");
    }
    mtp::chains(&m, &mut *head, &dir, 16, BOUND);
    let long = id_list(&prompts(&dir)["prompts"]["long"]);
    let (hf, mut hf_head) = load(&dir);
    let chain = |m: &Arc<dyn LanguageModel>, head: &mut dyn MtpHead| {
        let mut st = m
            .clone()
            .new_state(long.len() + 16, 16, KvType::F32)
            .unwrap();
        mtp::eval(&mut *st, &long[..100], 0, 16);
        mtp::drafts(head, &mut *st, long[100], 100, 4).1
    };
    let (a, b) = (chain(&m, &mut *head), chain(&hf, &mut *hf_head));
    for (x, y) in a.iter().zip(&b) {
        let e = nmse(x, y);
        assert!(e <= 1e-12, "GGUF vs checkpoint drafts: NMSE {e:.2e}");
    }
}

/// The block binds from where it was loaded only; a checkpoint without one says so.
#[test]
fn mtp_is_loaded_with_the_model() {
    let Some(dir) = golden_fixture("glm5", "mtp", "mtp_chain.json") else {
        return;
    };
    let be = Arc::new(CpuBackend::new(1));
    let m: Arc<dyn LanguageModel> =
        Arc::new(Glm5Model::load_hf(be.clone(), &dir, &Default::default()).unwrap());
    assert_eq!(m.discover_mtp(&dir).as_deref(), Some(dir.as_path()));
    let plain = dir.parent().unwrap().join("flash_mini");
    let e = m.load_mtp(&plain).err().unwrap().to_string();
    assert!(e.contains("loaded with the model"), "{e}");
    if plain.join("model.safetensors").exists() {
        let p: Arc<dyn LanguageModel> =
            Arc::new(Glm5Model::load_hf(be, &plain, &Default::default()).unwrap());
        assert!(p.discover_mtp(&plain).is_none());
        let e = p.load_mtp(&plain).err().unwrap().to_string();
        assert!(e.contains("no MTP layer"), "{e}");
    }
}

/// The block's optional `shared_head.head` and `embed_tokens` are read: with a head of twice the
/// model's and a table with two token rows swapped, a draft for one token is exactly twice the
/// model's draft for the other (tokens absent from the prefix, whose cache rows the table also
/// feeds).
#[test]
fn the_blocks_own_head_and_embedding_are_read() {
    let Some(dir) = golden_fixture("glm5", "mtp", "mtp_chain.json") else {
        return;
    };
    let long = id_list(&prompts(&dir)["prompts"]["long"]);
    let n = 100;
    let free: Vec<u32> = (2..512).filter(|t| !long[..n].contains(t)).collect();
    let (a, b) = (free[0], free[1]);
    let st = SafetensorsFile::open(dir.join("model.safetensors")).unwrap();
    let floats = |name: &str| -> (Vec<usize>, Vec<f32>) {
        let e = &st.tensors[name];
        let v = st.data(e).chunks_exact(4);
        (
            e.shape.clone(),
            v.map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect(),
        )
    };
    let bytes = |v: &[f32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let mut tensors: Vec<RawTensor> = st
        .tensors
        .iter()
        .map(|(k, e)| (k.clone(), "F32", e.shape.clone(), st.data(e).to_vec()))
        .collect();
    let (shape, head) = floats("lm_head.weight");
    let head: Vec<f32> = head.iter().map(|x| 2.0 * x).collect();
    let pre = "model.language_model.layers.8";
    tensors.push((
        format!("{pre}.shared_head.head.weight"),
        "F32",
        shape,
        bytes(&head),
    ));
    let (shape, mut emb) = floats("model.language_model.embed_tokens.weight");
    let h = shape[1];
    for j in 0..h {
        emb.swap(a as usize * h + j, b as usize * h + j);
    }
    tensors.push((
        format!("{pre}.embed_tokens.weight"),
        "F32",
        shape,
        bytes(&emb),
    ));
    let tmp = std::env::temp_dir().join(format!("vela-glm5-mtp-own-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    std::fs::copy(dir.join("config.json"), tmp.join("config.json")).unwrap();
    write_safetensors(&tmp.join("model.safetensors"), &tensors);
    let draft = |path: &Path, last: u32| {
        let (m, mut head) = load(path);
        let mut s = m.clone().new_state(n + 8, 16, KvType::F32).unwrap();
        mtp::eval(&mut *s, &long[..n], 0, 16);
        mtp::drafts(&mut *head, &mut *s, last, n, 1).1.remove(0)
    };
    let own = draft(&tmp, a);
    std::fs::remove_dir_all(&tmp).unwrap();
    let twice: Vec<f32> = draft(&dir, b).iter().map(|x| 2.0 * x).collect();
    assert!(own == twice, "the block's own head and table");
    assert!(draft(&dir, a) != draft(&dir, b));
}
