//! The A/B gate's statistics: pure functions over the measured samples (no I/O).
//!
//! Per arm: n, mean, sample standard deviation, coefficient of variation. Paired: the relative
//! difference of each repeat pair, d_i = B_i / A_i − 1 (negated for lower-is-better metrics, so a
//! positive d always means "B is better"), its mean and sd, and one-sided 95 % bounds
//! mean ∓ t(0.95, n−1)·sd/√n from a Student t table. The verdict:
//! - `promote` if mean ≥ floor and the lower bound > 0 (a real gain, large enough to matter);
//! - `reject` if mean ≤ −guard (the point estimate regresses beyond the guard: the burden of proof
//!   is on the change, so a clear average regression rejects even when noise could explain it;
//!   requiring the upper bound below −guard instead would let noisy regressions through);
//! - `inconclusive` otherwise.

use anyhow::{bail, Result};
use serde::{Deserialize, Serialize};

/// Which way a metric improves.
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Direction {
    HigherIsBetter,
    LowerIsBetter,
}

impl Direction {
    /// The direction implied by a metric's name: rates (`_tps`, `_per_s`) go up, times and sizes
    /// (`_ms`, `_s`, `_bytes`, `_mib`) go down; anything else is unknown.
    pub fn from_metric(name: &str) -> Option<Direction> {
        if name.ends_with("_tps") || name.ends_with("_per_s") {
            Some(Direction::HigherIsBetter)
        } else if ["_ms", "_s", "_bytes", "_mib"]
            .iter()
            .any(|s| name.ends_with(s))
        {
            Some(Direction::LowerIsBetter)
        } else {
            None
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Direction::HigherIsBetter => "higher is better",
            Direction::LowerIsBetter => "lower is better",
        }
    }
}

/// One-sided 95 % quantile of Student's t with `df` degrees of freedom (df 1..=30 tabulated,
/// beyond that the normal 1.645).
pub fn t95(df: usize) -> f64 {
    const T: [f64; 30] = [
        6.314, 2.920, 2.353, 2.132, 2.015, 1.943, 1.895, 1.860, 1.833, 1.812, //
        1.796, 1.782, 1.771, 1.761, 1.753, 1.746, 1.740, 1.734, 1.729, 1.725, //
        1.721, 1.717, 1.714, 1.711, 1.708, 1.706, 1.703, 1.701, 1.699, 1.697,
    ];
    match df {
        0 => f64::INFINITY,
        1..=30 => T[df - 1],
        _ => 1.645,
    }
}

/// Location and spread of one arm's measured values.
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Describe {
    pub n: usize,
    pub mean: f64,
    /// Sample standard deviation (n − 1 in the denominator).
    pub sd: f64,
    /// sd / |mean| in percent.
    pub cv_pct: f64,
}

fn check_values(xs: &[f64]) -> Result<()> {
    if xs.len() < 2 {
        bail!("need at least 2 values for statistics, have {}", xs.len());
    }
    if let Some(x) = xs.iter().find(|x| !x.is_finite()) {
        bail!("non-finite value {x} among the samples");
    }
    Ok(())
}

fn mean_sd(xs: &[f64]) -> (f64, f64) {
    let n = xs.len() as f64;
    let mean = xs.iter().sum::<f64>() / n;
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0);
    (mean, var.sqrt())
}

pub fn describe(xs: &[f64]) -> Result<Describe> {
    check_values(xs)?;
    let (mean, sd) = mean_sd(xs);
    if mean == 0.0 {
        bail!("mean is zero: the coefficient of variation is undefined");
    }
    Ok(Describe {
        n: xs.len(),
        mean,
        sd,
        cv_pct: sd / mean.abs() * 100.0,
    })
}

/// The paired comparison of B against A; every field is a fraction (0.05 = 5 %).
#[derive(Serialize, Debug, Clone, PartialEq)]
pub struct Paired {
    pub n: usize,
    /// d_i = B_i/A_i − 1, negated for lower-is-better metrics: positive = B better.
    pub diffs: Vec<f64>,
    pub mean: f64,
    pub sd: f64,
    /// The t quantile used, t(0.95, n − 1).
    pub t: f64,
    /// mean − t·sd/√n: B is better by at least this much with 95 % confidence.
    pub lower: f64,
    /// mean + t·sd/√n.
    pub upper: f64,
}

