//! The persistent prefix cache (`--cache-dir DIR`, `--cache-disk-mb`): a session evicted from the
//! memory cache, and every cached session at shutdown, is saved to DIR as one file of its tokens
//! and whole state (`vela_engine::persist`: every declared state kind, written temp + fsync +
//! rename, with the model's identity and a checksum); a request whose prompt shares more with a
//! saved sequence than with any session in memory loads it, also after a restart.
//!
//! Files are written by a thread of their own, so the engine only copies the state out. The
//! index (tokens and sizes of the files of this model) is read at start; a file of another
//! model or setting is left alone, a truncated or corrupt one is skipped with a log line (and
//! deleted when it fails to load), never loaded. A write that fails (a full disk) is logged and
//! counted; serving goes on. The least recently used files go when the directory's files of this
//! model exceed the budget.

use crate::cache::{plan, Reuse};
use crate::metrics::Metrics;
use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{mpsc, Arc, Mutex};
use vela_engine::persist::{self, StateExport};
use vela_engine::Session;

/// A saved sequence.
struct File {
    path: PathBuf,
    tokens: Vec<u32>,
    bytes: u64,
    used: u64,
}

#[derive(Default)]
struct Index {
    files: Vec<File>,
    clock: u64,
}

impl Index {
    fn touch(&mut self, i: usize) {
        self.clock += 1;
        self.files[i].used = self.clock;
    }

    /// Delete the least recently used files until the rest fit `budget`.
    fn evict(&mut self, budget: u64) {
        self.files.sort_by_key(|f| f.used);
        let mut total: u64 = self.files.iter().map(|f| f.bytes).sum();
        while total > budget && !self.files.is_empty() {
            let f = self.files.remove(0);
            total -= f.bytes;
            if let Err(e) = std::fs::remove_file(&f.path) {
                tracing::warn!("prefix cache: cannot delete {}: {e}", f.path.display());
            }
        }
    }

    fn publish(&self, m: &Metrics) {
        m.disk_files.store(self.files.len() as u64, Relaxed);
        m.disk_bytes
            .store(self.files.iter().map(|f| f.bytes).sum(), Relaxed);
    }
}

/// A state to write: its tokens and contents.
type Job = (Vec<u32>, StateExport);

pub struct DiskCache {
    dir: PathBuf,
    identity: Arc<str>,
    index: Arc<Mutex<Index>>,
    tx: Option<mpsc::Sender<Job>>,
    writer: Option<std::thread::JoinHandle<()>>,
    metrics: Arc<Metrics>,
}

