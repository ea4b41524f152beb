//! Vocabulary loaded from GGUF metadata, with llama.cpp's rules for defaults, special ids,
//! token attributes and the end-of-generation set.

use crate::pretok::PreTokenizer;
use anyhow::{anyhow, bail, Result};
use std::collections::{BTreeSet, HashMap};
use vela_formats::gguf::{GgufFile, Value};

/// Token attribute bits (llama.cpp's `llama_token_attr`).
pub mod attr {
    pub const UNDEFINED: u32 = 0;
    pub const UNKNOWN: u32 = 1 << 0;
    pub const UNUSED: u32 = 1 << 1;
    pub const NORMAL: u32 = 1 << 2;
    pub const CONTROL: u32 = 1 << 3;
    pub const USER_DEFINED: u32 = 1 << 4;
    pub const BYTE: u32 = 1 << 5;
    pub const NORMALIZED: u32 = 1 << 6;
    pub const LSTRIP: u32 = 1 << 7;
    pub const RSTRIP: u32 = 1 << 8;
    pub const SINGLE_WORD: u32 = 1 << 9;
}

/// The tokenization algorithm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum VocabType {
    /// SentencePiece-style (`tokenizer.ggml.model = llama`): score-driven bigram merges.
    Spm,
    /// Byte-level BPE (`gpt2`) and Gemma 4's SPM-style BPE (`gemma4`): rank-driven merges.
    Bpe,
}

/// One vocabulary entry.
#[derive(Clone, Debug)]
pub struct TokenData {
    pub text: String,
    pub score: f32,
    pub attr: u32,
}

/// Special token ids (None = absent).
#[derive(Clone, Debug, Default)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

/// Accessor of one special-id slot.
type Slot = fn(&mut SpecialIds) -> &mut Option<u32>;

/// A BPE merge: (left, right) interned ids -> (rank, interned id of the concatenation).
pub(crate) type MergeMap = HashMap<(u32, u32), (u32, u32)>;

/// A loaded vocabulary.
pub struct Vocab {
    pub kind: VocabType,
    /// `tokenizer.ggml.model`.
    pub model: String,
    /// Pre-tokenizer (BPE only).
    pub pre: Option<PreTokenizer>,
    pub tokens: Vec<TokenData>,
    pub special: SpecialIds,
    pub add_bos: bool,
    pub add_eos: bool,
    pub add_space_prefix: bool,
    pub remove_extra_whitespaces: bool,
    pub escape_whitespaces: bool,
    pub clean_spaces: bool,
    pub ignore_merges: bool,
    /// End-of-generation ids.
    pub eog: BTreeSet<u32>,
    /// Text -> id for vocabulary entries (ids < n_vocab) and, for BPE, interned merge strings
    /// (ids >= n_vocab).
    pub(crate) intern: HashMap<String, u32>,
    pub(crate) merges: MergeMap,
    /// Control / user-defined / unknown ids, longest text first (special-token partitioning).
    pub(crate) special_cache: Vec<u32>,
}

const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const FIM_PRE: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP: &[&str] = &["<|file_sep|>"];
pub(crate) const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

fn opt_bool(gf: &GgufFile, key: &str) -> Option<bool> {
    gf.get(key).and_then(Value::as_bool)
}

fn str_array<'a>(gf: &'a GgufFile, key: &str) -> Result<Option<&'a [Value]>> {
    match gf.get(key) {
        None => Ok(None),
        Some(Value::Array(a)) => Ok(Some(a)),
        Some(v) => bail!("{key}: expected an array, found {}", v.type_name()),
    }
}

