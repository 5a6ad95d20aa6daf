//! The grader of `../shared/spec/grading.md`: extraction, normalisation, typed parsing and the
//! comparison ladder, with the known false positives of public graders avoided (no ×100 rule, bracket
//! types kept, 6-decimal rule instead of a loose tolerance, no last-number fallback by default).
//!
//! Pure Rust, deterministic: identity tests of expressions with variables evaluate both sides at fixed
//! pseudo-random complex points (ChaCha8, fixed seed).

pub mod expr;
pub mod extract;
pub mod inequality;
pub mod normalize;
pub mod value;

pub use extract::{extract, Extracted};
pub use normalize::normalize;
use num_complex::Complex64;
use num_rational::BigRational;
use num_traits::{Signed, ToPrimitive};
use rand::{Rng, SeedableRng};
use value::{Interval, Rel, Value};

/// Bumped whenever a verdict can change; recorded with results.
pub const GRADER_VERSION: &str = "kvbench-grader-9";

/// The verdict on one output.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Correct,
    Incorrect,
    /// No answer could be extracted (counted as incorrect).
    NoAnswer,
    /// A thinking block never closed (counted as incorrect, reported separately).
    Truncated,
}

impl Verdict {
    pub fn is_correct(&self) -> bool {
        *self == Verdict::Correct
    }
}

/// Grades a whole model output against a gold answer.
pub fn grade_output(
    output: &str,
    gold: &str,
    prompt_opened_thinking: bool,
) -> (Option<String>, Verdict) {
    grade_output_with(output, gold, prompt_opened_thinking, false)
}

/// [`grade_output`], optionally in the lenient extraction mode ([`extract::extract_with`]).
pub fn grade_output_with(
    output: &str,
    gold: &str,
    prompt_opened_thinking: bool,
    lenient: bool,
) -> (Option<String>, Verdict) {
    match extract::extract_with(output, prompt_opened_thinking, lenient) {
        Extracted::Truncated => (None, Verdict::Truncated),
        Extracted::NoAnswer => (None, Verdict::NoAnswer),
        Extracted::Answer(a) => {
            let v = if equivalent(&a, gold) {
                Verdict::Correct
            } else {
                Verdict::Incorrect
            };
            (Some(a), v)
        }
    }
}

/// Answers longer than this (after normalisation) are compared as strings only (spec §4.5: give up
/// beyond a cap, which scores as incorrect unless the strings are equal).
pub const MAX_TYPED_LEN: usize = 4096;

/// Whether an extracted answer equals the gold answer (spec §3–§4).
pub fn equivalent(pred: &str, gold: &str) -> bool {
    let (p, g) = (
        normalize(&extract::tidy(pred)),
        normalize(&extract::tidy(gold)),
    );
    if p.is_empty() || g.is_empty() {
        return false;
    }
    // 1. String.
    if p == g {
        return true;
    }
    if p.len() > MAX_TYPED_LEN || g.len() > MAX_TYPED_LEN {
        return false;
    }
    // 2. Multiple choice.
    if let Some(letter) = choice_letter(&g, true) {
        return choice_letter(&p, false) == Some(letter);
    }
    // 3–4. Typed comparison.
    let (pv, gv) = (Value::parse(&p), Value::parse(&g));
    values_equal(&pv, &gv) || interval_meets_inequality(&pv, &g)
}

/// An interval (or union) prediction against an inequality gold, `(2,\infty)` for `x > 2`: the
/// spec's "the reverse may be accepted" (§4.4), as in Math-Verify. Never the other way round.
fn interval_meets_inequality(p: &Value, gold: &str) -> bool {
    if !matches!(p, Value::Interval(_) | Value::Tuple(_) | Value::Union(_)) {
        return false;
    }
    let Some(ivs) = inequality::intervals(gold) else {
        return false;
    };
    match (p, ivs.as_slice()) {
        (Value::Union(u), _) => {
            u.len() == ivs.len() && matches(u, &ivs, &|x: &Interval, y| intervals_equal(x, y))
        }
        (_, [iv]) => values_equal(p, &Value::Interval(iv.clone())),
        _ => false,
    }
}

/// The letter of a multiple-choice answer: `C`, `(C)`, or (for predictions) `(C)` followed by text.
fn choice_letter(s: &str, gold: bool) -> Option<char> {
    let t = s.trim();
    let inner = t
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .unwrap_or(t);
    let mut chars = inner.chars();
    if let (Some(c), None) = (chars.next(), chars.next()) {
        if ('A'..='E').contains(&c) {
            return Some(c);
        }
    }
    if !gold {
        let mut chars = t.chars();
        if let (Some('('), Some(c), Some(')')) = (chars.next(), chars.next(), chars.next()) {
            if ('A'..='E').contains(&c) {
                return Some(c);
            }
        }
    }
    None
}

