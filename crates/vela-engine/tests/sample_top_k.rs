//! Sampling from a top-k selection (`Sampler::sample_top_k`, fed by `Backend::top_k_rows` /
//! `vela_compute::top_k_row`, selected on the device by a GPU) draws exactly the token
//! `Sampler::sample` draws from the whole logits row, for the same configuration and seed:
//! - on random rows (ties, NaN, ±inf, ±0, width 1, k > width) for top-k 1/40/1000, top-p
//!   0.9/1, min-p 0/0.05, temperature 0.3/1/1.5, top-p without top-k and min-p alone, every draw;
//! - with the row normalizer perturbed like a GPU's different summation order;
//! - for top-p without top-k, where the CPU grows its candidate list 64 → 256 → 1024 → 4096:
//!   the cap-sized list gives the same candidates (bit-identical probabilities) whenever its
//!   mass reaches p, and asks for the row otherwise;
//! - through `generate` on SmolLM2 (CPU, and the GPU when there is one): the tokens of the
//!   top-k path equal those of a plain full-logits loop with the same seed.

use std::path::Path;
use vela_compute::{top_k_row, KvType, TopK};
use vela_engine::generate::SAMPLE_TOP_K_CAP;
use vela_engine::loader::{load, Device, LoadOptions, LoadedModel};
use vela_engine::sampler::{top_k, Rng};
use vela_engine::{generate, GenerateOptions, Sampler, SamplerConfig, Session, SessionOptions};
use vela_formats::testdata;

const CAP: usize = SAMPLE_TOP_K_CAP;

/// A random logits row of `width` elements; `kind` picks the distribution and special values.
fn row(rng: &mut Rng, width: usize, kind: usize) -> Vec<f32> {
    let scale = [0.5f64, 3.0, 10.0, 30.0][kind % 4];
    let mut v: Vec<f32> = (0..width)
        .map(|_| ((rng.uniform() * 2.0 - 1.0) * scale) as f32)
        .collect();
    match kind / 4 {
        0 => {}
        // Ties: a coarse grid.
        1 => v.iter_mut().for_each(|x| *x = (*x * 2.0).round() / 2.0),
        // NaN and -inf sprinkled, ±0.
        2 => {
            for x in v.iter_mut() {
                let u = rng.uniform();
                if u < 0.05 {
                    *x = f32::NAN;
                } else if u < 0.1 {
                    *x = f32::NEG_INFINITY;
                } else if u < 0.15 {
                    *x = 0.0;
                } else if u < 0.2 {
                    *x = -0.0;
                }
            }
        }
        // Mostly NaN / -inf with a few values; sometimes nothing valid at all.
        3 => {
            for x in v.iter_mut() {
                let u = rng.uniform();
                if u < 0.5 {
                    *x = f32::NAN;
                } else if u < 0.9 {
                    *x = f32::NEG_INFINITY;
                }
            }
        }
        // All equal.
        4 => v.iter_mut().for_each(|x| *x = 1.25),
        // A +inf (the softmax is NaN: both paths must still agree).
        _ => {
            let i = (rng.next_u64() % width as u64) as usize;
            v[i] = f32::INFINITY;
        }
    }
    v
}

fn configs() -> Vec<SamplerConfig> {
    let mut out = Vec::new();
    for &temperature in &[0.3f32, 1.0, 1.5] {
        for &min_p in &[0.0f32, 0.05] {
            for &top_k in &[1usize, 40, 1000] {
                for &top_p in &[0.9f32, 1.0] {
                    out.push((top_k, top_p, min_p, temperature));
                }
            }
            out.push((0, 0.9, min_p, temperature));
            out.push((0, 0.5, min_p, temperature));
        }
        out.push((0, 1.0, 0.05, temperature));
        out.push((0, 1.0, 0.2, temperature));
    }
    out.into_iter()
        .map(|(top_k, top_p, min_p, temperature)| SamplerConfig {
            top_k,
            top_p,
            min_p,
            temperature,
            seed: 77,
            ..Default::default()
        })
        .collect()
}

