//! Reference (non-imatrix) k-quant quantizers: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K.
//!
//! Each follows llama.cpp's `quantize_row_q*_K_ref` (ggml-quants.c, 0c1e570) operation for
//! operation, with the same helper searches:
//!
//! * `make_qkx2_quants` (Q2_K, Q4_K, Q5_K): asymmetric `x ~ scale * l - min` fit. Start from the
//!   min/max grid, then try `nstep + 1` slightly different grid scales, solving the weighted
//!   least-squares scale and min for each assignment, and keep the one with the least weighted
//!   error (absolute for Q2_K, squared otherwise).
//! * `make_q3_quants` (Q3_K): symmetric fit, then up to 5 passes of coordinate descent moving
//!   single quants when that improves `sumlx^2 / suml2` (the least-squares objective).
//! * `make_qx_quants` with `rmse_type = 1` (Q6_K): symmetric fit weighted by `x^2`, trying 18
//!   perturbed grid scales and keeping the best least-squares scale.
//!
//! The per-sub-block scales (and mins) are then themselves quantized to 4/6/8 bits against an
//! f16 super-block scale, and the quants are recomputed against the *stored* (rounded) scales.

use super::dequant::k4_scale_min;
use super::quantize::{f16_bytes, f16_round, nearest_int};
use super::QK_K;

