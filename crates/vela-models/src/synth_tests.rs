//! Tests of `synth`: value statistics, llama-quantize type rules, real-geometry parameter counts,
//! and end to end on small geometries (vela loads them, same seed → same bytes, gguf-py and
//! llama.cpp accept them).

use super::*;
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_compute::KvType;
use vela_formats::testdata;

#[test]
fn normal_approximation_has_unit_variance_and_is_seeded() {
    let key = tensor_key(1, "blk.0.attn_q.weight");
    let n = 200_000u64;
    let xs: Vec<f64> = (0..n).map(|j| normal(key, j) as f64).collect();
    let mean = xs.iter().sum::<f64>() / n as f64;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
    assert!(mean.abs() < 0.01, "mean {mean}");
    assert!((var - 1.0).abs() < 0.02, "variance {var}");
    assert!(xs.iter().all(|x| x.abs() < 3.5));
    // Different seeds and different tensor names give different streams.
    assert_ne!(
        normal(tensor_key(2, "blk.0.attn_q.weight"), 0),
        xs[0] as f32
    );
    assert_ne!(
        normal(tensor_key(1, "blk.0.attn_k.weight"), 0),
        xs[0] as f32
    );
}

#[test]
fn type_rules_follow_llama_quantize() {
    use GgmlType::*;
    let m = |t| QuantScheme::Mostly(t);
    // Norms are never quantized; the output tensor gets Q6_K, or Q8_0 for rows not of 256.
    assert_eq!(tensor_type(m(Q4_0), Role::Norm, false, 4096, 0, 1), F32);
    assert_eq!(tensor_type(m(Q4_0), Role::Output, false, 4096, 0, 1), Q6_K);
    assert_eq!(tensor_type(m(Q4_0), Role::Output, false, 896, 0, 1), Q8_0);
    assert_eq!(tensor_type(m(Q8_0), Role::Output, false, 4096, 0, 1), Q8_0);
    // A tied embedding is quantized like the output; an untied one like the rest.
    assert_eq!(
        tensor_type(m(Q4_0), Role::TokenEmbd, true, 4096, 0, 1),
        Q6_K
    );
    assert_eq!(
        tensor_type(m(Q4_0), Role::TokenEmbd, false, 4096, 0, 1),
        Q4_0
    );
    assert_eq!(tensor_type(m(F16), Role::Output, false, 4096, 0, 1), F16);
    // K-quant fallbacks when a row is not a multiple of 256.
    assert_eq!(tensor_type(m(Q4_K), Role::Matrix, false, 896, 0, 1), Q5_0);
    assert_eq!(tensor_type(m(Q5_K), Role::Matrix, false, 896, 0, 1), Q5_1);
    assert_eq!(tensor_type(m(Q6_K), Role::Matrix, false, 896, 0, 1), Q8_0);
    assert_eq!(tensor_type(m(Q4_K), Role::Matrix, false, 4096, 0, 1), Q4_K);
    // Q4_K_M: attn_v / ffn_down get Q6_K on the use_more_bits layers only.
    let q = QuantScheme::Q4KM;
    let picks: Vec<bool> = (0..32)
        .map(|i| tensor_type(q, Role::FfnDown, false, 14336, i, 32) == Q6_K)
        .collect();
    let expect: Vec<bool> = (0..32)
        .map(|i| !(4..28).contains(&i) || (i as i64 - 4) % 3 == 2)
        .collect();
    assert_eq!(picks, expect);
    assert_eq!(tensor_type(q, Role::AttnV, false, 4096, 5, 32), Q4_K);
    assert_eq!(tensor_type(m(Q4_K), Role::AttnV, false, 4096, 0, 32), Q4_K);
    assert_eq!(QuantScheme::parse("Q4_K_M").unwrap(), q);
    assert_eq!(QuantScheme::parse("q4_0").unwrap(), m(Q4_0));
    let e = QuantScheme::parse("q3_xx").unwrap_err().to_string();
    assert!(
        e.contains("unsupported synth type") && !e.contains('\n'),
        "{e}"
    );
}