/// Draw `n` tokens from `rows` (cycled) with both paths; returns the number of fallbacks to the
/// full row. `perturb` scales the normalizer like a GPU's summation order could.
fn compare(cfg: &SamplerConfig, rows: &[Vec<f32>], n: usize, perturb: f64) -> usize {
    let mut full = Sampler::new(cfg.clone());
    let mut dev = Sampler::new(cfg.clone());
    let k = dev.device_top_k(CAP).expect("config applies");
    let tops: Vec<TopK> = rows
        .iter()
        .map(|r| {
            let mut t = top_k_row(r, k);
            t.sum_exp *= perturb;
            t
        })
        .collect();
    let mut fallbacks = 0;
    for i in 0..n {
        let r = &rows[i % rows.len()];
        let a = full.sample(&mut r.clone());
        let b = match dev.sample_top_k(&tops[i % rows.len()]) {
            Some(t) => t,
            None => {
                fallbacks += 1;
                dev.sample(&mut r.clone())
            }
        };
        assert_eq!(
            a,
            b,
            "draw {i}: cfg {cfg:?} width {} perturb {perturb}",
            r.len()
        );
    }
    fallbacks
}

#[test]
fn top_k_row_equals_sampler_top_k() {
    let mut rng = Rng::new(5);
    for &width in &[1usize, 2, 3, 31, 64, 100, 1000, 1025, 5000] {
        for kind in 0..24 {
            let r = row(&mut rng, width, kind);
            let valid: Vec<f32> = r.iter().copied().filter(|x| !x.is_nan()).collect();
            for &k in &[0usize, 1, 2, 40, 1000, 1024, width, width + 7] {
                let t = top_k_row(&r, k);
                let want: Vec<(u32, f32)> = top_k(&r, k).iter().map(|c| (c.id, c.logit)).collect();
                let got_bits: Vec<(u32, u32)> =
                    t.items.iter().map(|&(i, l)| (i, l.to_bits())).collect();
                let want_bits: Vec<(u32, u32)> =
                    want.iter().map(|&(i, l)| (i, l.to_bits())).collect();
                assert_eq!(got_bits, want_bits, "width {width} kind {kind} k {k}");
                assert_eq!(t.n_valid, valid.len());
                let max = valid.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                assert!(t.max == max, "max {} vs {max}", t.max);
                let z: f64 = valid.iter().map(|&l| (l as f64 - max as f64).exp()).sum();
                assert!(
                    t.sum_exp.to_bits() == z.to_bits() || (z.is_nan() && t.sum_exp.is_nan()),
                    "sum_exp {} vs {z}",
                    t.sum_exp
                );
            }
        }
    }
}

/// Every draw of the top-k path equals `sample()`, on random rows and every configuration.
#[test]
fn top_k_path_draws_equal_sample() {
    let mut rng = Rng::new(11);
    let cfgs = configs();
    let mut total = 0;
    let mut fallbacks = 0;
    for &width in &[1usize, 2, 7, 64, 300, 1000, 1500, 8000, 49_152] {
        let rows: Vec<Vec<f32>> = (0..24).map(|kind| row(&mut rng, width, kind)).collect();
        for cfg in &cfgs {
            for chunk in rows.chunks(6) {
                let n = if width > 5000 { 60 } else { 240 };
                fallbacks += compare(cfg, chunk, n, 1.0);
                total += n;
            }
        }
    }
    eprintln!("{total} draws, {fallbacks} needed the full row");
    assert!(total > 100_000);
}

/// A normalizer that differs in the last bits (a GPU's summation order) never changes a token:
/// the top-p cut is only taken from the selection when it is clear of p by a margin.
#[test]
fn perturbed_normalizer_keeps_tokens() {
    let mut rng = Rng::new(12);
    let cfgs: Vec<SamplerConfig> = configs()
        .into_iter()
        .filter(|c| c.top_k == 0 && c.top_p < 1.0)
        .collect();
    for &width in &[50usize, 700, 3000, 20_000] {
        let rows: Vec<Vec<f32>> = (0..24).map(|kind| row(&mut rng, width, kind)).collect();
        for cfg in &cfgs {
            for perturb in [1.0 + 1e-13, 1.0 - 1e-13, 1.0 + 1e-12, 1.0 - 1e-12] {
                compare(cfg, &rows, 96, perturb);
            }
        }
    }
}

