//! Memory-mapped reader for Hugging Face `.safetensors` checkpoints (single file or sharded).
//!
//! Layout of one file: `u64` little-endian header length `N`, then `N` bytes of JSON
//! `{"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}}`,
//! then the data section; offsets are relative to the start of the data section. A sharded
//! checkpoint has `model.safetensors.index.json` whose `weight_map` names the shard of each tensor.
//!
//! Every offset, shape and dtype is validated when the file is opened, so later lookups cannot
//! read outside the map.

use crate::quant::GgmlType;
use anyhow::{anyhow, bail, Context, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Element types this reader accepts (the integer ones for index buffers, such as the Gemma 4
/// assistant's `token_ordering`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dtype {
    F32,
    F16,
    BF16,
    I32,
    I64,
    I8,
    /// e4m3fn bytes and e8m0 scale bytes (DeepSeek V4's release; decoded by
    /// [`crate::quant::fp8`]).
    F8E4M3,
    F8E8M0,
}

impl Dtype {
    fn parse(s: &str) -> Option<Dtype> {
        Some(match s {
            "F32" => Dtype::F32,
            "F16" => Dtype::F16,
            "BF16" => Dtype::BF16,
            "I32" => Dtype::I32,
            "I64" => Dtype::I64,
            "I8" => Dtype::I8,
            "F8_E4M3" => Dtype::F8E4M3,
            "F8_E8M0" => Dtype::F8E8M0,
            _ => return None,
        })
    }

    /// The GGML type of the same element layout (the one-byte float formats as raw `I8` bytes).
    pub fn ggml(self) -> GgmlType {
        match self {
            Dtype::F32 => GgmlType::F32,
            Dtype::F16 => GgmlType::F16,
            Dtype::BF16 => GgmlType::BF16,
            Dtype::I32 => GgmlType::I32,
            Dtype::I64 => GgmlType::I64,
            Dtype::I8 | Dtype::F8E4M3 | Dtype::F8E8M0 => GgmlType::I8,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::F16 | Dtype::BF16 => 2,
            Dtype::I64 => 8,
            Dtype::I8 | Dtype::F8E4M3 | Dtype::F8E8M0 => 1,
        }
    }
}

/// One tensor's header entry.
#[derive(Clone, Debug)]
pub struct TensorEntry {
    pub dtype: Dtype,
    /// Shape in PyTorch order (outermost first): a Linear weight is `[out_features, in_features]`.
    pub shape: Vec<usize>,
    /// Absolute byte range inside the file.
    pub start: usize,
    pub end: usize,
}

impl TensorEntry {
    /// Number of elements.
    pub fn n_elements(&self) -> usize {
        self.shape.iter().product()
    }
}

/// One mapped `.safetensors` file.
pub struct SafetensorsFile {
    pub path: PathBuf,
    map: memmap2::Mmap,
    pub tensors: BTreeMap<String, TensorEntry>,
    /// The free-form `__metadata__` string map.
    pub metadata: BTreeMap<String, String>,
}

/// Largest header we accept (the format's own limit is 100 MB).
const MAX_HEADER: u64 = 100 << 20;

impl SafetensorsFile {
    /// Map and validate a file.
    pub fn open(path: impl AsRef<Path>) -> Result<SafetensorsFile> {
        let path = path.as_ref();
        let file =
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
        // SAFETY: the file is opened read-only; like every mmap-based reader we assume nobody
        // truncates it while it is mapped.
        let map = unsafe { memmap2::Mmap::map(&file) }
            .with_context(|| format!("cannot map {}", path.display()))?;
        let (tensors, metadata) = parse_header(&map)
            .with_context(|| format!("invalid safetensors file {}", path.display()))?;
        Ok(SafetensorsFile {
            path: path.to_path_buf(),
            map,
            tensors,
            metadata,
        })
    }

    /// Raw little-endian bytes of a tensor.
    pub fn data(&self, e: &TensorEntry) -> &[u8] {
        &self.map[e.start..e.end]
    }

    /// The whole mapped file (a [`TensorEntry`]'s `start..end` indexes it).
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
}

/// A file's tensor entries and `__metadata__`, validated against `buf` (the whole file): every
/// byte range lies in the data section and matches its shape and dtype.
pub fn parse_header(
    buf: &[u8],
) -> Result<(BTreeMap<String, TensorEntry>, BTreeMap<String, String>)> {
    if buf.len() < 8 {
        bail!(
            "file is {} bytes, shorter than the 8-byte header length",
            buf.len()
        );
    }
    let n = u64::from_le_bytes(buf[..8].try_into().unwrap());
    if n > MAX_HEADER || n > (buf.len() - 8) as u64 {
        bail!(
            "header length {n} exceeds the file size {} (or 100 MB)",
            buf.len()
        );
    }
    let data_start = 8 + n as usize;
    let json: serde_json::Value =
        serde_json::from_slice(&buf[8..data_start]).context("header is not valid JSON")?;
    let obj = json
        .as_object()
        .ok_or_else(|| anyhow!("header is not a JSON object"))?;
    let data_len = buf.len() - data_start;
    let mut tensors = BTreeMap::new();
    let mut metadata = BTreeMap::new();
    let mut ranges = Vec::new();
    for (raw_name, v) in obj {
        if raw_name == "__metadata__" {
            if let Some(m) = v.as_object() {
                for (k, s) in m {
                    metadata.insert(k.clone(), s.as_str().unwrap_or_default().to_string());
                }
            }
            continue;
        }
        // names and dtypes are shown escaped, so an error stays one line whatever the file holds
        let name = raw_name.escape_debug();
        let dt = v
            .get("dtype")
            .and_then(|d| d.as_str())
            .ok_or_else(|| anyhow!("tensor '{name}': missing dtype"))?;
        let dtype = Dtype::parse(dt).ok_or_else(|| {
            anyhow!(
                "tensor '{name}': dtype {} is not supported \
                 (F32/F16/BF16/I32/I64/I8/F8_E4M3/F8_E8M0)",
                dt.escape_debug()
            )
        })?;
        let shape: Vec<usize> = v
            .get("shape")
            .and_then(|s| s.as_array())
            .ok_or_else(|| anyhow!("tensor '{name}': missing shape"))?
            .iter()
            .map(|d| d.as_u64().map(|d| d as usize))
            .collect::<Option<_>>()
            .ok_or_else(|| anyhow!("tensor '{name}': shape has a non-integer dimension"))?;
        let offs: Vec<u64> = v
            .get("data_offsets")
            .and_then(|s| s.as_array())
            .ok_or_else(|| anyhow!("tensor '{name}': missing data_offsets"))?
            .iter()
            .map(|d| d.as_u64())
            .collect::<Option<_>>()
            .ok_or_else(|| anyhow!("tensor '{name}': data_offsets are not integers"))?;
        if offs.len() != 2 || offs[0] > offs[1] || offs[1] > data_len as u64 {
            bail!(
                "tensor '{name}': data_offsets {offs:?} outside the {data_len}-byte data section"
            );
        }
        let n_el = shape
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| anyhow!("tensor '{name}': shape {shape:?} overflows"))?;
        let want = n_el as u128 * dtype.size() as u128;
        if want != (offs[1] - offs[0]) as u128 {
            bail!(
                "tensor '{name}': {} {shape:?} needs {want} bytes, data_offsets give {}",
                dt.escape_debug(),
                offs[1] - offs[0]
            );
        }
        ranges.push((offs[0], offs[1], raw_name));
        tensors.insert(
            raw_name.clone(),
            TensorEntry {
                dtype,
                shape,
                start: data_start + offs[0] as usize,
                end: data_start + offs[1] as usize,
            },
        );
    }
    ranges.sort();
    for w in ranges.windows(2) {
        if w[1].0 < w[0].1 {
            bail!(
                "tensors '{}' and '{}' overlap",
                w[0].2.escape_debug(),
                w[1].2.escape_debug()
            );
        }
    }
    Ok((tensors, metadata))
}

