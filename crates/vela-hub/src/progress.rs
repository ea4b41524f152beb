//! Download progress on stderr: an `indicatif` bar (bytes, rate, ETA) when stderr is a
//! terminal, one line per part otherwise, nothing when quiet.

use std::io::IsTerminal;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// How progress is shown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgressMode {
    /// Bar if stderr is a terminal, otherwise one line per part.
    Auto,
    /// Never print anything.
    Quiet,
}

/// Progress of one model download (possibly several parts).
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
    lines: bool,
    label: String,
    started: Instant,
    part_started: Instant,
}

/// `12.3 MB`-style size.
pub(crate) fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "kB", "MB", "GB", "TB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1000.0 && u + 1 < UNITS.len() {
        v /= 1000.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

impl Progress {
    /// Start reporting a download of `total` bytes (0 if unknown) for `label`.
    pub(crate) fn new(mode: ProgressMode, label: &str, total: u64) -> Progress {
        let tty = std::io::stderr().is_terminal();
        let bar = (mode == ProgressMode::Auto && tty).then(|| {
            let bar = ProgressBar::with_draw_target((total > 0).then_some(total), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{msg} [{bar:30}] {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec} ETA {eta}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            bar.set_style(style);
            bar.set_message(label.to_string());
            bar
        });
        Progress {
            bar,
            lines: mode == ProgressMode::Auto && !tty,
            label: label.to_string(),
            started: Instant::now(),
            part_started: Instant::now(),
        }
    }

    /// A new part (wheel or file) starts downloading.
    pub(crate) fn part(&mut self, index: usize, count: usize, what: &str, size: u64) {
        self.part_started = Instant::now();
        let part = if count > 1 {
            format!(" part {}/{count}", index + 1)
        } else {
            String::new()
        };
        if let Some(bar) = &self.bar {
            bar.set_message(format!("{}{part}", self.label));
        } else if self.lines {
            eprintln!(
                "vela: downloading {}{part}: {what} ({})",
                self.label,
                human_bytes(size)
            );
        }
    }

    /// The current part finished.
    pub(crate) fn part_done(&self, bytes: u64) {
        if self.lines {
            let secs = self.part_started.elapsed().as_secs_f64().max(1e-3);
            eprintln!(
                "vela:   {} in {secs:.1}s ({}/s)",
                human_bytes(bytes),
                human_bytes((bytes as f64 / secs) as u64)
            );
        }
    }

    /// `n` more bytes arrived.
    pub(crate) fn inc(&self, n: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(n);
        }
    }

    /// A retry restarts the current part: take back its bytes.
    pub(crate) fn rewind(&self, n: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(bar.position().saturating_sub(n));
        }
    }

    /// Print a one-off note without garbling the bar.
    pub(crate) fn note(&self, msg: &str) {
        match &self.bar {
            Some(bar) => bar.suspend(|| eprintln!("vela: {msg}")),
            None if self.lines => eprintln!("vela: {msg}"),
            None => {}
        }
    }

    /// All done.
    pub(crate) fn finish(&self, path: &std::path::Path) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        if self.bar.is_some() || self.lines {
            eprintln!(
                "vela: {} ready in {:.1}s: {}",
                self.label,
                self.started.elapsed().as_secs_f64(),
                path.display()
            );
        }
    }

    /// Give up (error path): remove the bar.
    pub(crate) fn abandon(&self) {
        if let Some(bar) = &self.bar {
            bar.abandon();
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn human_bytes() {
        assert_eq!(super::human_bytes(999), "999 B");
        assert_eq!(super::human_bytes(98_362_432), "98.4 MB");
        assert_eq!(super::human_bytes(1_500_000_000), "1.5 GB");
    }
}
