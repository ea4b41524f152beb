//! Sequence states on disk (the server's persistent prefix cache): a sequence's tokens and its
//! whole state ([`StateExport`]: K/V rows, recurrent states, block rows) in one file, written to
//! a temporary name, fsynced and renamed, so that a crash leaves either the old file or the new
//! one. A file names the model it belongs to ([`identity`]) and ends with a CRC-32 of everything
//! before it; a file of another model, a truncated or corrupt one is refused with an error that
//! says why, and nothing of it is loaded.
//!
//! Layout (little endian): magic `VELAPC` 0 1; u32 header length; the header (JSON: identity,
//! token count, payload bytes); the tokens (u32 each); the payload (below); the CRC-32 (u32).
//! Payload: the K/V part (element type u8, n_past u64, layer count u32, per layer first u64,
//! K row bytes u64, V row bytes u64, K bytes, V bytes: each a u64 length then the bytes), then
//! the extra part (u8 present; n_past u64, layer count u32, per layer a kind u8: 0 none,
//! 1 recurrent (u32 slots, each f32s), 2 blocks (rows f32s, raw first u64, raw f32s); f32s are
//! a u64 count then the values).

use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use vela_compute::{KvBytes, KvExport, KvLayerExport, KvType};
use vela_models::state::{ExtraExport, ExtraLayerExport};
pub use vela_models::StateExport;

const MAGIC: &[u8; 8] = b"VELAPC\x00\x01";

/// File name extension of a saved state.
pub const EXT: &str = "vpc";

/// Largest header accepted (a corrupt length must not allocate gigabytes).
const MAX_HEADER: usize = 64 << 10;

/// What a file says of itself before its state is read.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    pub identity: String,
    pub tokens: Vec<u32>,
    /// Bytes of the state part.
    pub payload: u64,
}

/// The identity of a model's sequence states: architecture, backend, vocabulary, state layout,
/// K/V element type and a fingerprint of the weights (the SHA-256 of each file's size and its
/// first and last MiB, or the `synth:` spec). States load only into the same identity.
pub fn identity(model: &dyn vela_models::LanguageModel, path: &Path, kv: KvType) -> Result<String> {
    let mut h = Sha256::new();
    let spec = path.to_string_lossy();
    if spec.starts_with("synth:") {
        h.update(spec.as_bytes());
    } else {
        let mut files: Vec<PathBuf> = if path.is_dir() {
            std::fs::read_dir(path)?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.extension()
                        .is_some_and(|x| x == "safetensors" || x == "json" || x == "gguf")
                })
                .collect()
        } else {
            vec![path.to_path_buf()]
        };
        files.sort();
        for f in files {
            fingerprint_file(&mut h, &f).with_context(|| format!("reading {}", f.display()))?;
        }
    }
    let w: String = h.finalize().iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!(
        "{} on {} | vocab {} | {:?} | kv {:?} | weights {}",
        model.arch(),
        model.backend_name(),
        model.n_vocab(),
        model.state_layout(),
        kv,
        &w[..32]
    ))
}

fn fingerprint_file(h: &mut Sha256, path: &Path) -> Result<()> {
    use std::io::{Seek, SeekFrom};
    const PART: u64 = 1 << 20;
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    h.update(path.file_name().unwrap_or_default().as_encoded_bytes());
    h.update(len.to_le_bytes());
    let mut buf = vec![0u8; PART.min(len) as usize];
    f.read_exact(&mut buf)?;
    h.update(&buf);
    if len > PART {
        let tail = PART.min(len - PART);
        f.seek(SeekFrom::Start(len - tail))?;
        buf.resize(tail as usize, 0);
        f.read_exact(&mut buf)?;
        h.update(&buf);
    }
    Ok(())
}

