//! Manifold-constrained hyper-connections (mHC: DeepSeek V4, GLM 5.3): `S` residual streams per
//! token; before a block a per-token mix (`pre`, `post`, a Sinkhorn-normalised `C`) is computed
//! from the unweighted-RMS-normalised streams, the block reads Σ pre_s·X_s through its norm, and
//! after it X_k = post_k·y + Σ_j C[j,k]·X_j. The ops are the backend's (`mhc_weights`,
//! `mhc_collapse`, `mhc_expand`); this is their order, written once.

use vela_compute::Backend;

/// One mHC module: `fn` `[(2+S)·S, S·H]` (`[S, S·H]` for a head), base, scales.
pub struct Hc<B: Backend> {
    pub mix: B::Weight,
    pub base: B::Vector,
    pub scale: [f32; 3],
}

/// Geometry and constants of a model's streams.
#[derive(Clone, Copy, Debug)]
pub struct HcDims {
    pub streams: usize,
    pub width: usize,
    pub sinkhorn_iters: usize,
    pub hc_eps: f32,
    /// The RMSNorms' epsilon (the streams' unweighted norm and the block's input norm).
    pub eps: f32,
}

/// The buffers mHC works in, `n` rows each: the streams `x` and normalised streams `f`
/// (`[n, S·H]`), the weights `mix` (`[n, (2+S)·S]`), the collapsed input `c` and the block
/// input `xn` (`[n, H]`).
pub struct HcBufs<'a, B: Backend> {
    pub x: &'a mut B::Buf,
    pub f: &'a mut B::Buf,
    pub mix: &'a mut B::Buf,
    pub c: &'a mut B::Buf,
    pub xn: &'a mut B::Buf,
}

/// Before a block: the weights into `mix`, the block input rms(Σ pre_s·X_s; `norm`) into `xn`.
/// `ones`: an all-ones vector at least `S·H` wide.
pub fn pre<B: Backend>(
    be: &B,
    hc: &Hc<B>,
    d: HcDims,
    (ones, norm): (&B::Vector, &B::Vector),
    n: usize,
    b: HcBufs<'_, B>,
) {
    let (s, h) = (d.streams, d.width);
    be.rms_norm(b.x, ones, n, s * h, d.eps, b.f);
    be.matmul(&hc.mix, b.f, n, b.mix);
    be.mhc_weights(
        b.mix,
        &hc.base,
        hc.scale,
        n,
        s,
        d.sinkhorn_iters,
        d.hc_eps,
        false,
    );
    be.mhc_collapse(b.x, b.mix, (2 + s) * s, n, s, h, b.c);
    be.rms_norm(b.c, norm, n, h, d.eps, b.xn);
}

/// After a block: X_k = post_k·y + Σ_j C[j,k]·X_j with the weights [`pre`] left in `mix`.
pub fn post<B: Backend>(be: &B, d: HcDims, n: usize, x: &mut B::Buf, mix: &B::Buf, y: &B::Buf) {
    be.mhc_expand(x, mix, y, n, d.streams, d.width);
}