pub fn paired(a: &[f64], b: &[f64], dir: Direction) -> Result<Paired> {
    if a.len() != b.len() {
        bail!(
            "unpaired samples: {} values for A, {} for B",
            a.len(),
            b.len()
        );
    }
    check_values(a)?;
    check_values(b)?;
    if a.contains(&0.0) {
        bail!("an A value is zero: relative differences are undefined");
    }
    let sign = match dir {
        Direction::HigherIsBetter => 1.0,
        Direction::LowerIsBetter => -1.0,
    };
    let diffs: Vec<f64> = a.iter().zip(b).map(|(a, b)| sign * (b / a - 1.0)).collect();
    let (mean, sd) = mean_sd(&diffs);
    let n = diffs.len();
    let t = t95(n - 1);
    let half = t * sd / (n as f64).sqrt();
    Ok(Paired {
        n,
        diffs,
        mean,
        sd,
        t,
        lower: mean - half,
        upper: mean + half,
    })
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Promote,
    Reject,
    Inconclusive,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Promote => "promote",
            Verdict::Reject => "reject",
            Verdict::Inconclusive => "inconclusive",
        }
    }
}

/// The gate's decision with a one-line reason; `floor_pct` and `guard_pct` are percentages.
pub fn verdict(p: &Paired, floor_pct: f64, guard_pct: f64) -> (Verdict, String) {
    let (m, lo, hi) = (p.mean * 100.0, p.lower * 100.0, p.upper * 100.0);
    if m >= floor_pct && p.lower > 0.0 {
        let r =
            format!("gain {m:+.2} % ≥ floor {floor_pct} % and the 95 % lower bound {lo:+.2} % > 0");
        (Verdict::Promote, r)
    } else if m <= -guard_pct {
        let r = format!(
            "regression {m:+.2} % is beyond the guard −{guard_pct} % (95 % upper bound {hi:+.2} %)"
        );
        (Verdict::Reject, r)
    } else if m >= floor_pct {
        let r = format!("gain {m:+.2} % ≥ floor {floor_pct} % but the 95 % lower bound {lo:+.2} % ≤ 0: too noisy");
        (Verdict::Inconclusive, r)
    } else {
        let r = format!(
            "difference {m:+.2} % is below the floor {floor_pct} % and within the guard −{guard_pct} % \
             (95 % bounds {lo:+.2} % … {hi:+.2} %)"
        );
        (Verdict::Inconclusive, r)
    }
}

