//! The device cache of a host-memory expert layer ([`super::experts`]): the most used experts of
//! the layer, copied to the device, so that most routed slots of a decode step run there while
//! the CPU runs the rest.
//!
//! Which experts: each routed slot counts for its expert; every [`REFRESH`] routed tokens the
//! counts decay by half. The first choice fills every slot (the most counted experts, then the
//! lowest ids); later ones replace a cached expert only by one counted [`ADMIT`] times as often
//! (the least counted cached one by the most counted other, while that holds), writing the new
//! expert's rows over the old one's slot in place: a refresh costs the changed experts' bytes,
//! and routing noise does not churn the set (re-uploading the whole cache every refresh made a
//! 4 GiB cache slower than none: `docs/perf-log.md`).
//! A step then splits its slots: cached ones multiply on the device (their expert ids mapped to
//! cache slots; the others to an id past the cache, which gives zero rows), the rest on the
//! CPU; the CPU's rows are added into the zero rows, so the combine runs over every slot in
//! the usual order and the result differs from all-on-device only by the CPU's rounding of
//! the slots it ran.

use super::expert_stream::{expert_rows, upload_experts};
use super::experts::GateUp;
use anyhow::Result;
use std::sync::atomic::{AtomicU64, Ordering};
use vela_compute::{Backend, HostWeight};

/// Routed tokens between two choices of the cached experts.
pub const REFRESH: usize = 128;

/// How many times as often as the least used cached expert another must have been routed to
/// take its slot.
pub const ADMIT: f64 = 1.25;

/// Hits and misses of every layer's cache (slots run on the device / on the CPU), for
/// `/metrics` and `vela bench`.
pub struct CacheStats {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub refreshes: AtomicU64,
    /// Experts written over another's slot by a later choice.
    pub replaced: AtomicU64,
    pub bytes_uploaded: AtomicU64,
}

pub static CACHE_STATS: CacheStats = CacheStats {
    hits: AtomicU64::new(0),
    misses: AtomicU64::new(0),
    refreshes: AtomicU64::new(0),
    replaced: AtomicU64::new(0),
    bytes_uploaded: AtomicU64::new(0),
};

/// The cached experts' weights on the device, in cache-slot order.
pub struct CachedWeights<B: Backend> {
    pub gate_up: GateUp<B>,
    pub down: B::Weight,
}

/// One layer's cache.
pub struct ExpertCache<B: Backend> {
    /// Experts it holds at most.
    pub cap: usize,
    n_expert: usize,
    /// Decayed use counts per expert.
    counts: Vec<f64>,
    /// Routed tokens since the last choice.
    since: usize,
    /// Cache slot of each expert (`u32::MAX`: not cached).
    slot_of: Vec<u32>,
    /// The expert in each slot.
    held: Vec<usize>,
    pub weights: Option<CachedWeights<B>>,
}

impl<B: Backend> ExpertCache<B> {
    pub fn new(cap: usize, n_expert: usize) -> Self {
        ExpertCache {
            cap: cap.min(n_expert),
            n_expert,
            counts: vec![0.0; n_expert],
            since: 0,
            slot_of: vec![u32::MAX; n_expert],
            held: Vec::new(),
            weights: None,
        }
    }

    /// Count a step's routed experts (`ids`, `n` tokens' slots); every [`REFRESH`] tokens choose
    /// the cached set again and copy the rows of the experts that came in from the host tensors
    /// (`gate_up` as fused `[E·2I, H]` or gate and up `[E·I, H]`; `down` `[E·H, I]`) to the
    /// device through `be`.
    pub fn observe(
        &mut self,
        ids: &[u32],
        n: usize,
        gate_up: &[&HostWeight],
        down: &HostWeight,
        be: &B,
    ) -> Result<()> {
        for &e in ids {
            if let Some(c) = self.counts.get_mut(e as usize) {
                *c += 1.0;
            }
        }
        self.since += n;
        if self.since < REFRESH && self.weights.is_some() {
            return Ok(());
        }
        self.since = 0;
        let r = if self.weights.is_some() {
            self.replace(gate_up, down, be)
        } else {
            self.fill(gate_up, down, be)
        };
        self.counts.iter_mut().for_each(|c| *c *= 0.5);
        r
    }

