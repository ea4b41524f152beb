//! Unicode helpers with exactly the classification llama.cpp's tokenizer uses: general-category
//! flags per code point (from the generated [`crate::unicode_table`]), its whitespace set, and the
//! GPT-2 byte <-> printable-character mapping.

use crate::unicode_table::CATEGORY_RANGES;
use std::sync::OnceLock;

/// Category and helper flags of one code point (bit layout as in llama.cpp's `unicode_cpt_flags`;
/// an all-zero value means "outside the text", used by the splitters as a sentinel).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CptFlags(pub u16);

impl CptFlags {
    pub const UNDEFINED: u16 = 0x01;
    pub const NUMBER: u16 = 0x02;
    pub const LETTER: u16 = 0x04;
    pub const SEPARATOR: u16 = 0x08;
    pub const MARK: u16 = 0x10;
    pub const PUNCTUATION: u16 = 0x20;
    pub const SYMBOL: u16 = 0x40;
    pub const CONTROL: u16 = 0x80;
    pub const WHITESPACE: u16 = 0x100;

    #[inline]
    pub fn is_number(self) -> bool {
        self.0 & Self::NUMBER != 0
    }
    #[inline]
    pub fn is_letter(self) -> bool {
        self.0 & Self::LETTER != 0
    }
    #[inline]
    pub fn is_mark(self) -> bool {
        self.0 & Self::MARK != 0
    }
    #[inline]
    pub fn is_whitespace(self) -> bool {
        self.0 & Self::WHITESPACE != 0
    }
    /// Any flag set (i.e. a real code point, not the out-of-range sentinel).
    #[inline]
    pub fn any(self) -> bool {
        self.0 != 0
    }
    /// The general-category part (low byte).
    #[inline]
    pub fn category(self) -> u16 {
        self.0 & 0xFF
    }
}

/// llama.cpp's whitespace set (Unicode White_Space).
const WHITESPACE: [u32; 25] = [
    0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, 0x2000, 0x2001, 0x2002, 0x2003, 0x2004,
    0x2005, 0x2006, 0x2007, 0x2008, 0x2009, 0x200A, 0x2028, 0x2029, 0x202F, 0x205F, 0x3000,
];

fn is_ws_cpt(c: u32) -> bool {
    WHITESPACE.binary_search(&c).is_ok()
}

fn ascii_table() -> &'static [CptFlags; 128] {
    static T: OnceLock<[CptFlags; 128]> = OnceLock::new();
    T.get_or_init(|| {
        let mut t = [CptFlags(0); 128];
        for (c, f) in t.iter_mut().enumerate() {
            *f = flags_slow(c as u32);
        }
        t
    })
}

fn flags_slow(c: u32) -> CptFlags {
    if c >= 0x110000 {
        return CptFlags(CptFlags::UNDEFINED);
    }
    let i = CATEGORY_RANGES.partition_point(|&(start, _)| start <= c) - 1;
    let mut f = CATEGORY_RANGES[i].1 as u16;
    if is_ws_cpt(c) {
        f |= CptFlags::WHITESPACE;
    }
    CptFlags(f)
}

/// Flags of a code point.
#[inline]
pub fn flags(c: u32) -> CptFlags {
    if c < 128 {
        ascii_table()[c as usize]
    } else {
        flags_slow(c)
    }
}

/// The code points of a string.
pub fn cpts(s: &str) -> Vec<u32> {
    s.chars().map(|c| c as u32).collect()
}

/// Length of the UTF-8 sequence started by lead byte `b` (llama.cpp's lookup: continuation and
/// invalid lead bytes count as 1).
#[inline]
pub fn utf8_len(b: u8) -> usize {
    const LOOKUP: [usize; 16] = [1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4];
    LOOKUP[(b >> 4) as usize]
}

/// GPT-2 byte-level mapping: every byte to a printable code point, and back.
pub struct ByteMap {
    pub to_char: [char; 256],
    pub from_char: std::collections::HashMap<char, u8>,
}

/// The GPT-2 byte mapping: printable Latin-1 bytes map to themselves, the rest to U+0100.. in
/// byte order.
pub fn byte_map() -> &'static ByteMap {
    static M: OnceLock<ByteMap> = OnceLock::new();
    M.get_or_init(|| {
        let mut to_char = ['\0'; 256];
        let mut direct = [false; 256];
        for b in (0x21..=0x7E).chain(0xA1..=0xAC).chain(0xAE..=0xFF) {
            direct[b] = true;
        }
        let mut n = 0u32;
        for b in 0..256usize {
            to_char[b] = if direct[b] {
                char::from_u32(b as u32).unwrap()
            } else {
                n += 1;
                char::from_u32(255 + n).unwrap()
            };
        }
        let from_char = to_char
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();
        ByteMap { to_char, from_char }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn categories() {
        assert!(flags('a' as u32).is_letter());
        assert!(flags('7' as u32).is_number());
        assert!(flags(' ' as u32).is_whitespace());
        assert!(flags(0x3000).is_whitespace());
        assert!(flags('é' as u32).is_letter());
        assert!(flags('中' as u32).is_letter());
        assert!(flags(0x0301).is_mark());
        assert_eq!(flags('!' as u32).category(), CptFlags::PUNCTUATION);
        assert_eq!(flags('$' as u32).category(), CptFlags::SYMBOL);
        assert_eq!(flags(0x1F600).category(), CptFlags::SYMBOL);
        assert_eq!(flags(0x0378).category(), CptFlags::UNDEFINED);
    }

    #[test]
    fn gpt2_bytes() {
        let m = byte_map();
        assert_eq!(m.to_char[b' ' as usize], 'Ġ');
        assert_eq!(m.to_char[b'\n' as usize], 'Ċ');
        assert_eq!(m.to_char[b'a' as usize], 'a');
        assert_eq!(m.from_char[&'Ġ'], b' ');
        assert_eq!(m.from_char.len(), 256);
    }
}
