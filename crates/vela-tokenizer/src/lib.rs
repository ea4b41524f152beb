//! vela-tokenizer