    /// The first choice: every slot, in expert order.
    fn fill(&mut self, gate_up: &[&HostWeight], down: &HostWeight, be: &B) -> Result<()> {
        if self.cap == 0 || self.counts.iter().all(|&c| c == 0.0) {
            return Ok(());
        }
        let mut order: Vec<usize> = (0..self.n_expert).collect();
        order.sort_by(|&a, &b| self.counts[b].total_cmp(&self.counts[a]).then(a.cmp(&b)));
        order.truncate(self.cap);
        order.sort_unstable();
        let (gate_up, down, bytes) =
            upload_experts::<B>(gate_up, down, self.n_expert, Some(&order), |w| {
                be.upload_weight(w)
            })?;
        for (s, &e) in order.iter().enumerate() {
            self.slot_of[e] = s as u32;
        }
        self.held = order;
        self.weights = Some(CachedWeights { gate_up, down });
        CACHE_STATS.refreshes.fetch_add(1, Ordering::Relaxed);
        CACHE_STATS
            .bytes_uploaded
            .fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// A later choice: the least used cached experts give their slots to the most used others
    /// while those were routed [`ADMIT`] times as often; their rows are written in place.
    fn replace(&mut self, gate_up: &[&HostWeight], down: &HostWeight, be: &B) -> Result<()> {
        let c = &self.counts;
        let mut outside: Vec<usize> = (0..self.n_expert)
            .filter(|&e| self.slot_of[e] == u32::MAX && c[e] > 0.0)
            .collect();
        outside.sort_by(|&a, &b| c[b].total_cmp(&c[a]).then(a.cmp(&b)));
        let mut inside = self.held.clone();
        inside.sort_by(|&a, &b| c[a].total_cmp(&c[b]).then(a.cmp(&b)));
        let swaps: Vec<(usize, usize)> = outside
            .into_iter()
            .zip(inside)
            .take_while(|&(new, old)| c[new] > ADMIT * c[old])
            .collect();
        if swaps.is_empty() {
            return Ok(());
        }
        let w = self.weights.as_mut().expect("replace follows fill");
        let ne = self.n_expert;
        let mut bytes = 0u64;
        let mut write = |dst: &mut B::Weight, src: &HostWeight, slot: usize, e: usize| {
            let rows = expert_rows(src, ne, &[e])?;
            bytes += rows.bytes().len() as u64;
            be.write_weight_rows(dst, slot * (src.rows / ne), &rows)
        };
        for &(new, old) in &swaps {
            let slot = self.slot_of[old] as usize;
            match (&mut w.gate_up, gate_up) {
                (GateUp::Fused(g), [src]) => write(g, src, slot, new)?,
                (GateUp::Split(g, u), [gs, us]) => {
                    write(g, gs, slot, new)?;
                    write(u, us, slot, new)?;
                }
                _ => anyhow::bail!("experts: the cache's gate/up layout changed"),
            }
            write(&mut w.down, down, slot, new)?;
            self.slot_of[old] = u32::MAX;
            self.slot_of[new] = slot as u32;
            self.held[slot] = new;
        }
        CACHE_STATS.refreshes.fetch_add(1, Ordering::Relaxed);
        CACHE_STATS
            .replaced
            .fetch_add(swaps.len() as u64, Ordering::Relaxed);
        CACHE_STATS
            .bytes_uploaded
            .fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// Experts it holds now.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// The cache slot of each routed slot's expert (`cap` where it is not cached: a zero row);
    /// also whether any slot is cached and whether any is not.
    pub fn map(&self, ids: &[u32]) -> (Vec<u32>, bool, bool) {
        let cap = self.held.len() as u32;
        let mapped: Vec<u32> = ids
            .iter()
            .map(|&e| match self.slot_of.get(e as usize) {
                Some(&s) if s != u32::MAX && self.weights.is_some() => s,
                _ => cap,
            })
            .collect();
        let hits = mapped.iter().filter(|&&s| s < cap).count();
        CACHE_STATS.hits.fetch_add(hits as u64, Ordering::Relaxed);
        CACHE_STATS
            .misses
            .fetch_add((mapped.len() - hits) as u64, Ordering::Relaxed);
        (mapped, hits > 0, hits < ids.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vela_compute::cpu::CpuBackend;
    use vela_formats::quant::GgmlType;

    fn tensor(name: &str, rows: usize, cols: usize) -> HostWeight {
        let v: Vec<u8> = (0..rows * cols)
            .flat_map(|i| (i as f32).to_le_bytes())
            .collect();
        HostWeight::owned(name, GgmlType::F32, rows, cols, v).unwrap()
    }

    #[test]
    fn keeps_the_most_used_experts() {
        let be = CpuBackend::new(1);
        let (gu, down) = (tensor("gu", 8 * 4, 2), tensor("down", 8 * 2, 2));
        let mut c = ExpertCache::<CpuBackend>::new(2, 8);
        // Experts 5 and 2 most used in the first window.
        let ids: Vec<u32> = [5, 2, 5, 2, 5, 1].repeat(REFRESH / 3);
        c.observe(&ids, REFRESH, &[&gu], &down, &be).unwrap();
        assert_eq!(c.held, vec![2, 5]);
        let (m, any_hit, any_miss) = c.map(&[1, 2, 5, 7]);
        assert_eq!(m, vec![2, 0, 1, 2]);
        assert!(any_hit && any_miss);
        // The cached rows are those experts' rows, in slot order.
        let w = c.weights.as_ref().unwrap();
        let GateUp::Fused(g) = &w.gate_up else {
            panic!("fused")
        };
        assert_eq!(g.host().rows, 8);
        assert_eq!(
            g.host().bytes()[..8],
            gu.row_range(2 * 4, 1, "r").unwrap().bytes()[..8]
        );
        assert_eq!(
            w.down.host().bytes()[..],
            {
                let mut v = down.row_range(4, 2, "a").unwrap().bytes().to_vec();
                v.extend(down.row_range(10, 2, "b").unwrap().bytes());
                v
            }[..]
        );
        // Within a window nothing changes; after the next, expert 7 replaces 2 in its slot (5
        // stays: routed about as often as 7).
        c.observe(&[7; 40], 40, &[&gu], &down, &be).unwrap();
        assert_eq!(c.held, vec![2, 5]);
        c.observe(&[7, 5].repeat(REFRESH), REFRESH, &[&gu], &down, &be)
            .unwrap();
        assert_eq!(c.held, vec![7, 5]);
        assert_eq!(c.map(&[7, 5, 2]).0, vec![0, 1, 2]);
        let w = c.weights.as_ref().unwrap();
        let GateUp::Fused(g) = &w.gate_up else {
            panic!("fused")
        };
        assert_eq!(g.host().bytes(), {
            let mut v = gu.row_range(7 * 4, 4, "a").unwrap().bytes().to_vec();
            v.extend(gu.row_range(5 * 4, 4, "b").unwrap().bytes());
            v
        });
        assert_eq!(w.down.host().bytes(), {
            let mut v = down.row_range(14, 2, "a").unwrap().bytes().to_vec();
            v.extend(down.row_range(10, 2, "b").unwrap().bytes());
            v
        });
        // No churn: expert 1, now routed as often as the cached ones but less before, stays out.
        c.observe(&[7, 5, 1].repeat(REFRESH), REFRESH, &[&gu], &down, &be)
            .unwrap();
        assert_eq!(c.held, vec![7, 5]);
    }
}
