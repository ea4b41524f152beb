//! The decode stepper every model's forward pass runs under: a single-token step is announced to
//! the backend so it can run as one recorded launch sequence (a CUDA graph), the next position's
//! step is recorded ahead while the device runs this one, and greedy decoding can pipeline (the
//! step and its argmax launched before the previous token is read back). A model supplies only
//! its layers (`layers`: the tokens through to the logits, left on the device) and says whether
//! a single-token step makes no host round trip ([`StepState::graph_safe`]); this module holds the
//! protocol with the backend's `decode_step_*` calls once, for every architecture.

use anyhow::{bail, Result};
use vela_compute::Backend;

/// Source of step keys (0 is never used).
static NEXT_STEP_KEY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// A sequence state's part of the protocol.
#[derive(Clone, Copy, Debug)]
pub struct StepCtl {
    /// Unique per state: the key of its recorded steps (`Backend::decode_step_prepare`).
    pub key: u64,
    /// Record the next position's step while the device runs this one (single-token steps).
    pub prepare_ahead: bool,
}

impl StepCtl {
    pub fn new() -> Self {
        StepCtl {
            key: NEXT_STEP_KEY.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            prepare_ahead: true,
        }
    }
}

impl Default for StepCtl {
    fn default() -> Self {
        StepCtl::new()
    }
}

/// Room for `rows` logits rows of `n_vocab` in `buf`, which holds `*cap` rows: a state's logits
/// buffer is made for one row and grown to what a pass keeps (a prompt chunk keeps its last row,
/// a step its token's; speculative checks a few), not for its batch of rows up front (Gemma 4's
/// vocabulary at 256 rows: 268 MB per sequence). A larger buffer replaces the old one, so steps
/// recorded ahead, which point at it, are dropped first.
pub(crate) fn logits_room<B: Backend>(
    be: &B,
    buf: &mut B::Buf,
    cap: &mut usize,
    rows: usize,
    n_vocab: usize,
) {
    if rows > *cap {
        be.decode_step_discard();
        *buf = be.alloc(rows * n_vocab);
        *cap = rows;
    }
}

/// What the stepper needs of a model's sequence state.
pub trait StepState<B: Backend> {
    fn ctl(&self) -> StepCtl;
    fn n_ctx(&self) -> usize;
    fn max_batch(&self) -> usize;
    /// The logits rows the last `layers` call left on the device.
    fn logits(&self) -> &B::Buf;
}

/// A model's layers: run `tokens` at `positions` on `st`, leaving the logits of rows
/// `logits_from..` in [`StepState::logits`]; returns their number.
pub type Layers<'a, S> = &'a dyn Fn(&mut S, &[u32], &[u32], usize) -> Result<usize>;

/// Validate a forward batch: 1..=`max_batch` tokens with one position each, all positions inside
/// the context, `logits_from` within the batch.
pub fn check_batch(
    n: usize,
    positions: &[u32],
    max_batch: usize,
    n_ctx: usize,
    logits_from: usize,
) -> Result<()> {
    if n == 0 || n != positions.len() || n > max_batch || logits_from > n {
        bail!(
            "invalid batch: {n} tokens, {} positions, max batch {max_batch}",
            positions.len()
        );
    }
    if positions.iter().any(|&p| p as usize >= n_ctx) {
        bail!("position beyond the context size {n_ctx}");
    }
    Ok(())
}

/// The forward pass up to the logits (left in [`StepState::logits`]); returns their number of
/// rows. With `graph_safe`, a single-token step is announced to the backend
/// ([`Backend::decode_step_begin`]) so it can run as one recorded graph, and the next position's
/// step is recorded ahead.
#[allow(clippy::too_many_arguments)]
pub fn run<B: Backend, S: StepState<B>>(
    be: &B,
    st: &mut S,
    tokens: &[u32],
    positions: &[u32],
    logits_from: usize,
    n_vocab: usize,
    graph_safe: bool,
    layers: Layers<'_, S>,
) -> Result<usize> {
    let n = tokens.len();
    check_batch(n, positions, st.max_batch(), st.n_ctx(), logits_from)?;
    let ctl = st.ctl();
    let one = graph_safe && n == 1 && logits_from == 0;
    if !one {
        // A batch may reallocate buffers a step recorded ahead points at, and leaves no
        // device token to chain on.
        be.decode_step_discard();
    }
    // A step recorded ahead (below) by the previous forward: launched, nothing to issue. (An
    // out-of-range token takes the normal path, whose embedding lookup rejects it.)
    let in_range = tokens.first().is_some_and(|&t| (t as usize) < n_vocab);
    if !(one && in_range && be.decode_step_launch(tokens[0], positions[0], ctl.key)) {
        let step = one && be.decode_step_begin(tokens[0], positions[0], ctl.key);
        let rows = layers(st, tokens, positions, logits_from);
        if step {
            be.decode_step_end();
        }
        rows?;
    }
    // The step of the next position, recorded while the device runs this one (launched by
    // the next forward if it is that step; the logits of this one are read before). It does
    // not affect this step: if recording it fails, it is dropped.
    let next = positions[0] + 1;
    if one
        && ctl.prepare_ahead
        && (next as usize) < st.n_ctx()
        && be.decode_step_prepare(next, ctl.key)
    {
        match layers(st, &[vela_compute::DEVICE_TOKEN], &[next], 0) {
            Ok(_) => be.decode_step_park(),
            Err(_) => be.decode_step_discard(),
        }
    }
    Ok(n - logits_from)
}

/// Pipelined greedy decoding: run the one-token step of `token` at `pos` (`None`: the token the
/// previous step's `argmax_start` left on the device, not yet read back) as one recorded step
/// with its argmax, without waiting for it. Returns the ticket for [`Backend::argmax_finish`],
/// or `None` when the model or backend cannot (nothing was run).
#[allow(clippy::too_many_arguments)]
pub fn argmax_start<B: Backend, S: StepState<B>>(
    be: &B,
    st: &mut S,
    token: Option<u32>,
    pos: u32,
    n_vocab: usize,
    graph_safe: bool,
    layers: Layers<'_, S>,
) -> Result<Option<u64>> {
    check_batch(1, &[pos], st.max_batch(), st.n_ctx(), 0)?;
    if !graph_safe {
        return Ok(None);
    }
    let key = st.ctl().key;
    let began = match token {
        Some(t) => be.decode_step_begin(t, pos, key),
        None => be.decode_step_begin_chained(pos, key),
    };
    if !began {
        return Ok(None);
    }
    let id = token.unwrap_or(vela_compute::DEVICE_TOKEN);
    if let Err(e) = layers(st, &[id], &[pos], 0) {
        be.decode_step_end();
        return Err(e);
    }
    match be.argmax_start(st.logits(), n_vocab) {
        Some(t) => Ok(Some(t)),
        None => {
            be.decode_step_end();
            bail!("the backend recorded a decode step but cannot start its argmax")
        }
    }
}
