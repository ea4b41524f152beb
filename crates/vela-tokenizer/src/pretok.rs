//! Pre-tokenizers: split text into words before BPE, exactly as llama.cpp 0c1e570 does for each
//! `tokenizer.ggml.pre` value.
//!
//! llama.cpp describes a pre-tokenizer as a list of regexes applied in sequence: each regex
//! splits every current piece into its matches *and* the gaps between them (gaps are kept as
//! pieces). The common GPT-2 / llama3 / qwen2 patterns are hand-written scanners there (and here);
//! the remaining regexes run through `std::regex` on a transformed text:
//! - patterns with `\p{..}` classes run on a "collapsed" text where every code point >= 128 is
//!   replaced by one byte for its category (whitespace -> 0x0B, number 0xD1, letter 0xD2,
//!   punctuation 0xD3, mark 0xD4, symbol 0xD5, anything else 0xD0), ASCII kept as is;
//! - other patterns run on the code points with non-ASCII whitespace replaced by 0x0B.
//!
//! Every regex used by a supported pre-tokenizer is simple enough to be implemented here as a
//! small scanner over that transformed text (`Split::*` below), which reproduces the ECMAScript
//! leftmost-greedy match semantics for that particular pattern.

use crate::unicode::{flags, CptFlags};
use anyhow::{bail, Result};

/// One splitting step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`
    Gpt2,
    /// llama3's pattern (`\p{N}{1,3}`, case-insensitive contractions, `\s*[\r\n]+`).
    Llama3,
    /// qwen2's pattern (llama3 with single digits).
    Qwen2,
    /// qwen3.5's pattern (qwen2 with marks joining letters).
    Qwen35,
    /// `[^\n]+|[\n]+`
    Newlines,
    /// A regex scanner on the collapsed (`collapsed = true`) or whitespace-mapped text.
    Scan {
        collapsed: bool,
        kind: ScanKind,
        class: Class,
    },
}

/// Shapes of the simple regexes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScanKind {
    /// `X+`
    Runs,
    /// `X`
    Single,
    /// `\s?X+`
    OptSpaceRuns,
    /// `\s+$`
    TrailingSpace,
    /// `[0-9][0-9][0-9]`
    AsciiTriples,
    /// `X{1,3}`
    UpToThree,
    /// deepseek-v3's word pattern (see [`deepseek3_at`]); the class is unused.
    Deepseek3,
}

/// Character classes of the simple regexes (tested on transformed text values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    None,
    /// `[\p{P}\$\+<=>\^~\|]` (with a backquote too when `backquote`).
    PunctSym {
        backquote: bool,
    },
    /// `\p{N}`
    Number,
    /// `\p{L}`
    Letter,
    /// `\p{P}`
    Punct,
    /// `[\r\n]`
    CrLf,
    /// `[一-龥ࠀ-一가-퟿]`
    Cjk,
    /// deepseek-llm's explicit letter ranges.
    DeepseekLetter,
    /// deepseek-llm's explicit punctuation ranges `[!-/:-~！-／：-～‘-‟　-。]`.
    DeepseekPunct,
    /// deepseek-v3's `[一-龥぀-ゟ゠-ヿ]`: CJK ideographs, hiragana, katakana.
    CjkKana,
}

const COLL_WS: u32 = 0x0B;
const COLL_NUMBER: u32 = 0xD1;
const COLL_LETTER: u32 = 0xD2;
const COLL_PUNCT: u32 = 0xD3;
const COLL_MARK: u32 = 0xD4;
const COLL_SYMBOL: u32 = 0xD5;
const COLL_OTHER: u32 = 0xD0;

/// ASCII members of `\p{P}` in llama.cpp's collapsed regex: `!-#%-*,-/:-;?-@[-]_{}`.
fn ascii_punct(v: u32) -> bool {
    matches!(v, 0x21..=0x23 | 0x25..=0x2A | 0x2C..=0x2F | 0x3A..=0x3B | 0x3F..=0x40 | 0x5B..=0x5D | 0x5F | 0x7B | 0x7D)
}

