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
/// A one-letter function of one-letter variables, `f(x)` or `g_1(s,t)`.
static FUNCTION_OF: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[a-zA-Z](?:_[a-zA-Z0-9])?\([a-zA-Z](?:,[a-zA-Z])*\)$").expect("static pattern")
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

impl Value {
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
        for (token, rel) in RELATIONS {
            let parts = split_top(s, token);
            if parts.len() == 2 && !parts[0].is_empty() && !parts[1].is_empty() {
                // `f(x) =` names a function's value as `y =` names a variable's (beyond the spec's one
                // letter): the left side is one unknown, so that the right side is the answer.
                let lhs = if FUNCTION_OF.is_match(&parts[0]) {
                    Box::new(Value::Expr(Expr::Var(parts[0].clone())))
                } else {
                    sub(&parts[0])
                };
                return Value::Relation {
                    lhs,
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
