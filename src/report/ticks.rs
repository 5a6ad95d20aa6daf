//! Axis tick labels that tell their ticks apart. plotters places at most `n` ticks over an axis's
//! span, a step of 1, 2 or 5 times a power of ten apart, and that step is more than `span / (n + 1)`
//! (the ends are rounded inwards to the step); a label prints its tick with just enough digits for
//! such a step. A fixed precision printed "0.1" eleven times under a one-budget run's point (an axis
//! a thousandth wide around it) and a heat map's event counts as "58 58 58 59 59".

/// Ticks labelled on a chart's axes, at most (plotters' own default).
pub const LABELS: usize = 11;

/// `v` rounded to `d` decimals (to tens, hundreds, ... where `d` is negative), divided by an exact
/// power of ten (a product by 0.1 would print `0.30000000000000004`), never a negative zero.
fn round_decimals(v: f64, d: i32) -> f64 {
    let p = 10f64.powi(d.abs().min(300));
    let r = match d >= 0 {
        true => (v * p).round() / p,
        false => (v / p).round() * p,
    };
    if r == 0.0 {
        0.0
    } else {
        r
    }
}

/// The smallest gap between two of at most `labels` ticks over `span`, in the axis's units.
fn least_step(span: f64, labels: usize) -> f64 {
    span / (labels + 1) as f64
}

/// The label of tick `v` on a linear axis `span` wide with at most `labels` ticks: as many decimals
/// as the step needs (none from a step of 1 up). Ticks are multiples of a step at least `10^-d`
/// (`d` those decimals) and of the form 1, 2 or 5 times a power of ten, so each prints exactly and
/// differently.
pub fn linear(v: f64, span: f64, labels: usize) -> String {
    let step = least_step(span, labels);
    let d = match step > 0.0 && step.is_finite() {
        true => (-step.log10()).ceil().clamp(0.0, 15.0) as i32,
        false => 0,
    };
    format!("{}", round_decimals(v, d))
}

/// The label of tick `x` on an axis of log10 values `span` wide (in log units) with at most `labels`
/// ticks: the value `10^x` to as many significant digits as its neighbours' relative distance needs
/// (two at least): the rounding grid is finer than that distance.
pub fn log10(x: f64, span: f64, labels: usize) -> String {
    let v = 10f64.powf(x);
    if v == 0.0 || !v.is_finite() {
        return format!("{v}");
    }
    let gap = 10f64.powf(least_step(span, labels)) - 1.0;
    let digits = match gap > 0.0 && gap.is_finite() {
        true => (1.0 - gap.log10()).ceil().clamp(2.0, 15.0) as i32,
        false => 2,
    };
    let magnitude = v.abs().log10().floor() as i32;
    format!("{}", round_decimals(v, digits - 1 - magnitude))
}

/// Ticks to label on an axis of whole numbers `span` wide (a heat map's token counts): one a step at
/// most, so that no tick falls between two whole numbers; [`LABELS`] at most, one at least.
pub fn whole(span: f64) -> usize {
    (span.floor() as usize).clamp(1, LABELS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use plotters::coord::ranged1d::Ranged;
    use plotters::coord::types::RangedCoordf64;
    use rand::{Rng, SeedableRng};

    /// The ticks plotters draws over `lo..hi` when asked for at most `n` labels.
    fn ticks(lo: f64, hi: f64, n: usize) -> Vec<f64> {
        RangedCoordf64::from(lo..hi).key_points(n)
    }

    fn distinct(labels: &[String]) -> bool {
        let mut sorted = labels.to_vec();
        sorted.sort();
        sorted.dedup();
        sorted.len() == labels.len()
    }

    #[test]
    fn a_one_budget_axis_labels_each_tick_differently() {
        // `range` around a single budget of 0.1: a thousandth wide.
        let (lo, hi) = (0.0995, 0.1005);
        let t = ticks(lo, hi, LABELS);
        let labels: Vec<String> = t.iter().map(|&v| linear(v, hi - lo, LABELS)).collect();
        assert!(t.len() > 2, "{t:?}");
        assert!(distinct(&labels), "{labels:?}");
        assert!(labels.contains(&"0.1".to_string()), "{labels:?}");
        // A wide axis keeps short labels.
        let labels: Vec<String> = ticks(0.0, 1.0, LABELS)
            .iter()
            .map(|&v| linear(v, 1.0, LABELS))
            .collect();
        assert_eq!(labels[..3], ["0", "0.1", "0.2"]);
        assert_eq!(linear(256.0, 500.0, LABELS), "256");
        assert_eq!(linear(-0.0001, 1.0, LABELS), "0");
    }

    #[test]
    fn labels_differ_on_random_axes_linear_and_logarithmic() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        for _ in 0..20_000 {
            let n = rng.random_range(1..=12usize);
            let centre = 10f64.powf(rng.random_range(-6.0..6.0)) * rng.random_range(-1.0..1.0);
            let width = 10f64.powf(rng.random_range(-7.0..4.0));
            let (lo, hi) = (centre - width * rng.random::<f64>(), centre + width);
            let t = ticks(lo, hi, n);
            let labels: Vec<String> = t.iter().map(|&v| linear(v, hi - lo, n)).collect();
            assert!(distinct(&labels), "{lo}..{hi}, {n}: {t:?} → {labels:?}");
            // A log axis: log10 values of a positive range.
            let (a, b) = (centre.abs().max(1e-6).log10(), width.log10());
            let (lo, hi) = (a.min(b), a.max(b) + 1e-4);
            let t = ticks(lo, hi, n);
            let labels: Vec<String> = t.iter().map(|&x| log10(x, hi - lo, n)).collect();
            assert!(distinct(&labels), "log {lo}..{hi}, {n}: {t:?} → {labels:?}");
        }
    }

    #[test]
    fn a_whole_number_axis_has_no_tick_between_whole_numbers() {
        for first in [0usize, 1, 57, 4_095] {
            for span in 1..40usize {
                let (lo, hi) = (first as f64, (first + span) as f64);
                let n = whole(hi - lo);
                let t = ticks(lo, hi, n);
                assert!(!t.is_empty() && t.len() <= LABELS, "{lo}..{hi}: {t:?}");
                assert!(t.iter().all(|v| v.fract() == 0.0), "{lo}..{hi}: {t:?}");
                let labels: Vec<String> = t.iter().map(|&v| linear(v, hi - lo, n)).collect();
                assert!(distinct(&labels), "{labels:?}");
            }
        }
    }
}
