//! Fuzz the sharded safetensors checkpoint reader: `Checkpoint::open` on a directory holding
//! `model.safetensors.index.json` and its shards, as vela opens a HF model directory.
//!
//! Input: a little-endian u32 length, that many bytes of index JSON, then another u32 length and
//! that many bytes of `model-00001-of-00002.safetensors`, the rest being
//! `model-00002-of-00002.safetensors` (a shard that the input does not reach is not written).
//! Next to the checkpoint directory lies `outside.safetensors`, a valid file with the tensor
//! `outside.secret`, which an index naming `../outside.safetensors` (or an absolute path) would
//! reach.
//!
//! Asserts: opening returns `Ok` or a one-line error, never panics (missing shards, a tensor
//! listed in the wrong shard, a tensor in two shards, shard names that are paths, bad offsets
//! all are errors). An opened checkpoint only maps files inside its directory (never
//! `outside.secret`); its shards are exactly those the weight map names; every weight-map tensor
//! is found in the shard the map names; every tensor it lists is read within its shard's bytes,
//! with as many bytes as its shape and dtype say, and converts to as many f32 (or i64) values.
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use vela_formats::safetensors::{Checkpoint, Dtype};

const SHARDS: [&str; 2] = [
    "model-00001-of-00002.safetensors",
    "model-00002-of-00002.safetensors",
];

/// A valid one-tensor safetensors file.
fn one_tensor(name: &str) -> Vec<u8> {
    let h = format!(r#"{{"{name}":{{"dtype":"F32","shape":[2],"data_offsets":[0,8]}}}}"#);
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(&[0, 0, 128, 63, 0, 0, 0, 64]);
    out
}

/// The checkpoint directory (`$TMPDIR/vela-fuzz-safetensors-index-PID/ckpt`), created once.
fn dir() -> &'static Path {
    static D: OnceLock<PathBuf> = OnceLock::new();
    D.get_or_init(|| {
        let base = std::env::temp_dir().join(format!(
            "vela-fuzz-safetensors-index-{}",
            std::process::id()
        ));
        let d = base.join("ckpt");
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            base.join("outside.safetensors"),
            one_tensor("outside.secret"),
        )
        .unwrap();
        d
    })
}

/// Split off a u32-length-prefixed field; a short input gives what is there.
fn field(data: &[u8]) -> (&[u8], &[u8], bool) {
    if data.len() < 4 {
        return (&[], &[], false);
    }
    let n = u32::from_le_bytes([data[0], data[1], data[2], data[3]]) as usize;
    let rest = &data[4..];
    let n = n.min(rest.len());
    (&rest[..n], &rest[n..], true)
}

fuzz_target!(|data: &[u8]| {
    let d = dir();
    let (index, rest) = match field(data) {
        (i, r, true) => (i, r),
        _ => (data, &[][..]),
    };
    let (shard1, shard2, has1) = field(rest);
    let has2 = has1 && !shard2.is_empty();
    std::fs::write(d.join("model.safetensors.index.json"), index).unwrap();
    for (name, bytes, present) in [(SHARDS[0], shard1, has1), (SHARDS[1], shard2, has2)] {
        let p = d.join(name);
        if present {
            std::fs::write(&p, bytes).unwrap();
        } else {
            let _ = std::fs::remove_file(&p);
        }
    }

    let cp = match Checkpoint::open(d) {
        Ok(cp) => cp,
        Err(e) => {
            let e = format!("{e:#}");
            assert!(!e.contains('\n'), "multi-line error {e:?}");
            return;
        }
    };

    // Only files of the directory are opened, exactly the shards the weight map names.
    let j: serde_json::Value = serde_json::from_slice(index).expect("an opened index is JSON");
    let map = j["weight_map"]
        .as_object()
        .expect("an opened index has a weight map");
    let named: BTreeSet<&str> = map.values().map(|v| v.as_str().unwrap()).collect();
    let opened: BTreeSet<String> = cp
        .files
        .iter()
        .map(|f| {
            assert_eq!(
                f.path.parent(),
                Some(d),
                "{} is outside the checkpoint",
                f.path.display()
            );
            f.path.file_name().unwrap().to_string_lossy().into_owned()
        })
        .collect();
    assert!(
        opened.iter().map(String::as_str).eq(named.iter().copied()),
        "opened {opened:?}, the weight map names {named:?}"
    );
    assert!(
        cp.locate("outside.secret").is_none(),
        "read a tensor outside the checkpoint"
    );

    // Every weight-map tensor is in the shard the map names.
    for (name, shard) in map {
        let (i, _) = cp.locate(name).expect("a weight-map tensor is found");
        assert!(
            cp.files[i].path.file_name().unwrap() == shard.as_str().unwrap(),
            "{name}"
        );
    }

    // Every tensor reads within its shard.
    let names: Vec<String> = cp.names().map(str::to_string).collect();
    for name in &names {
        let (i, e) = cp.locate(name).unwrap();
        let file = cp.files[i].bytes();
        assert!(
            e.start <= e.end && e.end <= file.len(),
            "{name}: outside its shard"
        );
        let (e2, b) = cp.get(name).unwrap();
        assert_eq!((e2.start, e2.end), (e.start, e.end));
        assert_eq!(b.len(), e.n_elements() * e.dtype.size(), "{name}");
        assert_eq!(cp.to_f32(name).unwrap().len(), e.n_elements(), "{name}");
        let ints = cp.to_i64(name);
        match e.dtype {
            Dtype::I32 | Dtype::I64 => assert_eq!(ints.unwrap().len(), e.n_elements()),
            _ => assert!(ints.is_err(), "{name}: {:?} read as integers", e.dtype),
        }
    }
    assert!(cp.to_f32("no such tensor").is_err());
});