/// Drift within one arm, in percent: the mean of the second half of its samples relative to the
/// first half (the middle sample of an odd count is in neither). `None` below 2 samples.
pub fn drift_pct(xs: &[f64]) -> Option<f64> {
    let h = xs.len() / 2;
    if h == 0 {
        return None;
    }
    let first = xs[..h].iter().sum::<f64>() / h as f64;
    let second = xs[xs.len() - h..].iter().sum::<f64>() / h as f64;
    (first != 0.0).then(|| (second / first - 1.0) * 100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, tol: f64) {
        assert!((a - b).abs() <= tol, "{a} vs {b} (tol {tol})");
    }

    #[test]
    fn direction_from_name() {
        use Direction::*;
        assert_eq!(Direction::from_metric("decode_tps"), Some(HigherIsBetter));
        assert_eq!(
            Direction::from_metric("requests_per_s"),
            Some(HigherIsBetter)
        );
        assert_eq!(Direction::from_metric("ttft_ms"), Some(LowerIsBetter));
        assert_eq!(Direction::from_metric("wall_s"), Some(LowerIsBetter));
        assert_eq!(Direction::from_metric("kv_bytes"), Some(LowerIsBetter));
        assert_eq!(Direction::from_metric("peak_rss_mib"), Some(LowerIsBetter));
        assert_eq!(Direction::from_metric("accuracy"), None);
        assert_eq!(Direction::from_metric("tps_total"), None);
    }

    #[test]
    fn t_table() {
        assert_eq!(t95(1), 6.314);
        assert_eq!(t95(2), 2.920);
        assert_eq!(
            (t95(5), t95(10), t95(20), t95(30)),
            (2.015, 1.812, 1.725, 1.697)
        );
        assert!(
            (1..=30).all(|df| t95(df) > t95(df + 1)),
            "t decreases with df"
        );
        assert_eq!(t95(31), 1.645);
        assert!(t95(0).is_infinite());
    }

    #[test]
    fn describe_hand_computed() {
        // mean 4; deviations −2, 0, 2 → sum of squares 8, /(3−1) = 4, sd 2; CV 50 %.
        let d = describe(&[2.0, 4.0, 6.0]).unwrap();
        assert_eq!(
            d,
            Describe {
                n: 3,
                mean: 4.0,
                sd: 2.0,
                cv_pct: 50.0
            }
        );
        // mean 10; squares 1+1+0+0 = 2 → var 2/3 → sd 0.816497; CV 8.16497 %.
        let d = describe(&[9.0, 11.0, 10.0, 10.0]).unwrap();
        close(d.mean, 10.0, 1e-12);
        close(d.sd, 0.816497, 1e-6);
        close(d.cv_pct, 8.16497, 1e-5);
    }

    #[test]
    fn describe_rejects_bad_input() {
        assert!(describe(&[1.0]).is_err());
        assert!(describe(&[1.0, f64::NAN]).is_err());
        assert!(describe(&[1.0, -1.0]).is_err());
    }

    #[test]
    fn paired_bounds_hand_computed() {
        // B/A − 1 = 0.10, 0.12, 0.08: mean 0.10, sd 0.02, t(0.95, 2) = 2.920,
        // half-width 2.920 · 0.02 / √3 = 0.033717 → bounds 0.066283 … 0.133717.
        let p = paired(
            &[100.0, 100.0, 100.0],
            &[110.0, 112.0, 108.0],
            Direction::HigherIsBetter,
        )
        .unwrap();
        close(p.mean, 0.10, 1e-12);
        close(p.sd, 0.02, 1e-12);
        assert_eq!(p.t, 2.920);
        close(p.lower, 0.066283, 1e-6);
        close(p.upper, 0.133717, 1e-6);
        for (d, e) in p.diffs.iter().zip([0.10, 0.12, 0.08]) {
            close(*d, e, 1e-12);
        }
        assert!(paired(&[1.0, 2.0], &[1.0, 2.0, 3.0], Direction::HigherIsBetter).is_err());
        assert!(paired(&[0.0, 2.0], &[1.0, 2.0], Direction::HigherIsBetter).is_err());
    }

    #[test]
    fn clear_gain_promotes() {
        let a = [40.0, 40.4, 39.8, 40.2];
        let b = [44.1, 44.3, 43.9, 44.2]; // ≈ +10 %, ±0.5 % noise
        let p = paired(&a, &b, Direction::HigherIsBetter).unwrap();
        close(p.mean, 0.10, 0.01);
        let (v, why) = verdict(&p, 3.0, 2.0);
        assert_eq!(v, Verdict::Promote, "{why}");
        assert!(why.contains("floor 3 %"), "{why}");
    }

    #[test]
    fn identical_arms_are_inconclusive() {
        let a = [40.0, 40.5, 39.6, 40.2, 39.9];
        let b = [40.3, 39.8, 40.1, 39.7, 40.4];
        let p = paired(&a, &b, Direction::HigherIsBetter).unwrap();
        assert!(p.lower < 0.0 && p.upper > 0.0);
        assert_eq!(verdict(&p, 3.0, 2.0).0, Verdict::Inconclusive);
    }

    #[test]
    fn noisy_gain_is_inconclusive() {
        // Mean +4 % but one pair at −6 %: the lower bound is below zero.
        let p = paired(
            &[100.0, 100.0, 100.0],
            &[109.0, 109.0, 94.0],
            Direction::HigherIsBetter,
        )
        .unwrap();
        close(p.mean, 0.04, 1e-12);
        assert!(p.lower < 0.0);
        let (v, why) = verdict(&p, 3.0, 2.0);
        assert_eq!(v, Verdict::Inconclusive);
        assert!(why.contains("too noisy"), "{why}");
    }

    #[test]
    fn regression_rejects() {
        let a = [40.0, 40.4, 39.8];
        let b = [36.0, 36.4, 35.8]; // ≈ −10 %
        let p = paired(&a, &b, Direction::HigherIsBetter).unwrap();
        close(p.mean, -0.10, 0.005);
        let (v, why) = verdict(&p, 3.0, 2.0);
        assert_eq!(v, Verdict::Reject, "{why}");
        // A small regression inside the guard is not a rejection.
        let p = paired(&a, &[39.6, 40.0, 39.4], Direction::HigherIsBetter).unwrap();
        assert_eq!(verdict(&p, 3.0, 2.0).0, Verdict::Inconclusive);
    }

    #[test]
    fn lower_is_better_flips_sign() {
        // Latency down 10 %: B/A − 1 = −0.10, negated → +0.10 → promote.
        let a = [800.0, 810.0, 790.0];
        let b = [720.0, 729.0, 711.0];
        let p = paired(&a, &b, Direction::LowerIsBetter).unwrap();
        close(p.mean, 0.10, 1e-12);
        assert_eq!(verdict(&p, 3.0, 2.0).0, Verdict::Promote);
        // The same numbers as a higher-is-better metric are a regression.
        let p = paired(&a, &b, Direction::HigherIsBetter).unwrap();
        close(p.mean, -0.10, 1e-12);
        assert_eq!(verdict(&p, 3.0, 2.0).0, Verdict::Reject);
    }

    #[test]
    fn drift() {
        assert_eq!(drift_pct(&[1.0]), None);
        close(drift_pct(&[100.0, 102.0]).unwrap(), 2.0, 1e-9);
        // Odd count: the middle value is in neither half.
        close(drift_pct(&[100.0, 500.0, 95.0]).unwrap(), -5.0, 1e-9);
        close(drift_pct(&[10.0, 10.0, 11.0, 11.0]).unwrap(), 10.0, 1e-9);
    }
}
