//! The batched multi-sequence forward on the real models: several sessions evaluated in one
//! pass (ragged: prefill chunks and decode tokens mixed) give the logits each session gets
//! alone (bit for bit on the CPU), and greedy decoding of every sequence picks the same tokens.

use std::path::Path;
use vela_compute::KvType;
use vela_engine::loader::{load_gguf, LoadedModel};
use vela_engine::{Select, Selected, Session, SessionOptions};
use vela_formats::testdata;

fn load(name: &str) -> Option<LoadedModel> {
    let p = testdata::model(name)?;
    Some(load_gguf(Path::new(&p), 2).unwrap())
}

fn session(m: &LoadedModel, ubatch: usize) -> Session {
    Session::new(
        m.model.clone(),
        &SessionOptions {
            n_ctx: 512,
            ubatch,
            kv_type: KvType::F16,
        },
    )
    .unwrap()
}

fn argmax(l: &[f32]) -> u32 {
    vela_compute::argmax(l)
}

/// Max |a - b| relative to max |b|.
fn rel_diff(a: &[f32], b: &[f32]) -> f32 {
    let d = a
        .iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max);
    let m = b.iter().map(|y| y.abs()).fold(0f32, f32::max);
    d / m
}

fn batched_matches_alone(name: &str) {
    let Some(m) = load(name) else {
        return;
    };
    let prompts = [
        "The capital of France is",
        "def fibonacci(n):\n    if n < 2:",
        "1, 2, 3, 4, 5,",
        "Once upon a time, in a land far away, there lived a",
    ];
    let ids: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| m.tokenizer.encode(p, true, false).unwrap())
        .collect();
    let ub = 16;
    // Alone: each prompt, then 6 greedy steps; record every step's logits.
    let mut alone = Vec::new();
    for p in &ids {
        let mut s = session(&m, ub);
        let mut l = s.eval(p).unwrap();
        let mut steps = vec![l.clone()];
        for _ in 0..6 {
            l = s.eval(&[argmax(&l)]).unwrap();
            steps.push(l.clone());
        }
        alone.push(steps);
    }
    // Batched: the prompts in one ragged pass, then the decode steps of all four together;
    // sequence 3 starts late (prefill chunks mixed with the others' decode tokens).
    let mut ss: Vec<Session> = (0..4).map(|_| session(&m, ub)).collect();
    let mut last: Vec<Vec<f32>> = vec![Vec::new(); 4];
    let mut step = [0usize; 4];
    let mut next: Vec<Vec<u32>> = ids.clone();
    for round in 0..9 {
        let active: Vec<usize> = (0..4)
            .filter(|&i| (i != 3 || round >= 2) && step[i] <= 6)
            .collect();
        if active.is_empty() {
            break;
        }
        let mut refs: Vec<&mut Session> = Vec::new();
        let mut inputs: Vec<&[u32]> = Vec::new();
        for (i, s) in ss.iter_mut().enumerate() {
            if active.contains(&i) {
                refs.push(s);
                inputs.push(&next[i]);
            }
        }
        let out = Session::eval_batch(&mut refs, &inputs).unwrap();
        for (&i, l) in active.iter().zip(out) {
            let want = &alone[i][step[i]];
            // The CPU's products give each row the same result whatever the batch: identical.
            let d = rel_diff(&l, want);
            assert!(d == 0.0, "{name} seq {i} step {}: rel diff {d}", step[i]);
            assert_eq!(argmax(&l), argmax(want), "{name} seq {i} step {}", step[i]);
            step[i] += 1;
            next[i] = vec![argmax(&l)];
            last[i] = l;
        }
    }
    assert!(step.iter().all(|&s| s == 7), "{step:?}");
    // The sessions' token lists are what was evaluated.
    for (i, s) in ss.iter().enumerate() {
        assert_eq!(s.n_past(), ids[i].len() + 6);
    }
}

#[test]
fn smollm2_batched_sessions_match_each_alone() {
    batched_matches_alone(testdata::SMOLLM2);
}

#[test]
fn gemma3_batched_sessions_match_each_alone() {
    batched_matches_alone(testdata::GEMMA3);
}

