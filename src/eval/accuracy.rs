//! Accuracy over problems and samples (grading spec, "Other settings"): pass@1 as the mean over
//! problems of the share of correct samples, its standard error across problems, and cons@n (the
//! largest cluster of equivalent answers, ties to the earliest sample).

use super::grade::equivalent;

/// One problem's samples: each extracted answer (if any) and whether it was graded correct.
#[derive(Debug, Clone, Default)]
pub struct ProblemSamples {
    pub gold: String,
    pub answers: Vec<Option<String>>,
    pub correct: Vec<bool>,
}

/// Accuracy figures of a run.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Accuracy {
    pub problems: usize,
    /// Mean over problems of correct samples / samples.
    pub pass_at_1: f64,
    /// Standard error of `pass_at_1` across problems.
    pub stderr: f64,
    /// Majority vote over each problem's samples, graded.
    pub cons: f64,
}

/// The answer most samples agree on (clusters by the grader's equivalence; ties: earliest).
fn majority(answers: &[Option<String>]) -> Option<&str> {
    let given: Vec<&str> = answers.iter().flatten().map(String::as_str).collect();
    let mut best: Option<(&str, usize)> = None;
    for (i, a) in given.iter().enumerate() {
        let votes = given
            .iter()
            .filter(|b| *a == **b || equivalent(b, a))
            .count();
        // Earlier samples win ties: only a strictly larger cluster replaces the best.
        if best.is_none_or(|(_, v)| votes > v) && !given[..i].iter().any(|b| equivalent(b, a)) {
            best = Some((a, votes));
        }
    }
    best.map(|(a, _)| a)
}

/// The unbiased pass@k of one problem with `n` samples of which `c` are correct (Codex paper):
/// `1 − C(n−c, k) / C(n, k)`, computed as a running product.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> f64 {
    if k == 0 || k > n {
        return f64::NAN;
    }
    if n - c < k {
        return 1.0;
    }
    1.0 - (n - c + 1..=n).fold(1.0, |acc, i| acc * (1.0 - k as f64 / i as f64))
}

/// Mean over problems of the unbiased pass@k.
pub fn mean_pass_at_k(problems: &[ProblemSamples], k: usize) -> f64 {
    let sum: f64 = problems
        .iter()
        .map(|p| pass_at_k(p.correct.len(), p.correct.iter().filter(|&&c| c).count(), k))
        .sum();
    sum / problems.len().max(1) as f64
}

pub fn accuracy(problems: &[ProblemSamples]) -> Accuracy {
    let n = problems.len().max(1) as f64;
    let rates: Vec<f64> = problems
        .iter()
        .map(|p| p.correct.iter().filter(|&&c| c).count() as f64 / p.correct.len().max(1) as f64)
        .collect();
    // A fold from +0.0: `Sum` of no floats is -0.0, which would print as "-0.0%".
    let mean = rates.iter().fold(0.0, |a, r| a + r) / n;
    let var = if rates.len() > 1 {
        rates.iter().map(|r| (r - mean).powi(2)).sum::<f64>() / (rates.len() - 1) as f64
    } else {
        0.0
    };
    let cons = problems
        .iter()
        .filter(|p| majority(&p.answers).is_some_and(|a| equivalent(a, &p.gold)))
        .count() as f64
        / n;
    Accuracy {
        problems: problems.len(),
        pass_at_1: mean,
        stderr: (var / n).sqrt(),
        cons,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(gold: &str, answers: &[Option<&str>]) -> ProblemSamples {
        ProblemSamples {
            gold: gold.into(),
            answers: answers.iter().map(|a| a.map(String::from)).collect(),
            correct: answers
                .iter()
                .map(|a| a.is_some_and(|a| equivalent(a, gold)))
                .collect(),
        }
    }

    #[test]
    fn unbiased_pass_at_k() {
        assert!((pass_at_k(4, 2, 1) - 0.5).abs() < 1e-12);
        // 1 − C(2,2)/C(4,2) = 1 − 1/6
        assert!((pass_at_k(4, 2, 2) - 5.0 / 6.0).abs() < 1e-12);
        assert_eq!(pass_at_k(4, 0, 2), 0.0);
        assert_eq!(pass_at_k(4, 3, 2), 1.0);
        assert!(pass_at_k(2, 1, 3).is_nan());
    }

    #[test]
    fn pass_at_1_stderr_and_consensus() {
        let probs = [
            p("2", &[Some("2"), Some("3"), Some("\\frac{4}{2}"), None]), // 2/4 correct, majority 2
            p("5", &[Some("4"), Some("4"), Some("5"), Some("5")]),       // tie 4/5: earliest (4)
        ];
        let a = accuracy(&probs);
        assert!((a.pass_at_1 - 0.5).abs() < 1e-12);
        assert!(a.stderr.abs() < 1e-12, "both problems score 0.5");
        assert!((a.cons - 0.5).abs() < 1e-12);
        let none = accuracy(&[]);
        assert!(
            none.pass_at_1 == 0.0 && none.pass_at_1.is_sign_positive(),
            "not -0.0"
        );
        let b = accuracy(&[p("1", &[Some("1")]), p("1", &[Some("0")])]);
        assert!((b.pass_at_1 - 0.5).abs() < 1e-12);
        assert!((b.stderr - 0.5).abs() < 1e-12);
    }
}
