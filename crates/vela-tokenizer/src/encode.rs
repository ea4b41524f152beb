//! Encoding (text -> ids) for GGUF vocabularies, matching llama.cpp's `llama_tokenize`.

use crate::unicode::utf8_len;
use crate::vocab::{attr, Vocab, VocabType};
use std::cmp::Ordering;
use std::collections::BinaryHeap;

/// A piece of the input after special-token partitioning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Frag {
    /// Byte range `[start, start + len)` of the input, not yet tokenized.
    Text(usize, usize),
    Token(u32),
}

/// C `isspace` in the "C" locale.
fn c_isspace(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// One symbol of the merge linked list (a byte range of the word).
#[derive(Clone, Copy, Debug)]
struct Sym {
    prev: i32,
    next: i32,
    start: usize,
    n: usize,
    /// Interned id of the symbol text (BPE), `u32::MAX` when unknown.
    id: u32,
}

/// SPM work item: the highest score first, then the leftmost.
struct SpmBigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for SpmBigram {
    fn eq(&self, o: &Self) -> bool {
        self.cmp(o) == Ordering::Equal
    }
}
impl Eq for SpmBigram {}
impl PartialOrd for SpmBigram {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for SpmBigram {
    fn cmp(&self, o: &Self) -> Ordering {
        self.score
            .total_cmp(&o.score)
            .then_with(|| o.left.cmp(&self.left))
    }
}

/// BPE work item: the lowest rank first, then the leftmost. Stored as a key in a max-heap.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct BpeBigram {
    key: std::cmp::Reverse<(u32, usize)>,
    right: usize,
    lsize: usize,
    rsize: usize,
    merged: u32,
}

fn link(n: usize, starts: impl Iterator<Item = (usize, usize)>) -> Vec<Sym> {
    starts
        .enumerate()
        .map(|(i, (start, len))| Sym {
            prev: i as i32 - 1,
            next: if i + 1 == n { -1 } else { i as i32 + 1 },
            start,
            n: len,
            id: u32::MAX,
        })
        .collect()
}

/// Split `s` into UTF-8 characters with llama.cpp's lead-byte length rule.
fn char_spans(s: &[u8]) -> Vec<(usize, usize)> {
    let mut v = Vec::with_capacity(s.len());
    let mut off = 0;
    while off < s.len() {
        let len = utf8_len(s[off]).min(s.len() - off);
        v.push((off, len));
        off += len;
    }
    v
}

impl Vocab {
    /// Tokenize like llama.cpp: `add_special` adds BOS/EOS per the vocabulary flags (and makes
    /// SPM prefix a space), `parse_special` lets control tokens in the text be recognised.
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        let frags = if text.is_empty() {
            Vec::new()
        } else {
            self.partition(text, parse_special)
        };
        let mut out = Vec::new();
        match self.kind {
            VocabType::Spm => {
                let mut prev_special = true;
                if add_special && self.add_bos {
                    out.extend(self.special.bos);
                }
                for f in frags {
                    match f {
                        Frag::Text(s, n) => {
                            let mut t = String::with_capacity(n + 1);
                            if self.add_space_prefix && prev_special {
                                t.push(' ');
                            }
                            t.push_str(&text[s..s + n]);
                            self.spm_tokenize(&t.replace(' ', "\u{2581}"), &mut out);
                            prev_special = false;
                        }
                        Frag::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
                if add_special && self.add_eos {
                    out.extend(self.special.eos);
                }
            }
            VocabType::Bpe => {
                if add_special && self.add_bos {
                    out.extend(self.special.bos);
                }
                for f in frags {
                    match f {
                        Frag::Text(s, n) => {
                            let t = &text[s..s + n];
                            if self.escape_whitespaces {
                                self.bpe_tokenize(&t.replace(' ', "\u{2581}"), &mut out);
                            } else {
                                self.bpe_tokenize(t, &mut out);
                            }
                        }
                        Frag::Token(id) => out.push(id),
                    }
                }
                if add_special && self.add_eos {
                    out.extend(self.special.eos);
                }
            }
        }
        out
    }

    /// Split special-token texts out of `text` (llama.cpp's `tokenizer_st_partition`): longest
    /// special tokens first; control/unknown tokens only when `parse_special`, user-defined
    /// tokens always. Honors the LSTRIP/RSTRIP attributes.
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Frag> {
        let bytes = text.as_bytes();
        let mut frags = vec![Frag::Text(0, text.len())];
        for &id in &self.special_cache {
            let tok = &self.tokens[id as usize];
            if !parse_special && tok.attr & (attr::CONTROL | attr::UNKNOWN) != 0 {
                continue;
            }
            let pat = tok.text.as_str();
            if !frags
                .iter()
                .any(|f| matches!(*f, Frag::Text(s, n) if text[s..s + n].contains(pat)))
            {
                continue;
            }
            let mut next = Vec::with_capacity(frags.len() + 2);
            for f in frags {
                let Frag::Text(mut base, mut len) = f else {
                    next.push(f);
                    continue;
                };
                loop {
                    let Some(rel) = text[base..base + len].find(pat) else {
                        if len > 0 {
                            next.push(Frag::Text(base, len));
                        }
                        break;
                    };
                    let m = base + rel;
                    if m > base {
                        let mut l = m - base;
                        if tok.attr & attr::LSTRIP != 0 {
                            while l > 0 && c_isspace(bytes[base + l - 1]) {
                                l -= 1;
                            }
                        }
                        if l > 0 {
                            next.push(Frag::Text(base, l));
                        }
                    }
                    next.push(Frag::Token(id));
                    let mut r = m + pat.len();
                    let end = base + len;
                    if tok.attr & attr::RSTRIP != 0 {
                        while r < end && c_isspace(bytes[r]) {
                            r += 1;
                        }
                    }
                    base = r;
                    len = end - r;
                    if len == 0 {
                        break;
                    }
                }
            }
            frags = next;
        }
        frags
    }

    /// The id of a single byte: `<0xXX>` or, failing that, the one-byte text.
    fn byte_token(&self, b: u8) -> Option<u32> {
        self.text_to_token(&format!("<0x{b:02X}>")).or_else(|| {
            std::str::from_utf8(&[b])
                .ok()
                .and_then(|s| self.text_to_token(s))
        })
    }

    /// SentencePiece BPE: repeatedly merge the adjacent pair whose concatenation is the
    /// highest-scoring vocabulary entry; unknown leftovers fall back to byte tokens.
    fn spm_tokenize(&self, text: &str, out: &mut Vec<u32>) {
        let s = text.as_bytes();
        if s.is_empty() {
            return;
        }
        let spans = char_spans(s);
        let mut syms = link(spans.len(), spans.into_iter());
        let mut heap = BinaryHeap::new();
        let try_add = |syms: &[Sym], heap: &mut BinaryHeap<SpmBigram>, l: i32, r: i32| {
            if l < 0 || r < 0 {
                return;
            }
            let (a, b) = (syms[l as usize], syms[r as usize]);
            let Ok(t) = std::str::from_utf8(&s[a.start..a.start + a.n + b.n]) else {
                return;
            };
            if let Some(id) = self.text_to_token(t) {
                let score = self.tokens[id as usize].score;
                heap.push(SpmBigram {
                    score,
                    left: l as usize,
                    right: r as usize,
                    size: a.n + b.n,
                });
            }
        };
        for i in 1..syms.len() {
            try_add(&syms, &mut heap, i as i32 - 1, i as i32);
        }
        while let Some(bg) = heap.pop() {
            let (l, r) = (syms[bg.left], syms[bg.right]);
            if l.n == 0 || r.n == 0 || l.n + r.n != bg.size {
                continue;
            }
            syms[bg.left].n += r.n;
            syms[bg.right].n = 0;
            syms[bg.left].next = r.next;
            if r.next >= 0 {
                syms[r.next as usize].prev = bg.left as i32;
            }
            try_add(&syms, &mut heap, l.prev, bg.left as i32);
            try_add(&syms, &mut heap, bg.left as i32, r.next);
        }
        let mut i = 0i32;
        while i != -1 {
            let sym = syms[i as usize];
            let piece = &s[sym.start..sym.start + sym.n];
            match std::str::from_utf8(piece)
                .ok()
                .and_then(|t| self.text_to_token(t))
            {
                Some(id) => out.push(id),
                None => {
                    for &b in piece {
                        if let Some(id) = self.byte_token(b).or(self.special.unk) {
                            out.push(id);
                        }
                    }
                }
            }
            i = sym.next;
        }
    }

    /// Byte-level BPE over the pre-tokenizer's words: merge the adjacent pair with the lowest
    /// merge rank until none applies.
    fn bpe_tokenize(&self, text: &str, out: &mut Vec<u32>) {
        let Some(pre) = &self.pre else { return };
        let gemma4 = pre.is_gemma4();
        for word in pre.split(text) {
            let w = word.as_bytes();
            let whole = (self.ignore_merges || (gemma4 && w.iter().all(|&b| b == b'\n')))
                .then(|| self.text_to_token(&word))
                .flatten();
            if let Some(id) = whole {
                out.push(id);
                continue;
            }
            let spans = char_spans(w);
            let mut syms = link(spans.len(), spans.into_iter());
            for sym in &mut syms {
                let t = std::str::from_utf8(&w[sym.start..sym.start + sym.n]).unwrap_or("");
                sym.id = self.intern.get(t).copied().unwrap_or(u32::MAX);
            }
            let mut heap = BinaryHeap::new();
            let try_add = |syms: &[Sym], heap: &mut BinaryHeap<BpeBigram>, l: i32, r: i32| {
                if l < 0 || r < 0 {
                    return;
                }
                let (a, b) = (syms[l as usize], syms[r as usize]);
                if let Some(&(rank, merged)) = self.merges.get(&(a.id, b.id)) {
                    heap.push(BpeBigram {
                        key: std::cmp::Reverse((rank, l as usize)),
                        right: r as usize,
                        lsize: a.n,
                        rsize: b.n,
                        merged,
                    });
                }
            };
            for i in 1..syms.len() {
                try_add(&syms, &mut heap, i as i32 - 1, i as i32);
            }
            while let Some(bg) = heap.pop() {
                let left = bg.key.0 .1;
                let (l, r) = (syms[left], syms[bg.right]);
                // stale: one side changed since the pair was queued
                if l.n == 0
                    || r.n == 0
                    || l.n != bg.lsize
                    || r.n != bg.rsize
                    || l.next != bg.right as i32
                {
                    continue;
                }
                syms[left].n += r.n;
                syms[left].id = bg.merged;
                syms[bg.right].n = 0;
                syms[left].next = r.next;
                if r.next >= 0 {
                    syms[r.next as usize].prev = left as i32;
                }
                try_add(&syms, &mut heap, l.prev, left as i32);
                try_add(&syms, &mut heap, left as i32, r.next);
            }
            for sym in syms.iter().filter(|s| s.n > 0) {
                if (sym.id as usize) < self.tokens.len() {
                    out.push(sym.id);
                    continue;
                }
                for &b in &w[sym.start..sym.start + sym.n] {
                    let id = if pre.byte_encode {
                        std::str::from_utf8(&[b])
                            .ok()
                            .and_then(|s| self.text_to_token(s))
                    } else {
                        self.text_to_token(&format!("<0x{b:02X}>"))
                    };
                    out.extend(id);
                }
            }
        }
    }
}