const DEEPSEEK_LETTER: [(u32, u32); 87] = [
    (0x41, 0x5A),
    (0x61, 0x7A),
    (0xB5, 0xB5),
    (0xC0, 0xD6),
    (0xD8, 0xF6),
    (0xF8, 0x1BA),
    (0x1BC, 0x1BF),
    (0x1C4, 0x293),
    (0x295, 0x2AF),
    (0x370, 0x373),
    (0x376, 0x376),
    (0x377, 0x377),
    (0x37B, 0x37D),
    (0x37F, 0x37F),
    (0x386, 0x386),
    (0x388, 0x38A),
    (0x38C, 0x38C),
    (0x38E, 0x3A1),
    (0x3A3, 0x3F5),
    (0x3F7, 0x481),
    (0x48A, 0x52F),
    (0x531, 0x556),
    (0x10A0, 0x10C5),
    (0x13A0, 0x13F5),
    (0x13F8, 0x13FD),
    (0x1C90, 0x1CBA),
    (0x1CBD, 0x1CBF),
    (0x1D00, 0x1D2B),
    (0x1D6B, 0x1D77),
    (0x1D79, 0x1D9A),
    (0x1E00, 0x1F15),
    (0x1F18, 0x1F1D),
    (0x1F20, 0x1F45),
    (0x1F48, 0x1F4D),
    (0x1F50, 0x1F57),
    (0x1F59, 0x1F59),
    (0x1F5B, 0x1F5B),
    (0x1F5D, 0x1F5D),
    (0x1F5F, 0x1F7D),
    (0x1F80, 0x1FB4),
    (0x1FB6, 0x1FBC),
    (0x1FBE, 0x1FBE),
    (0x1FC2, 0x1FC4),
    (0x1FC6, 0x1FCC),
    (0x1FD0, 0x1FD3),
    (0x1FD6, 0x1FDB),
    (0x1FE0, 0x1FEC),
    (0x1FF2, 0x1FF4),
    (0x1FF6, 0x1FFC),
    (0x2102, 0x2102),
    (0x2107, 0x2107),
    (0x210A, 0x2113),
    (0x2115, 0x2115),
    (0x2119, 0x211D),
    (0x2124, 0x2124),
    (0x2126, 0x2126),
    (0x2128, 0x2128),
    (0x212A, 0x212D),
    (0x212F, 0x2134),
    (0x2139, 0x2139),
    (0x213C, 0x213F),
    (0x2145, 0x2149),
    (0x214E, 0x214E),
    (0x2183, 0x2183),
    (0x2184, 0x2184),
    (0x2C00, 0x2C7B),
    (0x2C7E, 0x2CE4),
    (0x2CEB, 0x2CEE),
    (0x2CF2, 0x2CF2),
    (0x2CF3, 0x2CF3),
    (0xA640, 0xA66D),
    (0xA680, 0xA69B),
    (0xA722, 0xA76F),
    (0xA771, 0xA787),
    (0xA78B, 0xA78E),
    (0xAB70, 0xABBF),
    (0xFB00, 0xFB06),
    (0xFB13, 0xFB17),
    (0xFF21, 0xFF3A),
    (0xFF41, 0xFF5A),
    (0x10400, 0x1044F),
    (0x104B0, 0x104D3),
    (0x104D8, 0x104FB),
    (0x10C80, 0x10CB2),
    (0x10CC0, 0x10CF2),
    (0x118A0, 0x118DF),
    (0x1E900, 0x1E943),
];

const DEEPSEEK_PUNCT: [(u32, u32); 6] = [
    (0x21, 0x2F),
    (0x3A, 0x7E),
    (0xFF01, 0xFF0F),
    (0xFF1A, 0xFF5E),
    (0x2018, 0x201F),
    (0x3000, 0x3002),
];

fn in_ranges(v: u32, r: &[(u32, u32)]) -> bool {
    r.iter().any(|&(a, b)| a <= v && v <= b)
}