#[test]
fn real_geometries_have_their_published_sizes() {
    // Parameter counts of the real checkpoints (HF model cards), ±3 %.
    for (name, billions) in [
        ("llama3-8b", 8.03),
        ("qwen2.5-7b", 7.62),
        ("qwen2.5-0.5b", 0.494),
        ("gemma3-27b", 27.0),
        ("gemma3-270m", 0.268),
        ("smollm2-135m", 0.1346),
        ("gemma4-31b", 30.7),
        // No published count: at 11.9B, Q4_0 matrices (4.5 bits) and a Q8_0 embedding (8.5)
        // come to 7,203.8 MB, 0.2 % under the published Q4_0 file's 7,219,673,216 bytes (which
        // also hold the vocabulary and metadata).
        ("gemma4-12b", 11.9),
        // The vision tower's ~0.55B excluded from the published 25.2B.
        ("gemma4-26b-a4b", 25.2 - 0.55),
    ] {
        let g = geometry(name).unwrap();
        let n: u64 = plan(g).iter().map(|t| t.dims.iter().product::<u64>()).sum();
        let got = n as f64 / 1e9;
        assert!(
            (got / billions - 1.0).abs() < 0.03,
            "{name}: {got:.3}B parameters, expected ≈ {billions}B"
        );
    }
    // Gemma 4 26B-A4B: about 3.8B parameters active per token (8 of 128 experts).
    let g = geometry("gemma4-26b-a4b").unwrap();
    let (all, experts): (u64, u64) = plan(g).iter().fold((0, 0), |(a, e), t| {
        let n: u64 = t.dims.iter().product();
        (
            a + n,
            e + if t.name.contains("_exps.weight") {
                n
            } else {
                0
            },
        )
    });
    let active = (all - experts) as f64 + experts as f64 * 8.0 / 128.0;
    assert!((active / 3.8e9 - 1.0).abs() < 0.05, "{active:.3e} active");
    assert!(geometry("llama-9000b")
        .unwrap_err()
        .to_string()
        .contains("known: llama-tiny"));
}

fn tmp_dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("vela-synth-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// Synthesize `geom` if its tokenizer source is available.
fn make(geom: &str, scheme: QuantScheme, seed: u64, path: &Path) -> Option<()> {
    testdata::require(find_tokenizer(geometry(geom).unwrap().tokenizer).ok()?)?;
    let mut last = (0, 0);
    synth_with(
        geom,
        scheme,
        seed,
        path,
        &SynthOptions::default(),
        &mut |a, b| last = (a, b),
    )
    .unwrap();
    assert_eq!(last.0, last.1);
    assert_eq!(last.1, std::fs::metadata(path).unwrap().len());
    Some(())
}

/// Logits of a short prompt through the shared decoder.
fn decoder_logits(path: &Path) -> Vec<f32> {
    let g = Arc::new(GgufFile::open(path).unwrap());
    let m = crate::load(Arc::new(CpuBackend::new(2)), g).unwrap();
    let mut st = m.new_state(64, 8, KvType::F32).unwrap();
    let toks = [1u32, 450, 7483, 310, 3444, 338];
    let pos: Vec<u32> = (0..toks.len() as u32).collect();
    m.forward(&mut st, &toks, &pos, 0).unwrap()
}

fn check_logits(l: &[f32], n_vocab: usize, rows: usize) {
    assert_eq!(l.len(), n_vocab * rows);
    assert!(l.iter().all(|x| x.is_finite()));
    for r in l.chunks(n_vocab) {
        let mean = r.iter().sum::<f32>() / n_vocab as f32;
        let sd = (r.iter().map(|x| (x - mean).powi(2)).sum::<f32>() / n_vocab as f32).sqrt();
        // Well-scaled: neither constant nor exploding.
        assert!(sd > 0.1 && sd < 20.0, "logit stdev {sd}");
    }
    // Different positions see different contexts.
    assert_ne!(l[..n_vocab], l[n_vocab..2 * n_vocab]);
}

/// gguf-py parses the file and sees the same tensor directory (skipped without gguf-py). Only
/// used on small vocabularies: gguf-py needs ~20 s for a 262k-token tokenizer.
fn check_with_gguf_py(path: &Path, n_tensors: usize) {
    let code = format!(
        "import gguf,sys; r=gguf.GGUFReader(sys.argv[1]); assert len(r.tensors)=={n_tensors}, \
         len(r.tensors); print('ok', r.fields['general.architecture'].contents())"
    );
    match std::process::Command::new("python3")
        .args(["-c", &code])
        .arg(path)
        .output()
    {
        Ok(o) if o.status.success() => {
            assert!(String::from_utf8_lossy(&o.stdout).starts_with("ok"))
        }
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            if err.contains("No module named 'gguf'") && !testdata::data_required() {
                eprintln!("SKIP: gguf-py not installed");
            } else {
                panic!("gguf-py rejects {}: {err}", path.display());
            }
        }
        Err(e) => eprintln!("SKIP: python3 not runnable: {e}"),
    }
}