/// A checkpoint directory (or single file): every tensor name mapped to the shard holding it.
pub struct Checkpoint {
    pub files: Vec<SafetensorsFile>,
    index: BTreeMap<String, usize>,
}

impl Checkpoint {
    /// Open `path`: a `.safetensors` file, or a directory with `model.safetensors` or
    /// `model.safetensors.index.json` (sharded).
    pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint> {
        let path = path.as_ref();
        let files = if path.is_file() {
            vec![SafetensorsFile::open(path)?]
        } else if path.join("model.safetensors.index.json").is_file() {
            let ip = path.join("model.safetensors.index.json");
            let text = std::fs::read_to_string(&ip)
                .with_context(|| format!("cannot read {}", ip.display()))?;
            let j: serde_json::Value = serde_json::from_str(&text)
                .with_context(|| format!("{} is not valid JSON", ip.display()))?;
            let map = j
                .get("weight_map")
                .and_then(|m| m.as_object())
                .ok_or_else(|| anyhow!("{}: missing weight_map", ip.display()))?;
            let mut shards: Vec<String> = Vec::new();
            for v in map.values() {
                let s = v
                    .as_str()
                    .ok_or_else(|| anyhow!("{}: weight_map value is not a string", ip.display()))?;
                // a shard is a file of the directory: no path, no control characters
                if s.contains('/') || s.contains("..") || s.chars().any(char::is_control) {
                    bail!(
                        "{}: shard name '{}' is not a plain file name",
                        ip.display(),
                        s.escape_debug()
                    );
                }
                if !shards.iter().any(|x| x == s) {
                    shards.push(s.to_string());
                }
            }
            shards.sort();
            let files = shards
                .iter()
                .map(|s| SafetensorsFile::open(path.join(s)))
                .collect::<Result<Vec<_>>>()?;
            let cp = Checkpoint::from_files(files)?;
            for (name, shard) in map {
                let s = shard.as_str().unwrap_or_default();
                match cp.index.get(name) {
                    Some(&i) if cp.files[i].path.ends_with(s) => {}
                    _ => bail!(
                        "{}: tensor '{}' is not in shard {}",
                        ip.display(),
                        name.escape_debug(),
                        s.escape_debug()
                    ),
                }
            }
            return Ok(cp);
        } else if path.join("model.safetensors").is_file() {
            vec![SafetensorsFile::open(path.join("model.safetensors"))?]
        } else {
            bail!(
                "{}: no model.safetensors or model.safetensors.index.json",
                path.display()
            );
        };
        Checkpoint::from_files(files)
    }

