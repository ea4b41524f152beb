//! A bound on the digits of JSON numbers: a run of digits outside a JSON string (an integer
//! part, a fraction, an exponent) is at most [`MAX_DIGITS`] long, as llama.cpp's JSON grammars
//! bound them. JSON sets no limit, so without one a model that starts repeating `0` inside an
//! unbounded number never reaches a token that ends it.

use llguidance::toktrie::{SimpleVob, TokTrie};

/// The longest run of digits a number may have.
pub const MAX_DIGITS: usize = 16;

/// Where the output is, lexically: inside a JSON string (and after a backslash), and the length
/// of the trailing run of digits outside strings.
#[derive(Clone, Debug, Default)]
pub struct DigitRun {
    in_string: bool,
    escaped: bool,
    run: usize,
}

impl DigitRun {
    /// The state after the bytes `b`.
    pub fn after(&self, b: &[u8]) -> DigitRun {
        let mut s = self.clone();
        for &c in b {
            if s.in_string {
                match (s.escaped, c) {
                    (true, _) => s.escaped = false,
                    (false, b'\\') => s.escaped = true,
                    (false, b'"') => s.in_string = false,
                    _ => {}
                }
            } else if c.is_ascii_digit() {
                s.run += 1;
            } else {
                s.run = 0;
                s.in_string = c == b'"';
            }
        }
        s
    }

    /// Whether the output is inside a number's digits (only then can a token exceed the bound).
    pub fn in_digits(&self) -> bool {
        self.run > 0
    }

    /// Clear from `mask` the tokens that would make a run longer than [`MAX_DIGITS`]; if that
    /// would clear every token (a schema whose numbers need more digits), leave it.
    pub fn limit(&self, trie: &TokTrie, mask: &mut SimpleVob) {
        if !self.in_digits() {
            return;
        }
        let mut over = Vec::new();
        let mut any_left = false;
        mask.iter_set_entries(|t| {
            let b = trie.token(t as u32);
            if self.after(b).run > MAX_DIGITS || self.crosses(b) {
                over.push(t as u32);
            } else {
                any_left = true;
            }
        });
        if any_left {
            for t in over {
                mask.disallow_token(t);
            }
        }
    }

    /// Whether the digits `b` starts with overflow the current run (a token may also end
    /// the number and start another run).
    fn crosses(&self, b: &[u8]) -> bool {
        let lead = b.iter().take_while(|c| c.is_ascii_digit()).count();
        self.run + lead > MAX_DIGITS
    }
}