/// llama.cpp loads the model and generates a few tokens (skipped without the built oracle).
fn check_with_llama_cpp(path: &Path) {
    let bin_dir = testdata::cache_dir().join("llama.cpp-avx2").join("bin");
    let Some(bin) = testdata::require(bin_dir.join("llama-simple")) else {
        return;
    };
    let o = std::process::Command::new(bin)
        .env("LD_LIBRARY_PATH", &bin_dir)
        .arg("-m")
        .arg(path)
        .args(["-n", "4", "Hello world"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        o.status.success(),
        "llama-simple failed on {}: {err}",
        path.display()
    );
    assert!(err.contains("decoded 4 tokens"), "{err}");
}

#[test]
fn llama_tiny_end_to_end() {
    let dir = tmp_dir("llama");
    let (a, b, c) = (dir.join("a.gguf"), dir.join("b.gguf"), dir.join("c.gguf"));
    let q = QuantScheme::Mostly(GgmlType::Q4_0);
    if make("llama-tiny", q, 7, &a).is_none() {
        return;
    }
    make("llama-tiny", q, 7, &b).unwrap();
    make("llama-tiny", q, 8, &c).unwrap();
    let (ba, bb, bc) = (
        std::fs::read(&a).unwrap(),
        std::fs::read(&b).unwrap(),
        std::fs::read(&c).unwrap(),
    );
    assert!(ba == bb, "same seed gave different files");
    assert_eq!(ba.len(), bc.len());
    assert!(ba != bc, "different seeds gave the same file");

    let g = GgufFile::open(&a).unwrap();
    assert_eq!(g.get_str("tokenizer.ggml.model").unwrap(), "llama");
    assert_eq!(g.get_array("tokenizer.ggml.tokens").unwrap().len(), 32000);
    assert_eq!(g.tensor("output.weight").unwrap().ty, GgmlType::Q6_K);
    assert_eq!(
        g.tensor("blk.1.ffn_down.weight").unwrap().ty,
        GgmlType::Q4_0
    );
    assert_eq!(g.tensor("blk.1.ffn_norm.weight").unwrap().ty, GgmlType::F32);
    // Norm weights ≈ 1, never all zeros anywhere.
    let norm = g.tensor("output_norm.weight").unwrap();
    let mut v = vec![0f32; 256];
    vela_formats::quant::dequantize(norm.ty, g.tensor_data(norm), &mut v).unwrap();
    assert!(v.iter().all(|x| (x - 1.0).abs() < 0.1));
    for t in &g.tensors {
        assert!(
            g.tensor_data(t).iter().any(|&b| b != 0),
            "{} is all zeros",
            t.name
        );
    }
    let n_tensors = g.tensors.len();
    drop(g);

    check_logits(&decoder_logits(&a), 32000, 6);
    check_with_gguf_py(&a, n_tensors);
    check_with_llama_cpp(&a);
    // A different thread count gives the same bytes.
    let opts = SynthOptions {
        threads: Some(1),
        ..Default::default()
    };
    synth_with("llama-tiny", q, 7, &b, &opts, &mut |_, _| {}).unwrap();
    assert!(
        std::fs::read(&b).unwrap() == ba,
        "thread count changed the file"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn gemma4_tiny_end_to_end() {
    let dir = tmp_dir("gemma4");
    let p = dir.join("g4.gguf");
    if make("gemma4-tiny", QuantScheme::Mostly(GgmlType::Q8_0), 3, &p).is_none() {
        return;
    }
    let g = Arc::new(GgufFile::open(&p).unwrap());
    assert!(
        g.tensor("blk.5.attn_v.weight").is_none(),
        "k_eq_v layer has no V"
    );
    assert_eq!(
        g.tensor("blk.5.attn_k.weight").unwrap().dims,
        vec![256, 128]
    );
    assert_eq!(g.tensor("token_embd.weight").unwrap().ty, GgmlType::Q8_0);
    let m = crate::gemma4::load_gguf_gemma4(Arc::new(CpuBackend::new(2)), g).unwrap();
    let mut st = m.new_state(64, 8, KvType::F32).unwrap();
    let toks = [2u32, 818, 5279, 529, 7001, 563];
    let pos: Vec<u32> = (0..6).collect();
    let l = m.forward(&mut st, &toks, &pos, 0).unwrap();
    check_logits(&l, 262144, 6);
    check_with_llama_cpp(&p);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn gemma3_270m_q4_k_m_has_the_real_files_tensor_directory() {
    // llama-quantize's Q4_K_M of the real model: same names, shapes and per-tensor types (incl.
    // the Q5_0/Q8_0 fallbacks for 640-wide rows and Q6_K on the use_more_bits layers).
    let Some(real) = testdata::model(testdata::GEMMA3) else {
        return;
    };
    let dir = tmp_dir("gemma3");
    let p = dir.join("g3.gguf");
    make("gemma3-270m", QuantScheme::Q4KM, 5, &p).unwrap();
    let (a, b) = (GgufFile::open(&real).unwrap(), GgufFile::open(&p).unwrap());
    assert_eq!(a.tensors.len(), b.tensors.len());
    for t in &a.tensors {
        let s = b
            .tensor(&t.name)
            .unwrap_or_else(|| panic!("{} missing", t.name));
        assert_eq!((&s.dims, s.ty), (&t.dims, t.ty), "{}", t.name);
    }
    for k in a.key_order.iter().filter(|k| !k.starts_with("general.")) {
        assert_eq!(b.get(k), a.get(k), "metadata {k}");
    }
    drop(b);
    check_logits(&decoder_logits(&p), 262144, 6);
    check_with_llama_cpp(&p);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn qwen2_5_0_5b_loads_everywhere() {
    let dir = tmp_dir("qwen");
    let p = dir.join("q.gguf");
    if make("qwen2.5-0.5b", QuantScheme::Mostly(GgmlType::Q4_0), 9, &p).is_none() {
        return;
    }
    let g = GgufFile::open(&p).unwrap();
    assert_eq!(g.tensor("blk.3.attn_k.bias").unwrap().dims, vec![128]);
    assert_eq!(g.tensor("token_embd.weight").unwrap().ty, GgmlType::Q8_0);
    assert!(g.tensor("output.weight").is_none());
    drop(g);
    check_logits(&decoder_logits(&p), 151936, 6);
    check_with_llama_cpp(&p);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tokenizer_is_padded_to_the_embedding_rows() {
    let Some(src) = testdata::require(
        testdata::llama_cpp_src()
            .join("models")
            .join("ggml-vocab-qwen2.gguf"),
    ) else {
        return;
    };
    let g = GgufFile::open(src).unwrap();
    let md = tokenizer_metadata(&g, 152064).unwrap();
    let get = |k: &str| md.iter().find(|(n, _)| n == k).unwrap().1.clone();
    let toks = get("tokenizer.ggml.tokens");
    let toks = toks.as_array().unwrap();
    assert_eq!(toks.len(), 152064);
    assert_eq!(toks[152063].as_str(), Some("[PAD152063]"));
    assert_eq!(
        get("tokenizer.ggml.token_type").as_array().unwrap().len(),
        152064
    );
    assert_eq!(
        get("tokenizer.ggml.merges"),
        g.get("tokenizer.ggml.merges").unwrap().clone()
    );
    assert!(tokenizer_metadata(&g, 1000).is_err());
    // A vocab-only extract carries the same tokenizer.
    let dir = tmp_dir("vocab");
    let out = dir.join("v.gguf");
    write_vocab_only(&g_path(), &out).unwrap();
    let v = GgufFile::open(&out).unwrap();
    assert_eq!(v.tensors.len(), 0);
    assert_eq!(tokenizer_metadata(&v, 152064).unwrap(), md);
    std::fs::remove_dir_all(&dir).unwrap();
}

fn g_path() -> PathBuf {
    testdata::llama_cpp_src()
        .join("models")
        .join("ggml-vocab-qwen2.gguf")
}

/// Manual driver until the CLI subcommand exists (`VELA_SYNTH_TOKENIZER` optionally overrides
/// the tokenizer source):
/// `VELA_SYNTH_ARCH=llama3-8b VELA_SYNTH_TYPE=q4_0 VELA_SYNTH_SEED=1 VELA_SYNTH_OUT=/tmp/x.gguf
///  cargo test --release -p vela-models --lib synth_from_env -- --ignored --nocapture`
#[test]
#[ignore]
fn synth_from_env() {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("set {k}"));
    let scheme = QuantScheme::parse(&var("VELA_SYNTH_TYPE")).unwrap();
    let seed: u64 = var("VELA_SYNTH_SEED").parse().unwrap();
    let t0 = std::time::Instant::now();
    let mut last_pct = u64::MAX;
    synth_with(
        &var("VELA_SYNTH_ARCH"),
        scheme,
        seed,
        Path::new(&var("VELA_SYNTH_OUT")),
        &SynthOptions {
            tokenizer: std::env::var_os("VELA_SYNTH_TOKENIZER")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            threads: None,
        },
        &mut |a, b| {
            let pct = a * 100 / b.max(1);
            if pct / 10 != last_pct / 10 {
                eprintln!("{pct:3}% {:.1}s", t0.elapsed().as_secs_f64());
                last_pct = pct;
            }
        },
    )
    .unwrap();
    eprintln!("synth done in {:.1}s", t0.elapsed().as_secs_f64());
}

/// Manual: `VELA_SYNTH_VOCAB_SRC=model.gguf VELA_SYNTH_OUT=vocab.gguf cargo test ... vocab_from_env
/// -- --ignored` writes a vocabulary-only GGUF to carry instead of the whole model.
#[test]
#[ignore]
fn vocab_from_env() {
    let var = |k: &str| std::env::var(k).unwrap_or_else(|_| panic!("set {k}"));
    write_vocab_only(
        Path::new(&var("VELA_SYNTH_VOCAB_SRC")),
        Path::new(&var("VELA_SYNTH_OUT")),
    )
    .unwrap();
}
