//! Exact prefix cache: several recent sequence states kept within a memory budget.
//!
//! A request takes the cached session sharing the longest token prefix with its prompt and rolls
//! it back to that prefix. Rolling back is [`Session::truncate`] when the model's state allows
//! dropping that many positions (its rollback limit, `vela_models::StateLayout::rollback_limit`:
//! any number for full-attention caches, `ubatch` for sliding-window rings, the snapshots kept
//! for recurrent layers), otherwise a restore of the checkpoint taken right after the session's last prompt
//! was prefilled (so a follow-up turn that re-renders the previous answer differently still
//! reuses the whole previous prompt), otherwise a reset. At least one prompt token is always
//! re-evaluated to get logits. Sessions are evicted least-recently-used first.

use vela_engine::{Checkpoint, Session};

/// How to roll a cached session back for a prompt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reuse {
    /// Drop tokens after `n` (cheap).
    Truncate(usize),
    /// Restore the prompt-end checkpoint at `n` tokens.
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

/// Plan the rollback of a session holding `cached` (checkpoint at `cp`, if any) for `prompt`;
/// `rollback_limit`: how many trailing positions the state can drop without a checkpoint.
pub fn plan(cached: &[u32], cp: Option<usize>, rollback_limit: usize, prompt: &[u32]) -> Reuse {
    let target = common_prefix(cached, prompt).min(prompt.len().saturating_sub(1));
    if target == 0 {
        return Reuse::Reset;
    }
    if cached.len() - target <= rollback_limit {
        return Reuse::Truncate(target);
    }
    match cp {
        Some(c) if c <= target && c > 0 && c <= cached.len() => Reuse::Restore(c),
        _ => Reuse::Reset,
    }
}

/// Pick the entry with the most reusable tokens (ties: most recently used). `entries` are
/// (tokens, checkpoint position, last-used stamp).
pub fn choose(
    entries: &[(&[u32], Option<usize>, u64)],
    rollback_limit: usize,
    prompt: &[u32],
) -> Option<(usize, Reuse)> {
    entries
        .iter()
        .enumerate()
        .map(|(i, (t, cp, used))| (i, plan(t, *cp, rollback_limit, prompt), *used))
        .filter(|(_, r, _)| r.reused() > 0)
        .max_by_key(|(_, r, used)| (r.reused(), *used))
        .map(|(i, r, _)| (i, r))
}

/// Indices to evict (least recently used first) so that the total bytes fit `budget`, always
/// keeping at least `keep_min` entries. `items` are (bytes, last-used stamp).
pub fn lru_victims(items: &[(usize, u64)], budget: usize, keep_min: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..items.len()).collect();
    order.sort_by_key(|&i| items[i].1);
    let mut total: usize = items.iter().map(|x| x.0).sum();
    let mut out = Vec::new();
    for i in order {
        if total <= budget || items.len() - out.len() <= keep_min {
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
    pub last_used: u64,
}

/// The cache itself (owned by the engine worker).
pub struct PrefixCache {
    pub entries: Vec<Entry>,
    pub budget: usize,
    clock: u64,
}

impl PrefixCache {
    pub fn new(budget: usize) -> Self {
        PrefixCache {
            entries: Vec::new(),
            budget,
            clock: 0,
        }
    }

    /// Take the best entry for `prompt` out of the cache with its plan.
    pub fn take_best(&mut self, rollback_limit: usize, prompt: &[u32]) -> Option<(Entry, Reuse)> {
        let views: Vec<(&[u32], Option<usize>, u64)> = self
            .entries
            .iter()
            .map(|e| {
                (
                    e.session.tokens(),
                    e.prompt_cp.as_ref().map(|c| c.n_past()),
                    e.last_used,
                )
            })
            .collect();
        let (i, r) = choose(&views, rollback_limit, prompt)?;
        Some((self.entries.swap_remove(i), r))
    }

    /// Take the least recently used entry (to recycle its memory).
    pub fn take_lru(&mut self) -> Option<Entry> {
        let i = (0..self.entries.len()).min_by_key(|&i| self.entries[i].last_used)?;
        Some(self.entries.swap_remove(i))
    }

    pub fn total_bytes(&self) -> usize {
        self.entries.iter().map(|e| e.session.kv_bytes()).sum()
    }

    /// Put an entry back (most recently used) and evict down to the budget.
    pub fn put(&mut self, mut e: Entry) {
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
            self.entries.swap_remove(v);
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
            plan(&cached, None, usize::MAX, &[1, 2, 3, 9]),
            Reuse::Truncate(3)
        );
        // The whole prompt is cached: keep one token to evaluate.
        assert_eq!(
            plan(&cached, None, usize::MAX, &[1, 2, 3]),
            Reuse::Truncate(2)
        );
        assert_eq!(plan(&cached, None, usize::MAX, &[7, 2]), Reuse::Reset);
        assert_eq!(plan(&[], None, usize::MAX, &[7, 2]), Reuse::Reset);
    }

    #[test]
    fn plan_sliding_window_needs_checkpoint_for_long_rollback() {
        let cached: Vec<u32> = (0..100).collect();
        let mut prompt: Vec<u32> = (0..60).collect();
        prompt.push(999);
        // Dropping 40 > ubatch 8 tokens: restore the checkpoint at 50 (≤ 60 common).
        assert_eq!(plan(&cached, Some(50), 8, &prompt), Reuse::Restore(50));
        // Checkpoint beyond the common prefix is useless.
        assert_eq!(plan(&cached, Some(70), 8, &prompt), Reuse::Reset);
        assert_eq!(plan(&cached, None, 8, &prompt), Reuse::Reset);
        // Small rollback: truncate.
        let mut p2: Vec<u32> = (0..95).collect();
        p2.push(999);
        assert_eq!(plan(&cached, Some(50), 8, &p2), Reuse::Truncate(95));
    }

    #[test]
    fn choose_longest_then_recent() {
        let a: Vec<u32> = vec![1, 2, 3];
        let b: Vec<u32> = vec![1, 2, 3, 4, 5];
        let c: Vec<u32> = vec![1, 2, 3, 4, 5];
        let entries = [(&a[..], None, 5), (&b[..], None, 1), (&c[..], None, 2)];
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
    }
}