impl Class {
    fn test(self, v: u32) -> bool {
        match self {
            Class::None => false,
            Class::PunctSym { backquote } => {
                v == COLL_PUNCT
                    || ascii_punct(v)
                    || matches!(v, 0x24 | 0x2B | 0x3C..=0x3E | 0x5E | 0x7E | 0x7C)
                    || (backquote && v == 0x60)
            }
            Class::Number => v == COLL_NUMBER || (0x30..=0x39).contains(&v),
            Class::Letter => {
                v == COLL_LETTER || (0x41..=0x5A).contains(&v) || (0x61..=0x7A).contains(&v)
            }
            Class::Punct => v == COLL_PUNCT || ascii_punct(v),
            Class::CrLf => v == 0x0D || v == 0x0A,
            Class::Cjk => {
                (0x4E00..=0x9FA5).contains(&v)
                    || (0x0800..=0x4E00).contains(&v)
                    || (0xAC00..=0xD7FF).contains(&v)
            }
            Class::DeepseekLetter => in_ranges(v, &DEEPSEEK_LETTER),
            Class::DeepseekPunct => in_ranges(v, &DEEPSEEK_PUNCT),
            Class::CjkKana => (0x4E00..=0x9FA5).contains(&v) || (0x3040..=0x30FF).contains(&v),
        }
    }
}

/// `\s` of `std::regex` in the C locale, on transformed text.
fn regex_space(v: u32) -> bool {
    (0x09..=0x0D).contains(&v) || v == 0x20
}

/// Settings derived from `tokenizer.ggml.pre` (see llama.cpp's vocab loader).
#[derive(Clone, Debug)]
pub struct PreTokenizer {
    pub name: String,
    pub splits: Vec<Split>,
    /// Map bytes to GPT-2 printable characters (false for SPM-style BPE like gemma4).
    pub byte_encode: bool,
    /// Whole words found in the vocabulary skip the merges.
    pub ignore_merges: bool,
    /// Replace spaces by U+2581 before splitting (gemma4).
    pub escape_whitespaces: bool,
    /// Detokenizer cleanup of " ." etc.
    pub clean_spaces: bool,
    /// Forces `add_bos` (before the GGUF key is applied).
    pub add_bos: bool,
    /// The loader clears the BOS id (chatglm).
    pub no_bos: bool,
}

impl PreTokenizer {
    /// Settings for a byte-level BPE vocabulary with pre-tokenizer `pre` ("" = default).
    pub fn for_bpe(pre: &str) -> Result<PreTokenizer> {
        use Split::*;
        let scan = |collapsed, kind, class| Scan {
            collapsed,
            kind,
            class,
        };
        let default = vec![
            scan(true, ScanKind::Runs, Class::PunctSym { backquote: false }),
            Gpt2,
            scan(true, ScanKind::Runs, Class::Number),
            scan(false, ScanKind::AsciiTriples, Class::None),
        ];
        let starcoder = vec![scan(true, ScanKind::Single, Class::Number), Gpt2];
        let mut p = PreTokenizer {
            name: if pre.is_empty() {
                "default".into()
            } else {
                pre.into()
            },
            splits: Vec::new(),
            byte_encode: true,
            ignore_merges: false,
            escape_whitespaces: false,
            clean_spaces: true,
            add_bos: false,
            no_bos: false,
        };
        p.splits = match pre {
            "" | "default" => default,
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral"
            | "midm-2.0" | "lfm2" | "jina-v5-nano" => {
                p.ignore_merges = true;
                p.add_bos = true;
                vec![Llama3]
            }
            "dbrx" | "smaug-bpe" => vec![Llama3],
            "chatglm-bpe" | "glm4" | "glm5" => {
                p.no_bos = true;
                p.ignore_merges = pre != "chatglm-bpe";
                vec![Llama3]
            }
            "deepseek-llm" => {
                p.clean_spaces = false;
                vec![
                    scan(false, ScanKind::Single, Class::CrLf),
                    scan(false, ScanKind::OptSpaceRuns, Class::DeepseekLetter),
                    scan(false, ScanKind::OptSpaceRuns, Class::DeepseekPunct),
                    scan(false, ScanKind::TrailingSpace, Class::None),
                    scan(false, ScanKind::Runs, Class::Cjk),
                    scan(true, ScanKind::Runs, Class::Number),
                ]
            }
            // llama.cpp's DEEPSEEK3_LLM regexes (HUNYUAN_DENSE, JOYAI_LLM and HY_V4 share them).
            "deepseek-v3" | "hunyuan-dense" | "joyai-llm" | "hy_v4" => {
                p.clean_spaces = false;
                vec![
                    scan(true, ScanKind::UpToThree, Class::Number),
                    scan(false, ScanKind::Runs, Class::CjkKana),
                    scan(true, ScanKind::Deepseek3, Class::None),
                ]
            }
            "deepseek-coder" => {
                p.clean_spaces = false;
                vec![
                    scan(false, ScanKind::Single, Class::CrLf),
                    scan(true, ScanKind::OptSpaceRuns, Class::Letter),
                    scan(true, ScanKind::OptSpaceRuns, Class::Punct),
                    scan(false, ScanKind::Runs, Class::Cjk),
                    scan(true, ScanKind::Single, Class::Number),
                ]
            }
            "falcon" => vec![
                scan(true, ScanKind::Runs, Class::PunctSym { backquote: true }),
                Gpt2,
                scan(false, ScanKind::AsciiTriples, Class::None),
            ],
            "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" | "mellum2" => starcoder,
            "command-r" | "smollm" => {
                p.clean_spaces = false;
                starcoder
            }
            "gpt-2" | "phi-2" | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es"
            | "jina-v2-de" | "a.x-4.0" | "mellum" | "modern-bert" | "jina-v1-en"
            | "jina-v2-code" | "roberta-bpe" | "mpt" | "olmo" | "jais" | "exaone4" => vec![Gpt2],
            "trillion" | "granite-docling" => {
                p.clean_spaces = false;
                vec![Gpt2]
            }
            "stablelm2" | "megrez" => vec![Qwen2],
            "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "hunyuan" | "solar-open"
            | "grok-2" => {
                p.clean_spaces = false;
                vec![Qwen2]
            }
            "qwen35" => {
                p.clean_spaces = false;
                vec![Qwen35]
            }
            "gemma4" | "granite-embed-multi-311m" | "sarvam-moe" => {
                p.escape_whitespaces = true;
                p.byte_encode = false;
                p.clean_spaces = pre != "sarvam-moe";
                vec![Newlines]
            }
            other => bail!("unsupported pre-tokenizer type '{other}'"),
        };
        Ok(p)
    }