impl DiskCache {
    /// Open (create) `dir` for the model of `identity`: index its files, start the writer.
    pub fn open(dir: &Path, identity: &str, budget: u64, metrics: Arc<Metrics>) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the cache directory {}", dir.display()))?;
        let mut index = Index::default();
        let mut found: Vec<(std::time::SystemTime, File)> = Vec::new();
        for e in std::fs::read_dir(dir)?.flatten() {
            let path = e.path();
            let name = e.file_name().to_string_lossy().into_owned();
            // A write cut short by a crash leaves its temporary file.
            if name.starts_with('.') && name.ends_with(".tmp") {
                let _ = std::fs::remove_file(&path);
                continue;
            }
            if path.extension().is_none_or(|x| x != persist::EXT) {
                continue;
            }
            match persist::read_header(&path) {
                Ok(h) if h.identity == identity => {
                    let meta = e.metadata()?;
                    let mtime = meta.modified().unwrap_or(std::time::UNIX_EPOCH);
                    found.push((
                        mtime,
                        File {
                            path,
                            tokens: h.tokens,
                            bytes: meta.len(),
                            used: 0,
                        },
                    ));
                }
                Ok(_) => {}
                Err(e) => {
                    metrics.disk_errors.fetch_add(1, Relaxed);
                    tracing::warn!("prefix cache: skipping {}: {e:#}", path.display());
                }
            }
        }
        found.sort_by_key(|(t, _)| *t);
        for (_, f) in found {
            index.files.push(f);
            let i = index.files.len() - 1;
            index.touch(i);
        }
        index.evict(budget);
        index.publish(&metrics);
        tracing::info!(
            "prefix cache: {} saved sequence(s) of this model in {}",
            index.files.len(),
            dir.display()
        );
        let index = Arc::new(Mutex::new(index));
        let (tx, rx) = mpsc::channel::<Job>();
        let writer = {
            let (dir, identity, index, metrics) = (
                dir.to_path_buf(),
                Arc::<str>::from(identity),
                index.clone(),
                metrics.clone(),
            );
            std::thread::Builder::new()
                .name("vela-cache-writer".into())
                .spawn(move || {
                    for (tokens, state) in rx {
                        write(&dir, &identity, &index, &metrics, budget, tokens, &state);
                    }
                })?
        };
        Ok(DiskCache {
            dir: dir.to_path_buf(),
            identity: identity.into(),
            index,
            tx: Some(tx),
            writer: Some(writer),
            metrics,
        })
    }

    fn index(&self) -> std::sync::MutexGuard<'_, Index> {
        self.index.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Save `s` (in the background) unless a file of the same tokens exists.
    pub fn spill(&self, s: &Session) {
        let tokens = s.tokens();
        if tokens.is_empty() || self.index().files.iter().any(|f| f.tokens == tokens) {
            return;
        }
        match s.export() {
            Ok(state) => {
                if let Some(tx) = &self.tx {
                    let _ = tx.send((tokens.to_vec(), state));
                }
            }
            Err(e) => tracing::debug!("prefix cache: a session cannot be saved: {e:#}"),
        }
    }

    /// The saved sequence that lets `prompt` reuse the most tokens, if it reuses more than
    /// `than`: its file.
    pub fn best(&self, rollback_limit: usize, prompt: &[u32], than: usize) -> Option<PathBuf> {
        let ix = self.index();
        ix.files
            .iter()
            .map(|f| (f, plan(&f.tokens, &[], rollback_limit, prompt)))
            .filter(|(_, r)| matches!(r, Reuse::Truncate(n) if *n > than))
            .max_by_key(|(f, r)| (r.reused(), f.used))
            .map(|(f, _)| f.path.clone())
    }

    /// Load a file of [`Self::best`] into `s`. A file that fails to load is logged and
    /// forgotten, and deleted when it is unreadable (gone, truncated, corrupt) rather than only
    /// unfit for this session (a smaller context); `s` is then empty.
    pub fn load_into(&self, path: &Path, s: &mut Session) -> Result<usize> {
        let mut unreadable = false;
        let r = persist::load(path, &self.identity)
            .inspect_err(|_| unreadable = true)
            .and_then(|(t, st)| s.import(&t, &st));
        let mut ix = self.index();
        let at = ix.files.iter().position(|f| f.path == path);
        match r {
            Ok(()) => {
                if let Some(j) = at {
                    ix.touch(j);
                }
                self.metrics.disk_hits.fetch_add(1, Relaxed);
                Ok(s.n_past())
            }
            Err(e) => {
                s.reset();
                self.metrics.disk_errors.fetch_add(1, Relaxed);
                tracing::warn!("prefix cache: not loading {}: {e:#}", path.display());
                if let Some(j) = at {
                    ix.files.remove(j);
                    if unreadable {
                        let _ = std::fs::remove_file(path);
                    }
                }
                ix.publish(&self.metrics);
                Err(e)
            }
        }
    }

    /// Wait for every pending write.
    pub fn close(&mut self) {
        drop(self.tx.take());
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for DiskCache {
    fn drop(&mut self) {
        self.close();
    }
}

/// The writer thread's part: the file, then the index and the budget.
fn write(
    dir: &Path,
    identity: &str,
    index: &Mutex<Index>,
    metrics: &Metrics,
    budget: u64,
    tokens: Vec<u32>,
    state: &StateExport,
) {
    let bytes = persist::encode(identity, &tokens, state);
    let size = bytes.len() as u64;
    if size > budget {
        tracing::warn!(
            "prefix cache: a sequence of {} tokens ({:.1} MiB) is larger than --cache-disk-mb",
            tokens.len(),
            size as f64 / (1 << 20) as f64
        );
        return;
    }
    match persist::write_atomic(dir, &persist::file_name(identity, &tokens), &bytes) {
        Ok(path) => {
            let mut ix = index.lock().unwrap_or_else(|e| e.into_inner());
            ix.files.retain(|f| f.path != path);
            ix.files.push(File {
                path,
                tokens,
                bytes: size,
                used: 0,
            });
            let i = ix.files.len() - 1;
            ix.touch(i);
            ix.evict(budget);
            ix.publish(metrics);
            metrics.disk_writes.fetch_add(1, Relaxed);
        }
        Err(e) => {
            metrics.disk_errors.fetch_add(1, Relaxed);
            tracing::error!("prefix cache: {e:#}");
        }
    }
}