    fn from_files(files: Vec<SafetensorsFile>) -> Result<Checkpoint> {
        let mut index = BTreeMap::new();
        for (i, f) in files.iter().enumerate() {
            for name in f.tensors.keys() {
                if index.insert(name.clone(), i).is_some() {
                    bail!(
                        "tensor '{}' appears in more than one shard",
                        name.escape_debug()
                    );
                }
            }
        }
        Ok(Checkpoint { files, index })
    }

    /// All tensor names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    /// The shard holding a tensor (an index into `files`) and its entry; `None` if absent.
    pub fn locate(&self, name: &str) -> Option<(usize, &TensorEntry)> {
        let i = *self.index.get(name)?;
        Some((i, &self.files[i].tensors[name]))
    }

    /// A tensor's entry and bytes; `None` if absent.
    pub fn get(&self, name: &str) -> Option<(&TensorEntry, &[u8])> {
        let f = &self.files[*self.index.get(name)?];
        let e = &f.tensors[name];
        Some((e, f.data(e)))
    }

    /// An integer tensor (I32 or I64) as i64 values; an error for a float tensor.
    pub fn to_i64(&self, name: &str) -> Result<Vec<i64>> {
        let (e, b) = self
            .get(name)
            .ok_or_else(|| anyhow!("missing tensor {}", name.escape_debug()))?;
        Ok(match e.dtype {
            Dtype::I32 => b
                .chunks_exact(4)
                .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as i64)
                .collect(),
            Dtype::I64 => b
                .chunks_exact(8)
                .map(|c| i64::from_le_bytes(c.try_into().unwrap()))
                .collect(),
            other => bail!(
                "tensor {}: {other:?} is not an integer type",
                name.escape_debug()
            ),
        })
    }

    /// A tensor converted to f32 (row-major in PyTorch order).
    pub fn to_f32(&self, name: &str) -> Result<Vec<f32>> {
        let (e, b) = self
            .get(name)
            .ok_or_else(|| anyhow!("missing tensor {}", name.escape_debug()))?;
        Ok(bytes_to_f32(e.dtype, b))
    }
}