/// ggml's threshold below which a group is treated as all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// Asymmetric weighted fit of `x` to `l in 0..=nmax`; writes `l` to `big_l`, returns
/// `(scale, the_min)` with `x ~ scale * l - the_min`.
#[allow(clippy::too_many_arguments)]
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    big_l: &mut [u8],
    rmin: f32,
    rdelta: f32,
    nstep: i32,
    use_mad: bool,
) -> (f32, f32) {
    let n = x.len();
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        big_l.fill(0);
        return (0.0, -min);
    }
    let err = |scale: f32, min: f32, l: u8, x: f32, w: f32| {
        let diff = scale * l as f32 + min - x;
        w * if use_mad { diff.abs() } else { diff * diff }
    };
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let l = nearest_int(iscale * (x[i] - min));
        big_l[i] = l.clamp(0, nmax) as u8;
        best_error += err(scale, min, big_l[i], x[i], weights[i]);
    }
    if nstep < 1 {
        return (scale, -min);
    }
    let mut laux = [0u8; 32];
    let laux = &mut laux[..n];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let l = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = l as u8;
            let w = weights[i];
            let lf = l as f32;
            sum_l += w * lf;
            sum_l2 += w * lf * lf;
            sum_xl += w * lf * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                cur_error += err(this_scale, this_min, laux[i], x[i], weights[i]);
            }
            if cur_error < best_error {
                big_l.copy_from_slice(laux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// Signed value of largest magnitude (first on ties) and its magnitude.
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    (amax, max)
}

/// Symmetric fit of `x` to `l in -nmax..nmax` with coordinate-descent refinement (`do_rmse`
/// as in ggml, always on here); writes `l + nmax` to `big_l`, returns the scale.
fn make_q3_quants(nmax: i32, x: &[f32], big_l: &mut [i8]) -> f32 {
    let n = x.len();
    let (amax, max) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        big_l.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0f32, 0f32);
    for i in 0..n {
        let l = nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1);
        big_l[i] = l as i8;
        let w = x[i] * x[i];
        sumlx += w * x[i] * l as f32;
        suml2 += w * l as f32 * l as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for i in 0..n {
            let w = x[i] * x[i];
            let li = big_l[i] as f32;
            let mut slx = sumlx - w * x[i] * li;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * li * li;
                let new_l = nearest_int(x[i] * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != big_l[i] as i32 {
                    slx += w * x[i] * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        big_l[i] = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for l in big_l.iter_mut() {
        *l += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// `make_qx_quants` with `rmse_type = 1` and no importance weights: symmetric fit weighted by
/// `x^2`; writes `l + nmax` to `big_l`, returns the scale.
fn make_qx_quants_rmse1(nmax: i32, x: &[f32], big_l: &mut [i8]) -> f32 {
    let n = x.len();
    let (amax, max) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        big_l.fill(0);
        return 0.0;
    }
    let mut iscale = -(nmax as f32) / max;
    let fit = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for &xi in x {
            let l = nearest_int(iscale * xi).clamp(-nmax, nmax - 1) as f32;
            let w = xi * xi;
            sumlx += w * xi * l;
            suml2 += w * l * l;
        }
        (sumlx, suml2)
    };
    let assign = |iscale: f32, big_l: &mut [i8]| {
        for i in 0..n {
            big_l[i] = (nmax + nearest_int(iscale * x[i]).clamp(-nmax, nmax - 1)) as i8;
        }
    };
    assign(iscale, big_l);
    let (sumlx, suml2) = fit(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in -9..=9 {
        if is == 0 {
            continue;
        }
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = fit(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            assign(iscale, big_l);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// Pack 256 two-bit values as Q2_K/Q3_K `qs`: byte `32 * h + l` holds elements
/// `128 * h + l + 32 * k` at bits `2k`.
fn pack_2bit(big_l: &[u8; QK_K], qs: &mut [u8]) {
    for h in 0..2 {
        for l in 0..32 {
            let e = 128 * h + l;
            qs[32 * h + l] =
                big_l[e] | (big_l[e + 32] << 2) | (big_l[e + 64] << 4) | (big_l[e + 96] << 6);
        }
    }
}

pub(crate) fn q2_k(x: &[f32], o: &mut [u8]) {
    const Q4SCALE: f32 = 15.0;
    let mut big_l = [0u8; QK_K];
    let mut mins = [0f32; 16];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..16 {
        let xs = &x[16 * j..16 * j + 16];
        let mut weights = [0f32; 16];
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = v.abs();
        }
        let l = &mut big_l[16 * j..16 * j + 16];
        (scales[j], mins[j]) = make_qkx2_quants(3, xs, &weights, l, -0.5, 0.1, 15, true);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let (sc, rest) = o.split_at_mut(16);
    let (qs, dd) = rest.split_at_mut(64);
    if max_scale > 0.0 {
        let iscale = Q4SCALE / max_scale;
        for j in 0..16 {
            sc[j] = nearest_int(iscale * scales[j]) as u8;
        }
        dd[0..2].copy_from_slice(&f16_bytes(max_scale / Q4SCALE));
    } else {
        sc.fill(0);
        dd[0..2].copy_from_slice(&f16_bytes(0.0));
    }
    if max_min > 0.0 {
        let iscale = Q4SCALE / max_min;
        for j in 0..16 {
            sc[j] |= (nearest_int(iscale * mins[j]) << 4) as u8;
        }
        dd[2..4].copy_from_slice(&f16_bytes(max_min / Q4SCALE));
    } else {
        dd[2..4].copy_from_slice(&f16_bytes(0.0));
    }
    // max_scale and max_min are >= 0, so these equal the stored d and dmin in both branches.
    let d_all = f16_round(max_scale / Q4SCALE);
    let dmin_all = f16_round(max_min / Q4SCALE);
    for j in 0..16 {
        let d = d_all * (sc[j] & 0xF) as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * (sc[j] >> 4) as f32;
        for ii in 0..16 {
            big_l[16 * j + ii] = nearest_int((x[16 * j + ii] + dm) / d).clamp(0, 3) as u8;
        }
    }
    pack_2bit(&big_l, qs);
}

pub(crate) fn q3_k(x: &[f32], o: &mut [u8]) {
    let mut big_l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut amax, mut max_scale) = (0f32, 0f32);
    for j in 0..16 {
        scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut big_l[16 * j..16 * j + 16]);
        if scales[j].abs() > amax {
            amax = scales[j].abs();
            max_scale = scales[j];
        }
    }
    let (hmask, rest) = o.split_at_mut(32);
    let (qs, rest) = rest.split_at_mut(64);
    let (sc, dd) = rest.split_at_mut(12);
    sc.fill(0);
    let d_all = if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for j in 0..16 {
            // C stores nearest_int into an int8_t before clamping.
            let l = (nearest_int(iscale * scales[j]) as i8).clamp(-32, 31) + 32;
            let l = l as u8;
            if j < 8 {
                sc[j] = l & 0xF;
            } else {
                sc[j - 8] |= (l & 0xF) << 4;
            }
            sc[8 + j % 4] |= (l >> 4) << (2 * (j / 4));
        }
        dd.copy_from_slice(&f16_bytes(1.0 / iscale));
        f16_round(1.0 / iscale)
    } else {
        dd.copy_from_slice(&f16_bytes(0.0));
        0.0
    };
    for j in 0..16 {
        let low = if j < 8 { sc[j] & 0xF } else { sc[j - 8] >> 4 };
        let s = (low | (((sc[8 + j % 4] >> (2 * (j / 4))) & 3) << 4)) as i32 - 32;
        let d = d_all * s as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            let l = nearest_int(x[16 * j + ii] / d).clamp(-4, 3);
            big_l[16 * j + ii] = (l + 4) as i8;
        }
    }
    // High bit of element j goes to hmask[j % 32] bit j / 32.
    hmask.fill(0);
    let mut low = [0u8; QK_K];
    for j in 0..QK_K {
        let mut l = big_l[j] as u8;
        if l > 3 {
            hmask[j % 32] |= 1 << (j / 32);
            l -= 4;
        }
        low[j] = l;
    }
    pack_2bit(&low, qs);
}

/// Shared body of the Q4_K and Q5_K reference quantizers (they differ in `nmax`, the search
/// parameters and how the quants are packed). Returns the 256 quants.
fn q45_k_scales(x: &[f32], nmax: i32, rmin: f32, nstep: i32, o: &mut [u8]) -> [u8; QK_K] {
    let mut big_l = [0u8; QK_K];
    let mut mins = [0f32; 8];
    let mut scales = [0f32; 8];
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for j in 0..8 {
        let xs = &x[32 * j..32 * j + 32];
        let sum_x2 = xs.iter().fold(0f32, |s, &v| s + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        let mut weights = [0f32; 32];
        for (w, &v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        let l = &mut big_l[32 * j..32 * j + 32];
        (scales[j], mins[j]) = make_qkx2_quants(nmax, xs, &weights, l, rmin, 0.1, nstep, false);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let sc = &mut o[4..16];
    for j in 0..8 {
        // C: uint8_t ls = nearest_int(...); ls = MIN(63, ls).
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            sc[j - 4] |= (ls >> 4) << 6;
            sc[j] |= (lm >> 4) << 6;
        }
    }
    o[0..2].copy_from_slice(&f16_bytes(max_scale / 63.0));
    o[2..4].copy_from_slice(&f16_bytes(max_min / 63.0));
    let d_all = f16_round(max_scale / 63.0);
    let dmin_all = f16_round(max_min / 63.0);
    for j in 0..8 {
        let (s, m) = k4_scale_min(j, &o[4..16]);
        let d = d_all * s as f32;
        if d == 0.0 {
            continue;
        }
        let dm = dmin_all * m as f32;
        for ii in 0..32 {
            big_l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, nmax) as u8;
        }
    }
    big_l
}

pub(crate) fn q4_k(x: &[f32], o: &mut [u8]) {
    let big_l = q45_k_scales(x, 15, -1.0, 20, o);
    let qs = &mut o[16..144];
    for c in 0..4 {
        for l in 0..32 {
            qs[32 * c + l] = big_l[64 * c + l] | (big_l[64 * c + 32 + l] << 4);
        }
    }
}

pub(crate) fn q5_k(x: &[f32], o: &mut [u8]) {
    let big_l = q45_k_scales(x, 31, -0.5, 15, o);
    let (qh, qs) = o[16..176].split_at_mut(32);
    qh.fill(0);
    for c in 0..4 {
        let (m1, m2) = (1u8 << (2 * c), 2u8 << (2 * c));
        for j in 0..32 {
            let mut l1 = big_l[64 * c + j];
            if l1 > 15 {
                l1 -= 16;
                qh[j] |= m1;
            }
            let mut l2 = big_l[64 * c + 32 + j];
            if l2 > 15 {
                l2 -= 16;
                qh[j] |= m2;
            }
            qs[32 * c + j] = l1 | (l2 << 4);
        }
    }
}

pub(crate) fn q6_k(x: &[f32], o: &mut [u8]) {
    let mut big_l = [0i8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_abs_scale, mut max_scale) = (0f32, 0f32);
    for ib in 0..16 {
        let l = &mut big_l[16 * ib..16 * ib + 16];
        scales[ib] = make_qx_quants_rmse1(32, &x[16 * ib..16 * ib + 16], l);
        if scales[ib].abs() > max_abs_scale {
            max_abs_scale = scales[ib].abs();
            max_scale = scales[ib];
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        o.fill(0);
        return;
    }
    let iscale = -128.0 / max_scale;
    o[208..210].copy_from_slice(&f16_bytes(1.0 / iscale));
    let d_all = f16_round(1.0 / iscale);
    for ib in 0..16 {
        o[192 + ib] = nearest_int(iscale * scales[ib]).min(127) as i8 as u8;
    }
    for j in 0..16 {
        let d = d_all * (o[192 + j] as i8) as f32;
        if d == 0.0 {
            continue;
        }
        for ii in 0..16 {
            big_l[16 * j + ii] = (nearest_int(x[16 * j + ii] / d).clamp(-32, 31) + 32) as i8;
        }
    }
    let (ql, rest) = o.split_at_mut(128);
    let qh = &mut rest[..64];
    for h in 0..2 {
        for l in 0..32 {
            let e = 128 * h + l;
            let q = [big_l[e], big_l[e + 32], big_l[e + 64], big_l[e + 96]].map(|v| v as u8);
            ql[64 * h + l] = (q[0] & 0xF) | ((q[2] & 0xF) << 4);
            ql[64 * h + l + 32] = (q[1] & 0xF) | ((q[3] & 0xF) << 4);
            qh[32 * h + l] =
                (q[0] >> 4) | ((q[1] >> 4) << 2) | ((q[2] >> 4) << 4) | ((q[3] >> 4) << 6);
        }
    }
}
