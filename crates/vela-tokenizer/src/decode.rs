//! Decoding (ids -> bytes) for GGUF vocabularies, matching llama.cpp's `token_to_piece` and
//! `detokenize`, plus a streaming UTF-8-safe detokenizer.

use crate::unicode::byte_map;
use crate::vocab::{attr, Vocab, VocabType};

/// Parse the `XX` of a `<0xXX>` byte token.
fn hex_byte(text: &str) -> u8 {
    text.get(3..5)
        .and_then(|h| u8::from_str_radix(h, 16).ok())
        .unwrap_or(0)
}

impl Vocab {
    /// The raw bytes a token stands for. Control and unknown tokens render as their text only
    /// when `special` (empty otherwise); byte tokens give their byte; `▁` becomes a space (SPM);
    /// GPT-2 byte characters map back to bytes. Out-of-range ids give nothing.
    pub fn token_to_piece(&self, id: u32, special: bool) -> Vec<u8> {
        let Some(tok) = self.tokens.get(id as usize) else {
            return Vec::new();
        };
        let a = tok.attr;
        let special_attr = attr::UNKNOWN | attr::CONTROL;
        if !special && a & special_attr != 0 {
            return Vec::new();
        }
        if a & (special_attr | attr::USER_DEFINED) != 0 {
            return tok.text.as_bytes().to_vec();
        }
        if a & attr::NORMAL != 0 {
            if self.kind == VocabType::Spm || self.escape_whitespaces {
                return tok.text.replace('\u{2581}', " ").into_bytes();
            }
            return decode_gpt2_text(&tok.text);
        }
        if a & attr::BYTE != 0 {
            return vec![hex_byte(&tok.text)];
        }
        Vec::new()
    }

    /// llama.cpp's `detokenize`: concatenated pieces, optionally dropping a leading BOS and a
    /// trailing EOS (`remove_special`), the first piece's leading space for space-prefix
    /// vocabularies, and applying the "clean up tokenization spaces" rules.
    pub fn detokenize(&self, ids: &[u32], remove_special: bool, unparse_special: bool) -> Vec<u8> {
        let mut ids = ids;
        let mut remove_space = self.add_space_prefix;
        if remove_special && self.add_bos && !ids.is_empty() && Some(ids[0]) == self.special.bos {
            remove_space = false;
            ids = &ids[1..];
        }
        if remove_special
            && self.add_eos
            && ids.last().is_some_and(|&l| Some(l) == self.special.eos)
        {
            ids = &ids[..ids.len() - 1];
        }
        let mut text = Vec::new();
        for &id in ids {
            let piece = self.token_to_piece(id, unparse_special);
            let skip = usize::from(remove_space && piece.first() == Some(&b' '));
            text.extend_from_slice(&piece[skip..]);
            remove_space = false;
        }
        if self.clean_spaces {
            clean_up_spaces(&mut text);
        }
        text
    }
}

/// Map GPT-2 printable characters back to bytes; characters outside the mapping are rendered as
/// llama.cpp does (`[UNK_BYTE_0x..<text>]`).
fn decode_gpt2_text(text: &str) -> Vec<u8> {
    let map = byte_map();
    let mut out = Vec::with_capacity(text.len());
    for c in text.chars() {
        match map.from_char.get(&c) {
            Some(&b) => out.push(b),
            None => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}

/// llama.cpp's three clean-up passes: drop the space before `?!.,`, around a lone `'`, and
/// before `'s`, `'m`, `'re`, `'ve`.
fn clean_up_spaces(t: &mut Vec<u8>) {
    // pass 1: " ?", " !", " .", " ,"
    let mut out: Vec<u8> = Vec::with_capacity(t.len());
    for (i, &x) in t.iter().enumerate() {
        if i > 0 && t[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            out.pop();
        }
        out.push(x);
    }
    // pass 2: " ' " -> "'"
    let src = std::mem::take(&mut out);
    let mut i = 0;
    while i < src.len() {
        let x = src[i];
        if i > 0 && x == b'\'' && i + 1 < src.len() && src[i - 1] == b' ' && src[i + 1] == b' ' {
            out.pop();
            out.push(x);
            i += 2;
            continue;
        }
        out.push(x);
        i += 1;
    }
    // pass 3: " 's", " 'm", " 're", " 've"
    let src = std::mem::take(&mut out);
    for (i, &x) in src.iter().enumerate() {
        if i > 0 && src[i - 1] == b' ' && x == b'\'' && i + 1 < src.len() {
            let x1 = src[i + 1];
            let x2 = src.get(i + 2).copied();
            let drop = matches!(x1, b's' | b'm')
                || (i + 2 < src.len()
                    && matches!((x1, x2), (b'r', Some(b'e')) | (b'v', Some(b'e'))));
            if drop {
                out.pop();
            }
        }
        out.push(x);
    }
    *t = out;
}

/// Streaming detokenizer: feed ids one at a time, get back only complete UTF-8 text. Bytes of a
/// character split across tokens (byte-fallback tokens, GPT-2 byte pieces) are held back until
/// the character is complete; invalid sequences become U+FFFD.
pub struct Detokenizer<'a> {
    piece: Box<dyn Fn(u32) -> Vec<u8> + 'a>,
    pending: Vec<u8>,
}

impl<'a> Detokenizer<'a> {
    /// A detokenizer over a piece function (`id -> raw bytes`).
    pub fn new(piece: impl Fn(u32) -> Vec<u8> + 'a) -> Self {
        Detokenizer {
            piece: Box::new(piece),
            pending: Vec::new(),
        }
    }

    /// Add one token; returns the text that became complete.
    pub fn push(&mut self, id: u32) -> String {
        let bytes = (self.piece)(id);
        self.push_bytes(&bytes)
    }

    /// Add raw bytes; returns the text that became complete.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    out.push_str(std::str::from_utf8(&self.pending[..good]).unwrap_or_default());
                    match e.error_len() {
                        // incomplete sequence at the end: keep it for the next token
                        None => {
                            self.pending.drain(..good);
                            return out;
                        }
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..good + bad);
                        }
                    }
                }
            }
        }
    }

    /// Bytes held back waiting for the rest of a character.
    pub fn pending(&self) -> &[u8] {
        &self.pending
    }

    /// End of stream: anything still held back is emitted (lossily).
    pub fn flush(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clean_spaces_rules() {
        let mut t = b"Hello , world ! It 's a ' test ' you 're".to_vec();
        clean_up_spaces(&mut t);
        assert_eq!(
            String::from_utf8(t).unwrap(),
            "Hello, world! It's a'test'you're"
        );
    }

    #[test]
    fn streaming_holds_partial_chars() {
        let mut d = Detokenizer::new(|_| Vec::new());
        // "é" = C3 A9, "😀" = F0 9F 98 80
        assert_eq!(d.push_bytes(b"a\xC3"), "a");
        assert_eq!(d.pending(), b"\xC3");
        assert_eq!(d.push_bytes(b"\xA9\xF0\x9F"), "é");
        assert_eq!(d.push_bytes(b"\x98"), "");
        assert_eq!(d.push_bytes(b"\x80!"), "😀!");
        assert_eq!(d.push_bytes(b"\xFFx\xE4"), "\u{FFFD}x");
        assert_eq!(d.flush(), "\u{FFFD}");
    }
}
