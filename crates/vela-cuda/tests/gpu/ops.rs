//! The model kit's generic ops (MoE and hybrid architectures) against the CPU backend on odd
//! shapes: id buffers, softmax / sigmoid / mul, gather / scatter-add, routing and the
//! expert-indexed product. Skipped without a GPU like the other GPU tests.

use super::*;

fn up_ids<B: Backend>(be: &B, data: &[u32]) -> B::Ids {
    let mut b = be.alloc_ids(data.len());
    be.write_ids(&mut b, data);
    b
}

fn down_ids<B: Backend>(be: &B, b: &B::Ids, n: usize) -> Vec<u32> {
    let mut out = vec![0u32; n];
    be.read_ids(b, &mut out);
    out
}

/// Id buffers round-trip (a zero-length buffer too) and a fresh one reads zeros.
#[test]
fn ids_round_trip() {
    let Some(g) = gpu() else { return };
    let data: Vec<u32> = (0..1001u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let b = up_ids(&g, &data);
    assert_eq!(down_ids(&g, &b, data.len()), data);
    assert_eq!(down_ids(&g, &b, 7), data[..7]);
    let z = g.alloc_ids(5);
    assert_eq!(down_ids(&g, &z, 5), vec![0; 5]);
    let e = up_ids(&g, &[]);
    assert_eq!(down_ids(&g, &e, 0), Vec::<u32>::new());
}
