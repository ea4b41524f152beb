//! The engine: sequences with KV caches, sampling and the generation loop.

pub mod generate;
pub mod grammar;
pub mod loader;
pub mod persist;
pub mod prompt;
pub mod sampler;
pub mod session;
pub mod speculative;

pub use generate::{generate, generate_constrained, FinishReason, GenerateOptions};
pub use sampler::{Sampler, SamplerConfig};
pub use session::{Checkpoint, EvalOutcome, PendingArgmax, Session, SessionOptions, StepInput};
pub use vela_models::{Select, Selected};

/// Counters of routed experts in host memory and their device cache (`--experts`), for
/// `/metrics` and `vela bench`.
pub mod expert_stats {
    pub use vela_models::blocks::expert_cache::CACHE_STATS;
    pub use vela_models::blocks::expert_stream::STREAM_STATS;
    pub use vela_models::blocks::experts::HOST_TRAFFIC;
}
