//! Exact prefix cache: several recent sequence states kept within a memory budget.
//!
//! A request takes the cached session sharing the longest token prefix with its prompt and rolls
//! it back to that prefix. Rolling back is [`Session::truncate`] when the model's state allows
//! dropping that many positions (its rollback limit, `vela_models::StateLayout::rollback_limit`:
//! any number for full-attention caches, `ubatch` for sliding-window rings, the snapshots kept
//! for recurrent layers), otherwise a restore of the latest checkpoint at or before the shared
//! prefix: the one taken right after the session's last prompt was prefilled (so a follow-up
//! turn that re-renders the previous answer differently still reuses the whole previous prompt)
//! or, for states that cannot drop many positions, one taken a few tokens before the prompt's
//! end (a template that re-renders the previous generation prompt, such as thinking dropped from
//! the history), otherwise a reset. At least one prompt token is always
//! re-evaluated to get logits. Sessions are evicted least-recently-used first.

use vela_engine::{Checkpoint, Session};

/// How to roll a cached session back for a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reuse {
    /// Drop tokens after `n` (cheap).
    Truncate(usize),
    /// Restore the session's checkpoint at `n` tokens.
    Restore(usize),
    /// Nothing reusable: reset.
    Reset,
}

impl Reuse {
    /// Tokens not recomputed.
    pub fn reused(self) -> usize {
        match self {
            Reuse::Truncate(n) | Reuse::Restore(n) => n,
            Reuse::Reset => 0,
        }
    }
}

/// Length of the common prefix.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Plan the rollback of a session holding `cached` (checkpoints at the positions `cps`) for
/// `prompt`; `rollback_limit`: how many trailing positions the state can drop without a
/// checkpoint.
pub fn plan(cached: &[u32], cps: &[usize], rollback_limit: usize, prompt: &[u32]) -> Reuse {
    let target = common_prefix(cached, prompt).min(prompt.len().saturating_sub(1));
    if target == 0 {
        return Reuse::Reset;
    }
    if cached.len() - target <= rollback_limit {
        return Reuse::Truncate(target);
    }
    match cps
        .iter()
        .copied()
        .filter(|&c| c <= target && c > 0 && c <= cached.len())
        .max()
    {
        Some(c) => Reuse::Restore(c),
        None => Reuse::Reset,
    }
}

/// Pick the entry with the most reusable tokens (ties: most recently used). `entries` are
/// (tokens, checkpoint positions, last-used stamp).
pub fn choose(
    entries: &[(&[u32], Vec<usize>, u64)],
    rollback_limit: usize,
    prompt: &[u32],
) -> Option<(usize, Reuse)> {
    entries
        .iter()
        .enumerate()
        .map(|(i, (t, cps, used))| (i, plan(t, cps, rollback_limit, prompt), *used))
        .filter(|(_, r, _)| r.reused() > 0)
        .max_by_key(|(_, r, used)| (r.reused(), *used))
        .map(|(i, r, _)| (i, r))
}

/// Sequences the cache keeps at most, whatever their bytes: each also holds scratch buffers its
/// state bytes do not count, so sequences whose K/V is allocated by use (a few positions each)
/// must not pile up by the hundred.
pub const MAX_ENTRIES: usize = 64;

/// Indices to evict (least recently used first) so that the total bytes fit `budget` and at most
/// [`MAX_ENTRIES`] remain, always keeping at least `keep_min` entries. `items` are (bytes,
/// last-used stamp).
pub fn lru_victims(items: &[(usize, u64)], budget: usize, keep_min: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| items[i].1);
    let mut total: usize = items.iter().map(|x| x.0).sum();
    let mut out = Vec::new();
    for i in order {
        let left = items.len() - out.len();
        if (total <= budget && left <= MAX_ENTRIES) || left <= keep_min {
            break;
        }
        total -= items[i].0;
        out.push(i);
    }
    out
}

/// A cached sequence.
pub struct Entry {
    pub session: Session,
    /// Checkpoint right after the last prompt's prefill.
    pub prompt_cp: Option<Checkpoint>,
    /// For states with a short rollback limit: checkpoints a few tokens before the end of the
    /// last prompts ([`EARLY_CHECKPOINT`]; the latest [`EARLY_KEEP`], oldest first), so a turn
    /// whose history re-renders an earlier turn's generation prompt still finds one.
    pub early: Vec<Checkpoint>,
    pub last_used: u64,
}

/// How far before a prompt's end the early checkpoint is taken (covers the generation prompt a
/// template renders differently once the turn is history).
pub const EARLY_CHECKPOINT: usize = 16;

/// Early checkpoints an entry keeps.
pub const EARLY_KEEP: usize = 3;

impl Entry {
    pub fn new(session: Session) -> Self {
        Entry {
            session,
            prompt_cp: None,
            early: Vec::new(),
            last_used: 0,
        }
    }
}

/// The cache itself (owned by the engine worker).
pub struct PrefixCache {
    pub entries: Vec<Entry>,
    pub budget: usize,
    clock: u64,
    /// Where evicted sessions go (`--cache-dir`).
    pub disk: Option<crate::disk_cache::DiskCache>,
}

impl PrefixCache {
    pub fn new(budget: usize) -> Self {
        PrefixCache {
            entries: Vec::new(),
            budget,
            clock: 0,
            disk: None,
        }
    }

    /// Save every session to disk (shutdown) and wait for the writes.
    pub fn spill_all(&mut self) {
        if let Some(d) = &mut self.disk {
            for e in &self.entries {
                d.spill(&e.session);
            }
            d.close();
        }
    }