    /// Gemma 4's pre-tokenizer type (llama.cpp's `LLAMA_VOCAB_PRE_TYPE_GEMMA4`).
    pub fn is_gemma4(&self) -> bool {
        self.name == "gemma4" || self.name == "granite-embed-multi-311m"
    }

    /// Split `text` into words (GPT-2 byte-encoded when `byte_encode`).
    pub fn split(&self, text: &str) -> Vec<String> {
        let cpts: Vec<u32> = text.chars().map(|c| c as u32).collect();
        let mut offsets = vec![cpts.len()];
        let mut collapsed: Option<Vec<u32>> = None;
        let mut wide: Option<Vec<u32>> = None;
        for split in &self.splits {
            offsets = match *split {
                Split::Scan {
                    collapsed: true,
                    kind,
                    class,
                } => {
                    let subj = collapsed.get_or_insert_with(|| collapse(&cpts));
                    scan_split(subj, &offsets, kind, class)
                }
                Split::Scan {
                    collapsed: false,
                    kind,
                    class,
                } => {
                    let subj = wide.get_or_insert_with(|| widen(&cpts));
                    scan_split(subj, &offsets, kind, class)
                }
                custom => custom_split(&cpts, &offsets, custom),
            };
        }
        let map = crate::unicode::byte_map();
        let mut words = Vec::with_capacity(offsets.len());
        let mut start = 0;
        let mut buf = [0u8; 4];
        for len in offsets {
            let mut w = String::new();
            for &c in &cpts[start..start + len] {
                let ch = char::from_u32(c).unwrap_or('\u{FFFD}');
                if self.byte_encode {
                    for &b in ch.encode_utf8(&mut buf).as_bytes() {
                        w.push(map.to_char[b as usize]);
                    }
                } else {
                    w.push(ch);
                }
            }
            words.push(w);
            start += len;
        }
        words
    }
}

fn collapse(cpts: &[u32]) -> Vec<u32> {
    cpts.iter()
        .map(|&c| {
            if c < 128 {
                return c;
            }
            let f = flags(c);
            if f.is_whitespace() {
                return COLL_WS;
            }
            match f.category() {
                CptFlags::NUMBER => COLL_NUMBER,
                CptFlags::LETTER => COLL_LETTER,
                CptFlags::PUNCTUATION => COLL_PUNCT,
                CptFlags::MARK => COLL_MARK,
                CptFlags::SYMBOL => COLL_SYMBOL,
                _ => COLL_OTHER,
            }
        })
        .collect()
}

