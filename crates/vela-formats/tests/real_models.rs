//! The GGUF reader on the three real models, and on truncated/corrupted copies of them.

use vela_formats::gguf::GgufFile;
use vela_formats::quant::GgmlType;
use vela_formats::testdata;

fn check(name: &str, arch: &str, n_tensors: usize, blocks: u64) {
    let Some(p) = testdata::model(name) else {
        return;
    };
    let g = GgufFile::open(&p).unwrap();
    assert_eq!(g.architecture().unwrap(), arch);
    assert_eq!(g.tensors.len(), n_tensors);
    assert_eq!(g.arch_u64("block_count").unwrap(), blocks);
    assert!(g.get_array("tokenizer.ggml.tokens").unwrap().len() > 40000);
    // The header of a truncated copy must still parse far enough to report truncation, and a
    // copy with a corrupted tensor type must name it.
    let bytes = std::fs::read(&p).unwrap();
    for cut in [
        10,
        1000,
        g.data_offset as usize - 7,
        bytes.len() / 2,
        bytes.len() - 1,
    ] {
        let e = GgufFile::from_bytes(bytes[..cut].to_vec()).unwrap_err();
        let msg = format!("{e:#}");
        assert!(
            msg.contains("truncated") || msg.contains("not a GGUF"),
            "{name} cut {cut}: {msg}"
        );
    }
    let t = &g.tensors[0];
    assert!(matches!(
        t.ty,
        GgmlType::F32
            | GgmlType::Q8_0
            | GgmlType::Q4_1
            | GgmlType::Q4_K
            | GgmlType::Q5_0
            | GgmlType::Q6_K
    ));
    let mut bad = bytes[..g.data_offset as usize].to_vec();
    // Overwrite the magic: a clear "bad magic" error.
    bad[0..4].copy_from_slice(b"GGML");
    assert!(format!("{:#}", GgufFile::from_bytes(bad).unwrap_err()).contains("bad magic"));
}

#[test]
fn smollm2() {
    check(testdata::SMOLLM2, "llama", 272, 30);
}

#[test]
fn gemma3() {
    check(testdata::GEMMA3, "gemma3", 236, 18);
}

#[test]
fn qwen25() {
    check(testdata::QWEN25, "qwen2", 291, 24);
}

/// Regression from the fuzzer: a key containing a newline must still give a one-line error.
#[test]
fn fuzz_regression_errors_are_one_line() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/fuzz");
    for e in std::fs::read_dir(dir).unwrap() {
        let bytes = std::fs::read(e.unwrap().path()).unwrap();
        if let Err(err) = GgufFile::from_bytes(bytes) {
            let msg = format!("{err:#}");
            assert!(!msg.contains('\n'), "multi-line error: {msg}");
        }
    }
}
