//! A minimal zip reader: just enough to pull one member out of a Python wheel.
//!
//! Why not the `zip` crate: we need one code path (find a member by name in the central
//! directory, then stream it through stored/deflate decoding with a CRC-32 check) and nothing
//! else. Doing it by hand is ~250 lines and costs no compile time beyond `flate2`'s pure-Rust
//! `miniz_oxide` backend, which we need anyway; the `zip` crate even with only `deflate` pulls in
//! more (and its MSRV moves quickly).
//!
//! Layout used (APPNOTE.TXT): the *end of central directory* record (EOCD, signature
//! `PK\x05\x06`) sits in the last 22..22+65535 bytes of the archive and points at the central
//! directory: one 46-byte header + name/extra/comment per member, giving method, CRC-32, sizes
//! and the offset of the member's *local header* (30 bytes + name + extra), after which the
//! member's (compressed) bytes follow. ZIP64 (sizes or offsets >= 4 GiB) is supported through
//! the ZIP64 EOCD record and the `0x0001` extra field. Encrypted members are rejected.

use std::io::{self, Read, Seek, SeekFrom, Write};

use anyhow::{bail, Context, Result};

const EOCD_SIG: u32 = 0x0605_4b50;
const EOCD64_LOCATOR_SIG: u32 = 0x0706_4b50;
const EOCD64_SIG: u32 = 0x0606_4b50;
const CENTRAL_SIG: u32 = 0x0201_4b50;
const LOCAL_SIG: u32 = 0x0403_4b50;
const EOCD_LEN: usize = 22;
const CENTRAL_LEN: usize = 46;
const LOCAL_LEN: usize = 30;

/// Compression method "stored" (no compression).
pub const METHOD_STORED: u16 = 0;
/// Compression method "deflate" (raw DEFLATE stream).
pub const METHOD_DEFLATE: u16 = 8;

/// One member as described by the central directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZipEntry {
    /// Member path (`/`-separated).
    pub name: String,
    /// General-purpose flags (bit 0 = encrypted).
    pub flags: u16,
    /// Compression method ([`METHOD_STORED`] or [`METHOD_DEFLATE`] are supported).
    pub method: u16,
    /// CRC-32 of the uncompressed data.
    pub crc32: u32,
    /// Size of the member's data as stored in the archive.
    pub compressed_size: u64,
    /// Size after decompression.
    pub size: u64,
    /// Offset of the member's local header from the start of the archive.
    pub local_header_offset: u64,
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

fn read_exact_at<R: Read + Seek>(r: &mut R, offset: u64, len: usize) -> Result<Vec<u8>> {
    r.seek(SeekFrom::Start(offset))?;
    let mut buf = vec![0u8; len];
    r.read_exact(&mut buf)
        .with_context(|| format!("zip truncated reading {len} bytes at {offset}"))?;
    Ok(buf)
}

