//! GGUF writer (version 3), streaming.
//!
//! The header (metadata and tensor directory) is built in memory; tensor *data* is produced by a
//! caller-supplied callback, one tensor at a time, and streamed to disk, so a multi-gigabyte model
//! is written without ever holding it in RAM. Files are written to a temporary name next to the
//! destination, fsynced and renamed into place: a reader never sees a half-written file under the
//! final name, and a failed write leaves nothing behind.
//!
//! Layout written (what [`crate::gguf::GgufFile`], gguf-py and llama.cpp read):
//!
//! ```text
//! "GGUF" u32:3 u64:n_tensors u64:n_kv
//! n_kv × (string key, u32 type, value)               value types 0..=12, arrays nested
//! n_tensors × (string name, u32 n_dims, u64 dims[n_dims], u32 type, u64 offset)
//! zero padding to `alignment`
//! tensor data, each tensor starting at data_start + offset (a multiple of `alignment`),
//! zero padding between tensors and after the last one
//! ```

use crate::gguf::Value;
use crate::quant::GgmlType;
use anyhow::{anyhow, bail, Context, Result};
use std::collections::BTreeSet;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// The default data alignment of GGUF (used when `general.alignment` is absent).
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// One entry of the tensor directory to be written.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    /// GGML order: `dims[0]` is the contiguous (row) dimension.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset relative to the start of the data section (assigned by [`GgufWriter::add_tensor`]).
    pub offset: u64,
    /// Size in bytes of the tensor data.
    pub size: u64,
}

impl TensorSpec {
    /// Row length (elements along `dims[0]`).
    pub fn ne0(&self) -> usize {
        self.dims[0] as usize
    }
    /// Number of rows (product of all dims but the first).
    pub fn n_rows(&self) -> usize {
        self.dims[1..].iter().product::<u64>() as usize
    }
    /// Number of elements.
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A GGUF file under construction: metadata and tensor directory, data supplied at write time.
#[derive(Clone, Debug)]
pub struct GgufWriter {
    kv: Vec<(String, Value)>,
    keys: BTreeSet<String>,
    tensors: Vec<TensorSpec>,
    names: BTreeSet<String>,
    alignment: u64,
    data_len: u64,
}

impl Default for GgufWriter {
    fn default() -> Self {
        Self::new()
    }
}

/// Where a tensor's bytes go: a `Write` that refuses to take more than the tensor's size.
pub struct TensorSink<'a> {
    w: &'a mut dyn Write,
    remaining: u64,
}

impl TensorSink<'_> {
    /// Bytes still expected for this tensor.
    pub fn remaining(&self) -> u64 {
        self.remaining
    }
}

impl Write for TensorSink<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if buf.len() as u64 > self.remaining {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "{} bytes written but only {} remain in this tensor",
                    buf.len(),
                    self.remaining
                ),
            ));
        }
        let n = self.w.write(buf)?;
        self.remaining -= n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.w.flush()
    }
}

/// The GGUF value type id of a metadata value.
fn type_id(v: &Value) -> u32 {
    match v {
        Value::U8(_) => 0,
        Value::I8(_) => 1,
        Value::U16(_) => 2,
        Value::I16(_) => 3,
        Value::U32(_) => 4,
        Value::I32(_) => 5,
        Value::F32(_) => 6,
        Value::Bool(_) => 7,
        Value::String(_) => 8,
        Value::Array(_) => 9,
        Value::U64(_) => 10,
        Value::I64(_) => 11,
        Value::F64(_) => 12,
    }
}

/// Arrays must be homogeneous (one element type is written for the whole array).
fn check_value(v: &Value, key: &str) -> Result<()> {
    if let Value::Array(a) = v {
        if let Some(first) = a.first() {
            let t = type_id(first);
            if let Some(bad) = a.iter().find(|x| type_id(x) != t) {
                bail!(
                    "metadata '{}': array mixes {} and {} elements",
                    key.escape_debug(),
                    first.type_name(),
                    bad.type_name()
                );
            }
        }
        for x in a {
            check_value(x, key)?;
        }
    }
    Ok(())
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s),
        Value::Array(a) => {
            // An empty array has no element to take the type from; u8 is as good as any.
            let elem = a.first().map(type_id).unwrap_or(0);
            out.extend_from_slice(&elem.to_le_bytes());
            out.extend_from_slice(&(a.len() as u64).to_le_bytes());
            for x in a {
                put_value(out, x);
            }
        }
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