/// Decode little-endian element bytes to f32.
pub fn bytes_to_f32(dtype: Dtype, b: &[u8]) -> Vec<f32> {
    match dtype {
        Dtype::F32 => b
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect(),
        Dtype::F16 => b
            .chunks_exact(2)
            .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::BF16 => b
            .chunks_exact(2)
            .map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f32())
            .collect(),
        Dtype::I32 => b
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()) as f32)
            .collect(),
        Dtype::I64 => b
            .chunks_exact(8)
            .map(|c| i64::from_le_bytes(c.try_into().unwrap()) as f32)
            .collect(),
        Dtype::I8 => b.iter().map(|&x| x as i8 as f32).collect(),
        // Unscaled element values (the block scales live in another tensor).
        Dtype::F8E4M3 => b.iter().map(|&x| crate::quant::fp8::e4m3(x)).collect(),
        Dtype::F8E8M0 => b.iter().map(|&x| crate::quant::fp8::e8m0(x)).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Serialize tensors the way `safetensors.torch.save_file` does.
    fn build(entries: &[(&str, &str, Vec<usize>, Vec<u8>)]) -> Vec<u8> {
        let mut header = serde_json::Map::new();
        let mut data = Vec::new();
        for (name, dt, shape, bytes) in entries {
            let begin = data.len();
            data.extend_from_slice(bytes);
            header.insert(
                name.to_string(),
                serde_json::json!({"dtype": dt, "shape": shape, "data_offsets": [begin, data.len()]}),
            );
        }
        header.insert("__metadata__".into(), serde_json::json!({"format": "pt"}));
        let h = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
        let mut out = (h.len() as u64).to_le_bytes().to_vec();
        out.extend_from_slice(&h);
        out.extend_from_slice(&data);
        out
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn tmpdir(tag: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("vela-st-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn reads_all_dtypes() {
        let d = tmpdir("dtypes");
        let f16: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|&x| half::f16::from_f32(x).to_le_bytes())
            .collect();
        let bf16: Vec<u8> = [0.25f32, 3.0, -1.0]
            .iter()
            .flat_map(|&x| half::bf16::from_f32(x).to_le_bytes())
            .collect();
        let bytes = build(&[
            ("a", "F32", vec![2, 2], f32_bytes(&[1.0, 2.0, 3.0, 4.0])),
            ("b", "F16", vec![2], f16),
            ("c", "BF16", vec![3, 1], bf16),
        ]);
        std::fs::write(d.join("model.safetensors"), bytes).unwrap();
        let cp = Checkpoint::open(&d).unwrap();
        assert_eq!(cp.names().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(cp.get("a").unwrap().0.shape, [2, 2]);
        assert_eq!(cp.to_f32("a").unwrap(), [1.0, 2.0, 3.0, 4.0]);
        assert_eq!(cp.to_f32("b").unwrap(), [1.5, -2.0]);
        assert_eq!(cp.to_f32("c").unwrap(), [0.25, 3.0, -1.0]);
        assert_eq!(cp.files[0].metadata["format"], "pt");
        assert!(cp.to_f32("zzz").is_err());
    }

    #[test]
    fn integer_tensors() {
        let d = tmpdir("ints");
        let i64s: Vec<u8> = [7i64, -9].iter().flat_map(|v| v.to_le_bytes()).collect();
        let i32s: Vec<u8> = [3i32].iter().flat_map(|v| v.to_le_bytes()).collect();
        let bytes = build(&[
            ("o", "I64", vec![2], i64s),
            ("p", "I32", vec![1], i32s),
            ("f", "F32", vec![1], f32_bytes(&[1.0])),
        ]);
        std::fs::write(d.join("model.safetensors"), bytes).unwrap();
        let cp = Checkpoint::open(&d).unwrap();
        assert_eq!(cp.to_i64("o").unwrap(), [7, -9]);
        assert_eq!(cp.to_i64("p").unwrap(), [3]);
        assert!(cp.to_i64("f").is_err());
        assert_eq!(cp.get("o").unwrap().0.dtype.ggml(), GgmlType::I64);
        // A size that does not fit the type is refused at open.
        let bad = build(&[("o", "I64", vec![3], vec![0; 16])]);
        std::fs::write(d.join("model.safetensors"), bad).unwrap();
        assert!(Checkpoint::open(&d).is_err());
    }

    #[test]
    fn sharded_index() {
        let d = tmpdir("shards");
        std::fs::write(
            d.join("model-00001-of-00002.safetensors"),
            build(&[("x", "F32", vec![1], f32_bytes(&[7.0]))]),
        )
        .unwrap();
        std::fs::write(
            d.join("model-00002-of-00002.safetensors"),
            build(&[("y", "F32", vec![2], f32_bytes(&[8.0, 9.0]))]),
        )
        .unwrap();
        let idx = serde_json::json!({"metadata": {}, "weight_map": {
            "x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"}});
        std::fs::write(d.join("model.safetensors.index.json"), idx.to_string()).unwrap();
        let cp = Checkpoint::open(&d).unwrap();
        assert_eq!(cp.files.len(), 2);
        assert_eq!(cp.to_f32("y").unwrap(), [8.0, 9.0]);
        assert_eq!(cp.to_f32("x").unwrap(), [7.0]);
        // An index naming the wrong shard is rejected.
        let bad = serde_json::json!({"weight_map": {
            "x": "model-00002-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"}});
        std::fs::write(d.join("model.safetensors.index.json"), bad.to_string()).unwrap();
        let err = Checkpoint::open(&d).err().unwrap().to_string();
        assert!(err.contains("not in shard"), "{err}");
    }

    /// Fuzz finding (safetensors_index): a tensor name with a newline in the index gave an error
    /// spanning several lines; names from files are shown escaped.
    #[test]
    fn errors_on_names_with_newlines_stay_one_line() {
        let d = tmpdir("newline");
        let shard = "model-00001-of-00001.safetensors";
        std::fs::write(
            d.join(shard),
            build(&[("x", "F32", vec![1], f32_bytes(&[7.0]))]),
        )
        .unwrap();
        let one_line = |index: serde_json::Value| {
            std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();
            let err = format!("{:#}", Checkpoint::open(&d).err().expect("must fail"));
            assert!(!err.contains('\n'), "{err:?}");
            err
        };
        let err = one_line(serde_json::json!({"weight_map": {"x": shard, "a\nb": shard}}));
        assert!(err.contains("a\\nb"), "{err}");
        one_line(serde_json::json!({"weight_map": {"x": "a\n../b"}}));
        let err = one_line(serde_json::json!({"weight_map": {"x": "a\nb"}}));
        assert!(err.contains("not a plain file name"), "{err}");
        // the same tensor in two shards
        std::fs::write(
            d.join("model-00002-of-00002.safetensors"),
            build(&[("x\ny", "F32", vec![1], f32_bytes(&[7.0]))]),
        )
        .unwrap();
        std::fs::write(
            d.join("model-00001-of-00002.safetensors"),
            build(&[("x\ny", "F32", vec![1], f32_bytes(&[7.0]))]),
        )
        .unwrap();
        one_line(serde_json::json!({"weight_map": {
            "x\ny": "model-00001-of-00002.safetensors",
            "z": "model-00002-of-00002.safetensors"}}));
        // header errors name the tensor and dtype escaped
        let p = d.join("bad.safetensors");
        for (name, dt) in [("a\nb", "F32"), ("a", "F\n32")] {
            std::fs::write(&p, build(&[(name, dt, vec![3], f32_bytes(&[1.0]))])).unwrap();
            let err = format!("{:#}", SafetensorsFile::open(&p).err().expect("must fail"));
            assert!(!err.contains('\n'), "{err:?}");
        }
        std::fs::write(
            &p,
            build(&[
                ("a\n", "F32", vec![1], f32_bytes(&[1.0])),
                ("b\n", "F32", vec![1], f32_bytes(&[1.0])),
            ]),
        )
        .unwrap();
        // make the two tensors overlap: the second's offsets [4,8] become [0,4]
        let mut b = std::fs::read(&p).unwrap();
        let at = b.windows(5).position(|w| w == b"[4,8]").unwrap();
        b[at..at + 5].copy_from_slice(b"[0,4]");
        std::fs::write(&p, &b).unwrap();
        let err = format!("{:#}", SafetensorsFile::open(&p).err().expect("must fail"));
        assert!(!err.contains('\n'), "{err:?}");
    }

    #[test]
    fn rejects_bad_headers() {
        let d = tmpdir("bad");
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![1, 2, 3], "shorter than"),
            ((1u64 << 40).to_le_bytes().to_vec(), "exceeds"),
            (build(&[("a", "U8", vec![1], vec![0; 1])]), "not supported"),
            (
                build(&[("a", "F32", vec![3], f32_bytes(&[1.0, 2.0]))]),
                "needs 12 bytes",
            ),
            (
                {
                    let mut b = build(&[("a", "F32", vec![2], f32_bytes(&[1.0, 2.0]))]);
                    b.truncate(b.len() - 4);
                    b
                },
                "outside",
            ),
            (
                {
                    let mut b = 2u64.to_le_bytes().to_vec();
                    b.extend_from_slice(b"{x");
                    b
                },
                "not valid JSON",
            ),
        ];
        for (i, (bytes, want)) in cases.into_iter().enumerate() {
            let p = d.join(format!("{i}.safetensors"));
            std::fs::write(&p, bytes).unwrap();
            let err = format!("{:#}", SafetensorsFile::open(&p).err().expect("must fail"));
            assert!(err.contains(want), "case {i}: {err}");
        }
        let err = Checkpoint::open(d.join("nope")).err().unwrap().to_string();
        assert!(err.contains("no model.safetensors"), "{err}");
    }
}
