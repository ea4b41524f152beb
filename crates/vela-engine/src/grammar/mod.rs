//! Constrained decoding: a grammar (a JSON schema, or a Lark grammar that may embed JSON
//! schemas) compiled by `llguidance` against the model's vocabulary, applied as a token mask to
//! the logits before each sampling step.
//!
//! [`GrammarCompiler`] is built once per model (the vocabulary's token trie); [`Constraint`] is
//! one request's matcher. A constraint can be *gated*: it lets the model write freely until a
//! marker text (the end of a reasoning block, `</think>`) has been generated, and constrains only
//! what follows, as vLLM does with its reasoning parsers.

use anyhow::{anyhow, bail, Result};
use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{SimpleVob, TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::Value;
use std::sync::Arc;
use vela_tokenizer::Tokenizer;

mod digits;
#[doc(hidden)]
pub mod tiny;

use digits::DigitRun;
pub use digits::MAX_DIGITS;

/// The token trie of a vocabulary, as llguidance reads it: each token's bytes, control tokens
/// as `0xFF` + their text (llguidance's marker for special tokens, as llama.cpp builds it).
struct VocabEnv {
    trie: TokTrie,
}

impl TokenizerEnv for VocabEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    // Only used to force tokens and to tokenize a prompt, neither of which vela asks for
    // (`tokenize_is_canonical` is false): the trie's greedy split is enough.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.trie.greedy_tokenize(s)
    }

    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// JSON output style of every schema: `", "` and `": "` separators and no other whitespace, so a
/// model cannot loop on whitespace and the text is what models write naturally.
fn json_style() -> Value {
    serde_json::json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
    })
}

/// A schema with vela's JSON style set (llguidance reads it from the root's `x-guidance`).
pub fn styled_schema(schema: &Value) -> Value {
    let mut s = schema.clone();
    if let Value::Object(o) = &mut s {
        o.insert("x-guidance".into(), json_style());
    }
    s
}

/// What to constrain the output to.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// One JSON value valid under this schema (`{"type":"object"}` for any object).
    JsonSchema(Value),
    /// A Lark grammar in llguidance's dialect (`%json { schema }` embeds a schema; `<[ID]>` is
    /// one token by id).
    Lark(String),
}

/// Compiles grammars against one model's vocabulary.
pub struct GrammarCompiler {
    factory: ParserFactory,
    /// Logits beyond the vocabulary (padded output rows) are never allowed.
    n_vocab: usize,
}

impl GrammarCompiler {
    pub fn new(tok: &Tokenizer) -> Result<Self> {
        let n = tok.n_vocab();
        let mut words = Vec::with_capacity(n);
        for id in 0..n as u32 {
            let plain = tok.token_to_piece(id, false);
            if !plain.is_empty() {
                words.push(plain);
                continue;
            }
            let special = tok.token_to_piece(id, true);
            let mut w = Vec::with_capacity(special.len() + 1);
            if !special.is_empty() {
                w.push(TokTrie::SPECIAL_TOKEN_MARKER);
                w.extend_from_slice(&special);
            }
            words.push(w);
        }
        let eog: Vec<u32> = (0..n as u32).filter(|&t| tok.is_eog(t)).collect();
        let eos = tok
            .eos()
            .filter(|e| eog.contains(e))
            .or_else(|| eog.first().copied())
            .ok_or_else(|| anyhow!("the vocabulary has no end-of-generation token"))?;
        let mut trie = TokTrie::from(&TokRxInfo::new(n as u32, eos), &words);
        if eog.len() > 1 {
            trie = trie.with_eos_tokens(&eog);
        }
        let env: TokEnv = Arc::new(VocabEnv { trie });
        let mut factory = ParserFactory::new_simple(&env)?;
        factory.quiet();
        Ok(GrammarCompiler {
            factory,
            n_vocab: n,
        })
    }

    /// The id of a token whose text is exactly `text` when it is one control token (which a
    /// grammar must name by id: its bytes are not text); `None` otherwise.
    pub fn special_token(&self, text: &str) -> Option<u32> {
        let trie = self.factory.tok_env().tok_trie();
        let mut b = vec![TokTrie::SPECIAL_TOKEN_MARKER];
        b.extend_from_slice(text.as_bytes());
        trie.token_id_at_bytes(&b)
    }

    /// Compile `g`; the error names what llguidance could not handle (an unsupported schema
    /// keyword, an invalid grammar).
    pub fn compile(&self, g: &Grammar) -> Result<Constraint> {
        let top = match g {
            Grammar::JsonSchema(s) => TopLevelGrammar::from_json_schema(styled_schema(s)),
            Grammar::Lark(l) => TopLevelGrammar::from_lark(l.clone()),
        };
        let parser = self.factory.create_parser(top)?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            bail!("{e}");
        }
        Ok(Constraint {
            matcher,
            gate: None,
            n_vocab: self.n_vocab,
            env: self.factory.tok_env().clone(),
            consumed: 0,
            digits: DigitRun::default(),
            history: Vec::new(),
        })
    }
}