    /// Take the best entry for `prompt` out of the cache with its plan.
    pub fn take_best(&mut self, rollback_limit: usize, prompt: &[u32]) -> Option<(Entry, Reuse)> {
        let views: Vec<(&[u32], Vec<usize>, u64)> = self
            .entries
            .iter()
            .map(|e| {
                let cps = e
                    .prompt_cp
                    .iter()
                    .chain(&e.early)
                    .map(|c| c.n_past())
                    .collect();
                (e.session.tokens(), cps, e.last_used)
            })
            .collect();
        let (i, r) = choose(&views, rollback_limit, prompt)?;
        Some((self.entries.swap_remove(i), r))
    }

    /// Take the least recently used entry (to recycle its memory; saved to disk first).
    pub fn take_lru(&mut self) -> Option<Entry> {
        let i = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used)?;
        let e = self.entries.swap_remove(i);
        if let Some(d) = &self.disk {
            d.spill(&e.session);
        }
        Some(e)
    }

    pub fn total_bytes(&self) -> usize {
        self.entries.iter().map(|e| e.session.kv_bytes()).sum()
    }

    /// Put an entry back (most recently used) and evict down to the budget.
    pub fn put(&mut self, mut e: Entry) {
        // Idle in the cache: only its state is worth keeping, not its scratch buffers.
        e.session.park();
        self.clock += 1;
        e.last_used = self.clock;
        self.entries.push(e);
        let items: Vec<(usize, u64)> = self
            .entries
            .iter()
            .map(|e| (e.session.kv_bytes(), e.last_used))
            .collect();
        let mut victims = lru_victims(&items, self.budget, 1);
        victims.sort_unstable_by(|a, b| b.cmp(a));
        for v in victims {
            let e = self.entries.swap_remove(v);
            if let Some(d) = &self.disk {
                d.spill(&e.session);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plan_full_attention_truncates() {
        let cached = [1, 2, 3, 4, 5, 6];
        assert_eq!(
            plan(&cached, &[], usize::MAX, &[1, 2, 3, 9]),
            Reuse::Truncate(3)
        );
        // The whole prompt is cached: keep one token to evaluate.
        assert_eq!(
            plan(&cached, &[], usize::MAX, &[1, 2, 3]),
            Reuse::Truncate(2)
        );
        assert_eq!(plan(&cached, &[], usize::MAX, &[7, 2]), Reuse::Reset);
        assert_eq!(plan(&[], &[], usize::MAX, &[7, 2]), Reuse::Reset);
    }

    #[test]
    fn plan_sliding_window_needs_checkpoint_for_long_rollback() {
        let cached: Vec<u32> = (0..100).collect();
        let mut prompt: Vec<u32> = (0..60).collect();
        prompt.push(999);
        // Dropping 40 > ubatch 8 tokens: restore the checkpoint at 50 (≤ 60 common).
        assert_eq!(plan(&cached, &[50], 8, &prompt), Reuse::Restore(50));
        // Checkpoint beyond the common prefix is useless.
        assert_eq!(plan(&cached, &[70], 8, &prompt), Reuse::Reset);
        assert_eq!(plan(&cached, &[], 8, &prompt), Reuse::Reset);
        // Small rollback: truncate.
        let mut p2: Vec<u32> = (0..95).collect();
        p2.push(999);
        assert_eq!(plan(&cached, &[50], 8, &p2), Reuse::Truncate(95));
    }

    /// A recurrent state (rollback limit 4) with an early checkpoint: a prompt that leaves the
    /// previous one a few tokens before its end restores the early checkpoint.
    #[test]
    fn plan_picks_the_latest_checkpoint_before_the_split() {
        let cached: Vec<u32> = (0..130).collect();
        let mut prompt: Vec<u32> = (0..98).collect();
        prompt.push(999);
        assert_eq!(plan(&cached, &[84, 100], 4, &prompt), Reuse::Restore(84));
        let mut p2: Vec<u32> = (0..120).collect();
        p2.push(999);
        assert_eq!(plan(&cached, &[84, 100], 4, &p2), Reuse::Restore(100));
        assert_eq!(plan(&cached, &[100], 4, &prompt), Reuse::Reset);
    }

    #[test]
    fn choose_longest_then_recent() {
        let a: Vec<u32> = vec![1, 2, 3];
        let b: Vec<u32> = vec![1, 2, 3, 4, 5];
        let c: Vec<u32> = vec![1, 2, 3, 4, 5];
        let entries = [
            (&a[..], vec![], 5),
            (&b[..], vec![], 1),
            (&c[..], vec![], 2),
        ];
        assert_eq!(
            choose(&entries, usize::MAX, &[1, 2, 3, 4, 5, 6]),
            Some((2, Reuse::Truncate(5)))
        );
        assert_eq!(choose(&entries, usize::MAX, &[9]), None);
    }

    #[test]
    fn lru_eviction_respects_budget_and_minimum() {
        let items = [(100, 3), (100, 1), (100, 2)];
        assert_eq!(lru_victims(&items, 200, 1), vec![1]);
        assert_eq!(lru_victims(&items, 0, 1), vec![1, 2]);
        assert_eq!(lru_victims(&items, 1000, 1), Vec::<usize>::new());
        // Small sequences: at most MAX_ENTRIES, the oldest go.
        let many: Vec<(usize, u64)> = (0..MAX_ENTRIES as u64 + 3).map(|t| (1, 100 - t)).collect();
        let v = lru_victims(&many, 1 << 30, 1);
        assert_eq!(v, vec![MAX_ENTRIES + 2, MAX_ENTRIES + 1, MAX_ENTRIES]);
    }
}
