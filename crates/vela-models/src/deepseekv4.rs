//! DeepSeek V4 Flash (`deepseek_v4`), read side by side with transformers 5.23
//! `models/deepseek_v4/modeling_deepseek_v4.py`; docs/deepseekv4-spec.md spells out every step
//! with HF's line numbers. What exists so far: the config as transformers reads it (both the
//! release's keys and `save_pretrained`'s) and the release's FP8/MXFP4 storage decoded by the
//! weight source (`vela_formats::quant::fp8`); the model itself is not built yet.

mod config;

pub use config::{Attn, DeepseekV4Config, Rope, Routing, Scoring, Yarn};