/// A cut exactly at p (two equal logits, p = 0.5: the CPU keeps one token): the selection must
/// not decide it, since a normalizer off in the last bit would keep two; the row is asked for.
#[test]
fn cut_exactly_at_p_asks_for_the_row() {
    let r = vec![1.0f32, 1.0, f32::NEG_INFINITY, f32::NAN, -60.0];
    let cfg = SamplerConfig {
        top_k: 0,
        top_p: 0.5,
        min_p: 0.0,
        temperature: 1.0,
        seed: 9,
        ..Default::default()
    };
    let s = Sampler::new(cfg.clone());
    let (cand, _) = s.candidates(&r);
    assert_eq!(cand.len(), 1);
    let mut t = top_k_row(&r, CAP);
    assert!(s.candidates_from_top_k(&t).is_none());
    t.sum_exp *= 1.0 + 1e-13;
    assert!(s.candidates_from_top_k(&t).is_none());
    for perturb in [1.0, 1.0 + 1e-13, 1.0 - 1e-13] {
        assert_eq!(compare(&cfg, std::slice::from_ref(&r), 200, perturb), 200);
    }
}

/// Top-p without top-k: the CPU grows its list 64 → 256 → 1024 → 4096 → … until the mass
/// reaches p; the cut only depends on the sorted prefix, so the 1024-candidate selection gives
/// the same candidates and bit-identical probabilities whenever it reaches p (cut before 64,
/// before 256 and before 1024 below), and asks for the full row when it does not (cut past 1024).
#[test]
fn top_p_only_cap_list_equals_growing_search() {
    let width = 100_000;
    let mut rng = Rng::new(13);
    // l_i = -slope * rank (+ noise) over a random permutation: a geometric distribution whose 0.9
    // mass is reached near rank ln(10) / slope.
    for (slope, expect_device) in [
        (0.08f64, true),
        (0.015, true),
        (0.004, true),
        (0.0008, false),
    ] {
        let mut perm: Vec<usize> = (0..width).collect();
        for i in (1..width).rev() {
            let j = (rng.next_u64() % (i as u64 + 1)) as usize;
            perm.swap(i, j);
        }
        let mut r = vec![0f32; width];
        for (rank, &id) in perm.iter().enumerate() {
            r[id] = (-(slope * rank as f64) + rng.uniform() * 1e-3) as f32;
        }
        for temperature in [0.5f32, 1.0, 1.5] {
            for min_p in [0.0f32, 0.05] {
                let cfg = SamplerConfig {
                    top_k: 0,
                    top_p: 0.9,
                    min_p,
                    temperature,
                    seed: 3,
                    ..Default::default()
                };
                let s = Sampler::new(cfg.clone());
                let t = top_k_row(&r, s.device_top_k(CAP).unwrap());
                let (cand, probs) = s.candidates(&r);
                match s.candidates_from_top_k(&t) {
                    Some((c2, p2)) => {
                        assert!(expect_device, "slope {slope}: expected a fallback");
                        assert_eq!(cand, c2);
                        let b = |p: &[f64]| p.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                        assert_eq!(b(&probs), b(&p2));
                        let s2 = Sampler::new(SamplerConfig {
                            min_p: 0.0,
                            ..cfg.clone()
                        });
                        eprintln!(
                            "slope {slope}: top-p keeps {} candidates (min-p {min_p}: {})",
                            s2.candidates(&r).0.len(),
                            cand.len()
                        );
                    }
                    None => assert!(!expect_device, "slope {slope}: unexpected fallback"),
                }
                assert_eq!(compare(&cfg, std::slice::from_ref(&r), 300, 1.0), {
                    if expect_device {
                        0
                    } else {
                        300
                    }
                });
            }
        }
    }
}

fn load_on(device: Device) -> Option<LoadedModel> {
    let p = std::env::var_os("VELA_GPU_MODEL")
        .map(std::path::PathBuf::from)
        .or_else(|| testdata::model(testdata::SMOLLM2))?;
    match load(
        Path::new(&p),
        &LoadOptions {
            threads: 2,
            device,
            ..Default::default()
        },
    ) {
        Ok(m) => Some(m),
        Err(e) => {
            if device != Device::Cpu && std::env::var("VELA_REQUIRE_GPU").as_deref() != Ok("1") {
                eprintln!("SKIP (no GPU): {e:#}");
                return None;
            }
            panic!("loading the model: {e:#}");
        }
    }
}