impl Vocab {
    /// Number of vocabulary entries.
    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }

    /// Exact text -> token id.
    pub fn text_to_token(&self, text: &str) -> Option<u32> {
        self.intern
            .get(text)
            .copied()
            .filter(|&id| (id as usize) < self.tokens.len())
    }

    /// Attribute bits of a token (0 for out-of-range ids).
    pub fn attr(&self, id: u32) -> u32 {
        self.tokens.get(id as usize).map_or(0, |t| t.attr)
    }

    /// The vocabulary text of a token.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(|t| t.text.as_str())
    }

    /// Whether `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.contains(&id)
    }

    /// Load from GGUF metadata (model files and vocab-only files alike).
    pub fn from_gguf(gf: &GgufFile) -> Result<Vocab> {
        let model = gf
            .get("tokenizer.ggml.model")
            .and_then(Value::as_str)
            .ok_or_else(|| anyhow!("GGUF has no tokenizer.ggml.model"))?
            .to_string();
        let pre_name = gf
            .get("tokenizer.ggml.pre")
            .and_then(Value::as_str)
            .unwrap_or("");
        let mut sp = SpecialIds::default();
        let (kind, pre) = match model.as_str() {
            "llama" => {
                sp.bos = Some(1);
                sp.eos = Some(2);
                sp.unk = Some(0);
                (VocabType::Spm, None)
            }
            "gpt2" => {
                sp.bos = Some(11);
                sp.eos = Some(11);
                (VocabType::Bpe, Some(PreTokenizer::for_bpe(pre_name)?))
            }
            "gemma4" => (VocabType::Bpe, Some(PreTokenizer::for_bpe("gemma4")?)),
            other => bail!("unsupported tokenizer model '{other}'"),
        };
        let mut add_bos = kind == VocabType::Spm;
        let mut add_space_prefix = kind == VocabType::Spm;
        let (mut escape_whitespaces, mut clean_spaces, mut ignore_merges) = (true, false, false);
        if let Some(p) = &pre {
            add_bos = p.add_bos;
            escape_whitespaces = p.escape_whitespaces;
            clean_spaces = p.clean_spaces;
            ignore_merges = p.ignore_merges;
            if p.no_bos {
                sp.bos = None;
            }
        }
        add_space_prefix =
            opt_bool(gf, "tokenizer.ggml.add_space_prefix").unwrap_or(add_space_prefix);
        let remove_extra_whitespaces =
            opt_bool(gf, "tokenizer.ggml.remove_extra_whitespaces").unwrap_or(false);

        // tokens, scores, types
        let list = str_array(gf, "tokenizer.ggml.tokens")?
            .ok_or_else(|| anyhow!("GGUF has no tokenizer.ggml.tokens"))?;
        let n = list.len();
        if n == 0 || n > u32::MAX as usize / 2 {
            bail!("tokenizer.ggml.tokens: bad vocabulary size {n}");
        }
        let scores = str_array(gf, "tokenizer.ggml.scores")?;
        let types = str_array(gf, "tokenizer.ggml.token_type")?;
        if scores.is_some_and(|s| s.len() < n) {
            bail!("tokenizer.ggml.scores has fewer entries than tokenizer.ggml.tokens");
        }
        if types.is_some_and(|s| s.len() < n) {
            bail!("tokenizer.ggml.token_type has fewer entries than tokenizer.ggml.tokens");
        }
        let mut tokens = Vec::with_capacity(n);
        let mut intern: HashMap<String, u32> = HashMap::with_capacity(n * 2);
        for (i, v) in list.iter().enumerate() {
            let mut text = v
                .as_str()
                .ok_or_else(|| anyhow!("tokenizer.ggml.tokens[{i}] is not a string"))?
                .to_string();
            if text.is_empty() {
                text = format!("[EMPTY_{i}]");
            }
            let score = scores.and_then(|s| s[i].as_f64()).unwrap_or(0.0) as f32;
            let attr = match types.and_then(|t| t[i].as_i64()) {
                None => attr::NORMAL,
                Some(1) => attr::NORMAL,
                Some(2) => attr::UNKNOWN,
                Some(3) => attr::CONTROL,
                Some(4) => attr::USER_DEFINED,
                Some(5) => attr::UNUSED,
                Some(6) => attr::BYTE,
                Some(_) => attr::UNDEFINED,
            };
            intern.insert(text.clone(), i as u32);
            tokens.push(TokenData { text, score, attr });
        }

        // merges (interned: strings outside the vocabulary get ids >= n)
        let mut merges = MergeMap::new();
        if kind == VocabType::Bpe {
            let list = str_array(gf, "tokenizer.ggml.merges")?
                .ok_or_else(|| anyhow!("cannot find tokenizer merges in model file"))?;
            merges.reserve(list.len());
            let mut next = n as u32;
            let mut id_of = |s: &str, intern: &mut HashMap<String, u32>| -> u32 {
                if let Some(&id) = intern.get(s) {
                    return id;
                }
                intern.insert(s.to_string(), next);
                next += 1;
                next - 1
            };
            for (rank, m) in list.iter().enumerate() {
                let m = m
                    .as_str()
                    .ok_or_else(|| anyhow!("tokenizer.ggml.merges[{rank}] is not a string"))?;
                // split at the first space after the first byte
                let (a, b) = match m.as_bytes().iter().skip(1).position(|&c| c == b' ') {
                    Some(p) => (&m[..p + 1], &m[p + 2..]),
                    None => ("", ""),
                };
                let ia = id_of(a, &mut intern);
                let ib = id_of(b, &mut intern);
                let merged = id_of(&format!("{a}{b}"), &mut intern);
                merges.entry((ia, ib)).or_insert((rank as u32, merged));
            }
        }

        // special ids from metadata
        for slot in [&mut sp.bos, &mut sp.eos, &mut sp.unk] {
            if slot.is_some_and(|id| id as usize >= n) {
                *slot = None;
            }
        }
        let keys: [(&str, Slot); 17] = [
            ("bos", |s| &mut s.bos),
            ("eos", |s| &mut s.eos),
            ("eot", |s| &mut s.eot),
            ("eom", |s| &mut s.eom),
            ("unknown", |s| &mut s.unk),
            ("seperator", |s| &mut s.sep),
            ("padding", |s| &mut s.pad),
            ("mask", |s| &mut s.mask),
            ("fim_pre", |s| &mut s.fim_pre),
            ("fim_suf", |s| &mut s.fim_suf),
            ("fim_mid", |s| &mut s.fim_mid),
            ("fim_pad", |s| &mut s.fim_pad),
            ("fim_rep", |s| &mut s.fim_rep),
            ("fim_sep", |s| &mut s.fim_sep),
            ("prefix", |s| &mut s.fim_pre),
            ("suffix", |s| &mut s.fim_suf),
            ("middle", |s| &mut s.fim_mid),
        ];
        // the deprecated prefix/suffix/middle keys come last and win, as in llama.cpp
        for (name, slot) in keys {
            let key = format!("tokenizer.ggml.{name}_token_id");
            if let Some(v) = gf.get(&key).and_then(Value::as_i64) {
                if v >= 0 && (v as usize) < n {
                    *slot(&mut sp) = Some(v as u32);
                }
            }
        }
        add_bos = opt_bool(gf, "tokenizer.ggml.add_bos_token").unwrap_or(add_bos);
        let add_eos = opt_bool(gf, "tokenizer.ggml.add_eos_token").unwrap_or(false);
        if pre.as_ref().is_some_and(|p| p.is_gemma4()) {
            add_bos = true; // llama.cpp's Gemma 4 workaround
        }

        let mut v = Vocab {
            kind,
            model,
            pre,
            tokens,
            special: sp,
            add_bos,
            add_eos,
            add_space_prefix,
            remove_extra_whitespaces,
            escape_whitespaces,
            clean_spaces,
            ignore_merges,
            eog: BTreeSet::new(),
            intern,
            merges,
            special_cache: Vec::new(),
        };
        v.detect_specials();
        v.build_special_cache();
        v.apply_model_attrs(gf);
        Ok(v)
    }

    /// Lowest id among vocabulary entries whose text is in `texts`.
    fn find_text(&self, texts: &[&str]) -> Option<u32> {
        texts.iter().filter_map(|t| self.text_to_token(t)).min()
    }

    fn set_attr(&mut self, id: u32, bits: u32, on: bool) {
        if let Some(t) = self.tokens.get_mut(id as usize) {
            if on {
                t.attr |= bits;
            } else {
                t.attr &= !bits;
            }
        }
    }

    /// llama.cpp's text-based detection of EOT/EOM/FIM tokens, unused tokens and the EOG set.
    /// Where llama.cpp takes the first match in hash-map order we take the lowest id.
    fn detect_specials(&mut self) {
        let detect: [(&[&str], Slot); 8] = [
            (EOT_TEXTS, |s| &mut s.eot),
            (&["<|eom_id|>"], |s| &mut s.eom),
            (FIM_PRE, |s| &mut s.fim_pre),
            (FIM_SUF, |s| &mut s.fim_suf),
            (FIM_MID, |s| &mut s.fim_mid),
            (FIM_PAD, |s| &mut s.fim_pad),
            (FIM_REP, |s| &mut s.fim_rep),
            (FIM_SEP, |s| &mut s.fim_sep),
        ];
        for (texts, slot) in detect {
            if slot(&mut self.special).is_none() {
                if let Some(id) = self.find_text(texts) {
                    *slot(&mut self.special) = Some(id);
                    self.set_attr(id, attr::CONTROL, true);
                }
            }
        }
        for t in &mut self.tokens {
            if t.attr & attr::CONTROL != 0 && t.text.contains("unused") {
                t.attr |= attr::UNUSED;
            }
        }
        let mut eog: BTreeSet<u32> = [
            self.special.fim_pad,
            self.special.fim_rep,
            self.special.fim_sep,
        ]
        .into_iter()
        .flatten()
        .collect();
        for text in EOG_TEXTS {
            if let Some(&id) = self.intern.get(*text) {
                if (id as usize) < self.tokens.len() {
                    eog.insert(id);
                    self.set_attr(id, attr::CONTROL, true);
                }
            }
        }
        for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(id) = self.text_to_token(text) {
                self.tokens[id as usize].attr = attr::USER_DEFINED;
            }
        }
        eog.extend(
            [self.special.eos, self.special.eot, self.special.eom]
                .into_iter()
                .flatten(),
        );
        fn has(tokens: &[TokenData], eog: &BTreeSet<u32>, text: &str) -> Option<u32> {
            eog.iter()
                .find(|&&id| tokens[id as usize].text == text)
                .copied()
        }
        // o200k_harmony / solar-open: "<|end|>" is not an end of generation there
        let t = &self.tokens;
        let call = has(t, &eog, "<|call|>").or(has(t, &eog, "<|calls|>"));
        let other = has(t, &eog, "<|return|>").or(has(t, &eog, "<|flush|>"));
        if let (Some(end), true) = (has(t, &eog, "<|end|>"), call.is_some() && other.is_some()) {
            eog.remove(&end);
            self.tokens[end as usize].attr = attr::USER_DEFINED;
        }
        // gemma4 / plamo: "</s>" is a normal token
        let t = &self.tokens;
        let marker = has(t, &eog, "<|tool_response>").or(has(t, &eog, "<|plamo:eos|>"));
        if let (Some(s), true) = (has(t, &eog, "</s>"), marker.is_some()) {
            eog.remove(&s);
            self.tokens[s as usize].attr = attr::NORMAL;
        }
        self.eog = eog;
    }

    fn build_special_cache(&mut self) {
        let mask = attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN;
        let mut ids: Vec<u32> = (0..self.tokens.len() as u32)
            .filter(|&i| self.tokens[i as usize].attr & mask != 0)
            .collect();
        ids.sort_by_key(|&i| std::cmp::Reverse(self.tokens[i as usize].text.len()));
        self.special_cache = ids;
    }

    /// Per-model token attribute fixes llama.cpp applies by model/tokenizer name.
    fn apply_model_attrs(&mut self, gf: &GgufFile) {
        let name = gf
            .get("general.name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_ascii_lowercase();
        let pre = gf
            .get("tokenizer.ggml.pre")
            .and_then(Value::as_str)
            .unwrap_or("");
        let arch = gf
            .get("general.architecture")
            .and_then(Value::as_str)
            .unwrap_or("");
        let any = |s: &str, subs: &[&str]| subs.iter().any(|x| s.contains(x));
        if any(pre, &["jina-v2-de", "jina-v2-es", "jina-v2-code"])
            || any(arch, &["nomic-bert-moe", "jina-bert-v3"])
        {
            if let Some(id) = self.text_to_token("<mask>") {
                self.set_attr(id, attr::LSTRIP, true);
            }
        } else if any(&name, &["phi-3", "phi3"]) {
            for id in self.special_cache.clone() {
                self.set_attr(id, attr::RSTRIP, true);
            }
            if let Some(id) = self.text_to_token("</s>") {
                self.set_attr(id, attr::RSTRIP, true);
            }
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                if let Some(id) = self.text_to_token(t) {
                    self.set_attr(id, attr::RSTRIP, false);
                }
            }
        } else if any(&name, &["modern-bert"]) {
            if let Some(id) = self.text_to_token("[MASK]") {
                self.set_attr(id, attr::LSTRIP, true);
            }
        }
    }
}