fn values_equal(p: &Value, g: &Value) -> bool {
    use Value::*;
    match (p, g) {
        (Num { .. } | Expr(_), Num { .. } | Expr(_)) => scalars_equal(p, g),
        (Tuple(a), Tuple(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| values_equal(x, y))
        }
        (Interval(a), Interval(b)) => intervals_equal(a, b),
        // "(a,b)" is ambiguous: a 2-tuple prediction against an open interval compares element-wise.
        (Tuple(t), Interval(iv)) if t.len() == 2 && !iv.lo_closed && !iv.hi_closed => {
            values_equal(&t[0], &iv.lo) && values_equal(&t[1], &iv.hi)
        }
        (Union(a), Union(b)) => {
            a.len() == b.len() && matches(a, b, &|x: &value::Interval, y| intervals_equal(x, y))
        }
        (Set(a), Set(b)) => {
            // Assignments to distinct variables on both sides (`a_3 = 2, a_{37} = 19`) match as
            // equations, in any order; otherwise `x = 1` in a list stands for its value.
            if distinct_assignments(a) && distinct_assignments(b) {
                return a.len() == b.len() && matches(a, b, &values_equal);
            }
            let a: Vec<Value> = a.iter().map(assignment_value).collect();
            let b: Vec<Value> = b.iter().map(assignment_value).collect();
            a.len() == b.len() && matches(&a, &b, &values_equal)
        }
        (Matrix(a), Matrix(b)) => {
            a.len() == b.len()
                && a.iter().zip(b).all(|(r, s)| {
                    r.len() == s.len() && r.iter().zip(s).all(|(x, y)| values_equal(x, y))
                })
        }
        (
            Relation { lhs, op, rhs },
            Relation {
                lhs: l2,
                op: o2,
                rhs: r2,
            },
        ) => relations_equal((lhs, *op, rhs), (l2, *o2, r2)),
        // Exactly one side an assignment `v = value`: compare the value. A prediction may name its
        // quantity as any expression of variables (`AB = 6`, `m+n = 7`: Math-Verify takes the right
        // side of such an equation) or show a true computation of it (`\frac{100}{5} = 20`); a gold's
        // left side must be one variable, so that a gold equation (`x+y = 6`, a line) is not met by
        // its right side alone.
        (
            Relation {
                lhs,
                op: Rel::Eq,
                rhs,
            },
            other,
        ) if lhs.names_quantity() || computes(lhs, rhs) => values_equal(rhs, other),
        // `2\sqrt{2} \approx 2.83`: an exact value with its true rounding; either is the answer (a
        // gold may ask for the rounding).
        (
            Relation {
                lhs,
                op: Rel::Eq,
                rhs,
            },
            other,
        ) if approximates(lhs, rhs) => values_equal(lhs, other) || values_equal(rhs, other),
        (
            other,
            Relation {
                lhs,
                op: Rel::Eq,
                rhs,
            },
        ) if is_variable(lhs) => values_equal(other, rhs),
        (Based(d, b), Based(d2, b2)) => d == d2 && b == b2,
        // Dropping the base is accepted; the base-10 value is not.
        (
            Num {
                value,
                decimal: false,
            },
            Based(d, _),
        ) => value.to_string() == *d,
        (Text(a), Text(b)) => a.eq_ignore_ascii_case(b),
        _ => false,
    }
}

/// Every element is `variable = value`, and no variable appears twice.
fn distinct_assignments(list: &[Value]) -> bool {
    let mut names = std::collections::HashSet::new();
    list.iter().all(|v| match v {
        Value::Relation {
            lhs, op: Rel::Eq, ..
        } => match &**lhs {
            Value::Expr(expr::Expr::Var(name)) => names.insert(name.clone()),
            _ => false,
        },
        _ => false,
    })
}

/// `x = 1` inside a list of solutions stands for `1`.
fn assignment_value(v: &Value) -> Value {
    match v {
        Value::Relation {
            lhs,
            op: Rel::Eq,
            rhs,
        } if is_variable(lhs) => (**rhs).clone(),
        other => other.clone(),
    }
}