/// Where the central directory lives: (number of entries, offset, size).
fn find_central_directory<R: Read + Seek>(r: &mut R) -> Result<(u64, u64, u64)> {
    let file_len = r.seek(SeekFrom::End(0))?;
    if file_len < EOCD_LEN as u64 {
        bail!("not a zip archive: only {file_len} bytes");
    }
    let tail_len = (file_len).min((EOCD_LEN + 0xFFFF) as u64) as usize;
    let tail_start = file_len - tail_len as u64;
    let tail = read_exact_at(r, tail_start, tail_len)?;
    // Scan backwards for an EOCD whose comment length reaches exactly the end of the file.
    let eocd_rel = (0..=tail_len - EOCD_LEN)
        .rev()
        .find(|&i| {
            u32_at(&tail, i) == EOCD_SIG
                && i + EOCD_LEN + u16_at(&tail, i + 20) as usize == tail_len
        })
        .context("not a zip archive: end of central directory record not found")?;
    let e = &tail[eocd_rel..];
    let (disk, cd_disk) = (u16_at(e, 4), u16_at(e, 6));
    let mut entries = u16_at(e, 10) as u64;
    let mut cd_size = u32_at(e, 12) as u64;
    let mut cd_offset = u32_at(e, 16) as u64;
    let eocd_pos = tail_start + eocd_rel as u64;
    let maybe_zip64 = entries == 0xFFFF || cd_size == 0xFFFF_FFFF || cd_offset == 0xFFFF_FFFF;
    if eocd_pos >= 20 {
        let loc = read_exact_at(r, eocd_pos - 20, 20)?;
        if u32_at(&loc, 0) == EOCD64_LOCATOR_SIG {
            let eocd64_pos = u64_at(&loc, 8);
            let e64 = read_exact_at(r, eocd64_pos, 56).context("bad ZIP64 end record offset")?;
            if u32_at(&e64, 0) != EOCD64_SIG {
                bail!("corrupt zip: ZIP64 end of central directory signature missing");
            }
            entries = u64_at(&e64, 32);
            cd_size = u64_at(&e64, 40);
            cd_offset = u64_at(&e64, 48);
        } else if maybe_zip64 {
            bail!("corrupt zip: ZIP64 markers without a ZIP64 end of central directory locator");
        }
    }
    if disk != 0 || cd_disk != 0 {
        bail!("multi-disk zip archives are not supported");
    }
    if cd_offset
        .checked_add(cd_size)
        .is_none_or(|end| end > eocd_pos)
    {
        bail!(
            "corrupt zip: central directory ({cd_size} bytes at {cd_offset}) past its end record"
        );
    }
    if entries > cd_size / CENTRAL_LEN as u64 {
        bail!("corrupt zip: {entries} entries cannot fit in a {cd_size}-byte central directory");
    }
    Ok((entries, cd_offset, cd_size))
}

/// Read all central-directory entries of a zip archive.
pub fn read_central_directory<R: Read + Seek>(r: &mut R) -> Result<Vec<ZipEntry>> {
    let (entries, cd_offset, cd_size) = find_central_directory(r)?;
    let cd = read_exact_at(r, cd_offset, cd_size as usize)?;
    let mut out = Vec::with_capacity(entries as usize);
    let mut at = 0usize;
    for i in 0..entries {
        if at + CENTRAL_LEN > cd.len() || u32_at(&cd, at) != CENTRAL_SIG {
            bail!("corrupt zip: bad central directory header #{i}");
        }
        let h = &cd[at..];
        let (name_len, extra_len, comment_len) = (
            u16_at(h, 28) as usize,
            u16_at(h, 30) as usize,
            u16_at(h, 32) as usize,
        );
        let var_end = CENTRAL_LEN + name_len + extra_len + comment_len;
        if at + var_end > cd.len() {
            bail!("corrupt zip: central directory header #{i} overruns the directory");
        }
        let name = String::from_utf8_lossy(&h[CENTRAL_LEN..CENTRAL_LEN + name_len]).into_owned();
        let mut e = ZipEntry {
            name,
            flags: u16_at(h, 8),
            method: u16_at(h, 10),
            crc32: u32_at(h, 16),
            compressed_size: u32_at(h, 20) as u64,
            size: u32_at(h, 24) as u64,
            local_header_offset: u32_at(h, 42) as u64,
        };
        apply_zip64_extra(
            &mut e,
            &h[CENTRAL_LEN + name_len..CENTRAL_LEN + name_len + extra_len],
        )?;
        out.push(e);
        at += var_end;
    }
    Ok(out)
}

