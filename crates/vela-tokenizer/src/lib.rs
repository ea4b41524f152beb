//! vela-tokenizer: exact tokenization from GGUF vocabularies (matching llama.cpp 0c1e570) and
//! HF `tokenizer.json` files.
//!
//! - [`Vocab`]: a GGUF vocabulary (SPM `llama`, byte-level BPE `gpt2` with its per-model
//!   pre-tokenizer, Gemma 4's `gemma4` BPE), special ids and the end-of-generation set.
//! - [`Tokenizer`]: one type over GGUF and HF tokenizers, with [`load`] for either source.
//! - [`Detokenizer`]: streaming decoding that never splits a UTF-8 character.

mod decode;
mod encode;
#[cfg(feature = "hf")]
pub mod hf;
pub mod pretok;
pub mod unicode;
mod unicode_table;
pub mod vocab;

pub use decode::Detokenizer;
pub use vocab::{attr, SpecialIds, TokenData, Vocab, VocabType};

use anyhow::{bail, Result};
use std::path::Path;
use vela_formats::gguf::GgufFile;

/// A tokenizer from either a GGUF vocabulary or an HF `tokenizer.json`.
pub enum Tokenizer {
    Gguf(Box<Vocab>),
    #[cfg(feature = "hf")]
    Hf(Box<hf::HfTokenizer>),
}

/// Load a tokenizer from a GGUF file (full model or vocab-only) or an HF model directory
/// (containing `tokenizer.json`).
pub fn load(path: impl AsRef<Path>) -> Result<Tokenizer> {
    let path = path.as_ref();
    if path.is_dir() {
        return Tokenizer::from_hf_dir(path);
    }
    if !path.exists() {
        bail!("tokenizer source {} does not exist", path.display());
    }
    if path.file_name().is_some_and(|n| n == "tokenizer.json") {
        return Tokenizer::from_hf_dir(path.parent().unwrap_or(Path::new(".")));
    }
    Tokenizer::from_gguf(&GgufFile::open(path)?)
}

impl Tokenizer {
    /// From GGUF metadata.
    pub fn from_gguf(gf: &GgufFile) -> Result<Tokenizer> {
        Ok(Tokenizer::Gguf(Box::new(Vocab::from_gguf(gf)?)))
    }

    /// From an HF model directory (`tokenizer.json`, optional `tokenizer_config.json` and
    /// `generation_config.json`).
    pub fn from_hf_dir(dir: impl AsRef<Path>) -> Result<Tokenizer> {
        #[cfg(feature = "hf")]
        {
            Ok(Tokenizer::Hf(Box::new(hf::HfTokenizer::from_dir(
                dir.as_ref(),
            )?)))
        }
        #[cfg(not(feature = "hf"))]
        {
            bail!(
                "{}: HF tokenizers need the `hf` feature",
                dir.as_ref().display()
            )
        }
    }

    /// Text -> ids. `add_special` adds BOS/EOS as the model wants; `parse_special` lets
    /// special-token text in `text` become special tokens (off for untrusted user input).
    pub fn encode(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>> {
        match self {
            Tokenizer::Gguf(v) => Ok(v.encode(text, add_special, parse_special)),
            #[cfg(feature = "hf")]
            Tokenizer::Hf(h) => h.encode(text, add_special, parse_special),
        }
    }

    /// Ids -> text (lossy UTF-8). `skip_special` drops control tokens (and a leading BOS /
    /// trailing EOS for GGUF vocabularies); otherwise they are rendered as their text.
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        match self {
            Tokenizer::Gguf(v) => {
                let bytes = v.detokenize(ids, skip_special, !skip_special);
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
            #[cfg(feature = "hf")]
            Tokenizer::Hf(h) => h.decode(ids, skip_special),
        }
    }

    /// Raw bytes of one token; control tokens are empty unless `special`.
    pub fn token_to_piece(&self, id: u32, special: bool) -> Vec<u8> {
        match self {
            Tokenizer::Gguf(v) => v.token_to_piece(id, special),
            #[cfg(feature = "hf")]
            Tokenizer::Hf(h) => h.token_to_piece(id, special),
        }
    }

    /// Vocabulary size.
    pub fn n_vocab(&self) -> usize {
        match self {
            Tokenizer::Gguf(v) => v.n_vocab(),
            #[cfg(feature = "hf")]
            Tokenizer::Hf(h) => h.n_vocab(),
        }
    }

    pub fn bos(&self) -> Option<u32> {
        match self {
            Tokenizer::Gguf(v) => v.special.bos,
            #[cfg(feature = "hf")]
            Tokenizer::Hf(h) => h.bos,
        }
    }

    pub fn eos(&self) -> Option<u32> {
        match self {
            Tokenizer::Gguf(v) => v.special.eos,
            #[cfg(feature = "hf")]
            Tokenizer::Hf(h) => h.eos,
        }
    }

    /// Whether the model adds BOS when `add_special` is set.
    pub fn add_bos(&self) -> bool {
        match self {
            Tokenizer::Gguf(v) => v.add_bos,
            #[cfg(feature = "hf")]
            Tokenizer::Hf(h) => h.add_bos,
        }
    }

    /// Whether `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        match self {
            Tokenizer::Gguf(v) => v.is_eog(id),
            #[cfg(feature = "hf")]
            Tokenizer::Hf(h) => h.eog.contains(&id),
        }
    }

    /// The vocabulary text of a token.
    pub fn token_text(&self, id: u32) -> Option<String> {
        match self {
            Tokenizer::Gguf(v) => v.token_text(id).map(str::to_string),
            #[cfg(feature = "hf")]
            Tokenizer::Hf(h) => h.token_text(id),
        }
    }

    /// A streaming detokenizer; `special` renders control tokens as their text.
    pub fn detokenizer(&self, special: bool) -> Detokenizer<'_> {
        Detokenizer::new(move |id| self.token_to_piece(id, special))
    }
}