/// The expression of a constant: a number, or an expression without variables.
fn constant(v: &Value) -> Option<expr::Expr> {
    as_expr(v).filter(|e| e.vars().is_empty())
}

/// Whether `lhs = rhs` is a computation: a constant left side whose value is the right side's.
fn computes(lhs: &Value, rhs: &Value) -> bool {
    constant(lhs).is_some() && scalars_equal(lhs, rhs)
}

/// Whether `rhs` is `lhs` rounded: a constant left side and a decimal right side with one to twelve
/// places, which the left side rounds to (`2\sqrt{2} \approx 2.83`, `\frac{\pi}{4} = 0.785`).
fn approximates(lhs: &Value, rhs: &Value) -> bool {
    let (
        Some(exact),
        Value::Num {
            value,
            decimal: true,
        },
    ) = (constant(lhs), rhs)
    else {
        return false;
    };
    // The places a decimal literal shows, as far as its exact value tells (`2.80` is 2.8).
    let ten = BigRational::from_integer(10.into());
    let mut scaled = value.clone();
    let Some(places) = (1..=12).find(|_| {
        scaled *= &ten;
        scaled.is_integer()
    }) else {
        return false;
    };
    let (Some(x), Some(shown)) = (exact.eval(&|_| None), value.to_f64()) else {
        return false;
    };
    let scale = 10f64.powi(places);
    x.im.abs() < 1e-12 && (x.re * scale).round() == (shown * scale).round()
}

fn is_variable(v: &Value) -> bool {
    matches!(v, Value::Expr(expr::Expr::Var(_)))
}

/// A perfect matching between two equally long lists under `eq` (backtracking; lists are short).
fn matches<T>(a: &[T], b: &[T], eq: &dyn Fn(&T, &T) -> bool) -> bool {
    fn go<T>(a: &[T], b: &[T], used: &mut Vec<bool>, eq: &dyn Fn(&T, &T) -> bool) -> bool {
        let Some((x, rest)) = a.split_first() else {
            return true;
        };
        for j in 0..b.len() {
            if !used[j] && eq(x, &b[j]) {
                used[j] = true;
                if go(rest, b, used, eq) {
                    return true;
                }
                used[j] = false;
            }
        }
        false
    }
    a.len() <= 12 && go(a, b, &mut vec![false; b.len()], eq)
}

fn intervals_equal(a: &Interval, b: &Interval) -> bool {
    a.lo_closed == b.lo_closed
        && a.hi_closed == b.hi_closed
        && values_equal(&a.lo, &b.lo)
        && values_equal(&a.hi, &b.hi)
}

fn relations_equal(a: (&Value, Rel, &Value), b: (&Value, Rel, &Value)) -> bool {
    let diff = |l: &Value, r: &Value| -> Option<expr::Expr> {
        Some(expr::Expr::Sub(
            Box::new(as_expr(l)?),
            Box::new(as_expr(r)?),
        ))
    };
    if a.1 == Rel::Eq && b.1 == Rel::Eq {
        // Equations equal up to sign: L−R against ±(L'−R').
        let (Some(d1), Some(d2)) = (diff(a.0, a.2), diff(b.0, b.2)) else {
            return false;
        };
        return exprs_equal(&d1, &d2, 1e-8)
            || exprs_equal(&d1, &expr::Expr::Neg(Box::new(d2)), 1e-8);
    }
    if (a.1 == b.1 && values_equal(a.0, b.0) && values_equal(a.2, b.2))
        || (a.1 == b.1.flipped() && values_equal(a.0, b.2) && values_equal(a.2, b.0))
    {
        return true;
    }
    // Inequalities as one side against 0: `L < R` is `L − R < 0` and `L > R` is `R − L < 0`, so that
    // `-x > -1` equals `x < 1` (as in Math-Verify; the spec names equations only). The direction fixes
    // the sign, so no sign flip and no scaling; `≠` is symmetric, so up to sign.
    let oriented = |(l, op, r): (&Value, Rel, &Value)| -> Option<(expr::Expr, Rel)> {
        match op {
            Rel::Lt | Rel::Le | Rel::Ne => Some((diff(l, r)?, op)),
            Rel::Gt | Rel::Ge => Some((diff(r, l)?, op.flipped())),
            Rel::Eq => None,
        }
    };
    let (Some((d1, o1)), Some((d2, o2))) = (oriented(a), oriented(b)) else {
        return false;
    };
    o1 == o2
        && (exprs_equal(&d1, &d2, 1e-8)
            || (o1 == Rel::Ne && exprs_equal(&d1, &expr::Expr::Neg(Box::new(d2)), 1e-8)))
}