/// A short hex digest of `bytes` (file names).
pub fn short_hash(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The file name of a state of `tokens` under `identity`.
pub fn file_name(identity: &str, tokens: &[u32]) -> String {
    let t: Vec<u8> = tokens.iter().flat_map(|t| t.to_le_bytes()).collect();
    format!(
        "{}-{}-{}.{EXT}",
        short_hash(identity.as_bytes()),
        tokens.len(),
        short_hash(&t)
    )
}

/// The file's bytes.
pub fn encode(identity: &str, tokens: &[u32], s: &StateExport) -> Vec<u8> {
    let mut p = Vec::with_capacity(s.bytes() + 1024);
    encode_kv(&mut p, &s.kv);
    match &s.extra {
        None => p.push(0),
        Some(e) => {
            p.push(1);
            encode_extra(&mut p, e);
        }
    }
    let header = serde_json::json!({
        "identity": identity,
        "tokens": tokens.len(),
        "payload": p.len(),
    })
    .to_string();
    let mut out = Vec::with_capacity(16 + header.len() + 4 * tokens.len() + p.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(header.len() as u32).to_le_bytes());
    out.extend_from_slice(header.as_bytes());
    for t in tokens {
        out.extend_from_slice(&t.to_le_bytes());
    }
    out.extend_from_slice(&p);
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

fn put_u64(o: &mut Vec<u8>, v: usize) {
    o.extend_from_slice(&(v as u64).to_le_bytes());
}

fn put_bytes(o: &mut Vec<u8>, b: &[u8]) {
    put_u64(o, b.len());
    o.extend_from_slice(b);
}

fn put_f32s(o: &mut Vec<u8>, v: &[f32]) {
    put_u64(o, v.len());
    for x in v {
        o.extend_from_slice(&x.to_le_bytes());
    }
}

fn encode_kv(o: &mut Vec<u8>, kv: &KvExport) {
    o.push(match kv.ty {
        KvType::F32 => 0,
        KvType::F16 => 1,
        KvType::Bf16 => 2,
    });
    put_u64(o, kv.n_past);
    o.extend_from_slice(&(kv.layers.len() as u32).to_le_bytes());
    for l in &kv.layers {
        put_u64(o, l.first);
        put_u64(o, l.k_row);
        put_u64(o, l.v_row);
        put_bytes(o, &l.k);
        put_bytes(o, &l.v);
    }
}

fn encode_extra(o: &mut Vec<u8>, e: &ExtraExport) {
    put_u64(o, e.n_past);
    o.extend_from_slice(&(e.layers.len() as u32).to_le_bytes());
    for l in &e.layers {
        match l {
            ExtraLayerExport::None => o.push(0),
            ExtraLayerExport::Recurrent { slots } => {
                o.push(1);
                o.extend_from_slice(&(slots.len() as u32).to_le_bytes());
                for s in slots {
                    put_f32s(o, s);
                }
            }
            ExtraLayerExport::Blocks {
                rows,
                raw_first,
                raw,
            } => {
                o.push(2);
                put_f32s(o, rows);
                put_u64(o, *raw_first);
                put_f32s(o, raw);
            }
        }
    }
}

/// A reader over a byte slice that fails, never panics, on a short or inconsistent input.
/// With `shared` (the whole buffer the slice lies in), K/V rows come out as ranges of it
/// instead of copies.
struct Cursor<'a> {
    b: &'a [u8],
    shared: Option<&'a SharedBytes>,
}

/// A whole file's bytes, shared by the K/V rows decoded from it.
type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if n > self.b.len() {
            bail!("truncated state ({n} bytes wanted, {} left)", self.b.len());
        }
        let (a, rest) = self.b.split_at(n);
        self.b = rest;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<usize> {
        let b = self.take(8)?;
        let v = u64::from_le_bytes(b.try_into().expect("8 bytes"));
        usize::try_from(v).map_err(|_| anyhow!("a length beyond the address space"))
    }
    /// A length of items of `size` bytes that the rest of the input can hold.
    fn len_of(&mut self, size: usize) -> Result<usize> {
        let n = self.u64()?;
        if n.checked_mul(size).is_none_or(|b| b > self.b.len()) {
            bail!("a length of {n} beyond the end of the state");
        }
        Ok(n)
    }
    fn bytes(&mut self) -> Result<KvBytes> {
        let n = self.len_of(1)?;
        let b = self.take(n)?;
        Ok(match self.shared {
            Some(all) => {
                let at = b.as_ptr() as usize - (**all).as_ref().as_ptr() as usize;
                KvBytes::Shared(all.clone(), at..at + n)
            }
            None => b.to_vec().into(),
        })
    }
    fn f32s(&mut self) -> Result<Vec<f32>> {
        let n = self.len_of(4)?;
        Ok(self
            .take(n * 4)?
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect())
    }
}

/// Parse a whole file: its header (with the tokens) and state. Checks the magic, the lengths
/// and the checksum; the identity is the caller's to compare.
pub fn decode(bytes: &[u8]) -> Result<(Header, StateExport)> {
    decode_in(bytes, None)
}

/// [`decode`] of `shared`'s bytes, the K/V rows left in it (no copy).
pub fn decode_shared(shared: &SharedBytes) -> Result<(Header, StateExport)> {
    decode_in((**shared).as_ref(), Some(shared))
}

