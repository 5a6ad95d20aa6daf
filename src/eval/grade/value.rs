//! Normalised answers parsed into small typed values (grading spec §4.3).

use super::expr::Expr;
use super::normalize::matching;
use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::Zero;
use regex::Regex;
use std::sync::LazyLock;

/// A parsed answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// An exact rational, or a decimal literal (`decimal`: written with a point).
    Num {
        value: BigRational,
        decimal: bool,
    },
    Expr(Expr),
    Tuple(Vec<Value>),
    Interval(Interval),
    Union(Vec<Interval>),
    Set(Vec<Value>),
    Matrix(Vec<Vec<Value>>),
    Relation {
        lhs: Box<Value>,
        op: Rel,
        rhs: Box<Value>,
    },
    /// A number with a base subscript, `52_8`: digits and base.
    Based(String, String),
    Text(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct Interval {
    pub lo: Box<Value>,
    pub hi: Box<Value>,
    pub lo_closed: bool,
    pub hi_closed: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rel {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Rel {
    /// The relation with its sides swapped.
    pub fn flipped(self) -> Rel {
        match self {
            Rel::Lt => Rel::Gt,
            Rel::Gt => Rel::Lt,
            Rel::Le => Rel::Ge,
            Rel::Ge => Rel::Le,
            r => r,
        }
    }
}

static PLAIN_NUMBER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^(-?)(\d+)(?:\.(\d+))?$").expect("static pattern"));
static FRACTION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(-?)(?:(\d+))?\\frac\{(-?\d+)\}\{(\d+)\}$").expect("static pattern")
});
/// A repeating decimal, `0.\overline{3}` or `1.2\bar{45}`: sign, whole part, the digits before the
/// bar and the repeating ones (braced or one digit).
static REPEATING: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(-?)(\d*)\.(\d*)\\(?:overline|bar)(?:\{(\d+)\}|(\d))$").expect("static pattern")
});
/// A one-letter function of one-letter variables or of numbers, `f(x)`, `g_1(s,t)` or `f(-2)`.
static FUNCTION_OF: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[a-zA-Z](?:_[a-zA-Z0-9])?\((?:[a-zA-Z]|-?\d+)(?:,(?:[a-zA-Z]|-?\d+))*\)$")
        .expect("static pattern")
});
/// A segment, angle or polygon named by its points (`AB`, `\angle ABC`, `m\angle A`, `\overline{AB}`),
/// as normalised: letters alone are text, so these are recognised here.
static FIGURE_NAME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(?:[A-Z]{2,3}|m?\\angle[A-Z]{1,3}|\\overline\{[A-Z]{2}\})$")
        .expect("static pattern")
});
/// The most digits a repeating decimal may have (beyond them it stays unparsed: spec §4.5's cap).
const MAX_REPEATING_DIGITS: usize = 200;
static BASED: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^([0-9A-Za-z]+)_(\d+)$").expect("static pattern"));
static WORD: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"[A-Za-z]{3,}").expect("static pattern"));
static MACRO: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\\[A-Za-z]+").expect("static pattern"));

/// Splits `s` at top-level occurrences of `sep` (outside (), [], {}).
pub fn split_top(s: &str, sep: &str) -> Vec<String> {
    let sep = sep.as_bytes();
    split_top_at(s, |rest| rest.starts_with(sep).then_some(((), sep.len()))).0
}

/// Splits `s` wherever `separator` recognises one at the top level (outside (), [], {}), given the
/// rest of the string from that byte: the pieces between, and what each separator was. The one
/// bracket scan behind [`split_top`] and a chain of relations.
pub fn split_top_at<T>(
    s: &str,
    separator: impl Fn(&[u8]) -> Option<(T, usize)>,
) -> (Vec<String>, Vec<T>) {
    let (mut pieces, mut found) = (Vec::new(), Vec::new());
    let (mut depth, mut start, mut i) = (0i32, 0, 0);
    let b = s.as_bytes();
    while i < b.len() {
        match b[i] {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth -= 1,
            _ => {}
        }
        // Byte comparison: `i` may sit inside a multi-byte character; an ASCII separator never does.
        if let Some((what, len)) = (depth == 0).then(|| separator(&b[i..])).flatten() {
            pieces.push(s[start..i].to_string());
            found.push(what);
            i += len;
            start = i;
            continue;
        }
        i += 1;
    }
    pieces.push(s[start..].to_string());
    (pieces, found)
}