impl GgufWriter {
    /// An empty file with the default alignment (32).
    pub fn new() -> GgufWriter {
        GgufWriter {
            kv: Vec::new(),
            keys: BTreeSet::new(),
            tensors: Vec::new(),
            names: BTreeSet::new(),
            alignment: DEFAULT_ALIGNMENT,
            data_len: 0,
        }
    }

    /// Use a non-default data alignment (a power of two); records `general.alignment` (u32).
    /// Must be called before any tensor is added.
    pub fn set_alignment(&mut self, alignment: u64) -> Result<()> {
        if !alignment.is_power_of_two() || alignment > 1 << 20 {
            bail!("invalid alignment {alignment} (must be a power of two ≤ 2^20)");
        }
        if !self.tensors.is_empty() {
            bail!("the alignment must be set before tensors are added");
        }
        self.alignment = alignment;
        self.add_kv("general.alignment", Value::U32(alignment as u32))
    }

    /// The data alignment in bytes.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Append a metadata entry (keys are written in the order they are added).
    pub fn add_kv(&mut self, key: impl Into<String>, value: Value) -> Result<()> {
        let key = key.into();
        if key.is_empty() {
            bail!("empty metadata key");
        }
        check_value(&value, &key)?;
        if !self.keys.insert(key.clone()) {
            bail!("duplicate metadata key '{}'", key.escape_debug());
        }
        self.kv.push((key, value));
        Ok(())
    }

    /// The metadata added so far, in order.
    pub fn metadata(&self) -> &[(String, Value)] {
        &self.kv
    }

    /// Append a tensor to the directory; its data is supplied when the file is written.
    pub fn add_tensor(
        &mut self,
        name: impl Into<String>,
        dims: &[u64],
        ty: GgmlType,
    ) -> Result<()> {
        let name = name.into();
        let shown = name.escape_debug().to_string();
        if dims.is_empty() || dims.len() > 4 {
            bail!(
                "tensor '{shown}' has {} dimensions (1..=4 allowed)",
                dims.len()
            );
        }
        if dims.contains(&0) {
            bail!("tensor '{shown}' has a zero dimension in {dims:?}");
        }
        if !dims[0].is_multiple_of(ty.block_size() as u64) {
            bail!(
                "tensor '{shown}': row length {} is not a multiple of the {ty} block size {}",
                dims[0],
                ty.block_size()
            );
        }
        let n = dims
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .ok_or_else(|| anyhow!("tensor '{shown}' shape {dims:?} overflows"))?;
        let size = ty
            .row_bytes(n)
            .ok_or_else(|| anyhow!("tensor '{shown}': size of shape {dims:?} overflows"))?;
        if !self.names.insert(name.clone()) {
            bail!("duplicate tensor name '{shown}'");
        }
        let offset = self.data_len;
        self.data_len = (offset + size).div_ceil(self.alignment) * self.alignment;
        self.tensors.push(TensorSpec {
            name,
            dims: dims.to_vec(),
            ty,
            offset,
            size,
        });
        Ok(())
    }

    /// The tensor directory, in file order.
    pub fn tensors(&self) -> &[TensorSpec] {
        &self.tensors
    }

    /// Serialized header including the padding up to the data section.
    pub fn header_bytes(&self) -> Vec<u8> {
        let mut h = Vec::new();
        h.extend_from_slice(b"GGUF");
        h.extend_from_slice(&3u32.to_le_bytes());
        h.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        h.extend_from_slice(&(self.kv.len() as u64).to_le_bytes());
        for (k, v) in &self.kv {
            put_str(&mut h, k);
            h.extend_from_slice(&type_id(v).to_le_bytes());
            put_value(&mut h, v);
        }
        for t in &self.tensors {
            put_str(&mut h, &t.name);
            h.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for d in &t.dims {
                h.extend_from_slice(&d.to_le_bytes());
            }
            h.extend_from_slice(&t.ty.id().to_le_bytes());
            h.extend_from_slice(&t.offset.to_le_bytes());
        }
        let padded = (h.len() as u64).div_ceil(self.alignment) * self.alignment;
        h.resize(padded as usize, 0);
        h
    }

