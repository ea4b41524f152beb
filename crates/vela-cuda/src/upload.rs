//! Weight-upload progress: an `indicatif` bar on a terminal, one summary line otherwise.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::Instant;

struct State {
    bar: Option<ProgressBar>,
    total: u64,
    done: u64,
    t0: Instant,
}

/// Progress of one model's upload (between [`Upload::begin`] and [`Upload::end`]).
#[derive(Default)]
pub(crate) struct Upload(Mutex<Option<State>>);

impl Upload {
    pub(crate) fn begin(&self, total: u64, label: &str) {
        let bar = std::io::stderr().is_terminal().then(|| {
            let b = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            b.set_style(
                ProgressStyle::with_template(
                    "{msg} [{bar:30}] {decimal_bytes}/{decimal_total_bytes} {decimal_bytes_per_sec}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            b.set_message(format!("uploading weights to {label}"));
            b
        });
        if let Ok(mut s) = self.0.lock() {
            *s = Some(State {
                bar,
                total,
                done: 0,
                t0: Instant::now(),
            });
        }
    }

    pub(crate) fn add(&self, n: u64) {
        if let Ok(mut s) = self.0.lock() {
            if let Some(st) = s.as_mut() {
                st.done += n;
                if let Some(b) = &st.bar {
                    b.set_position(st.done.min(st.total));
                }
            }
        }
    }

    /// Finish the bar; returns (bytes uploaded, seconds).
    pub(crate) fn end(&self) -> Option<(u64, f64)> {
        let st = self.0.lock().ok()?.take()?;
        if let Some(b) = &st.bar {
            b.finish_and_clear();
        }
        Some((st.done, st.t0.elapsed().as_secs_f64()))
    }
}
