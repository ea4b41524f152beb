//! Cross-process download lock: a `<file>.lock` created with `O_CREAT|O_EXCL` (`create_new`).
//!
//! The holder refreshes the lock's mtime while it works ([`LockGuard::touch`]); a lock whose
//! mtime is older than the staleness limit (1 h by default) is assumed to belong to a crashed
//! process and is removed. Removal of a stale lock by two waiters at once is a benign race in
//! practice: it needs two processes to notice the same hour-old lock in the same instant.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};

/// Default age after which an untouched lock is considered abandoned.
pub const STALE_AFTER: Duration = Duration::from_secs(3600);

/// An acquired lock; the lock file is removed on drop.
#[derive(Debug)]
pub struct LockGuard {
    path: PathBuf,
    file: File,
}

impl LockGuard {
    /// The lock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Refresh the lock's mtime so waiters do not consider it stale.
    pub fn touch(&self) {
        let _ = self.file.set_modified(SystemTime::now());
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Try once to take the lock. `Ok(None)` means another live process holds it.
pub fn try_acquire(path: &Path, stale_after: Duration) -> Result<Option<LockGuard>> {
    for _ in 0..2 {
        match OpenOptions::new().write(true).create_new(true).open(path) {
            Ok(mut file) => {
                // Informational only; correctness rests on create_new.
                let _ = writeln!(file, "pid={}", std::process::id());
                return Ok(Some(LockGuard {
                    path: path.to_path_buf(),
                    file,
                }));
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                let age = fs::metadata(path)
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| SystemTime::now().duration_since(t).ok());
                match age {
                    Some(age) if age > stale_after => {
                        eprintln!(
                            "vela: removing stale lock {} (untouched for {} min)",
                            path.display(),
                            age.as_secs() / 60
                        );
                        match fs::remove_file(path) {
                            Ok(()) => continue,
                            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                            Err(e) => {
                                return Err(e).with_context(|| {
                                    format!("cannot remove stale lock {}", path.display())
                                })
                            }
                        }
                    }
                    // Fresh lock, or it vanished between open and stat: report busy and let
                    // the caller poll again.
                    _ => return Ok(None),
                }
            }
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("cannot create lock file {}", path.display()))
            }
        }
    }
    Ok(None)
}

/// Take the lock, polling every `poll` while another process holds it. `on_wait` is called once,
/// the first time the lock is found busy (to tell the user why nothing happens).
pub fn acquire(
    path: &Path,
    stale_after: Duration,
    poll: Duration,
    mut on_wait: impl FnMut(),
) -> Result<LockGuard> {
    let mut told = false;
    loop {
        if let Some(g) = try_acquire(path, stale_after)? {
            return Ok(g);
        }
        if !told {
            on_wait();
            told = true;
        }
        std::thread::sleep(poll);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exclusive_then_released() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.gguf.lock");
        let g = try_acquire(&p, STALE_AFTER)
            .unwrap()
            .expect("first acquire");
        assert!(p.exists());
        assert!(
            try_acquire(&p, STALE_AFTER).unwrap().is_none(),
            "second acquire must fail"
        );
        g.touch();
        drop(g);
        assert!(!p.exists(), "lock removed on drop");
        let g2 = try_acquire(&p, STALE_AFTER).unwrap();
        assert!(g2.is_some());
    }

    #[test]
    fn stale_lock_is_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.gguf.lock");
        let f = File::create(&p).unwrap();
        f.set_modified(SystemTime::now() - Duration::from_secs(7200))
            .unwrap();
        drop(f);
        // Not stale under a 3-hour limit, stale under the 1-hour default.
        assert!(try_acquire(&p, Duration::from_secs(3 * 3600))
            .unwrap()
            .is_none());
        let g = try_acquire(&p, STALE_AFTER)
            .unwrap()
            .expect("stale lock taken over");
        let content = fs::read_to_string(g.path()).unwrap();
        assert_eq!(content.trim(), format!("pid={}", std::process::id()));
    }

    #[test]
    fn waiter_gets_lock_after_holder_releases() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("m.gguf.lock");
        let g = try_acquire(&p, STALE_AFTER).unwrap().unwrap();
        let p2 = p.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            let g = acquire(&p2, STALE_AFTER, Duration::from_millis(10), || {
                tx.send(()).unwrap()
            });
            g.unwrap().path().to_path_buf()
        });
        // The waiter must report that it is waiting while we still hold the lock.
        rx.recv_timeout(Duration::from_secs(30))
            .expect("waiter told the user it waits");
        assert!(p.exists());
        drop(g);
        assert_eq!(t.join().unwrap(), p);
        assert!(!p.exists(), "waiter's guard released too");
    }
}