/// `generate` (top-k path) against a plain loop over full logits rows with the same seed, and a
/// manual top-k loop that counts the steps which needed the row.
fn generation_matches(m: &LoadedModel) {
    let opts = SessionOptions {
        n_ctx: 512,
        ubatch: 16,
        kv_type: KvType::F16,
    };
    let prompt = m
        .tokenizer
        .encode(
            "Once upon a time, in a small village by the sea,",
            true,
            false,
        )
        .unwrap();
    let never = |_: u32| false;
    let n = 48;
    let mut cfgs = vec![SamplerConfig::default()];
    for (top_k, top_p, min_p, temperature) in [
        (0, 0.9, 0.0, 1.0),
        (0, 0.95, 0.05, 1.5),
        (1000, 1.0, 0.0, 1.5),
        (40, 0.9, 0.0, 0.3),
        (0, 1.0, 0.05, 1.0),
    ] {
        cfgs.push(SamplerConfig {
            top_k,
            top_p,
            min_p,
            temperature,
            seed: 99,
            ..Default::default()
        });
    }
    for cfg in cfgs {
        let mut s = Session::new(m.model.clone(), &opts).unwrap();
        let mut sampler = Sampler::new(cfg.clone());
        let (got, _) = generate(
            &mut s,
            &mut sampler,
            &prompt,
            &GenerateOptions {
                max_tokens: n,
                is_eog: &never,
            },
            &mut |_| true,
        )
        .unwrap();

        let mut s = Session::new(m.model.clone(), &opts).unwrap();
        let mut sampler = Sampler::new(cfg.clone());
        prompt.iter().for_each(|&t| sampler.accept(t));
        let mut logits = s.eval(&prompt).unwrap();
        let mut want = Vec::new();
        for _ in 0..n {
            let t = sampler.sample(&mut logits);
            want.push(t);
            if want.len() < n {
                logits = s.eval(&[t]).unwrap();
            }
        }

        let mut s = Session::new(m.model.clone(), &opts).unwrap();
        let mut sampler = Sampler::new(cfg.clone());
        prompt.iter().for_each(|&t| sampler.accept(t));
        let k = sampler.device_top_k(CAP).unwrap();
        let mut manual = Vec::new();
        let mut rows_read = 0;
        let mut toks = prompt.clone();
        for _ in 0..n {
            let (t, row) = s
                .eval_top_k(&toks, k, &|t| !sampler.top_k_suffices(t))
                .unwrap();
            let tok = match row {
                Some(mut l) => {
                    rows_read += 1;
                    sampler.sample(&mut l)
                }
                None => sampler.sample_top_k(&t).unwrap(),
            };
            manual.push(tok);
            toks = vec![tok];
        }
        eprintln!(
            "{}: top_k {} top_p {} min_p {} temp {}: {n} tokens equal: {}, rows read {rows_read}/{n}",
            m.model.backend_name(),
            cfg.top_k,
            cfg.top_p,
            cfg.min_p,
            cfg.temperature,
            got == want && manual == want
        );
        assert_eq!(got, want, "generate vs full logits, {cfg:?}");
        assert_eq!(manual, want, "top-k loop vs full logits, {cfg:?}");
    }
}

#[test]
fn generation_top_k_path_equals_full_logits_cpu() {
    let Some(m) = load_on(Device::Cpu) else {
        return;
    };
    generation_matches(&m);
}

/// The same on the GPU (device top-k): skipped without one, unless `VELA_REQUIRE_GPU=1`.
#[test]
fn generation_top_k_path_equals_full_logits_gpu() {
    let Some(m) = load_on(Device::Cuda(0)) else {
        return;
    };
    generation_matches(&m);
}

#[cfg(feature = "cuda")]
#[test]
fn cap_is_the_cuda_device_limit() {
    assert_eq!(CAP, vela_cuda::sample::TOP_K_DEVICE_MAX);
}