fn widen(cpts: &[u32]) -> Vec<u32> {
    cpts.iter()
        .map(|&c| {
            if c > 0x7F && flags(c).is_whitespace() {
                COLL_WS
            } else {
                c
            }
        })
        .collect()
}

/// Leftmost match of the simple regex in `s` at or after `pos`, as (start, end), never empty.
fn find(s: &[u32], pos: usize, kind: ScanKind, class: Class) -> Option<(usize, usize)> {
    let run_end = |mut i: usize| {
        while i < s.len() && class.test(s[i]) {
            i += 1;
        }
        i
    };
    match kind {
        ScanKind::Runs => (pos..s.len())
            .find(|&i| class.test(s[i]))
            .map(|i| (i, run_end(i))),
        ScanKind::Single => (pos..s.len())
            .find(|&i| class.test(s[i]))
            .map(|i| (i, i + 1)),
        ScanKind::OptSpaceRuns => (pos..s.len()).find_map(|i| {
            if regex_space(s[i]) && i + 1 < s.len() && class.test(s[i + 1]) {
                Some((i, run_end(i + 1)))
            } else if class.test(s[i]) {
                Some((i, run_end(i)))
            } else {
                None
            }
        }),
        ScanKind::TrailingSpace => {
            let mut i = s.len();
            while i > pos && regex_space(s[i - 1]) {
                i -= 1;
            }
            (i < s.len()).then_some((i, s.len()))
        }
        ScanKind::AsciiTriples => (pos..s.len().saturating_sub(2))
            .find(|&i| s[i..i + 3].iter().all(|&v| (0x30..=0x39).contains(&v)))
            .map(|i| (i, i + 3)),
        ScanKind::UpToThree => (pos..s.len())
            .find(|&i| class.test(s[i]))
            .map(|i| (i, run_end(i).min(i + 3))),
        ScanKind::Deepseek3 => (pos..s.len()).find_map(|i| deepseek3_at(s, i).map(|e| (i, e))),
    }
}

/// The match at `i` (its end) of deepseek-v3's word pattern on collapsed text, alternatives
/// tried in order as ECMAScript does:
/// `[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+` | `[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+` |
/// ` ?[\p{P}\p{S}]+[\r\n]*` | `\s*[\r\n]+` | `\s+(?!\S)` | `\s+`.
fn deepseek3_at(s: &[u32], i: usize) -> Option<usize> {
    let at = |k: usize| s.get(k).copied();
    let alpha = |v: u32| (0x41..=0x5A).contains(&v) || (0x61..=0x7A).contains(&v);
    let letter = |v: u32| v == COLL_LETTER || alpha(v);
    let punct = |v: u32| Class::Punct.test(v);
    let symbol = |v: u32| {
        v == COLL_SYMBOL || matches!(v, 0x24 | 0x2B | 0x3C..=0x3E | 0x5E | 0x60 | 0x7C | 0x7E)
    };
    let crlf = |v: u32| v == 0x0D || v == 0x0A;
    let run = |mut k: usize, f: &dyn Fn(u32) -> bool| {
        while at(k).is_some_and(f) {
            k += 1;
        }
        k
    };
    let c0 = at(i)?;
    let c1 = at(i + 1);
    // An ASCII punctuation mark or symbol glued to ASCII letters.
    if (0x21..=0x7E).contains(&c0)
        && !alpha(c0)
        && !(0x30..=0x39).contains(&c0)
        && c1.is_some_and(alpha)
    {
        return Some(run(i + 1, &alpha));
    }
    // Letters and marks, with one other leading code point.
    let lm = |v: u32| letter(v) || v == COLL_MARK;
    let lead = !(crlf(c0) || letter(c0) || punct(c0) || symbol(c0));
    if lead && c1.is_some_and(lm) {
        return Some(run(i + 1, &lm));
    }
    if lm(c0) {
        return Some(run(i, &lm));
    }
    // Punctuation and symbols, with one leading space, then line breaks.
    let ps = |v: u32| punct(v) || symbol(v);
    let start = if c0 == 0x20 && c1.is_some_and(ps) {
        Some(i + 1)
    } else if ps(c0) {
        Some(i)
    } else {
        None
    };
    if let Some(k) = start {
        return Some(run(run(k, &ps), &crlf));
    }
    if !regex_space(c0) {
        return None;
    }
    // The whitespace alternatives.
    let j = run(i, &regex_space);
    if let Some(k) = (i..j).rev().find(|&k| crlf(s[k])) {
        return Some(k + 1);
    }
    Some(if j - i > 1 && j < s.len() { j - 1 } else { j })
}

