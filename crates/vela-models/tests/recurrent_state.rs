//! The state kit with a toy architecture that keeps a recurrent state and pooled blocks (as the
//! hybrid models do): sequences, rollback within the declared limit, checkpoints and forks
//! give exactly what evaluating the token list from scratch gives.
//!
//! The toy model: `s ← s/2 + onehot(token)` per position (recurrent layer 0); blocks layer 1
//! pools each complete pair of positions (`row = onehot(a) + onehot(b)`) from its raw ring.
//! Logits of a position: `s + Σ complete block rows / 8 + (open block's raw row) / 64`.

use anyhow::Result;
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_compute::{Backend, KvType};
use vela_models::state::ExtraState;
use vela_models::stepper::{StepCtl, StepState};
use vela_models::{CausalLm, LanguageModel, LayerState, ModelState, StateLayout};

const V: usize = 6;
const SNAPSHOTS: usize = 3;

struct Toy {
    be: Arc<CpuBackend>,
}

struct ToyState {
    kv: <CpuBackend as Backend>::Kv,
    extra: ExtraState<CpuBackend>,
    logits: Vec<f32>,
    n_ctx: usize,
    max_batch: usize,
}

impl StepState<CpuBackend> for ToyState {
    fn ctl(&self) -> StepCtl {
        StepCtl::new()
    }
    fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    fn max_batch(&self) -> usize {
        self.max_batch
    }
    fn logits(&self) -> &Vec<f32> {
        &self.logits
    }
}

fn onehot(t: u32) -> [f32; V] {
    let mut o = [0f32; V];
    o[t as usize] = 1.0;
    o
}

/// The logits of every position of `tokens`, computed from scratch.
fn reference(tokens: &[u32]) -> Vec<[f32; V]> {
    let mut s = [0f32; V];
    let mut out = Vec::new();
    for (p, &t) in tokens.iter().enumerate() {
        let h = onehot(t);
        for i in 0..V {
            s[i] = s[i] / 2.0 + h[i];
        }
        let mut l = s;
        for b in 0..p.div_ceil(2) {
            let (x, y) = (onehot(tokens[2 * b]), onehot(tokens[2 * b + 1]));
            for i in 0..V {
                l[i] += (x[i] + y[i]) / 8.0;
            }
        }
        if p.is_multiple_of(2) {
            for i in 0..V {
                l[i] += h[i] / 64.0;
            }
        }
        out.push(l);
    }
    out
}

impl Toy {
    fn run(&self, st: &mut ToyState, tokens: &[u32], positions: &[u32]) -> Result<Vec<f32>> {
        let be = &*self.be;
        let p0 = positions[0] as usize;
        let mut s = vec![0f32; V];
        be.read(st.extra.recurrent(0, p0)?, &mut s);
        let mut out = Vec::new();
        for (i, &t) in tokens.iter().enumerate() {
            let p = p0 + i;
            let h = onehot(t);
            for j in 0..V {
                s[j] = s[j] / 2.0 + h[j];
            }
            be.write(st.extra.recurrent_mut(0, p + 1)?, &s);
            // Blocks: raw row of p into its ring slot; pool when the pair completes.
            let b = st.extra.blocks_mut(1)?;
            let slots = b.raw_slots;
            let mut raw = vec![0f32; slots * V];
            be.read(b.raw, &mut raw);
            raw[(p % slots) * V..][..V].copy_from_slice(&h);
            be.write(b.raw, &raw);
            let n_rows = p.div_ceil(2);
            let mut rows = vec![0f32; n_rows.max(1) * V];
            be.read(b.rows, &mut rows);
            if p % 2 == 1 {
                let prev = ((p - 1) % slots) * V;
                for j in 0..V {
                    rows[(p / 2) * V + j] = raw[prev + j] + h[j];
                }
                be.write(b.rows, &rows);
            }
            let mut l = s.clone();
            for r in 0..n_rows {
                for j in 0..V {
                    l[j] += rows[r * V + j] / 8.0;
                }
            }
            if p.is_multiple_of(2) {
                for j in 0..V {
                    l[j] += raw[(p % slots) * V + j] / 64.0;
                }
            }
            out.extend_from_slice(&l);
        }
        Ok(out)
    }
}