/// The relations an answer may state, as the normaliser leaves them; a longer token before any
/// it starts with.
pub const RELATIONS: [(&str, Rel); 7] = [
    ("\\le", Rel::Le),
    ("\\ge", Rel::Ge),
    ("\\ne", Rel::Ne),
    // `x \approx 11` states a value as `x = 11` does (Math-Verify reads it so).
    ("\\approx", Rel::Eq),
    ("<", Rel::Lt),
    (">", Rel::Gt),
    ("=", Rel::Eq),
];

/// A chain of relations at the top level, `a < x \le b` or `x = y = 2`: its operands, and the
/// relations between them with the tokens they were written as.
pub fn relation_chain(s: &str) -> (Vec<String>, Vec<(&'static str, Rel)>) {
    split_top_at(s, |rest| {
        RELATIONS
            .iter()
            .find(|(token, _)| rest.starts_with(token.as_bytes()))
            .map(|&(token, rel)| ((token, rel), token.len()))
    })
}

impl Value {
    /// Whether this, on the left of `= value`, names the quantity the value is for: a variable (`x`,
    /// `a_3`, `f(x)`, `f(2)`), an expression of variables with no number in it (`m+n`, `a+b+c`), as
    /// Math-Verify reads an assignment's left side, or a figure named by its points (`AB`, `\angle ABC`).
    pub fn names_quantity(&self) -> bool {
        match self {
            Value::Expr(e) => !e.vars().is_empty() && !e.has_number(),
            Value::Text(t) => FIGURE_NAME.is_match(t),
            _ => false,
        }
    }

    /// The left side of a relation: a function's value (`f(x)`, `f(2)`) is one unknown, as `y` is
    /// (beyond the spec's one letter), so that the right side is the answer.
    fn left_side(s: &str, depth: usize) -> Box<Value> {
        Box::new(if FUNCTION_OF.is_match(s) {
            Value::Expr(Expr::Var(s.to_string()))
        } else {
            Self::parse_depth(s, depth + 1)
        })
    }

    /// A chain of two or more equalities whose first operand names a quantity, `x = y = 2`,
    /// `AB = BC = 6` or `x = 2\sqrt{2} \approx 2.83`, as the one equation it states: that name equals
    /// the value the chain ends in, or, from the last `=` before an `\approx`, an exact value with its
    /// rounding. Math-Verify truncates a chain so; the spec names one `=` only. A list is no chain:
    /// `x=1, x=-2` is two assignments.
    fn equality_chain(s: &str, depth: usize) -> Option<Value> {
        let (operands, relations) = relation_chain(s);
        if relations.len() < 2
            || relations.iter().any(|&(_, rel)| rel != Rel::Eq)
            || operands
                .iter()
                .any(|o| o.trim().is_empty() || split_top(o, ",").len() > 1)
        {
            return None;
        }
        let lhs = Self::left_side(&operands[0], depth);
        if !lhs.names_quantity() {
            return None;
        }
        // From the last `=` before the first `\approx` on: one value, or a value with its rounding.
        let first_approx = relations
            .iter()
            .position(|&(token, _)| token == "\\approx")
            .filter(|&k| k >= 1);
        let rhs = match first_approx {
            Some(k) => {
                let mut rest = operands[k].clone();
                for (operand, (token, _)) in operands[k + 1..].iter().zip(&relations[k..]) {
                    rest.push_str(token);
                    rest.push_str(operand);
                }
                rest
            }
            None => operands[operands.len() - 1].clone(),
        };
        Some(Value::Relation {
            lhs,
            op: Rel::Eq,
            rhs: Box::new(Self::parse_depth(&rhs, depth + 1)),
        })
    }

    /// The elements of a comma list; an element written with `±` stands for its two values.
    fn elements(list: &str, depth: usize) -> Vec<Value> {
        let mut out = Vec::new();
        for part in split_top(list, ",") {
            match Self::parse_depth(&part, depth + 1) {
                Value::Set(pm) if part.contains("\\pm") => out.extend(pm),
                v => out.push(v),
            }
        }
        out
    }

    /// Parses a normalised answer string.
    pub fn parse(s: &str) -> Value {
        Self::parse_depth(s, 0)
    }

    fn parse_depth(s: &str, depth: usize) -> Value {
        let s = s.trim();
        if depth > 8 || s.is_empty() {
            return Value::Text(s.to_string());
        }
        let sub = |x: &str| Box::new(Self::parse_depth(x, depth + 1));
        // Matrices.
        if let Some(body) = s
            .strip_prefix("\\begin{pmatrix}")
            .and_then(|r| r.strip_suffix("\\end{pmatrix}"))
        {
            let rows: Vec<Vec<Value>> = body
                .split("\\\\")
                .filter(|r| !r.trim().is_empty())
                .map(|r| {
                    r.split('&')
                        .map(|c| Self::parse_depth(c, depth + 1))
                        .collect()
                })
                .collect();
            return Value::Matrix(rows);
        }
        // Relations (at top level).
        if let Some(chain) = Self::equality_chain(s, depth) {
            return chain;
        }
        for (token, rel) in RELATIONS {
            let parts = split_top(s, token);
            if parts.len() == 2 && !parts[0].is_empty() && !parts[1].is_empty() {
                return Value::Relation {
                    lhs: Self::left_side(&parts[0], depth),
                    op: rel,
                    rhs: sub(&parts[1]),
                };
            }
        }
        // Unions of intervals.
        let pieces = split_top(s, "\\cup");
        if pieces.len() > 1 {
            let ivs: Option<Vec<Interval>> = pieces
                .iter()
                .map(|p| match Self::parse_depth(p, depth + 1) {
                    Value::Interval(iv) => Some(iv),
                    Value::Tuple(t) if t.len() == 2 => Some(Interval {
                        lo: Box::new(t[0].clone()),
                        hi: Box::new(t[1].clone()),
                        lo_closed: false,
                        hi_closed: false,
                    }),
                    _ => None,
                })
                .collect();
            return match ivs {
                Some(v) => Value::Union(v),
                None => Value::Text(s.to_string()),
            };
        }
        // Sets in braces, `\{2, 3\}`, or bare braces around a list, `{2, 3}`.
        let bare_braces = s.starts_with('{')
            && matching(s, '{', '}') == Some(s.len() - 1)
            && split_top(&s[1..s.len() - 1], ",").len() > 1;
        let set_inner = s
            .strip_prefix("\\{")
            .and_then(|r| r.strip_suffix("\\}"))
            .or_else(|| bare_braces.then(|| &s[1..s.len() - 1]));
        if let Some(inner) = set_inner {
            return Value::Set(Self::elements(inner, depth));
        }
        // Tuples and intervals: one bracket pair around the whole string.
        let open = s.chars().next().unwrap_or(' ');
        let close = s.chars().last().unwrap_or(' ');
        let wraps_all = match open {
            '(' => matching(s, '(', ')') == Some(s.len() - 1),
            '[' => matching(s, '[', ']') == Some(s.len() - 1),
            _ => false,
        };
        if matches!(open, '(' | '[') && matches!(close, ')' | ']') {
            let inner = &s[1..s.len() - 1];
            let parts = split_top(inner, ",");
            let mixed = open == '[' || close == ']';
            if parts.len() == 2 && mixed {
                return Value::Interval(Interval {
                    lo: sub(&parts[0]),
                    hi: sub(&parts[1]),
                    lo_closed: open == '[',
                    hi_closed: close == ']',
                });
            }
            if parts.len() >= 2 && open == '(' && close == ')' && wraps_all {
                return Value::Tuple(
                    parts
                        .iter()
                        .map(|x| Self::parse_depth(x, depth + 1))
                        .collect(),
                );
            }
        }
        if let Some(inner) = s
            .strip_prefix("\\langle")
            .and_then(|r| r.strip_suffix("\\rangle"))
        {
            return Value::Tuple(
                split_top(inner, ",")
                    .iter()
                    .map(|x| Self::parse_depth(x, depth + 1))
                    .collect(),
            );
        }
        // Bare comma lists and ±.
        if split_top(s, ",").len() > 1 {
            return Value::Set(Self::elements(s, depth));
        }
        if let Some((a, b)) = s.split_once("\\pm") {
            let a = if a.is_empty() { "0" } else { a };
            return Value::Set(vec![
                Self::parse_depth(&format!("{a}+{b}"), depth + 1),
                Self::parse_depth(&format!("{a}-{b}"), depth + 1),
            ]);
        }
        // `52_8` is a number in base 8; a single letter with a subscript, `a_3`, is a variable.
        if let Some(c) = BASED.captures(s) {
            let digits = &c[1];
            if digits.len() > 1 || digits.chars().all(|ch| ch.is_ascii_digit()) {
                return Value::Based(digits.to_string(), c[2].to_string());
            }
        }
        if let Some(n) = exact_number(s) {
            return n;
        }
        // Words are text; everything else an expression if it parses.
        let bare = MACRO.replace_all(s, "");
        let all_letters = s.len() >= 2 && s.chars().all(|c| c.is_ascii_alphabetic());
        if !WORD.is_match(&bare) && !all_letters {
            if let Some(e) = Expr::parse(s) {
                return Value::Expr(e);
            }
        }
        Value::Text(s.to_string())
    }
}

/// Plain integers and decimals, `\frac{a}{b}`, mixed numbers `n\frac{a}{b}` and (beyond the spec)
/// repeating decimals `0.1\overline{6}`, exactly.
fn exact_number(s: &str) -> Option<Value> {
    if s.contains("\\overline") || s.contains("\\bar") {
        return repeating_decimal(s);
    }
    if let Some(c) = PLAIN_NUMBER.captures(s) {
        let int: BigInt = c[2].parse().ok()?;
        let (value, decimal) = match c.get(3) {
            Some(frac) => {
                let digits = frac.as_str();
                let den = BigInt::from(10u32).pow(digits.len() as u32);
                let num = int * &den + digits.parse::<BigInt>().ok()?;
                (BigRational::new(num, den), true)
            }
            None => (BigRational::from_integer(int), false),
        };
        let value = if &c[1] == "-" { -value } else { value };
        return Some(Value::Num { value, decimal });
    }
    let c = FRACTION.captures(s)?;
    let num: BigInt = c[3].parse().ok()?;
    let den: BigInt = c[4].parse().ok()?;
    if den.is_zero() {
        return None;
    }
    let mut value = BigRational::new(num, den);
    if let Some(whole) = c.get(2) {
        // A mixed number: the sign covers both parts.
        let whole: BigInt = whole.as_str().parse().ok()?;
        if value < BigRational::zero() {
            return None;
        }
        value += BigRational::from_integer(whole);
    }
    if &c[1] == "-" {
        value = -value;
    }
    Some(Value::Num {
        value,
        decimal: false,
    })
}

/// `w.a\overline{r}` is w + (a·(10^|r| − 1) + r) / (10^|a|·(10^|r| − 1)): a number, not a decimal
/// literal, so it compares exactly (`0.\overline{3}` is 1/3, `0.\overline{9}` is 1).
fn repeating_decimal(s: &str) -> Option<Value> {
    let c = REPEATING.captures(s)?;
    let (whole, fixed) = (&c[2], &c[3]);
    let repeat = c.get(4).or(c.get(5))?.as_str();
    if whole.len() + fixed.len() + repeat.len() > MAX_REPEATING_DIGITS {
        return None;
    }
    let digits = |d: &str| -> Option<BigInt> {
        if d.is_empty() {
            Some(BigInt::zero())
        } else {
            d.parse().ok()
        }
    };
    let ten = BigInt::from(10u32);
    let nines = ten.pow(repeat.len() as u32) - 1;
    let num = digits(fixed)? * &nines + digits(repeat)?;
    let den = ten.pow(fixed.len() as u32) * nines;
    let mut value = BigRational::from_integer(digits(whole)?) + BigRational::new(num, den);
    if &c[1] == "-" {
        value = -value;
    }
    Some(Value::Num {
        value,
        decimal: false,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_types() {
        assert!(matches!(
            Value::parse("025"),
            Value::Num { decimal: false, .. }
        ));
        assert!(matches!(
            Value::parse("0.5"),
            Value::Num { decimal: true, .. }
        ));
        assert!(matches!(Value::parse("(3,4]"), Value::Interval(_)));
        assert!(matches!(Value::parse("(3,4)"), Value::Tuple(_)));
        assert!(matches!(Value::parse("3,5,7"), Value::Set(_)));
        assert!(matches!(Value::parse("y=2x+3"), Value::Relation { .. }));
        assert!(matches!(Value::parse("52_8"), Value::Based(..)));
        assert!(matches!(Value::parse("Evelyn"), Value::Text(_)));
        assert!(matches!(Value::parse("(a+5)(b+2)"), Value::Expr(_)));
        assert!(matches!(Value::parse("(1,2)\\cup[3,4]"), Value::Union(_)));
        if let Value::Num { value, .. } = Value::parse("137\\frac{1}{2}") {
            assert_eq!(value, BigRational::new(275.into(), 2.into()));
        } else {
            panic!("mixed number");
        }
    }
}