fn decode_in(bytes: &[u8], shared: Option<&SharedBytes>) -> Result<(Header, StateExport)> {
    let (header, body) = decode_header(bytes)?;
    if bytes.len() < body + 4 {
        bail!("truncated file");
    }
    let end = bytes.len() - 4;
    let crc = u32::from_le_bytes(bytes[end..].try_into().expect("4 bytes"));
    if crc32fast::hash(&bytes[..end]) != crc {
        bail!("checksum mismatch (corrupt file)");
    }
    if (end - body) as u64 != header.payload {
        bail!("the payload length does not match the file");
    }
    let mut c = Cursor {
        b: &bytes[body..end],
        shared,
    };
    let kv = decode_kv(&mut c)?;
    let extra = match c.u8()? {
        0 => None,
        1 => Some(decode_extra(&mut c)?),
        k => bail!("unknown extra-state marker {k}"),
    };
    if !c.b.is_empty() {
        bail!("{} stray bytes after the state", c.b.len());
    }
    Ok((header, StateExport { kv, extra }))
}

/// The fields of a header's JSON: identity, token count, payload bytes.
fn header_fields(json: &[u8]) -> Result<(String, usize, u64)> {
    let h: serde_json::Value = serde_json::from_slice(json).context("bad header")?;
    let identity = h["identity"]
        .as_str()
        .ok_or_else(|| anyhow!("header without identity"))?
        .to_string();
    let n = h["tokens"]
        .as_u64()
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| anyhow!("header without a token count"))?;
    let payload = h["payload"]
        .as_u64()
        .ok_or_else(|| anyhow!("header without a payload length"))?;
    Ok((identity, n, payload))
}

/// The header and tokens at the start of a file, and where its payload starts.
fn decode_header(bytes: &[u8]) -> Result<(Header, usize)> {
    let mut c = Cursor {
        b: bytes,
        shared: None,
    };
    if c.take(8).ok() != Some(&MAGIC[..]) {
        bail!("not a vela state file");
    }
    let hl = c.u32()? as usize;
    if hl > MAX_HEADER {
        bail!("header of {hl} bytes");
    }
    let (identity, n, payload) = header_fields(c.take(hl)?)?;
    let tokens = c
        .take(n.checked_mul(4).ok_or_else(|| anyhow!("token count"))?)?
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    let at = bytes.len() - c.b.len();
    Ok((
        Header {
            identity,
            tokens,
            payload,
        },
        at,
    ))
}

fn decode_kv(c: &mut Cursor) -> Result<KvExport> {
    let ty = match c.u8()? {
        0 => KvType::F32,
        1 => KvType::F16,
        2 => KvType::Bf16,
        t => bail!("unknown K/V element type {t}"),
    };
    let n_past = c.u64()?;
    let n = c.u32()? as usize;
    let mut layers = Vec::with_capacity(n.min(4096));
    for _ in 0..n {
        let first = c.u64()?;
        let k_row = c.u64()?;
        let v_row = c.u64()?;
        let k = c.bytes()?;
        let v = c.bytes()?;
        layers.push(KvLayerExport {
            first,
            k_row,
            v_row,
            k,
            v,
        });
    }
    Ok(KvExport { ty, n_past, layers })
}

fn decode_extra(c: &mut Cursor) -> Result<ExtraExport> {
    let n_past = c.u64()?;
    let n = c.u32()? as usize;
    let mut layers = Vec::with_capacity(n.min(4096));
    for _ in 0..n {
        layers.push(match c.u8()? {
            0 => ExtraLayerExport::None,
            1 => {
                let k = c.u32()? as usize;
                let mut slots = Vec::with_capacity(k.min(64));
                for _ in 0..k {
                    slots.push(c.f32s()?);
                }
                ExtraLayerExport::Recurrent { slots }
            }
            2 => {
                let rows = c.f32s()?;
                let raw_first = c.u64()?;
                let raw = c.f32s()?;
                ExtraLayerExport::Blocks {
                    rows,
                    raw_first,
                    raw,
                }
            }
            k => bail!("unknown state kind {k}"),
        });
    }
    Ok(ExtraExport { n_past, layers })
}

/// Read a file's header and tokens only (the index at start-up), checking that the file is as
/// long as they say.
pub fn read_header(path: &Path) -> Result<Header> {
    let mut f = std::fs::File::open(path)?;
    let len = f.metadata()?.len();
    let mut head = vec![0u8; 12];
    f.read_exact(&mut head).context("truncated file")?;
    if head[..8] != MAGIC[..] {
        bail!("not a vela state file");
    }
    let hl = u32::from_le_bytes(head[8..12].try_into().expect("4 bytes")) as usize;
    if hl > MAX_HEADER {
        bail!("header of {hl} bytes");
    }
    head.resize(12 + hl, 0);
    f.read_exact(&mut head[12..]).context("truncated header")?;
    let (_, n, _) = header_fields(&head[12..])?;
    if (n as u64).saturating_mul(4) > len {
        bail!("token count beyond the end of the file");
    }
    head.resize(12 + hl + 4 * n, 0);
    f.read_exact(&mut head[12 + hl..])
        .context("truncated tokens")?;
    let (h, at) = decode_header(&head)?;
    let want = (at as u64).saturating_add(h.payload).saturating_add(4);
    if len != want {
        bail!("file of {len} bytes, {want} expected (truncated?)");
    }
    Ok(h)
}