/// Apply one simple regex to every piece: matches and the gaps between them become pieces.
fn scan_split(subject: &[u32], offsets: &[usize], kind: ScanKind, class: Class) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let s = &subject[start..start + len];
        let mut last = 0;
        while let Some((a, b)) = find(s, last, kind, class) {
            if a > last {
                out.push(a - last);
            }
            out.push(b - a);
            last = b;
        }
        if last < len {
            out.push(len - last);
        }
        start += len;
    }
    out
}

const OOR: u32 = u32::MAX;

/// One piece being scanned by a hand-written splitter.
struct Piece<'a> {
    cpts: &'a [u32],
    ini: usize,
    end: usize,
    prev_end: usize,
    out: &'a mut Vec<usize>,
}

impl Piece<'_> {
    #[inline]
    fn cpt(&self, pos: usize) -> u32 {
        if self.ini <= pos && pos < self.end {
            self.cpts[pos]
        } else {
            OOR
        }
    }
    #[inline]
    fn fl(&self, pos: usize) -> CptFlags {
        if self.ini <= pos && pos < self.end {
            flags(self.cpts[pos])
        } else {
            CptFlags(0)
        }
    }
    /// Close the current word at `end`; returns its length.
    fn add(&mut self, end: usize) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            self.out.push(len);
        }
        self.prev_end = end;
        len
    }

    /// `'s|'t|'re|'ve|'m|'ll|'d` (ASCII case-insensitive when `ci`); returns the new position.
    fn contraction(&mut self, pos: usize, ci: bool) -> Option<usize> {
        if self.cpt(pos) != '\'' as u32 || pos + 1 >= self.end {
            return None;
        }
        let low = |c: u32| {
            if ci && (0x41..=0x5A).contains(&c) {
                c + 32
            } else {
                c
            }
        };
        let n = low(self.cpt(pos + 1));
        if [b's', b't', b'm', b'd'].iter().any(|&b| n == b as u32) {
            return Some(pos + self.add(pos + 2));
        }
        if pos + 2 < self.end {
            let nn = low(self.cpt(pos + 2));
            let pair = |a: u8, b: u8| n == a as u32 && nn == b as u32;
            if pair(b'r', b'e') || pair(b'v', b'e') || pair(b'l', b'l') {
                return Some(pos + self.add(pos + 3));
            }
        }
        None
    }

    /// The whitespace tail shared by llama3/qwen2/qwen35: `\s*[\r\n]+|\s+(?!\S)|\s+`, else one
    /// code point. Returns the new position.
    fn whitespace_tail(&mut self, mut pos: usize, crlf_rule: bool) -> usize {
        let mut n = 0;
        let mut last_crlf = 0;
        while self.fl(pos + n).is_whitespace() {
            let c = self.cpt(pos + n);
            if c == '\r' as u32 || c == '\n' as u32 {
                last_crlf = pos + n + 1;
            }
            n += 1;
        }
        if crlf_rule && last_crlf > 0 {
            pos = last_crlf;
        } else if n > 1 && self.cpt(pos + n) != OOR {
            pos += n - 1;
        } else if n > 0 {
            pos += n;
        } else {
            pos += 1;
        }
        self.add(pos);
        pos
    }
}

fn custom_split(cpts: &[u32], offsets: &[usize], split: Split) -> Vec<usize> {
    let mut out = Vec::with_capacity(offsets.len());
    let mut start = 0;
    for &len in offsets {
        let (ini, end) = (start, start + len);
        start = end;
        if split == Split::Newlines {
            let mut pos = ini;
            while pos < end {
                let nl = cpts[pos] == '\n' as u32;
                let run = pos;
                while pos < end && (cpts[pos] == '\n' as u32) == nl {
                    pos += 1;
                }
                out.push(pos - run);
            }
            continue;
        }
        let mut p = Piece {
            cpts,
            ini,
            end,
            prev_end: ini,
            out: &mut out,
        };
        let mut pos = ini;
        while pos < end {
            pos = match split {
                Split::Gpt2 => gpt2_step(&mut p, pos),
                Split::Llama3 => llama3_step(&mut p, pos, 3, false),
                Split::Qwen2 => llama3_step(&mut p, pos, 1, false),
                _ => llama3_step(&mut p, pos, 1, true),
            };
        }
    }
    out
}