    /// Total size of the file that will be written.
    pub fn file_size(&self) -> u64 {
        self.header_bytes().len() as u64 + self.data_len
    }

    /// Stream the file to `w`. `fill(i, spec, sink)` must write exactly `spec.size` bytes of
    /// tensor `i` into `sink`. Returns the number of bytes written.
    pub fn write_to<W, F>(&self, w: &mut W, mut fill: F) -> Result<u64>
    where
        W: Write,
        F: FnMut(usize, &TensorSpec, &mut TensorSink) -> Result<()>,
    {
        let header = self.header_bytes();
        w.write_all(&header).context("writing the GGUF header")?;
        let mut pos = 0u64;
        let zeros = vec![0u8; self.alignment as usize];
        for (i, t) in self.tensors.iter().enumerate() {
            debug_assert_eq!(pos, t.offset);
            let mut sink = TensorSink {
                w,
                remaining: t.size,
            };
            fill(i, t, &mut sink)
                .with_context(|| format!("writing tensor '{}'", t.name.escape_debug()))?;
            if sink.remaining != 0 {
                bail!(
                    "tensor '{}': {} of {} bytes were written",
                    t.name.escape_debug(),
                    t.size - sink.remaining,
                    t.size
                );
            }
            let end = t.offset + t.size;
            let pad = end.div_ceil(self.alignment) * self.alignment - end;
            w.write_all(&zeros[..pad as usize])?;
            pos = end + pad;
        }
        Ok(header.len() as u64 + pos)
    }

    /// Write the file to `path` atomically: stream into a temporary file in the same directory,
    /// fsync it, then rename it over `path`. On any error the temporary file is removed.
    pub fn write_file<F>(&self, path: &Path, fill: F) -> Result<u64>
    where
        F: FnMut(usize, &TensorSpec, &mut TensorSink) -> Result<()>,
    {
        let tmp = temp_path(path)?;
        let result = (|| -> Result<u64> {
            let file =
                File::create(&tmp).with_context(|| format!("cannot create {}", tmp.display()))?;
            let mut w = BufWriter::with_capacity(1 << 22, file);
            let n = self.write_to(&mut w, fill)?;
            let file = w
                .into_inner()
                .map_err(|e| anyhow!("writing {}: {}", tmp.display(), e.error()))?;
            file.sync_all()
                .with_context(|| format!("fsync {}", tmp.display()))?;
            drop(file);
            std::fs::rename(&tmp, path).with_context(|| {
                format!("cannot rename {} to {}", tmp.display(), path.display())
            })?;
            Ok(n)
        })();
        match result {
            Ok(n) => {
                // Make the rename durable too (best effort: not every platform can open a dir).
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    if let Ok(d) = File::open(dir) {
                        let _ = d.sync_all();
                    }
                }
                Ok(n)
            }
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                Err(e)
            }
        }
    }

    /// The whole file in memory (for tests and small files).
    pub fn to_bytes<F>(&self, fill: F) -> Result<Vec<u8>>
    where
        F: FnMut(usize, &TensorSpec, &mut TensorSink) -> Result<()>,
    {
        let mut v = Vec::new();
        self.write_to(&mut v, fill)?;
        Ok(v)
    }
}