/// Replace 0xFFFFFFFF placeholders with the 64-bit values of the ZIP64 extra field (id 1),
/// which lists, in this order, only the fields that overflowed.
fn apply_zip64_extra(e: &mut ZipEntry, mut extra: &[u8]) -> Result<()> {
    const MAX: u64 = 0xFFFF_FFFF;
    let needs = [
        e.size == MAX,
        e.compressed_size == MAX,
        e.local_header_offset == MAX,
    ];
    if !needs.iter().any(|&n| n) {
        return Ok(());
    }
    while extra.len() >= 4 {
        let (id, len) = (u16_at(extra, 0), u16_at(extra, 2) as usize);
        let body = extra
            .get(4..4 + len)
            .context("corrupt zip: extra field overruns")?;
        if id == 1 {
            let mut vals = body.chunks_exact(8).map(|c| u64_at(c, 0));
            let mut take = |need: bool, slot: &mut u64| -> Result<()> {
                if need {
                    *slot = vals
                        .next()
                        .context("corrupt zip: short ZIP64 extra field")?;
                }
                Ok(())
            };
            take(needs[0], &mut e.size)?;
            take(needs[1], &mut e.compressed_size)?;
            take(needs[2], &mut e.local_header_offset)?;
            return Ok(());
        }
        extra = &extra[4 + len..];
    }
    bail!(
        "corrupt zip: member {:?} needs a ZIP64 extra field but has none",
        e.name
    )
}

/// Stream the uncompressed bytes of `entry` into `out`, checking size and CRC-32.
/// Returns the number of bytes written.
pub fn extract_entry<R: Read + Seek, W: Write>(
    r: &mut R,
    entry: &ZipEntry,
    out: &mut W,
) -> Result<u64> {
    if entry.flags & 1 != 0 {
        bail!("zip member {:?} is encrypted", entry.name);
    }
    let lh = read_exact_at(r, entry.local_header_offset, LOCAL_LEN)?;
    if u32_at(&lh, 0) != LOCAL_SIG {
        bail!("corrupt zip: bad local header for {:?}", entry.name);
    }
    let data_start = entry.local_header_offset
        + LOCAL_LEN as u64
        + u16_at(&lh, 26) as u64
        + u16_at(&lh, 28) as u64;
    r.seek(SeekFrom::Start(data_start))?;
    let raw = r.take(entry.compressed_size);
    let mut sink = CrcWriter {
        inner: out,
        crc: crc32fast::Hasher::new(),
        n: 0,
    };
    let copied = match entry.method {
        METHOD_STORED => copy(raw, &mut sink),
        METHOD_DEFLATE => copy(flate2::read::DeflateDecoder::new(raw), &mut sink),
        m => bail!(
            "zip member {:?} uses unsupported compression method {m}",
            entry.name
        ),
    };
    copied.map_err(|e| match e {
        CopyError::Read(e) => anyhow::Error::new(e).context(format!(
            "zip member {:?}: corrupt or truncated data",
            entry.name
        )),
        CopyError::Write(e) => anyhow::Error::new(e).context("writing extracted data"),
    })?;
    let (n, crc) = (sink.n, sink.crc.finalize());
    if n != entry.size {
        bail!(
            "zip member {:?}: extracted {n} bytes, directory says {}",
            entry.name,
            entry.size
        );
    }
    if crc != entry.crc32 {
        bail!(
            "zip member {:?}: CRC-32 mismatch ({crc:08x} != {:08x})",
            entry.name,
            entry.crc32
        );
    }
    Ok(n)
}

/// Find `member` by exact path and stream it into `out` (see [`extract_entry`]).
pub fn extract_member<R: Read + Seek, W: Write>(
    r: &mut R,
    member: &str,
    out: &mut W,
) -> Result<u64> {
    let entries = read_central_directory(r)?;
    let Some(entry) = entries.iter().find(|e| e.name == member) else {
        let mut names: Vec<&str> = entries.iter().map(|e| e.name.as_str()).take(8).collect();
        if entries.len() > 8 {
            names.push("...");
        }
        bail!(
            "member {member:?} not found in archive (has: {})",
            names.join(", ")
        );
    };
    extract_entry(r, entry, out)
}

enum CopyError {
    Read(io::Error),
    Write(io::Error),
}

/// `io::copy`, but telling read errors (corrupt input) from write errors (e.g. disk full).
fn copy<R: Read, W: Write>(mut r: R, w: &mut W) -> std::result::Result<u64, CopyError> {
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) => return Ok(total),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CopyError::Read(e)),
        };
        w.write_all(&buf[..n]).map_err(CopyError::Write)?;
        total += n as u64;
    }
}

