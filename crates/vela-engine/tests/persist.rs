//! A session saved to a file and loaded into a fresh session (another context size and batch
//! size) goes on exactly as the original: the next logits and a greedy continuation are
//! bit-identical, for every declared state kind: full and sliding-window K/V (SmolLM2, Gemma 3's
//! 512-token window passed), recurrent states with their snapshots, block rows and raw rings
//! (the tiny synthetic Qwen3.8, DeepSeek V4 and GLM 5.3 geometries), and the token history
//! Qwen3.8's n-gram layer keeps. A rollback within the snapshot limit works after the load, and
//! a file of another model is refused.

use std::path::Path;
use std::sync::Arc;
use vela_compute::cpu::CpuBackend;
use vela_compute::KvType;
use vela_engine::persist;
use vela_engine::{Session, SessionOptions};
use vela_formats::quant::GgmlType;
use vela_formats::testdata;
use vela_models::LanguageModel;

fn session(m: &Arc<dyn LanguageModel>, n_ctx: usize, ubatch: usize) -> Session {
    Session::new(
        m.clone(),
        &SessionOptions {
            n_ctx,
            ubatch,
            kv_type: KvType::F16,
        },
    )
    .unwrap()
}

fn argmax(v: &[f32]) -> u32 {
    v.iter()
        .enumerate()
        .fold((0, f32::MIN), |b, (i, &x)| if x > b.1 { (i, x) } else { b })
        .0 as u32
}

/// `steps` greedy tokens after `first`.
fn greedy(s: &mut Session, first: u32, steps: usize) -> Vec<Vec<f32>> {
    let mut t = first;
    (0..steps)
        .map(|_| {
            let l = s.eval(&[t]).unwrap();
            t = argmax(&l);
            l
        })
        .collect()
}

