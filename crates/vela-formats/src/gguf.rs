//! GGUF reader (versions 2 and 3), memory-mapped.
//!
//! The whole header is parsed and validated up front: every malformed file (bad magic,
//! unsupported version, truncation, absurd counts, tensors out of range or overlapping, unknown
//! types, shape/size mismatches) is rejected with a one-line error and never a panic. Tensor data
//! is used in place from the map.

use crate::quant::GgmlType;
use anyhow::{anyhow, bail, Context, Result};
use std::collections::BTreeMap;
use std::fs::File;
use std::ops::Deref;
use std::path::Path;

const MAGIC: &[u8; 4] = b"GGUF";
/// Limits that reject absurd headers before any allocation is attempted.
const MAX_TENSORS: u64 = 1 << 20;
const MAX_KV: u64 = 1 << 20;
const MAX_DIMS: u32 = 4;
const MAX_STRING: u64 = 1 << 30;
const MAX_ARRAY: u64 = 1 << 28;
const MAX_NESTING: u32 = 8;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<Value>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Value {
    /// Integer view of any integer value (bools count as 0/1).
    pub fn as_i64(&self) -> Option<i64> {
        Some(match *self {
            Value::U8(v) => v as i64,
            Value::I8(v) => v as i64,
            Value::U16(v) => v as i64,
            Value::I16(v) => v as i64,
            Value::U32(v) => v as i64,
            Value::I32(v) => v as i64,
            Value::U64(v) => i64::try_from(v).ok()?,
            Value::I64(v) => v,
            Value::Bool(v) => v as i64,
            _ => return None,
        })
    }

    /// Float view of any numeric value.
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::F32(v) => Some(v as f64),
            Value::F64(v) => Some(v),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            Value::Bool(b) => Some(b),
            _ => self.as_i64().map(|v| v != 0),
        }
    }

    pub fn as_array(&self) -> Option<&[Value]> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }

    /// Short type name used in error messages and `vela info`.
    pub fn type_name(&self) -> &'static str {
        match self {
            Value::U8(_) => "u8",
            Value::I8(_) => "i8",
            Value::U16(_) => "u16",
            Value::I16(_) => "i16",
            Value::U32(_) => "u32",
            Value::I32(_) => "i32",
            Value::F32(_) => "f32",
            Value::Bool(_) => "bool",
            Value::String(_) => "string",
            Value::Array(_) => "array",
            Value::U64(_) => "u64",
            Value::I64(_) => "i64",
            Value::F64(_) => "f64",
        }
    }
}

/// One entry of the tensor directory.
#[derive(Clone, Debug)]
pub struct TensorInfo {
    pub name: String,
    /// GGML order: `dims[0]` is the contiguous (row) dimension.
    pub dims: Vec<u64>,
    pub ty: GgmlType,
    /// Offset relative to the start of the data section.
    pub offset: u64,
    /// Size in bytes of the tensor data.
    pub size: u64,
}

impl TensorInfo {
    pub fn n_elements(&self) -> u64 {
        self.dims.iter().product()
    }
    /// Row length (elements along `dims[0]`).
    pub fn ne0(&self) -> usize {
        self.dims[0] as usize
    }
    /// Number of rows (product of all dims but the first).
    pub fn n_rows(&self) -> usize {
        self.dims[1..].iter().product::<u64>() as usize
    }
}

enum Storage {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Deref for Storage {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Storage::Mmap(m) => m,
            Storage::Owned(v) => v,
        }
    }
}

/// A parsed GGUF file.
pub struct GgufFile {
    data: Storage,
    pub version: u32,
    pub alignment: u64,
    /// Absolute offset of the tensor data section.
    pub data_offset: u64,
    pub metadata: BTreeMap<String, Value>,
    /// Metadata keys in file order.
    pub key_order: Vec<String>,
    pub tensors: Vec<TensorInfo>,
    tensor_index: BTreeMap<String, usize>,
    /// The file it was opened from (`None`: parsed from memory).
    path: Option<std::path::PathBuf>,
}

struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: u64, what: &str) -> Result<&'a [u8]> {
        let n_us = usize::try_from(n).map_err(|_| anyhow!("{what}: length {n} too large"))?;
        let end = self
            .pos
            .checked_add(n_us)
            .filter(|&e| e <= self.buf.len())
            .ok_or_else(|| {
                anyhow!(
                    "truncated file: {what} needs {n} bytes at offset {} but the file has {}",
                    self.pos,
                    self.buf.len()
                )
            })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn arr<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        Ok(self.take(N as u64, what)?.try_into().unwrap())
    }
    fn u32(&mut self, what: &str) -> Result<u32> {
        Ok(u32::from_le_bytes(self.arr(what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64> {
        Ok(u64::from_le_bytes(self.arr(what)?))
    }
    fn string(&mut self, what: &str) -> Result<String> {
        let len = self.u64(what)?;
        if len > MAX_STRING {
            bail!("{what}: string length {len} is absurd");
        }
        let bytes = self.take(len, what)?;
        // Real vocabularies contain invalid UTF-8 in a few tokens; keep them lossily rather than fail.
        Ok(match std::str::from_utf8(bytes) {
            Ok(s) => s.to_owned(),
            Err(_) => String::from_utf8_lossy(bytes).into_owned(),
        })
    }

    fn value(&mut self, ty: u32, what: &str, depth: u32) -> Result<Value> {
        Ok(match ty {
            0 => Value::U8(self.arr::<1>(what)?[0]),
            1 => Value::I8(self.arr::<1>(what)?[0] as i8),
            2 => Value::U16(u16::from_le_bytes(self.arr(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.arr(what)?)),
            4 => Value::U32(self.u32(what)?),
            5 => Value::I32(i32::from_le_bytes(self.arr(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.arr(what)?)),
            7 => {
                let b = self.arr::<1>(what)?[0];
                if b > 1 {
                    bail!("{what}: invalid bool byte {b}");
                }
                Value::Bool(b == 1)
            }
            8 => Value::String(self.string(what)?),
            9 => {
                if depth >= MAX_NESTING {
                    bail!("{what}: arrays nested deeper than {MAX_NESTING}");
                }
                let elem_ty = self.u32(what)?;
                let n = self.u64(what)?;
                if n > MAX_ARRAY {
                    bail!("{what}: array length {n} is absurd");
                }
                // Every element needs at least one byte: reject lengths the file cannot hold
                // before allocating.
                let remaining = (self.buf.len() - self.pos) as u64;
                if n > remaining {
                    bail!("truncated file: {what} claims {n} array elements but only {remaining} bytes remain");
                }
                let mut v = Vec::with_capacity(n as usize);
                for _ in 0..n {
                    v.push(self.value(elem_ty, what, depth + 1)?);
                }
                Value::Array(v)
            }
            10 => Value::U64(self.u64(what)?),
            11 => Value::I64(i64::from_le_bytes(self.arr(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.arr(what)?)),
            t => bail!("{what}: unknown metadata value type {t}"),
        })
    }
}

impl std::fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("n_kv", &self.metadata.len())
            .field("n_tensors", &self.tensors.len())
            .finish()
    }
}

impl GgufFile {
    /// Open and validate a GGUF file, memory-mapping it.
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile> {
        let path = path.as_ref();
        let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        let len = file.metadata()?.len();
        if len < 24 {
            bail!("{}: not a GGUF file (only {len} bytes)", path.display());
        }
        // SAFETY: the map is read-only; a file truncated underneath us by another process is the
        // usual mmap caveat and not something a reader can defend against.
        let mmap = unsafe { memmap2::Mmap::map(&file) }
            .with_context(|| format!("cannot map {}", path.display()))?;
        let mut g = Self::parse(Storage::Mmap(mmap))
            .with_context(|| format!("invalid GGUF file {}", path.display()))?;
        g.path = Some(path.to_path_buf());
        Ok(g)
    }

    /// The file it was opened from (`None`: parsed from memory), so a model can find files
    /// that sit beside it (a drafter's GGUF).
    pub fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// Parse and validate a GGUF image held in memory.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile> {
        Self::parse(Storage::Owned(bytes))
    }

    fn parse(data: Storage) -> Result<GgufFile> {
        let buf: &[u8] = &data;
        let mut c = Cursor { buf, pos: 0 };
        let magic = c.take(4, "magic")?;
        if magic != MAGIC {
            bail!(
                "bad magic {:?}: not a GGUF file",
                String::from_utf8_lossy(magic)
            );
        }
        let version = c.u32("version")?;
        match version {
            2 | 3 => {}
            1 => bail!(
                "GGUF version 1 is not supported (re-convert the model with a current llama.cpp)"
            ),
            v if v.swap_bytes() == 2 || v.swap_bytes() == 3 => {
                bail!("big-endian GGUF files are not supported")
            }
            v => bail!("unsupported GGUF version {v}"),
        }
        let n_tensors = c.u64("tensor count")?;
        let n_kv = c.u64("metadata count")?;
        if n_tensors > MAX_TENSORS {
            bail!("absurd tensor count {n_tensors}");
        }
        if n_kv > MAX_KV {
            bail!("absurd metadata count {n_kv}");
        }
        let mut metadata = BTreeMap::new();
        let mut key_order = Vec::with_capacity(n_kv.min(4096) as usize);
        for i in 0..n_kv {
            let key = c.string(&format!("metadata key #{i}"))?;
            // Names are shown escaped so that every error stays on one line.
            let shown = key.escape_debug().to_string();
            let ty = c.u32(&format!("type of metadata '{shown}'"))?;
            let v = c.value(ty, &format!("metadata '{shown}'"), 0)?;
            if metadata.insert(key.clone(), v).is_some() {
                bail!("duplicate metadata key '{shown}'");
            }
            key_order.push(key);
        }
        let alignment = match metadata.get("general.alignment") {
            None => 32,
            Some(v) => {
                let a = v
                    .as_i64()
                    .ok_or_else(|| anyhow!("general.alignment has type {}", v.type_name()))?;
                if a <= 0 || (a as u64).count_ones() != 1 || a > 1 << 20 {
                    bail!("invalid general.alignment {a} (must be a power of two)");
                }
                a as u64
            }
        };
        let mut tensors = Vec::with_capacity(n_tensors.min(65536) as usize);
        let mut tensor_index = BTreeMap::new();
        for i in 0..n_tensors {
            let raw_name = c.string(&format!("tensor #{i} name"))?;
            let name = raw_name.escape_debug().to_string();
            let nd = c.u32(&format!("tensor '{name}' dims"))?;
            if nd == 0 || nd > MAX_DIMS {
                bail!("tensor '{name}' has {nd} dimensions (1..={MAX_DIMS} allowed)");
            }
            let mut dims = Vec::with_capacity(nd as usize);
            for _ in 0..nd {
                let d = c.u64(&format!("tensor '{name}' shape"))?;
                if d == 0 || d > 1 << 40 {
                    bail!("tensor '{name}' has invalid dimension {d}");
                }
                dims.push(d);
            }
            let ty_id = c.u32(&format!("tensor '{name}' type"))?;
            let ty = GgmlType::from_id(ty_id)
                .ok_or_else(|| anyhow!("tensor '{name}' has unknown type id {ty_id}"))?;
            let offset = c.u64(&format!("tensor '{name}' offset"))?;
            if offset % alignment != 0 {
                bail!("tensor '{name}' offset {offset} is not aligned to {alignment}");
            }
            let n_el = dims
                .iter()
                .try_fold(1u64, |a, &d| a.checked_mul(d))
                .filter(|&n| n <= 1 << 44)
                .ok_or_else(|| anyhow!("tensor '{name}' shape {dims:?} is absurd"))?;
            if dims[0] % ty.block_size() as u64 != 0 {
                bail!(
                    "tensor '{name}': row length {} is not a multiple of the {} block size {}",
                    dims[0],
                    ty,
                    ty.block_size()
                );
            }
            let size = ty
                .row_bytes(n_el)
                .ok_or_else(|| anyhow!("tensor '{name}': size of shape {dims:?} overflows"))?;
            if tensor_index
                .insert(raw_name.clone(), tensors.len())
                .is_some()
            {
                bail!("duplicate tensor name '{name}'");
            }
            tensors.push(TensorInfo {
                name: raw_name,
                dims,
                ty,
                offset,
                size,
            });
        }
        let data_offset = (c.pos as u64).div_ceil(alignment) * alignment;
        let file_len = buf.len() as u64;
        if n_tensors > 0 && data_offset > file_len {
            bail!(
                "truncated file: header ends at {} but the file has {file_len} bytes",
                c.pos
            );
        }
        // Range and overlap checks.
        let mut spans: Vec<(u64, u64, usize)> = tensors
            .iter()
            .enumerate()
            .map(|(i, t)| (t.offset, t.offset.saturating_add(t.size), i))
            .collect();
        spans.sort_unstable();
        for w in spans.windows(2) {
            if w[1].0 < w[0].1 {
                bail!(
                    "tensors '{}' and '{}' overlap in the data section",
                    tensors[w[0].2].name.escape_debug(),
                    tensors[w[1].2].name.escape_debug()
                );
            }
        }
        if let Some(&(_, end, i)) = spans.iter().max_by_key(|s| s.1) {
            let need = data_offset.saturating_add(end);
            if need > file_len {
                bail!(
                    "truncated file: tensor '{}' ends at byte {need} but the file has {file_len} bytes",
                    tensors[i].name.escape_debug()
                );
            }
        }
        Ok(GgufFile {
            data,
            version,
            alignment,
            data_offset,
            metadata,
            key_order,
            tensors,
            tensor_index,
            path: None,
        })
    }

    /// The whole file image.
    pub fn bytes(&self) -> &[u8] {
        &self.data
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.metadata.get(key)
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str> {
        self.get_str("general.architecture")
    }

    pub fn get_str(&self, key: &str) -> Result<&str> {
        let v = self
            .get(key)
            .ok_or_else(|| anyhow!("missing metadata key '{}'", key.escape_debug()))?;
        v.as_str().ok_or_else(|| {
            anyhow!(
                "metadata '{}' is {}, expected string",
                key.escape_debug(),
                v.type_name()
            )
        })
    }

    pub fn get_u64(&self, key: &str) -> Result<u64> {
        let v = self
            .get(key)
            .ok_or_else(|| anyhow!("missing metadata key '{}'", key.escape_debug()))?;
        v.as_i64()
            .and_then(|x| u64::try_from(x).ok())
            .ok_or_else(|| {
                anyhow!(
                    "metadata '{}' is {}, expected a non-negative integer",
                    key.escape_debug(),
                    v.type_name()
                )
            })
    }

    pub fn get_f64(&self, key: &str) -> Result<f64> {
        let v = self
            .get(key)
            .ok_or_else(|| anyhow!("missing metadata key '{}'", key.escape_debug()))?;
        v.as_f64().ok_or_else(|| {
            anyhow!(
                "metadata '{}' is {}, expected a number",
                key.escape_debug(),
                v.type_name()
            )
        })
    }

    pub fn get_bool(&self, key: &str) -> Result<bool> {
        let v = self
            .get(key)
            .ok_or_else(|| anyhow!("missing metadata key '{}'", key.escape_debug()))?;
        v.as_bool().ok_or_else(|| {
            anyhow!(
                "metadata '{}' is {}, expected bool",
                key.escape_debug(),
                v.type_name()
            )
        })
    }

    pub fn get_array(&self, key: &str) -> Result<&[Value]> {
        let v = self
            .get(key)
            .ok_or_else(|| anyhow!("missing metadata key '{}'", key.escape_debug()))?;
        v.as_array().ok_or_else(|| {
            anyhow!(
                "metadata '{}' is {}, expected array",
                key.escape_debug(),
                v.type_name()
            )
        })
    }

    /// `{arch}.{suffix}` as an unsigned integer.
    pub fn arch_u64(&self, suffix: &str) -> Result<u64> {
        self.get_u64(&format!("{}.{suffix}", self.architecture()?))
    }

    /// `{arch}.{suffix}` as a float, if present.
    pub fn arch_f64_opt(&self, suffix: &str) -> Result<Option<f64>> {
        let key = format!("{}.{suffix}", self.architecture()?);
        if self.get(&key).is_none() {
            return Ok(None);
        }
        self.get_f64(&key).map(Some)
    }

    /// `{arch}.{suffix}` as an unsigned integer, if present.
    pub fn arch_u64_opt(&self, suffix: &str) -> Result<Option<u64>> {
        let key = format!("{}.{suffix}", self.architecture()?);
        if self.get(&key).is_none() {
            return Ok(None);
        }
        self.get_u64(&key).map(Some)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The raw bytes of a tensor (in place in the map).
    pub fn tensor_data(&self, t: &TensorInfo) -> &[u8] {
        let start = (self.data_offset + t.offset) as usize;
        &self.data[start..start + t.size as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Minimal GGUF writer for tests.
    pub(crate) fn build(
        kv: &[(&str, u32, Vec<u8>)],
        tensors: &[(&str, &[u64], u32, Vec<u8>)],
    ) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(kv.len() as u64).to_le_bytes());
        let s = |out: &mut Vec<u8>, s: &str| {
            out.extend_from_slice(&(s.len() as u64).to_le_bytes());
            out.extend_from_slice(s.as_bytes());
        };
        for (k, ty, v) in kv {
            s(&mut out, k);
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(v);
        }
        let mut off = 0u64;
        let mut offs = vec![];
        for (name, dims, ty, data) in tensors {
            s(&mut out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in *dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(&off.to_le_bytes());
            offs.push(off);
            off += (data.len() as u64).div_ceil(32) * 32;
        }
        while out.len() % 32 != 0 {
            out.push(0);
        }
        for ((_, _, _, data), o) in tensors.iter().zip(offs) {
            let base = out.len() as u64;
            assert_eq!(base % 32, 0);
            let _ = o;
            out.extend_from_slice(data);
            while out.len() % 32 != 0 {
                out.push(0);
            }
        }
        out
    }

    fn str_val(s: &str) -> Vec<u8> {
        let mut v = (s.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(s.as_bytes());
        v
    }

    fn sample() -> Vec<u8> {
        let mut arr = 4u32.to_le_bytes().to_vec();
        arr.extend_from_slice(&3u64.to_le_bytes());
        for x in [1u32, 2, 3] {
            arr.extend_from_slice(&x.to_le_bytes());
        }
        build(
            &[
                ("general.architecture", 8, str_val("llama")),
                ("llama.block_count", 4, 2u32.to_le_bytes().to_vec()),
                ("llama.rope.freq_base", 6, 10000f32.to_le_bytes().to_vec()),
                ("some.array", 9, arr),
            ],
            &[
                ("a", &[4, 2], 0, vec![0u8; 32]),
                ("b", &[32], 8, vec![1u8; 34]),
            ],
        )
    }

    #[test]
    fn parses_valid() {
        let g = GgufFile::from_bytes(sample()).unwrap();
        assert_eq!(g.architecture().unwrap(), "llama");
        assert_eq!(g.arch_u64("block_count").unwrap(), 2);
        assert_eq!(g.arch_f64_opt("rope.freq_base").unwrap(), Some(10000.0));
        assert_eq!(g.get_array("some.array").unwrap().len(), 3);
        let b = g.tensor("b").unwrap();
        assert_eq!(b.ty, GgmlType::Q8_0);
        assert_eq!(g.tensor_data(b), &[1u8; 34][..]);
        assert_eq!(g.tensor("a").unwrap().n_rows(), 2);
    }

    /// Fuzz finding (config_json): keys built from the file's architecture name were echoed
    /// verbatim, so a name with a newline gave a multi-line error.
    #[test]
    fn getter_errors_stay_one_line() {
        let arch = "qw\n2";
        let mut v = (arch.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(arch.as_bytes());
        let mut e = 7u64.to_le_bytes().to_vec();
        e.extend_from_slice(b"llama\nx");
        let g = GgufFile::from_bytes(build(
            &[("general.architecture", 8, v), ("qw\n2.block_count", 8, e)],
            &[],
        ))
        .unwrap();
        let errs = [
            g.arch_u64("block_count").unwrap_err(),
            g.arch_u64("context_length").unwrap_err(),
            g.arch_f64_opt("block_count").unwrap_err(),
            g.get_bool("qw\n2.block_count").unwrap_err(),
            g.get_array("qw\n2.block_count").unwrap_err(),
            g.get_str("general.architecture\n").unwrap_err(),
        ];
        for e in errs {
            let m = format!("{e:#}");
            assert!(!m.contains('\n') && m.contains("\\n"), "{m}");
        }
    }

    #[test]
    fn every_truncation_is_an_error_not_a_panic() {
        let full = sample();
        for n in 0..full.len() - 1 {
            let r = GgufFile::from_bytes(full[..n].to_vec());
            // Trailing tensor padding may be cut without losing data; everything else must fail.
            if n < full.len() - 30 {
                let e = r
                    .err()
                    .unwrap_or_else(|| panic!("truncation at {n} accepted"));
                assert!(!format!("{e:#}").contains('\n'), "multi-line error: {e:#}");
            }
        }
    }

    #[test]
    fn rejects_bad_magic_version_and_types() {
        let mut b = sample();
        b[0] = b'X';
        assert!(GgufFile::from_bytes(b)
            .unwrap_err()
            .to_string()
            .contains("bad magic"));
        let mut b = sample();
        b[4] = 9;
        assert!(GgufFile::from_bytes(b)
            .unwrap_err()
            .to_string()
            .contains("version 9"));
        let b = build(&[], &[("x", &[32], 77, vec![0; 64])]);
        assert!(GgufFile::from_bytes(b)
            .unwrap_err()
            .to_string()
            .contains("unknown type id 77"));
        let b = build(&[], &[("x", &[33], 8, vec![0; 64])]);
        assert!(GgufFile::from_bytes(b)
            .unwrap_err()
            .to_string()
            .contains("block size"));
    }

    #[test]
    fn rejects_overlap_and_absurd_counts() {
        let mut b = build(
            &[],
            &[("a", &[8], 0, vec![0; 32]), ("b", &[8], 0, vec![0; 32])],
        );
        // Make b's offset 0 as well: find the second offset (last 8 bytes of tensor info section).
        let info_end = b.len() - 64;
        let pos = (0..info_end)
            .rev()
            .find(|&i| b[i..i + 8] == 32u64.to_le_bytes())
            .unwrap();
        b[pos..pos + 8].copy_from_slice(&0u64.to_le_bytes());
        assert!(GgufFile::from_bytes(b)
            .unwrap_err()
            .to_string()
            .contains("overlap"));
        let mut b = sample();
        b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(GgufFile::from_bytes(b)
            .unwrap_err()
            .to_string()
            .contains("absurd"));
    }
}