struct CrcWriter<'a, W: Write> {
    inner: &'a mut W,
    crc: crc32fast::Hasher,
    n: u64,
}

impl<W: Write> Write for CrcWriter<'_, W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.crc.update(&buf[..n]);
        self.n += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::io::Cursor;

    /// A tiny zip writer for tests: `(name, data, deflate?)`; `zip64` forces ZIP64 records.
    pub(crate) fn build_zip(members: &[(&str, &[u8], bool)], zip64: bool) -> Vec<u8> {
        let mut out = Vec::new();
        let mut central = Vec::new();
        for (name, data, deflate) in members {
            let crc = crc32fast::hash(data);
            let payload = if *deflate {
                let mut enc =
                    flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::default());
                enc.write_all(data).unwrap();
                enc.finish().unwrap()
            } else {
                data.to_vec()
            };
            let method: u16 = if *deflate { 8 } else { 0 };
            let offset = out.len() as u32;
            out.extend_from_slice(&LOCAL_SIG.to_le_bytes());
            out.extend_from_slice(&[20, 0, 0, 0]);
            out.extend_from_slice(&method.to_le_bytes());
            out.extend_from_slice(&[0; 4]);
            out.extend_from_slice(&crc.to_le_bytes());
            out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
            out.extend_from_slice(&(data.len() as u32).to_le_bytes());
            out.extend_from_slice(&(name.len() as u16).to_le_bytes());
            out.extend_from_slice(&[3, 0]); // 3 bytes of junk local extra, must be skipped
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(&[0xAA, 0xBB, 0xCC]);
            out.extend_from_slice(&payload);

            let mut extra = Vec::new();
            let (csz, usz, off) = if zip64 {
                extra.extend_from_slice(&1u16.to_le_bytes());
                extra.extend_from_slice(&24u16.to_le_bytes());
                extra.extend_from_slice(&(data.len() as u64).to_le_bytes());
                extra.extend_from_slice(&(payload.len() as u64).to_le_bytes());
                extra.extend_from_slice(&(offset as u64).to_le_bytes());
                (u32::MAX, u32::MAX, u32::MAX)
            } else {
                (payload.len() as u32, data.len() as u32, offset)
            };
            central.extend_from_slice(&CENTRAL_SIG.to_le_bytes());
            central.extend_from_slice(&[20, 3, 20, 0, 0, 0]);
            central.extend_from_slice(&method.to_le_bytes());
            central.extend_from_slice(&[0; 4]);
            central.extend_from_slice(&crc.to_le_bytes());
            central.extend_from_slice(&csz.to_le_bytes());
            central.extend_from_slice(&usz.to_le_bytes());
            central.extend_from_slice(&(name.len() as u16).to_le_bytes());
            central.extend_from_slice(&(extra.len() as u16).to_le_bytes());
            central.extend_from_slice(&[0; 10]); // comment len, disk, int + ext attrs
            central.extend_from_slice(&off.to_le_bytes());
            central.extend_from_slice(name.as_bytes());
            central.extend_from_slice(&extra);
        }
        let cd_offset = out.len() as u64;
        out.extend_from_slice(&central);
        let n = members.len() as u64;
        if zip64 {
            let eocd64_pos = out.len() as u64;
            out.extend_from_slice(&EOCD64_SIG.to_le_bytes());
            out.extend_from_slice(&44u64.to_le_bytes());
            out.extend_from_slice(&[45, 0, 45, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
            out.extend_from_slice(&n.to_le_bytes());
            out.extend_from_slice(&n.to_le_bytes());
            out.extend_from_slice(&(central.len() as u64).to_le_bytes());
            out.extend_from_slice(&cd_offset.to_le_bytes());
            out.extend_from_slice(&EOCD64_LOCATOR_SIG.to_le_bytes());
            out.extend_from_slice(&0u32.to_le_bytes());
            out.extend_from_slice(&eocd64_pos.to_le_bytes());
            out.extend_from_slice(&1u32.to_le_bytes());
        }
        out.extend_from_slice(&EOCD_SIG.to_le_bytes());
        out.extend_from_slice(&[0; 4]);
        let n16 = if zip64 { 0xFFFF } else { n as u16 };
        out.extend_from_slice(&n16.to_le_bytes());
        out.extend_from_slice(&n16.to_le_bytes());
        let (cs, co) = if zip64 {
            (u32::MAX, u32::MAX)
        } else {
            (central.len() as u32, cd_offset as u32)
        };
        out.extend_from_slice(&cs.to_le_bytes());
        out.extend_from_slice(&co.to_le_bytes());
        out.extend_from_slice(&4u16.to_le_bytes());
        out.extend_from_slice(b"PK\x05\x06"); // comment that looks like a signature
        out
    }

    fn sample_data() -> Vec<u8> {
        (0..200_000u32)
            .map(|i| (i % 251) as u8 ^ (i / 1000) as u8)
            .collect()
    }

    #[test]
    fn extract_stored_and_deflated_members() {
        let big = sample_data();
        for zip64 in [false, true] {
            let z = build_zip(
                &[
                    ("pkg/__init__.py", b"", false),
                    ("pkg/data/model.bin", &big, true),
                    ("pkg/data/raw.bin", b"hello stored world", false),
                ],
                zip64,
            );
            let mut cur = Cursor::new(&z);
            let entries = read_central_directory(&mut cur).unwrap();
            assert_eq!(entries.len(), 3);
            assert_eq!(entries[1].method, METHOD_DEFLATE);
            assert!(
                entries[1].compressed_size < entries[1].size,
                "deflate actually compressed"
            );
            let mut out = Vec::new();
            assert_eq!(
                extract_member(&mut cur, "pkg/data/model.bin", &mut out).unwrap(),
                200_000
            );
            assert_eq!(out, big);
            let mut out = Vec::new();
            extract_member(&mut cur, "pkg/data/raw.bin", &mut out).unwrap();
            assert_eq!(out, b"hello stored world");
            let mut out = Vec::new();
            assert_eq!(
                extract_member(&mut cur, "pkg/__init__.py", &mut out).unwrap(),
                0
            );
            let err = extract_member(&mut cur, "pkg/missing", &mut out).unwrap_err();
            assert!(format!("{err}").contains("not found"), "{err}");
        }
    }

    #[test]
    fn corrupt_archives_are_clear_errors() {
        let big = sample_data();
        let z = build_zip(&[("a.bin", &big, true), ("b.txt", b"abc", false)], false);
        // Flip a byte inside the deflated payload of a.bin: decoding or CRC must fail.
        let mut bad = z.clone();
        bad[30 + 5 + 3 + 100] ^= 0x55;
        let err = extract_member(&mut Cursor::new(&bad), "a.bin", &mut Vec::new()).unwrap_err();
        let msg = format!("{err:#}");
        assert!(msg.contains("a.bin"), "{msg}");
        // Corrupt a stored member: only the CRC can catch it.
        let mut bad = z.clone();
        let pos = z.windows(3).position(|w| w == b"abc").unwrap();
        bad[pos] = b'x';
        let err = extract_member(&mut Cursor::new(&bad), "b.txt", &mut Vec::new()).unwrap_err();
        assert!(format!("{err}").contains("CRC-32 mismatch"), "{err}");
        // Truncated archive / not a zip.
        for junk in [&z[..z.len() / 2], b"PK\x03\x04 nothing" as &[u8], b""] {
            assert!(read_central_directory(&mut Cursor::new(junk)).is_err());
        }
        // Unsupported method.
        let mut bad = z.clone();
        let cd = z.len() - 26 - (46 + 5) - (46 + 5);
        assert_eq!(u32_at(&bad, cd), CENTRAL_SIG);
        bad[cd + 10] = 12; // bzip2
        let err = extract_member(&mut Cursor::new(&bad), "a.bin", &mut Vec::new()).unwrap_err();
        assert!(
            format!("{err}").contains("unsupported compression method 12"),
            "{err}"
        );
    }
}
