//! Speculative decoding respects the state's rollback limit: a model whose state can drop only
//! 2 trailing positions without a checkpoint (as a recurrent layer with 2 snapshots) gets at most
//! 2 drafts per round, so rejecting all of them is a plain rollback, and the output is plain
//! greedy decoding's.

use anyhow::Result;
use std::any::Any;
use std::sync::Arc;
use vela_compute::KvType;
use vela_engine::speculative::{
    generate_speculative, AcceptRule, Draft, Drafter, Propose, SpecOptions,
};
use vela_engine::{SamplerConfig, Session, SessionOptions};
use vela_models::{LanguageModel, ModelState, StateLayout};

const V: usize = 16;
const LIMIT: usize = 2;

/// Greedy next token of `t`: `t + 1` (mod V), as a one-hot logits row.
fn row(t: u32) -> Vec<f32> {
    let mut r = vec![0f32; V];
    r[(t as usize + 1) % V] = 10.0;
    r
}

struct Counter;
struct CounterState {
    n_ctx: usize,
    max_batch: usize,
}

impl LanguageModel for Counter {
    fn arch(&self) -> &str {
        "counter"
    }
    fn backend_name(&self) -> String {
        "test".into()
    }
    fn n_vocab(&self) -> usize {
        V
    }
    fn n_ctx_train(&self) -> usize {
        0
    }
    fn state_layout(&self) -> StateLayout {
        StateLayout::new(vec![vela_models::LayerState::Recurrent {
            floats: 1,
            snapshots: LIMIT,
        }])
    }
    fn weight_bytes_per_token(&self) -> u64 {
        0
    }
    fn memory_free(&self) -> Option<u64> {
        None
    }
    fn new_state(
        self: Arc<Self>,
        n_ctx: usize,
        max_batch: usize,
        _: KvType,
    ) -> Result<Box<dyn ModelState>> {
        Ok(Box::new(CounterState { n_ctx, max_batch }))
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl ModelState for CounterState {
    fn forward(&mut self, tokens: &[u32], _: &[u32], from: usize) -> Result<Vec<f32>> {
        Ok(tokens[from..].iter().flat_map(|&t| row(t)).collect())
    }
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    fn max_batch(&self) -> usize {
        self.max_batch
    }
    fn checkpoint(&self, _: usize) -> Box<dyn Any + Send + Sync> {
        Box::new(())
    }
    fn restore(&mut self, _: &(dyn Any + Send + Sync)) -> Result<()> {
        Ok(())
    }
    fn fork(&self) -> Result<Box<dyn ModelState>> {
        anyhow::bail!("not used")
    }
    fn rollback_limit(&self) -> usize {
        LIMIT
    }
    fn kv_bytes(&self) -> usize {
        0
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// Always wrong: proposes `last + 2`, so every draft is rejected.
struct Wrong;

impl Drafter for Wrong {
    fn sync(&mut self, _: &Session, _: usize) -> Result<()> {
        Ok(())
    }
    fn draft(
        &mut self,
        _: &mut Session,
        last: u32,
        k: usize,
        propose: Propose,
    ) -> Result<Vec<Draft>> {
        let mut out = Vec::new();
        let mut t = last;
        for _ in 0..k {
            let d = propose(row(t + 1))?;
            t = d.token;
            out.push(d);
        }
        Ok(out)
    }
}

#[test]
fn drafts_are_clamped_to_the_rollback_limit() {
    let opts = SessionOptions {
        n_ctx: 64,
        ubatch: 8,
        kv_type: KvType::F32,
    };
    let mut s = Session::new(Arc::new(Counter), &opts).unwrap();
    assert_eq!(s.rollback_limit(), LIMIT);
    let cfg = SamplerConfig {
        temperature: 0.0,
        ..Default::default()
    };
    let spec = SpecOptions {
        depth: None,
        max_tokens: 12,
        draft_max: 6,
        is_eog: &|_| false,
        rule: AcceptRule::Exact,
    };
    let (out, _, stats) =
        generate_speculative(&mut s, &mut Wrong, &cfg, &[3], &spec, &mut |_| true).unwrap();
    let want: Vec<u32> = (4..16).map(|t| t % V as u32).collect();
    assert_eq!(out, want);
    assert_eq!(stats.accepted, 0);
    assert!(
        stats.drafted > 0 && stats.drafted <= stats.rounds * LIMIT,
        "{stats:?}"
    );
}