/// Read and check a whole file; its identity must be `identity`. The file is mapped, not read:
/// its K/V rows go from the page cache to the importing cache with no copy in between (a
/// multi-GiB sequence at long context). Files are written once and renamed into place, never
/// changed after; a file deleted while mapped stays readable until unmapped.
pub fn load(path: &Path, identity: &str) -> Result<(Vec<u32>, StateExport)> {
    let f = std::fs::File::open(path)?;
    // SAFETY: see above; decoding checks every length against the mapping's size, but a file
    // cut short by another program while mapped would fault on access, as a model file would.
    let map = unsafe { memmap2::Mmap::map(&f) }?;
    #[cfg(unix)]
    let _ = map.advise(memmap2::Advice::Sequential);
    let shared: SharedBytes = Arc::new(map);
    let (h, s) = decode_shared(&shared)?;
    if h.identity != identity {
        bail!("saved by another model or setting ({})", h.identity);
    }
    Ok((h.tokens, s))
}

/// Write `bytes` as `dir/name`: a temporary file, fsynced, renamed over the name, and the
/// directory fsynced. A failure (a full disk) removes the temporary file.
pub fn write_atomic(dir: &Path, name: &str, bytes: &[u8]) -> Result<PathBuf> {
    let path = dir.join(name);
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let r = (|| -> Result<()> {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(dir)?.sync_all()?;
        Ok(())
    })();
    if let Err(e) = r {
        let _ = std::fs::remove_file(&tmp);
        return Err(e.context(format!("writing {}", path.display())));
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> StateExport {
        StateExport {
            kv: KvExport {
                ty: KvType::F16,
                n_past: 3,
                layers: vec![KvLayerExport {
                    first: 1,
                    k_row: 4,
                    v_row: 2,
                    k: (0..8).collect::<Vec<u8>>().into(),
                    v: (10..14).collect::<Vec<u8>>().into(),
                }],
            },
            extra: Some(ExtraExport {
                n_past: 3,
                layers: vec![
                    ExtraLayerExport::None,
                    ExtraLayerExport::Recurrent {
                        slots: vec![vec![1.0, 2.0], vec![3.5, -0.0]],
                    },
                    ExtraLayerExport::Blocks {
                        rows: vec![0.25; 6],
                        raw_first: 1,
                        raw: vec![-1.0; 4],
                    },
                ],
            }),
        }
    }

    #[test]
    fn round_trip_and_every_truncation_or_flip_is_refused() {
        let s = sample();
        let b = encode("id", &[5, 6, 7], &s);
        let (h, back) = decode(&b).unwrap();
        assert_eq!(h.tokens, vec![5, 6, 7]);
        assert_eq!(h.identity, "id");
        assert_eq!(back, s);
        // A shared buffer gives the same state, its K/V rows left in the buffer.
        let shared: SharedBytes = Arc::new(b.clone());
        let (_, mapped) = decode_shared(&shared).unwrap();
        assert_eq!(mapped, s);
        assert!(matches!(mapped.kv.layers[0].k, KvBytes::Shared(..)));
        for n in 0..b.len() {
            assert!(decode(&b[..n]).is_err(), "truncated at {n} accepted");
        }
        for i in 0..b.len() {
            let mut c = b.clone();
            c[i] ^= 0x10;
            assert!(decode(&c).is_err(), "flipped byte {i} accepted");
        }
    }

    #[test]
    fn header_alone_and_atomic_write() {
        let dir = std::env::temp_dir().join(format!("vela-persist-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let s = sample();
        let b = encode("model x", &[1, 2, 3], &s);
        let p = write_atomic(&dir, "a.vpc", &b).unwrap();
        let h = read_header(&p).unwrap();
        assert_eq!(h.tokens, vec![1, 2, 3]);
        assert_eq!(load(&p, "model x").unwrap().1, s);
        assert!(load(&p, "model y").is_err());
        // A truncated file is refused by the header check too.
        std::fs::write(&p, &b[..b.len() - 1]).unwrap();
        assert!(read_header(&p).is_err());
        assert!(load(&p, "model x").is_err());
        // So is an empty file (a zero-length mapping).
        std::fs::write(&p, b"").unwrap();
        assert!(read_header(&p).is_err());
        assert!(load(&p, "model x").is_err());
        // No temporary files are left.
        let left: Vec<_> = std::fs::read_dir(&dir).unwrap().collect();
        assert_eq!(left.len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
