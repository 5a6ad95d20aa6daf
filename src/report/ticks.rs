//! Axis tick labels that tell their ticks apart. plotters places at most `n` ticks over an axis's
//! span, a step of 1, 2 or 5 times a power of ten apart, and that step is more than `span / (n + 1)`
//! (the ends are rounded inwards to the step); a label prints its tick with just enough digits for
//! such a step. A fixed precision printed "0.1" eleven times under a one-budget run's point (an axis
//! a thousandth wide around it) and a heat map's event counts as "58 58 58 59 59". A budget axis in
//! entries ticks powers of two ([`XAxis`]).

use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::coord::types::RangedCoordf64;

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

/// A chart's x axis: plotters' own linear axis, or over log10 values (KV budgets in entries) one
/// whose ticks fall on powers of two, every `m`-th where there are more than asked, as budgets are
/// 64, 128, 256... (ticks a nice step apart in log10 read "63" under a point at 64); within one
/// doubling, the linear axis's ticks.
pub struct XAxis {
    linear: RangedCoordf64,
    log2_ticks: bool,
}

impl XAxis {
    pub fn new(range: std::ops::Range<f64>, log2_ticks: bool) -> Self {
        Self {
            linear: range.into(),
            log2_ticks,
        }
    }
}

impl Ranged for XAxis {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        self.linear.map(value, limit)
    }

    fn key_points<Hint: KeyPointHint>(&self, hint: Hint) -> Vec<f64> {
        let most = hint.max_num_points();
        let r = self.linear.range();
        let step = 2f64.log10();
        let (first, last) = (
            (r.start / step).ceil() as i64,
            (r.end / step).floor() as i64,
        );
        if !self.log2_ticks || last < first || most == 0 {
            return self.linear.key_points(most);
        }
        let every = ((last - first + 1) as usize).div_ceil(most) as i64;
        (first..=last)
            .filter(|k| k.rem_euclid(every) == 0)
            .map(|k| k as f64 * step)
            .collect()
    }

    fn range(&self) -> std::ops::Range<f64> {
        self.linear.range()
    }
}

/// The label of a tick on an [`XAxis`] of log10 values: a power of two as its value (64, 0.5), any
/// other tick as [`log10`] prints it.
pub fn power_of_two(x: f64, span: f64, labels: usize) -> String {
    let k = x / 2f64.log10();
    if (k - k.round()).abs() < 1e-9 && k.abs() < 64.0 {
        return format!("{}", 2f64.powi(k.round() as i32));
    }
    log10(x, span, labels)
}

/// Ticks to label on an axis of whole numbers `span` wide (a heat map's token counts): one a step at
/// most, so that no tick falls between two whole numbers; [`LABELS`] at most, one at least.
pub fn whole(span: f64) -> usize {
    (span.floor() as usize).clamp(1, LABELS)
}

#[cfg(test)]
mod tests {
    use super::*;
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
    fn a_budget_axis_in_entries_ticks_powers_of_two() {
        let axis = |lo: f64, hi: f64| XAxis::new(lo.log10()..hi.log10(), true);
        let labels = |a: &XAxis| -> Vec<String> {
            let r = a.range();
            a.key_points(LABELS)
                .iter()
                .map(|&x| power_of_two(x, r.end - r.start, LABELS))
                .collect()
        };
        assert_eq!(labels(&axis(48.0, 300.0)), ["64", "128", "256"]);
        // One budget of 64, half its log either side (`range`): 8 to 512.
        assert_eq!(
            labels(&axis(8.0, 512.0)),
            ["8", "16", "32", "64", "128", "256", "512"]
        );
        // More doublings than labels: every second, third...
        let wide = labels(&axis(1.0, 1e6));
        assert!(wide.len() <= LABELS && wide.len() >= 5, "{wide:?}");
        assert!(wide.contains(&"1024".to_string()) || wide.contains(&"4096".to_string()));
        // Within one doubling: plotters' ticks, still distinct.
        let narrow = labels(&axis(70.0, 90.0));
        assert!(narrow.len() >= 2 && distinct(&narrow), "{narrow:?}");
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
        for _ in 0..20_000 {
            let lo = 10f64.powf(rng.random_range(-1.0..5.0));
            let hi = lo * 10f64.powf(rng.random_range(1e-4..4.0));
            let n = rng.random_range(2..=12usize);
            let a = axis(lo, hi);
            let l: Vec<String> = a
                .key_points(n)
                .iter()
                .map(|&x| power_of_two(x, hi.log10() - lo.log10(), n))
                .collect();
            assert!(
                !l.is_empty() && l.len() <= n.max(1) + 1,
                "{lo}..{hi}, {n}: {l:?}"
            );
            assert!(distinct(&l), "{lo}..{hi}, {n}: {l:?}");
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