impl CausalLm for Toy {
    type Be = CpuBackend;
    type State = ToyState;
    fn arch(&self) -> &str {
        "toy"
    }
    fn backend(&self) -> &Arc<CpuBackend> {
        &self.be
    }
    fn n_vocab(&self) -> usize {
        V
    }
    fn n_ctx_train(&self) -> usize {
        0
    }
    fn weight_bytes_per_token(&self) -> u64 {
        0
    }
    fn state_layout(&self) -> StateLayout {
        StateLayout::new(vec![
            LayerState::Recurrent {
                floats: V,
                snapshots: SNAPSHOTS,
            },
            LayerState::Blocks {
                width: V,
                ratio: 2,
                raw_width: V,
            },
        ])
    }
    fn state_with(
        &self,
        kv: <CpuBackend as Backend>::Kv,
        extra: ExtraState<CpuBackend>,
        n_ctx: usize,
        max_batch: usize,
    ) -> Result<ToyState> {
        Ok(ToyState {
            kv,
            extra,
            logits: Vec::new(),
            n_ctx,
            max_batch,
        })
    }
    fn kv(st: &ToyState) -> &<CpuBackend as Backend>::Kv {
        &st.kv
    }
    fn kv_mut(st: &mut ToyState) -> &mut <CpuBackend as Backend>::Kv {
        &mut st.kv
    }
    fn extra(st: &ToyState) -> Option<&ExtraState<CpuBackend>> {
        Some(&st.extra)
    }
    fn extra_mut(st: &mut ToyState) -> Option<&mut ExtraState<CpuBackend>> {
        Some(&mut st.extra)
    }
    fn run(
        &self,
        st: &mut ToyState,
        tokens: &[u32],
        positions: &[u32],
        logits_from: usize,
    ) -> Result<usize> {
        let rows = Toy::run(self, st, tokens, positions)?;
        st.logits = rows[logits_from * V..].to_vec();
        Ok(tokens.len() - logits_from)
    }
}

const MAX_BATCH: usize = 4;

fn new_seq() -> Box<dyn ModelState> {
    let m = Arc::new(Toy {
        be: Arc::new(CpuBackend::new(1)),
    });
    m.new_state(64, MAX_BATCH, KvType::F32).unwrap()
}

/// Evaluate `tokens` at `start..` in chunks of at most MAX_BATCH; returns every row.
fn eval(s: &mut dyn ModelState, start: usize, tokens: &[u32]) -> Vec<[f32; V]> {
    let mut rows = Vec::new();
    for (c, chunk) in tokens.chunks(MAX_BATCH).enumerate() {
        let p0 = (start + c * MAX_BATCH) as u32;
        let pos: Vec<u32> = (p0..p0 + chunk.len() as u32).collect();
        let l = s.forward(chunk, &pos, 0).unwrap();
        rows.extend(l.chunks(V).map(|r| <[f32; V]>::try_from(r).unwrap()));
    }
    rows
}

fn assert_rows(got: &[[f32; V]], tokens: &[u32], from: usize) {
    let want = reference(tokens);
    assert_eq!(got, &want[from..], "tokens {tokens:?} from {from}");
}

const TOKENS: [u32; 13] = [1, 4, 2, 2, 0, 5, 3, 1, 1, 4, 0, 2, 5];

#[test]
fn chunked_evaluation_matches_the_reference() {
    let mut s = new_seq();
    let got = eval(&mut *s, 0, &TOKENS);
    assert_rows(&got, &TOKENS, 0);
    // The layout's limits: the recurrent snapshots and the blocks' ring (one batch).
    assert_eq!(s.rollback_limit(), SNAPSHOTS.min(MAX_BATCH));
    // Restarting at position 0 starts from zeros again.
    let got = eval(&mut *s, 0, &TOKENS[..5]);
    assert_rows(&got, &TOKENS[..5], 0);
}

#[test]
fn rollback_within_the_limit_needs_no_checkpoint() {
    for drop in 1..=SNAPSHOTS {
        let mut s = new_seq();
        eval(&mut *s, 0, &TOKENS);
        let keep = TOKENS.len() - drop;
        let mut alt = TOKENS[..keep].to_vec();
        alt.extend_from_slice(&[5, 0, 3, 3, 1]);
        let got = eval(&mut *s, keep, &alt[keep..]);
        assert_rows(&got, &alt, keep);
    }
    // One past the limit is not guaranteed (and here it is wrong): why the limit exists.
    let mut s = new_seq();
    eval(&mut *s, 0, &TOKENS);
    let keep = TOKENS.len() - SNAPSHOTS - 1;
    let got = eval(&mut *s, keep, &TOKENS[keep..keep + 1]);
    assert_ne!(got[0], reference(&TOKENS)[keep]);
}

#[test]
fn checkpoint_restore_and_fork() {
    let mut s = new_seq();
    eval(&mut *s, 0, &TOKENS[..5]);
    let cp = s.checkpoint(5);
    let mut f = s.fork().unwrap();
    // Far past every ring and snapshot.
    let other: Vec<u32> = [&TOKENS[..5], &[3, 3, 3, 3, 3, 3, 3, 3, 3, 3][..]].concat();
    let got = eval(&mut *s, 5, &other[5..]);
    assert_rows(&got, &other, 5);
    s.restore(&*cp).unwrap();
    let got = eval(&mut *s, 5, &TOKENS[5..]);
    assert_rows(&got, &TOKENS, 5);
    // The fork kept the state at 5, untouched by the original's writes.
    let got = eval(&mut *f, 5, &TOKENS[5..]);
    assert_rows(&got, &TOKENS, 5);
    // A checkpoint of another model's state is refused.
    let foreign: Box<dyn std::any::Any + Send + Sync> = Box::new(0u8);
    assert!(s.restore(&*foreign).is_err());
    // The state's bytes count the recurrent slots and the blocks.
    assert!(s.kv_bytes() >= (SNAPSHOTS + 1) * V * 4 + 32 * V * 4);
}
