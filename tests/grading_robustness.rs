//! The grader never panics and never hangs: adversarial answers and random LaTeX-like strings get a
//! verdict within a bounded time.

use kvbench::eval::grade::{equivalent, extract::tidy, grade_output, normalize};
use proptest::prelude::*;
use std::time::{Duration, Instant};

/// Grades `pred` against a few golds (and itself) and checks the time taken.
fn bounded(pred: &str) {
    let start = Instant::now();
    for gold in ["1", "\\frac{1}{2}", "(1,2]", "x+1", pred] {
        let _ = equivalent(pred, gold);
        let _ = equivalent(gold, pred);
    }
    let _ = grade_output(pred, "1", false);
    let _ = grade_output(pred, "1", true);
    let took = start.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "{took:?} on an input of {} bytes starting {:?}",
        pred.len(),
        &pred.chars().take(40).collect::<String>()
    );
}

#[test]
fn adversarial_inputs_get_a_verdict_quickly() {
    let deep = |open: &str, inner: &str, close: &str, n: usize| {
        format!("{}{inner}{}", open.repeat(n), close.repeat(n))
    };
    let cases = [
        deep("{", "1", "}", 100_000),
        deep("(", "1", ")", 100_000),
        deep("\\frac{", "1", "}{2}", 20_000),
        deep("\\boxed{", "1", "}", 50_000),
        deep("\\text{", "1", "}", 50_000),
        "10^{10^{10}}".to_string(),
        "1000!".to_string(),
        "2^{100000}".to_string(),
        "9".repeat(1 << 20),
        "1,".repeat(300_000),
        "\\frac{1}{2}+".repeat(50_000) + "1",
        "-".repeat(100_000) + "1",
        "\\sin".repeat(100_000) + "x",
        "\\boxed{1} and ".repeat(50_000),
        (0..40_000)
            .map(|i| format!("\\boxed{{{i}}} and "))
            .collect(),
        (0..40_000).map(|i| format!("\\boxed{{x^{i}}}, ")).collect(),
        "İ the answer is ünïcödé İ".repeat(1000),
        "\\sqrt".repeat(50_000),
        "x".repeat(1 << 20),
        "{".repeat(1 << 20),
        "$".repeat(1 << 20),
        "<think>".repeat(10_000) + "</think>\\boxed{1}",
    ];
    for c in &cases {
        bounded(c);
    }
    assert!(!equivalent("10^{10^{10}}", "1"));
    assert!(
        equivalent("10^{10^{10}}", "10^{10^{10}}"),
        "equal strings still match"
    );
}

/// Tokens random answers are built from.
fn token() -> impl Strategy<Value = &'static str> {
    prop::sample::select(vec![
        "1",
        "2",
        "0",
        "9",
        ".",
        ",",
        "-",
        "+",
        "x",
        "y",
        "i",
        "e",
        "\\pi",
        "\\frac",
        "\\sqrt",
        "{",
        "}",
        "(",
        ")",
        "[",
        "]",
        "^",
        "_",
        "\\cdot",
        "\\infty",
        "\\in",
        "=",
        "<",
        "\\le",
        "\\cup",
        "\\{",
        "\\}",
        "\\text{",
        " ",
        "\\boxed{",
        "\\left(",
        "\\right)",
        "!",
        "|",
        "\\$",
        "%",
        "^\\circ",
        "\\pm",
        "&",
        "\\\\",
        "\\begin{pmatrix}",
        "\\end{pmatrix}",
        "</think>",
        "é",
    ])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    #[test]
    fn random_latex_never_panics_and_equals_itself(parts in prop::collection::vec(token(), 0..40)) {
        let s: String = parts.concat();
        bounded(&s);
        if !normalize(&tidy(&s)).is_empty() {
            prop_assert!(equivalent(&s, &s), "{s:?} does not equal itself");
        }
    }
}