/// One request's grammar state.
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    gate: Option<Gate>,
    n_vocab: usize,
    env: TokEnv,
    /// Tokens consumed by the matcher (after the gate).
    consumed: usize,
    /// The digit run of the constrained output ([`MAX_DIGITS`]), and its state before each
    /// consumed token (for rollback).
    digits: DigitRun,
    history: Vec<DigitRun>,
}

#[derive(Clone)]
struct Gate {
    marker: Vec<u8>,
    seen: Vec<u8>,
}

impl Constraint {
    /// Constrain only what follows the first occurrence of `marker` in the generated text.
    pub fn gated(mut self, marker: &str) -> Self {
        self.gate = Some(Gate {
            marker: marker.as_bytes().to_vec(),
            seen: Vec::new(),
        });
        self
    }

    /// Whether the grammar applies to the next token (the gate, if any, has opened).
    pub fn active(&self) -> bool {
        self.gate.is_none()
    }

    /// The tokens allowed next (`None`: any token, the gate is still closed). Past the end of
    /// the grammar only the end-of-generation tokens are allowed; numbers have at most
    /// [`MAX_DIGITS`] digits in a row.
    pub fn mask(&mut self) -> Result<Option<SimpleVob>> {
        if !self.active() {
            return Ok(None);
        }
        let mut m = self.matcher.compute_mask_or_eos()?;
        self.digits.limit(self.env.tok_trie(), &mut m);
        Ok(Some(m))
    }

    /// Set every logit the grammar forbids to -inf (rows longer than the vocabulary: the
    /// padding too). Before the gate opens only the end-of-generation tokens are forbidden: the
    /// constrained part must still come.
    pub fn apply(&mut self, logits: &mut [f32]) -> Result<()> {
        let Some(m) = self.mask()? else {
            for &t in self.env.tok_trie().eos_tokens() {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
            return Ok(());
        };
        let n = self.n_vocab.min(logits.len());
        for (i, l) in logits[..n].iter_mut().enumerate() {
            if !m.is_allowed(i as u32) {
                *l = f32::NEG_INFINITY;
            }
        }
        for l in &mut logits[n..] {
            *l = f32::NEG_INFINITY;
        }
        Ok(())
    }

    /// Whether the grammar allows `tok` next (without computing the whole mask).
    pub fn allows(&mut self, tok: u32) -> bool {
        if (tok as usize) >= self.n_vocab {
            return false;
        }
        if !self.active() {
            return !self.env.tok_trie().eos_tokens().contains(&tok);
        }
        if self.matcher.is_stopped() {
            return self.env.tok_trie().eos_token_set().is_allowed(tok);
        }
        if self.digits.in_digits() {
            return self
                .mask()
                .is_ok_and(|m| m.is_some_and(|m| m.is_allowed(tok)));
        }
        self.matcher.validate_tokens(&[tok]).is_ok_and(|n| n == 1)
    }

    /// Advance past the sampled token `tok`. An end-of-generation token at an accepting point
    /// ends the grammar; a token the grammar forbids is an error.
    pub fn accept(&mut self, tok: u32) -> Result<()> {
        if let Some(g) = &mut self.gate {
            let trie = self.env.tok_trie();
            let b = if (tok as usize) < self.n_vocab {
                trie.token(tok)
            } else {
                &[]
            };
            let b = b
                .strip_prefix(&[TokTrie::SPECIAL_TOKEN_MARKER])
                .unwrap_or(b);
            g.seen.extend_from_slice(b);
            if g.seen.windows(g.marker.len()).any(|w| w == g.marker) {
                self.gate = None;
            }
            return Ok(());
        }
        if self.matcher.is_stopped() && self.env.tok_trie().eos_tokens().contains(&tok) {
            return Ok(());
        }
        self.matcher.consume_token(tok)?;
        self.consumed += 1;
        self.history.push(self.digits.clone());
        self.digits = self.digits.after(self.env.tok_trie().token(tok));
        Ok(())
    }

    /// Undo the last `n` accepted tokens (speculative verification). Only tokens the matcher
    /// consumed can be undone: a gated constraint cannot roll back across its gate.
    pub fn rollback(&mut self, n: usize) -> Result<()> {
        if n > self.consumed {
            bail!(
                "cannot roll the grammar back {n} tokens ({} consumed)",
                self.consumed
            );
        }
        self.matcher.rollback(n)?;
        self.consumed -= n;
        let at = self.history.len() - n;
        self.digits = self.history[at].clone();
        self.history.truncate(at);
        Ok(())
    }

    /// Whether the grammar is complete (the output so far is a whole match).
    pub fn is_accepting(&mut self) -> bool {
        self.active() && self.matcher.is_accepting().unwrap_or(false)
    }
}
