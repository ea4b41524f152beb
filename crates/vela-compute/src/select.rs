//! Picking from a row on the host: the argmax and top-k every backend's device versions match.

/// Index of the largest element: the lowest index among equal maxima, NaNs skipped (all NaN or
/// empty: 0). The semantics of [`crate::Backend::argmax_rows`] on every backend.
pub fn argmax(row: &[f32]) -> u32 {
    let mut best = 0usize;
    let mut bv = f32::NEG_INFINITY;
    let mut found = false;
    for (i, &x) in row.iter().enumerate() {
        if x > bv || (!found && x == bv) {
            (best, bv, found) = (i, x, true);
        }
    }
    best as u32
}

/// What [`crate::Backend::top_k_rows`] returns for one row.
#[derive(Clone, Debug, PartialEq)]
pub struct TopK {
    /// The `min(k, n_valid)` best `(index, value)` pairs: value descending in IEEE total order
    /// (`f32::total_cmp`, so +0 ranks above -0), the lower index first among equal values, NaNs
    /// never selected.
    pub items: Vec<(u32, f32)>,
    /// Number of non-NaN elements of the row.
    pub n_valid: usize,
    /// Largest non-NaN element (-inf when there is none).
    pub max: f32,
    /// `sum exp(x - max)` over the non-NaN elements, in f64 (the full-row softmax normalizer;
    /// a GPU sums in another order, so it may differ from the host value in the last bits).
    pub sum_exp: f64,
}

/// The selection of [`crate::Backend::top_k_rows`] for one row, on the host (the reference every
/// backend must match: items bit-exact, `sum_exp` up to rounding).
pub fn top_k_row(row: &[f32], k: usize) -> TopK {
    // Order-preserving key: larger key = larger value in IEEE total order.
    let key = |x: f32| {
        let b = x.to_bits();
        if b >> 31 == 1 {
            !b
        } else {
            b | 0x8000_0000
        }
    };
    let mut v: Vec<(u32, u32)> = row
        .iter()
        .enumerate()
        .filter(|(_, x)| !x.is_nan())
        .map(|(i, &x)| (key(x), i as u32))
        .collect();
    let n_valid = v.len();
    let kk = k.min(n_valid);
    let order = |a: &(u32, u32), b: &(u32, u32)| b.0.cmp(&a.0).then(a.1.cmp(&b.1));
    if kk > 0 && kk < v.len() {
        v.select_nth_unstable_by(kk - 1, order);
    }
    v.truncate(kk);
    v.sort_unstable_by(order);
    // The same expressions as the sampler's full-vocabulary softmax (bit-identical there).
    let max = row
        .iter()
        .cloned()
        .filter(|x| !x.is_nan())
        .fold(f32::NEG_INFINITY, f32::max);
    let sum_exp: f64 = row
        .iter()
        .filter(|x| !x.is_nan())
        .map(|&l| (l as f64 - max as f64).exp())
        .sum();
    TopK {
        items: v.into_iter().map(|(_, i)| (i, row[i as usize])).collect(),
        n_valid,
        max,
        sum_exp,
    }
}