/// `<dir>/.<name>.tmp-<pid>` next to `path`.
fn temp_path(path: &Path) -> Result<PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| anyhow!("output path {} has no file name", path.display()))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(format!(".tmp-{}", std::process::id()));
    Ok(path.with_file_name(tmp_name))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::GgufFile;

    fn sample_writer() -> GgufWriter {
        let mut w = GgufWriter::new();
        w.add_kv("general.architecture", Value::String("llama".into()))
            .unwrap();
        let scalars = [
            Value::U8(200),
            Value::I8(-3),
            Value::U16(65000),
            Value::I16(-30000),
            Value::U32(4_000_000_000),
            Value::I32(-2_000_000_000),
            Value::F32(1.5e-6),
            Value::Bool(true),
            Value::String("héllo\nworld".into()),
            Value::U64(u64::MAX - 7),
            Value::I64(i64::MIN + 1),
            Value::F64(std::f64::consts::PI),
        ];
        for (i, v) in scalars.iter().enumerate() {
            w.add_kv(format!("test.scalar{i}"), v.clone()).unwrap();
        }
        w.add_kv(
            "test.strings",
            Value::Array(vec![Value::String("a".into()), Value::String("".into())]),
        )
        .unwrap();
        w.add_kv(
            "test.nested",
            Value::Array(vec![
                Value::Array(vec![Value::I32(1), Value::I32(-2)]),
                Value::Array(vec![Value::Bool(false)]),
            ]),
        )
        .unwrap();
        w.add_kv("test.bools", Value::Array(vec![Value::Bool(true); 3]))
            .unwrap();
        w.add_tensor("a", &[4, 3], GgmlType::F32).unwrap();
        w.add_tensor("b", &[64], GgmlType::Q8_0).unwrap();
        w.add_tensor("c", &[256, 2], GgmlType::Q4_K).unwrap();
        w
    }

    /// Tensor `i`'s bytes: a recognizable pattern.
    fn fill(i: usize, t: &TensorSpec, s: &mut TensorSink) -> Result<()> {
        let data: Vec<u8> = (0..t.size)
            .map(|j| (j as u8).wrapping_mul(7) ^ i as u8)
            .collect();
        s.write_all(&data)?;
        Ok(())
    }

    #[test]
    fn round_trips_through_the_reader() {
        let w = sample_writer();
        let bytes = w.to_bytes(fill).unwrap();
        assert_eq!(bytes.len() as u64, w.file_size());
        let g = GgufFile::from_bytes(bytes).unwrap();
        assert_eq!(g.version, 3);
        assert_eq!(g.key_order.len(), w.metadata().len());
        for ((k, v), k2) in w.metadata().iter().zip(&g.key_order) {
            assert_eq!(k, k2);
            assert_eq!(g.get(k).unwrap(), v, "value of {k}");
        }
        assert_eq!(g.tensors.len(), 3);
        for (i, t) in w.tensors().iter().enumerate() {
            let r = g.tensor(&t.name).unwrap();
            assert_eq!(r.dims, t.dims);
            assert_eq!(r.ty, t.ty);
            assert_eq!(r.offset % 32, 0);
            let mut expect = Vec::new();
            let mut sink = TensorSink {
                w: &mut expect,
                remaining: t.size,
            };
            fill(i, t, &mut sink).unwrap();
            assert_eq!(g.tensor_data(r), &expect[..], "data of {}", t.name);
        }
    }

    /// gguf-py (the converter's own reader) parses every value type, nested arrays included,
    /// to the same values. Skipped when python3 or gguf-py is missing.
    #[test]
    fn gguf_py_reads_what_we_write() {
        let path = std::env::temp_dir().join(format!("vela-gguf-py-{}.gguf", std::process::id()));
        let w = sample_writer();
        w.write_file(&path, fill).unwrap();
        let code = r#"
import gguf, json, sys
r = gguf.GGUFReader(sys.argv[1])
out = {}
for k, f in r.fields.items():
    if k.startswith("GGUF."):
        continue
    v = f.contents()
    out[k] = v if not isinstance(v, float) else repr(v)
out["__tensors__"] = [[t.name, [int(d) for d in t.shape], t.tensor_type.name,
                       list(bytes(t.data.tobytes()[:4]))] for t in r.tensors]
print(json.dumps(out))
"#;
        let o = match std::process::Command::new("python3")
            .args(["-c", code])
            .arg(&path)
            .output()
        {
            Ok(o) => o,
            Err(e) => {
                eprintln!("SKIP: python3 not runnable: {e}");
                return;
            }
        };
        std::fs::remove_file(&path).unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        if !o.status.success() && err.contains("No module named 'gguf'") {
            eprintln!("SKIP: gguf-py not installed");
            return;
        }
        assert!(o.status.success(), "gguf-py failed: {err}");
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(v["general.architecture"], "llama");
        assert_eq!(v["test.scalar0"], 200);
        assert_eq!(v["test.scalar1"], -3);
        assert_eq!(v["test.scalar4"], 4_000_000_000u64);
        assert_eq!(v["test.scalar5"], -2_000_000_000i64);
        assert_eq!(v["test.scalar7"], true);
        assert_eq!(v["test.scalar8"], "héllo\nworld");
        assert_eq!(v["test.scalar9"], u64::MAX - 7);
        assert_eq!(v["test.scalar10"], i64::MIN + 1);
        assert_eq!(v["test.scalar11"], format!("{:?}", std::f64::consts::PI));
        assert_eq!(v["test.strings"], serde_json::json!(["a", ""]));
        // gguf-py's `contents()` flattens nested arrays; that it parsed them at all (and every
        // field after them) shows the nested layout is right.
        assert_eq!(v["test.nested"], serde_json::json!([1, -2, false]));
        assert_eq!(v["test.bools"], serde_json::json!([true, true, true]));
        let t = &v["__tensors__"];
        assert_eq!(t[0][0], "a");
        assert_eq!(t[0][2], "F32");
        assert_eq!(t[1][2], "Q8_0");
        assert_eq!(t[2][1], serde_json::json!([256, 2]));
        assert_eq!(t[2][2], "Q4_K");
        // First data bytes of tensor 2 ("c"): the fill pattern.
        assert_eq!(t[2][3], serde_json::json!([2, 7 ^ 2, 14 ^ 2, 21 ^ 2]));
    }

    #[test]
    fn custom_alignment_is_honoured() {
        let mut w = GgufWriter::new();
        w.set_alignment(64).unwrap();
        w.add_tensor("x", &[32], GgmlType::Q8_0).unwrap();
        w.add_tensor("y", &[3], GgmlType::F32).unwrap();
        let g = GgufFile::from_bytes(w.to_bytes(fill).unwrap()).unwrap();
        assert_eq!(g.alignment, 64);
        assert_eq!(g.data_offset % 64, 0);
        assert_eq!(g.tensor("y").unwrap().offset, 64);
        assert!(GgufWriter::new().set_alignment(48).is_err());
    }

    #[test]
    fn rejects_bad_input_with_one_line_errors() {
        let mut w = GgufWriter::new();
        w.add_kv("k", Value::U8(1)).unwrap();
        let errs = [
            w.add_kv("k", Value::U8(2)).unwrap_err(),
            w.add_kv("m", Value::Array(vec![Value::U8(1), Value::I8(1)]))
                .unwrap_err(),
            w.add_tensor("t", &[33], GgmlType::Q8_0).unwrap_err(),
            w.add_tensor("t", &[0], GgmlType::F32).unwrap_err(),
            w.add_tensor("t", &[1, 1, 1, 1, 1], GgmlType::F32)
                .unwrap_err(),
        ];
        for e in errs {
            assert!(!format!("{e:#}").contains('\n'), "{e:#}");
        }
        w.add_tensor("t", &[8], GgmlType::F32).unwrap();
        assert!(w.add_tensor("t", &[8], GgmlType::F32).is_err());
        // A fill that writes too little or too much is an error, not a corrupt file.
        let short = w.to_bytes(|_, _, s| Ok(s.write_all(&[0u8; 4])?));
        assert!(format!("{:#}", short.unwrap_err()).contains("4 of 32 bytes"));
        let long = w.to_bytes(|_, _, s| Ok(s.write_all(&[0u8; 40])?));
        assert!(long.is_err());
    }

    #[test]
    fn file_write_is_atomic_and_cleans_up() {
        let dir = std::env::temp_dir().join(format!("vela-gguf-write-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("m.gguf");
        let w = sample_writer();
        let n = w.write_file(&path, fill).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), n);
        let g = GgufFile::open(&path).unwrap();
        assert_eq!(g.tensors.len(), 3);
        // A failing fill leaves the old file untouched and no temporary behind.
        let err = w.write_file(&path, |i, _, _| {
            if i == 1 {
                bail!("boom")
            }
            Ok(())
        });
        assert!(err.is_err());
        assert_eq!(std::fs::metadata(&path).unwrap().len(), n);
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 1, "temporary file left behind");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
