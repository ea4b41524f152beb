//! Blocks that several architectures share, each mirroring the HF module it implements, so a
//! model file composes them and reads side by side with its `modeling_<arch>.py`.

pub mod expert_cache;
pub mod expert_stream;
pub mod experts;
pub mod mhc;
