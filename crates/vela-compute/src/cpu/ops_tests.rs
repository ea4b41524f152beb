//! Tests of the CPU backend's ops (`ops.rs`): KV allocation, chunking, RoPE, attention, KV
//! checkpoints.

use super::*;

#[test]
fn kv_allocation_failure_is_an_error() {
    // Beyond any address space: Layout refuses it; far beyond RAM: the allocator does. Nothing
    // is allocated before `reserve`.
    let mut k = KvData::new(KvType::F32, 4, usize::MAX / 64);
    assert!(k.reserve(1).is_err());
    let mut k = KvData::new(KvType::F16, 2, 1 << 55);
    assert_eq!(k.bytes(), 0);
    let e = k.reserve(2).expect_err("a 64 PiB block must fail");
    assert!(e.to_string().contains("--ctx"), "{e}");
    let mut k = KvData::new(KvType::Bf16, 1000, 3);
    k.reserve(1000).unwrap();
    let mut b = Vec::new();
    k.read_bytes(0, 3000, &mut b);
    assert!(b.len() == 6000 && b.iter().all(|&x| x == 0));
    assert!(host_memory_available().is_none_or(|b| b > 0));
}

/// The cache holds blocks for the positions it has: reserved as a sequence grows, freed by a
/// rollback, copied by a fork only where they exist; a wrapped ring keeps all of its slots.
#[test]
fn kv_memory_follows_the_positions_held() {
    let be = CpuBackend::new(1);
    let bs = super::super::kvdata::BLOCK_SLOTS;
    let specs = [kv_spec(None, 4 * bs), kv_spec(Some(8), 12)];
    let mut kv = be.new_kv(&specs, KvType::F16).unwrap();
    assert_eq!(be.kv_bytes(&kv), 0);
    // Per block of the full layer: `bs` slots × 4 values × 2 bytes, K and V; the ring: 12 slots.
    let (block, ring) = (bs * 4 * 2 * 2, 12 * 4 * 2 * 2);
    be.kv_reserve(&mut kv, 10).unwrap();
    assert_eq!(be.kv_bytes(&kv), block + ring);
    let n = bs + bs / 2;
    be.kv_reserve(&mut kv, n).unwrap();
    assert_eq!(be.kv_bytes(&kv), 2 * block + ring);
    let row = |p: usize| vec![p as f32; 4];
    for p in 0..n {
        be.kv_store(&mut kv, 0, &row(p), &row(p), &[p as u32]);
    }
    let fork = be.kv_clone(&kv).unwrap();
    assert_eq!(be.kv_bytes(&fork), 2 * block + ring);
    // Back to half a block: the full layer's second block goes; the wrapped ring stays.
    be.kv_release(&mut kv, bs / 2);
    assert_eq!(be.kv_bytes(&kv), block + ring);
    let e = be.kv_export(&fork, n);
    let x = half::f16::from_f32((n - 1) as f32).to_bits().to_le_bytes();
    assert_eq!(&e.layers[0].k[(n - 1) * 8..n * 8], &x.repeat(4)[..]);
    let mut back = be.new_kv(&specs, KvType::F16).unwrap();
    be.kv_import(&mut back, &e).unwrap();
    assert_eq!(be.kv_export(&back, n).layers[0].k, e.layers[0].k);
    // A reset frees everything.
    be.kv_release(&mut back, 0);
    assert_eq!(be.kv_bytes(&back), 0);
}

#[test]
fn chunking_covers_everything() {
    for n in 0..20 {
        for parts in 1..5 {
            let v: Vec<usize> = (0..parts).flat_map(|i| chunk(n, parts, i)).collect();
            assert_eq!(v, (0..n).collect::<Vec<_>>());
        }
    }
}

#[test]
fn rope_is_a_rotation_and_identity_at_zero() {
    let p = RopeParams {
        n_rot: 8,
        freq_base: 10000.0,
        freq_scale: 1.0,
        neox: true,
        freq_factors: None,
    };
    let mut c = vec![0.0; 8];
    rope_cache(0, &p, &mut c);
    let mut x: Vec<f32> = (0..8).map(|i| i as f32).collect();
    let orig = x.clone();
    rope_head(&mut x, &c, 8, true);
    assert_eq!(x, orig);
    rope_cache(17, &p, &mut c);
    rope_head(&mut x, &c, 8, false);
    let n0: f32 = orig.iter().map(|v| v * v).sum();
    let n1: f32 = x.iter().map(|v| v * v).sum();
    assert!((n0 - n1).abs() < 1e-3);
    assert_ne!(x, orig);
}

fn kv_spec(window: Option<usize>, capacity: usize) -> KvLayerSpec {
    KvLayerSpec {
        n_head_kv: 1,
        head_dim_k: 4,
        head_dim_v: 4,
        capacity,
        window,
    }
}