/// One word of the GPT-2 pattern starting at `pos`; returns the next position.
fn gpt2_step(p: &mut Piece, mut pos: usize) -> usize {
    if let Some(np) = p.contraction(pos, false) {
        return np;
    }
    let cpt = p.cpt(pos);
    let sp = cpt == ' ' as u32;
    let mut f2 = if sp { p.fl(pos + 1) } else { p.fl(pos) };
    let classes: [fn(CptFlags) -> bool; 3] = [
        |f| f.is_letter(),
        |f| f.is_number(),
        |f| !(f.is_whitespace() || f.is_letter() || f.is_number()) && f.any(),
    ];
    for class in classes {
        if class(f2) {
            pos += sp as usize;
            while class(f2) {
                pos += 1;
                f2 = p.fl(pos);
            }
            p.add(pos);
            return pos;
        }
    }
    p.whitespace_tail(pos, false)
}

/// One word of the llama3-family patterns: `max_digits` is 3 for `\p{N}{1,3}` and 1 for
/// `\p{N}`; `marks` joins `\p{M}` with letters (qwen3.5).
fn llama3_step(p: &mut Piece, mut pos: usize, max_digits: usize, marks: bool) -> usize {
    if let Some(np) = p.contraction(pos, true) {
        return np;
    }
    let cpt = p.cpt(pos);
    let f = p.fl(pos);
    let letter = |f: CptFlags| f.is_letter() || (marks && f.is_mark());
    // [^\r\n\p{L}\p{N}]?\p{L}+
    if !(cpt == '\r' as u32 || cpt == '\n' as u32 || f.is_number())
        && (letter(f) || letter(p.fl(pos + 1)))
    {
        pos += 1;
        while letter(p.fl(pos)) {
            pos += 1;
        }
        p.add(pos);
        return pos;
    }
    // \p{N}{1,max}
    if f.is_number() {
        let mut run = pos;
        while p.fl(pos).is_number() {
            pos += 1;
            if pos - run >= max_digits {
                p.add(pos);
                run = pos;
            }
        }
        p.add(pos);
        return pos;
    }
    // <space>?[^\s\p{L}\p{N}]+[\r\n]*
    let sp = cpt == ' ' as u32;
    let other = |f: CptFlags| !(f.is_whitespace() || letter(f) || f.is_number());
    let mut f2 = if sp { p.fl(pos + 1) } else { f };
    if other(f2) && f.any() {
        pos += sp as usize;
        while other(f2) && f2.any() {
            pos += 1;
            f2 = p.fl(pos);
        }
        let mut c2 = p.cpt(pos);
        while c2 == '\r' as u32 || c2 == '\n' as u32 {
            pos += 1;
            c2 = p.cpt(pos);
        }
        p.add(pos);
        return pos;
    }
    p.whitespace_tail(pos, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(pre: &str, text: &str) -> Vec<String> {
        let mut p = PreTokenizer::for_bpe(pre).unwrap();
        p.byte_encode = false;
        p.split(text)
    }

    #[test]
    fn gpt2_words() {
        assert_eq!(
            words("gpt-2", "Hello world's  end  "),
            ["Hello", " world", "'s", " ", " end", "  "]
        );
        assert_eq!(words("gpt-2", "a1 22!?"), ["a", "1", " 22", "!?"]);
    }

    #[test]
    fn llama3_words() {
        assert_eq!(
            words("llama-bpe", "12345 x\n\n  y"),
            ["123", "45", " x", "\n\n", " ", " y"]
        );
        assert_eq!(words("llama-bpe", "I'M ok"), ["I", "'M", " ok"]);
    }

    #[test]
    fn default_regex_chain() {
        // punctuation runs split first, then gpt2, digit runs, ASCII triples
        assert_eq!(
            words("", "ab+=cd 12345"),
            ["ab", "+=", "cd", " ", "123", "45"]
        );
    }

    #[test]
    fn unknown_pre_is_error() {
        assert!(PreTokenizer::for_bpe("no-such-pre").is_err());
    }
}