fn check(name: &str, m: Arc<dyn LanguageModel>, prompt: &[u32], rollback: usize) {
    let dir = std::env::temp_dir().join(format!("vela-persist-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let id = format!("{name} test");
    let mut a = session(&m, 1024, 64);
    let la = a.eval(prompt).unwrap();
    let t0 = argmax(&la);
    let bytes = persist::encode(&id, a.tokens(), &a.export().unwrap());
    let path = persist::write_atomic(&dir, &persist::file_name(&id, a.tokens()), &bytes).unwrap();
    assert_eq!(persist::read_header(&path).unwrap().tokens, prompt);
    let want = greedy(&mut a, t0, 12);
    // Another context and batch size.
    let (tokens, st) = persist::load(&path, &id).unwrap();
    let mut b = session(&m, 2048, 16);
    b.import(&tokens, &st).unwrap();
    let got = greedy(&mut b, t0, 12);
    assert!(want == got, "{name}: the loaded session differs");
    // Load again and roll back within the limit first: the prompt's last tokens re-evaluated
    // give the original prompt's logits.
    let mut c = session(&m, 1024, 64);
    c.import(&tokens, &st).unwrap();
    if rollback > 0 {
        let n = prompt.len() - rollback;
        c.truncate(n).unwrap();
        assert_eq!(
            c.eval(&prompt[n..]).unwrap(),
            la,
            "{name}: rollback after a load"
        );
    }
    assert!(persist::load(&path, "another model").is_err());
    // A context too small for it is refused and leaves the session empty.
    let mut d = session(&m, prompt.len() / 2, 16);
    assert!(d.import(&tokens, &st).is_err());
    assert_eq!(d.n_past(), 0);
    eprintln!(
        "RESULT | persist {name} | {} tokens, {} bytes, 12 steps identical |",
        prompt.len(),
        bytes.len()
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

fn prompt(n: usize, vocab: usize) -> Vec<u32> {
    (0..n).map(|i| ((i * 7919 + 13) % vocab) as u32).collect()
}

#[test]
fn hybrid_states_survive_a_file() {
    let be = Arc::new(CpuBackend::new(2));
    let q: Arc<dyn LanguageModel> = Arc::new(
        vela_models::qwen4exp::Qwen4ExpModel::synth(be.clone(), "qwen4exp-tiny", GgmlType::Q4_0, 3)
            .unwrap(),
    );
    check("qwen4exp", q.clone(), &prompt(150, q.n_vocab()), 2);
    let d: Arc<dyn LanguageModel> = Arc::new(
        vela_models::deepseekv4::DeepseekV4Model::synth(
            be.clone(),
            "deepseek-v4-tiny",
            GgmlType::Q4_0,
            3,
        )
        .unwrap(),
    );
    check("deepseekv4", d.clone(), &prompt(150, d.n_vocab()), 0);
    let g: Arc<dyn LanguageModel> =
        Arc::new(vela_models::glm5::Glm5Model::synth(be, "glm5-tiny", GgmlType::Q4_0, 3).unwrap());
    check("glm5", g.clone(), &prompt(150, g.n_vocab()), 2);
}

#[test]
fn kv_caches_survive_a_file() {
    for (name, n) in [(testdata::SMOLLM2, 200), (testdata::GEMMA3, 700)] {
        let Some(p) = testdata::model(name) else {
            continue;
        };
        let m = vela_engine::loader::load_gguf(Path::new(&p), 2).unwrap();
        let ids = prompt(n, 20_000);
        check(name, m.model.clone(), &ids, 3);
    }
}

/// The directory of [`killed_writers_never_leave_a_corrupt_file`] run by process `pid`.
fn kill_dir(pid: u32) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("vela-persist-kill-{pid}"))
}

/// The writer of [`killed_writers_never_leave_a_corrupt_file`]: started by that test (its
/// parent), writes states into the parent's directory until it is killed; otherwise (no such
/// directory) nothing.
#[test]
fn writer_child() {
    let dir = kill_dir(std::os::unix::process::parent_id());
    if !dir.is_dir() {
        return;
    }
    let st = vela_models::StateExport {
        kv: vela_compute::KvExport {
            ty: KvType::F16,
            n_past: 1,
            layers: vec![vela_compute::KvLayerExport {
                first: 0,
                k_row: 4 << 20,
                v_row: 4 << 20,
                k: vec![7; 4 << 20].into(),
                v: vec![9; 4 << 20].into(),
            }],
        },
        extra: None,
    };
    for i in 0u32.. {
        let tokens = [i % 8];
        let b = persist::encode("writer", &tokens, &st);
        persist::write_atomic(&dir, &persist::file_name("writer", &tokens), &b).unwrap();
    }
}

/// A process killed (SIGKILL) at random points while it writes 8 MiB states, 100 times: every
/// file left under a state's name loads and checks out; only temporary files can be partial.
#[test]
fn killed_writers_never_leave_a_corrupt_file() {
    let dir = kill_dir(std::process::id());
    std::fs::create_dir_all(&dir).unwrap();
    let exe = std::env::current_exe().unwrap();
    let (mut loaded, mut partial) = (0usize, 0usize);
    let mut rng = 0x2545_f491_4f6c_dd1du64;
    for _ in 0..100 {
        let mut child = std::process::Command::new(&exe)
            .args(["--exact", "writer_child", "--test-threads", "1"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        std::thread::sleep(std::time::Duration::from_millis(20 + rng % 120));
        child.kill().unwrap();
        child.wait().unwrap();
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            if p.extension().is_some_and(|x| x == persist::EXT) {
                let (tokens, st) = persist::load(&p, "writer")
                    .unwrap_or_else(|err| panic!("{} left corrupt: {err:#}", p.display()));
                assert_eq!(tokens.len(), 1);
                assert_eq!(st.kv.layers[0].k[123], 7);
                loaded += 1;
            } else {
                partial += 1;
                std::fs::remove_file(&p).unwrap();
            }
        }
    }
    eprintln!("RESULT | persist kill -9 loop | 100 kills, {loaded} files checked, {partial} temporary files left |");
    assert!(loaded > 0);
    std::fs::remove_dir_all(&dir).unwrap();
}