/// Attention against a naive reference, including a sliding window whose ring wraps.
#[test]
fn attention_matches_naive_with_window() {
    let be = CpuBackend::new(2);
    for (ty, tol) in [
        (KvType::F32, 1e-5),
        (KvType::F16, 2e-2),
        (KvType::Bf16, 2e-2),
    ] {
        let mut kv = be.new_kv(&[kv_spec(Some(3), 5)], ty).unwrap();
        let mut rng = 1u32;
        let mut rnd = || {
            rng = rng.wrapping_mul(1664525).wrapping_add(1013904223);
            (rng >> 8) as f32 / (1 << 24) as f32 - 0.5
        };
        let n_pos = 12;
        let ks: Vec<f32> = (0..n_pos * 4).map(|_| rnd()).collect();
        let vs: Vec<f32> = (0..n_pos * 4).map(|_| rnd()).collect();
        let p = AttnParams {
            n_head: 2,
            n_head_kv: 1,
            head_dim_k: 4,
            head_dim_v: 4,
            scale: 0.5,
            window: Some(3),
            softcap: None,
        };
        for pos in 0..n_pos {
            be.kv_store(
                &mut kv,
                0,
                &ks[pos * 4..pos * 4 + 4].to_vec(),
                &vs[pos * 4..pos * 4 + 4].to_vec(),
                &[pos as u32],
            );
            let q: Vec<f32> = (0..8).map(|_| rnd()).collect();
            let mut out = vec![0.0; 8];
            be.attention(&q, &kv, 0, &[pos as u32], &p, &mut out);
            for h in 0..2 {
                let first = pos.saturating_sub(2);
                let sc: Vec<f32> = (first..=pos)
                    .map(|j| (0..4).map(|d| q[h * 4 + d] * ks[j * 4 + d]).sum::<f32>() * 0.5)
                    .collect();
                let m = sc.iter().cloned().fold(f32::MIN, f32::max);
                let e: Vec<f32> = sc.iter().map(|s| (s - m).exp()).collect();
                let z: f32 = e.iter().sum();
                for d in 0..4 {
                    let r: f32 = (first..=pos)
                        .zip(&e)
                        .map(|(j, w)| w / z * vs[j * 4 + d])
                        .sum();
                    assert!(
                        (r - out[h * 4 + d]).abs() < tol,
                        "pos {pos} h {h}: {r} vs {}",
                        out[h * 4 + d]
                    );
                }
            }
        }
    }
}

#[test]
fn checkpoint_restore_undoes_ring_overwrites() {
    let be = CpuBackend::new(1);
    let mut kv = be
        .new_kv(&[kv_spec(Some(3), 4), kv_spec(None, 16)], KvType::F32)
        .unwrap();
    let row = |p: usize| vec![p as f32; 4];
    for p in 0..6 {
        be.kv_store(&mut kv, 0, &row(p), &row(p), &[p as u32]);
        be.kv_store(&mut kv, 1, &row(p), &row(p), &[p as u32]);
    }
    let snap = be.kv_checkpoint(&kv, 6);
    for p in 6..10 {
        be.kv_store(&mut kv, 0, &row(100 + p), &row(100 + p), &[p as u32]);
    }
    be.kv_restore(&mut kv, &snap);
    // Positions 3,4,5 (the window of position 5) must be back in their slots.
    if let KvData::F32(k) = &kv.layers[0].k {
        for p in 3..6 {
            assert_eq!(k.get(p % 4, 0, 1)[0], p as f32);
        }
    } else {
        panic!()
    }
    let clone = be.kv_clone(&kv).unwrap();
    assert_eq!(be.kv_bytes(&clone), be.kv_bytes(&kv));
}

/// The fused gate/up activation gives what act_mul gives on the separate halves, bit for bit.
#[test]
fn act_mul_split_matches_act_mul_of_the_halves() {
    let be = CpuBackend::new(1);
    for (rows, width) in [(1, 1), (3, 17), (2, 64), (5, 100)] {
        let gu: Vec<f32> = (0..rows * 2 * width)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 13.0)
            .collect();
        for act in [Activation::Silu, Activation::GeluTanh] {
            let mut out = vec![0f32; rows * width];
            be.act_mul_split(&gu, rows, width, act, &mut out);
            for r in 0..rows {
                let row = &gu[r * 2 * width..(r + 1) * 2 * width];
                let (mut g, u) = (row[..width].to_vec(), row[width..].to_vec());
                be.act_mul(&mut g, &u, width, act);
                assert_eq!(
                    &out[r * width..(r + 1) * width],
                    &g[..],
                    "{act:?} {rows}x{width}"
                );
            }
        }
    }
}
