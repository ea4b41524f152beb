//! Stop strings over streamed text: text that could still be the start of a stop string is
//! held back until it is decided.

/// Matches stop strings incrementally.
pub struct StopMatcher {
    stops: Vec<String>,
    buf: String,
}

/// Length of the longest suffix of `buf` that is a proper prefix of `s`.
fn partial(buf: &str, s: &str) -> usize {
    let max = s.len().saturating_sub(1).min(buf.len());
    (1..=max)
        .rev()
        .find(|&k| buf.is_char_boundary(buf.len() - k) && s.starts_with(&buf[buf.len() - k..]))
        .unwrap_or(0)
}

impl StopMatcher {
    pub fn new(stops: Vec<String>) -> Self {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            buf: String::new(),
        }
    }

    /// Feed text; returns the text safe to emit and the matched stop string, if any (the stop
    /// string and anything after it are dropped).
    pub fn push(&mut self, text: &str) -> (String, Option<String>) {
        self.buf.push_str(text);
        let hit = self
            .stops
            .iter()
            .filter_map(|s| self.buf.find(s.as_str()).map(|p| (p, s)))
            .min_by_key(|(p, _)| *p);
        if let Some((p, s)) = hit {
            let s = s.clone();
            let out = self.buf[..p].to_string();
            self.buf.clear();
            return (out, Some(s));
        }
        let hold = self
            .stops
            .iter()
            .map(|s| partial(&self.buf, s))
            .max()
            .unwrap_or(0);
        let emit = self.buf.len() - hold;
        let out = self.buf[..emit].to_string();
        self.buf.drain(..emit);
        (out, None)
    }

    /// End of generation: release what was held.
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], chunks: &[&str]) -> (String, Option<String>) {
        let mut m = StopMatcher::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = String::new();
        for c in chunks {
            let (t, hit) = m.push(c);
            out.push_str(&t);
            if hit.is_some() {
                return (out, hit);
            }
        }
        out.push_str(&m.finish());
        (out, None)
    }

    #[test]
    fn holds_partial_matches_at_every_split() {
        let text = "one two\nthree END four";
        for i in 0..=text.len() {
            let (out, hit) = run(&["END", "\n\n"], &[&text[..i], &text[i..]]);
            assert_eq!(out, "one two\nthree ", "split {i}");
            assert_eq!(hit.as_deref(), Some("END"));
        }
        // A partial match that never completes is released at the end.
        assert_eq!(run(&["ENDX"], &["a EN", "D"]), ("a END".to_string(), None));
        // Earliest stop wins.
        assert_eq!(run(&["b", "a"], &["xab"]).1.as_deref(), Some("a"));
    }
}