fn as_expr(v: &Value) -> Option<expr::Expr> {
    match v {
        Value::Expr(e) => Some(e.clone()),
        Value::Num { value, .. } => Some(expr::Expr::Num(value.to_f64()?)),
        _ => None,
    }
}

/// Numbers and expressions: exact rationals exactly; a decimal literal on either side by the
/// 6-decimal rule; constant expressions to relative 1e-9; expressions with variables by identity
/// testing when both have the same free variables.
fn scalars_equal(p: &Value, g: &Value) -> bool {
    if let (
        Value::Num {
            value: a,
            decimal: da,
        },
        Value::Num {
            value: b,
            decimal: db,
        },
    ) = (p, g)
    {
        return if *da || *db {
            round6(a) == round6(b)
        } else {
            a == b
        };
    }
    let decimal = matches!(p, Value::Num { decimal: true, .. })
        || matches!(g, Value::Num { decimal: true, .. });
    let (Some(a), Some(b)) = (as_expr(p), as_expr(g)) else {
        return false;
    };
    if decimal {
        let (Some(x), Some(y)) = (a.eval(&|_| None), b.eval(&|_| None)) else {
            return false;
        };
        let r = |v: f64| (v * 1e6).round();
        return x.im.abs() < 1e-12 && y.im.abs() < 1e-12 && r(x.re) == r(y.re);
    }
    exprs_equal(&a, &b, 1e-9)
}

/// Rounds to 6 decimal places, half away from zero, exactly.
fn round6(x: &BigRational) -> BigRational {
    let scale = BigRational::from_integer(1_000_000.into());
    let scaled = x * &scale;
    let half = BigRational::new(1.into(), 2.into());
    let rounded = if scaled.is_negative() {
        -((-scaled) + half).floor()
    } else {
        (scaled + half).floor()
    };
    rounded / scale
}

/// Whether two expressions agree: constants directly, otherwise at 5 fixed pseudo-random complex
/// points (same free variables required).
fn exprs_equal(a: &expr::Expr, b: &expr::Expr, tol: f64) -> bool {
    let vars = a.vars();
    if vars != b.vars() {
        return false;
    }
    let close = |x: Complex64, y: Complex64| {
        (x - y).norm() <= tol * x.norm().max(y.norm()).max(1e-12) || (x - y).norm() < 1e-12
    };
    if vars.is_empty() {
        return match (a.eval(&|_| None), b.eval(&|_| None)) {
            (Some(x), Some(y)) => close(x, y),
            _ => false,
        };
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x006b_7662_656e_6368);
    let names: Vec<&String> = vars.iter().collect();
    let mut agreed = 0;
    for _ in 0..10 {
        let point: Vec<Complex64> = names
            .iter()
            .map(|_| {
                let re: f64 =
                    rng.random_range(0.5..2.0) * if rng.random_bool(0.5) { 1.0 } else { -1.0 };
                Complex64::new(re, rng.random_range(-0.5..0.5))
            })
            .collect();
        let env = |name: &str| names.iter().position(|n| *n == name).map(|i| point[i]);
        match (a.eval(&env), b.eval(&env)) {
            (Some(x), Some(y)) if close(x, y) => agreed += 1,
            (Some(_), Some(_)) => return false,
            // A pole or a cap: try another point.
            _ => {}
        }
        if agreed == 5 {
            return true;
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ladder_basics() {
        assert!(equivalent("\\frac{2}{4}", "\\frac12"));
        assert!(!equivalent("300", "3"));
        assert!(!equivalent("(3,4)", "(3,4]"));
        assert!(equivalent("ab+5b+2a+10", "(a+5)(b+2)"));
        assert!(equivalent("\\sqrt{117}", "3\\sqrt{13}"));
        assert!(equivalent("10.816654", "3\\sqrt{13}"));
        assert!(!equivalent("6366.2", "\\frac{20000}{\\pi}"));
        assert!(equivalent("-2,1", "1,-2"));
        assert!(!equivalent("x", "y"));
        assert!(!equivalent("25.5", "25"));
        assert!(equivalent("\\text{25}", "25"));
        assert!(equivalent("(1,2)\\cup(3,4)", "(3,4)\\cup(1,2)"));
        assert!(equivalent("\\{1,2\\}", "\\{2,1\\}"));
        assert!(equivalent("1\\pm\\sqrt{2}", "1-\\sqrt{2},1+\\sqrt{2}"));
    }
}