/// A batched step's selections (argmax, top-k at different k, the row only where asked) are
/// exactly what the logits rows of the same step give.
#[test]
fn batched_selections_match_the_rows() {
    let Some(m) = load(testdata::SMOLLM2) else {
        return;
    };
    let prompts = ["The capital of France is", "1, 2, 3,", "Hello", "def f(x):"];
    let ids: Vec<Vec<u32>> = prompts
        .iter()
        .map(|p| m.tokenizer.encode(p, true, false).unwrap())
        .collect();
    let inputs: Vec<&[u32]> = ids.iter().map(|v| &v[..]).collect();
    let mut a: Vec<Session> = (0..4).map(|_| session(&m, 16)).collect();
    let mut b: Vec<Session> = (0..4).map(|_| session(&m, 16)).collect();
    let rows = Session::eval_batch(&mut a.iter_mut().collect::<Vec<_>>(), &inputs).unwrap();
    let never = |_: &vela_compute::TopK| false;
    let always = |_: &vela_compute::TopK| true;
    let selects = [
        Select::Argmax,
        Select::TopK(5, &never),
        Select::TopK(3, &always),
        Select::Logits,
    ];
    let mut refs: Vec<&mut Session> = b.iter_mut().collect();
    let got = Session::eval_batch_select(&mut refs, &inputs, &selects).unwrap();
    assert_eq!(got[0], Selected::Argmax(vec![argmax(&rows[0])]));
    let top = |r: &[f32], k| vela_compute::top_k_row(r, k);
    assert_eq!(got[1], Selected::TopK(vec![(top(&rows[1], 5), None)]));
    let want = Selected::TopK(vec![(top(&rows[2], 3), Some(rows[2].clone()))]);
    assert_eq!(got[2], want);
    assert_eq!(got[3], Selected::Logits(rows[3].clone()));
    // A selection count that does not match is refused.
    let e = Session::eval_batch_select(&mut refs, &inputs, &selects[..2]).unwrap_err();
    assert!(e.to_string().contains("selections"), "{e}");
}

#[test]
fn batch_errors_are_clear_and_change_nothing() {
    let Some(m) = load(testdata::SMOLLM2) else {
        return;
    };
    let (mut a, mut b) = (session(&m, 4), session(&m, 4));
    a.eval(&[1, 2]).unwrap();
    // More tokens than a session's ubatch.
    let e = Session::eval_batch(&mut [&mut a, &mut b], &[&[3], &[1, 2, 3, 4, 5]])
        .err()
        .unwrap();
    assert!(e.to_string().contains("1..=4 tokens"), "{e}");
    // An empty input.
    assert!(Session::eval_batch(&mut [&mut a, &mut b], &[&[3], &[]]).is_err());
    // Mismatched lengths.
    assert!(Session::eval_batch(&mut [&mut a], &[&[3], &[4]]).is_err());
    // A session of another model.
    let other = load(testdata::SMOLLM2).unwrap();
    let mut c = session(&other, 4);
    let e = Session::eval_batch(&mut [&mut a, &mut c], &[&[3], &[4]])
        .err()
        .unwrap();
    assert!(e.to_string().contains("different models"), "{e}");
    assert_eq!((a.n_past(), b.n_past(), c.n_past()), (2, 0, 0));
    // Nothing to do.
    assert!(Session::eval_batch(&mut [], &[]).unwrap().is_empty());
}

/// The server's warm-up run (`Session::warm_up`) succeeds and leaves nothing behind: a session
/// evaluated after it gives the logits one evaluated before it gave, bit for bit.
#[test]
fn warm_up_runs_and_changes_nothing() {
    let Some(m) = load(testdata::SMOLLM2) else {
        return;
    };
    let prompt = m
        .tokenizer
        .encode("The capital of France is", true, false)
        .unwrap();
    let before = session(&m, 64).eval(&prompt).unwrap();
    let opts = SessionOptions {
        n_ctx: 512,
        ubatch: 256,
        kv_type: KvType::F16,
    };
    Session::warm_up(m.model.clone(), &opts).unwrap();
    let after = session(&m, 64).eval(&prompt).unwrap();
    assert_eq!(before, after);
}
