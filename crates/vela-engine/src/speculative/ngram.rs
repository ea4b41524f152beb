//! Prompt-lookup drafting: no draft model; the drafts are the tokens that followed the most recent
//! earlier occurrence of the sequence's last n-gram (`n_max` down to `n_min` tokens). Useful
//! whenever the output repeats its context — code edits, quoting, extraction, templated answers.
//!
//! The proposal is deterministic, so its distribution is one-hot: the exact rule then keeps a
//! draft `d` with probability `p(d)` and otherwise samples from `p` without `d` (renormalized),
//! which keeps the output distributed exactly as plain decoding (greedy: keep iff `d` is the
//! target's argmax).

use super::{Dist, Draft, Drafter, Propose};
use crate::session::Session;
use anyhow::{bail, Result};

/// Prompt-lookup drafter (see the module docs).
#[derive(Clone, Debug)]
pub struct NgramDrafter {
    pub n_max: usize,
    pub n_min: usize,
}

impl NgramDrafter {
    /// Match n-grams of `n_min..=n_max` tokens (longest first).
    pub fn new(n_min: usize, n_max: usize) -> Result<NgramDrafter> {
        if n_min == 0 || n_min > n_max {
            bail!("n-gram sizes must satisfy 1 <= min <= max (got {n_min}..{n_max})");
        }
        Ok(NgramDrafter { n_max, n_min })
    }

    /// The up-to-`k` tokens that followed the latest earlier occurrence of `ctx`'s longest
    /// matching suffix.
    pub fn lookup(&self, ctx: &[u32], k: usize) -> Vec<u32> {
        for n in (self.n_min..=self.n_max).rev() {
            if ctx.len() <= n {
                continue;
            }
            let suffix = &ctx[ctx.len() - n..];
            // Latest occurrence that is not the suffix itself and has a continuation.
            for start in (0..ctx.len() - n).rev() {
                if &ctx[start..start + n] == suffix {
                    let from = start + n;
                    let to = (from + k).min(ctx.len());
                    if from < to {
                        return ctx[from..to].to_vec();
                    }
                }
            }
        }
        Vec::new()
    }
}

impl Drafter for NgramDrafter {
    fn sync(&mut self, _target: &Session, _row: usize) -> Result<()> {
        Ok(())
    }

    fn draft(
        &mut self,
        target: &mut Session,
        last: u32,
        k: usize,
        _propose: Propose,
    ) -> Result<Vec<Draft>> {
        let mut ctx = target.tokens().to_vec();
        ctx.push(last);
        Ok(self
            .lookup(&ctx, k)
            .into_iter()
            .map(|token| Draft {
                token,
                q: Dist::one_hot(token),
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_takes_the_longest_latest_match() {
        let d = NgramDrafter::new(1, 3).unwrap();
        // "1 2 3 9 9 | 1 2 3 4 5 | 1 2 3" → the latest "1 2 3" is followed by 4 5.
        let ctx = [1, 2, 3, 9, 9, 1, 2, 3, 4, 5, 1, 2, 3];
        assert_eq!(d.lookup(&ctx, 2), vec![4, 5]);
        assert_eq!(d.lookup(&ctx, 10), vec![4, 5, 1, 2, 3]);
        // Only a 1-gram matches: 7 8 … 7 → 8.
        assert_eq!(d.lookup(&[7, 8, 6, 7], 3), vec![8, 6, 7]);
        // No match, and too-short contexts.
        assert!(d.lookup(&[1, 2, 3], 4).is_empty());
        assert!(d.lookup(&[5], 4).is_empty());
        let strict = NgramDrafter::new(2, 2).unwrap();
        assert!(strict.lookup(&[7, 8, 6, 7], 3).is_empty());
        assert!(NgramDrafter::new(0, 2).is_err());
        assert!(NgramDrafter::new(3, 2).is_err());
    }
}
