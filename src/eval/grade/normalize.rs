//! String normalisation of an answer, gold and prediction alike (grading spec §3, steps in order).

use super::value::RELATIONS;
use regex::Regex;
use std::sync::LazyLock;

fn re(pattern: &str) -> Regex {
    Regex::new(pattern).expect("static pattern")
}

static UNIT_TEXT: LazyLock<Regex> = LazyLock::new(|| {
    re(r"\\(?:text|textnormal|textrm|mbox|mathrm)\{\s[^{}]*\}(?:\^\{?[23]\}?)?\s*$")
});
static UNIT_WORD: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"([0-9}\s])\s*(?:square\s+)?(?:cm|mm|km|m|meters?|metres?|inches|inch|in|feet|foot|ft|yards?|miles?|mph|units?|degrees?|cents?|dollars?|hours?|hrs?|minutes?|mins?|seconds?|secs?|days?|weeks?|years?|pounds?|lbs?|ounces?|oz|grams?|kg|liters?|litres?|gallons?|people|students|ways|sq)(?:\^\{?[23]\}?)?\s*$",
    )
});
static WRAPPER: LazyLock<Regex> = LazyLock::new(|| {
    re(
        r"\\(?:text|textnormal|textrm|textsf|textbf|textit|mathrm|mathbf|mathit|mbox|operatorname)\{([^{}]*)\}",
    )
});
/// A run of digit groups separated by commas (`1,234,567`, or a list `1,2,3`).
static DIGIT_GROUPS: LazyLock<Regex> = LazyLock::new(|| re(r"\d+(?:,\d+)+"));
/// A thousands separator written `,\!` (with any spacing after it): never a list.
static THIN_THOUSANDS: LazyLock<Regex> = LazyLock::new(|| re(r"(\d),\\!\s*(\d{3})"));
/// A thousands separator in braces, however spaced (`14 {, }916`, `14{,}916`): never a list.
static BRACED_THOUSANDS: LazyLock<Regex> = LazyLock::new(|| re(r"(\d)\s*\{\s*,\s*\}\s*(\d{3})"));
static PCT: LazyLock<Regex> = LazyLock::new(|| re(r"(\d)\s*pct\b"));
static ASSIGN: LazyLock<Regex> =
    LazyLock::new(|| re(r"^\s*[a-zA-Z](?:_\{?[a-zA-Z0-9]+\}?)?\s*=\s*(.*)$"));
/// `(a, b) =` before an ordered pair's values: the tuple form of `v =` (beyond the spec's one letter),
/// its variables letters, subscripted or not, or the Greek letters the expression parser reads as
/// variables (`(r, \theta)`; π is a number).
static TUPLE_ASSIGN: LazyLock<Regex> = LazyLock::new(|| {
    let greek = super::expr::GREEK.join("|");
    let var = format!(r"(?:[a-zA-Z]|\\(?:{greek}))(?:_\{{?[a-zA-Z0-9]+\}}?)?");
    re(&format!(
        r"^\s*\(\s*{var}(?:\s*,\s*{var})+\s*\)\s*=\s*(\(.*)$"
    ))
});
static IN_PREFIX: LazyLock<Regex> = LazyLock::new(|| re(r"^\s*[a-zA-Z]\s*\\in\s*"));
static INT_SLASH: LazyLock<Regex> = LazyLock::new(|| re(r"^(-?\d+)/(\d+)$"));
static MIXED_SLASH: LazyLock<Regex> = LazyLock::new(|| re(r"^(-?\d+)\s+(\d+)/(\d+)$"));
static LEADING_DOT: LazyLock<Regex> = LazyLock::new(|| re(r"(^|[^\d])\.(\d)"));
static INF_WORD: LazyLock<Regex> = LazyLock::new(|| re(r"\b(?:infinity|inf)\b"));
static SUB_BRACE: LazyLock<Regex> = LazyLock::new(|| re(r"_\{([a-zA-Z0-9])\}"));
static MACRO: LazyLock<Regex> = LazyLock::new(|| re(r"\\[a-zA-Z]+"));
static REL_LE: LazyLock<Regex> = LazyLock::new(|| re(r"\\(?:leqslant|leq|le)\b|<=|≤"));
static REL_GE: LazyLock<Regex> = LazyLock::new(|| re(r"\\(?:geqslant|geq|ge)\b|>=|≥"));
static REL_NE: LazyLock<Regex> = LazyLock::new(|| re(r"\\(?:neq|ne)\b|!=|≠"));
static BACKSLASH_SPACE: LazyLock<Regex> = LazyLock::new(|| re(r"(^|[^\\])\\ "));
/// `\hspace{…}` and `\hspace*{…}`: a space of a given width.
static HSPACE: LazyLock<Regex> = LazyLock::new(|| re(r"\\hspace\*?\{[^{}]*\}"));
static DOUBLE_BACKSLASH: LazyLock<Regex> = LazyLock::new(|| re(r"\\\\([a-zA-Z])"));
/// A trigonometric function's macro.
static TRIG: LazyLock<Regex> = LazyLock::new(|| re(r"\\(?:sin|cos|tan|sec|csc|cot)"));
/// A number of degrees.
static DEGREES: LazyLock<Regex> =
    LazyLock::new(|| re(r"(\d+(?:\.\d+)?)\s*(?:\^\{\\circ\}|\^\\circ|°|\\degree)"));
/// An ordinal, `5^{th}` or `2nd`, as the whole answer (after whitespace is gone).
static ORDINAL: LazyLock<Regex> =
    LazyLock::new(|| re(r"^(-?\d+)(?:\^\{(?:st|nd|rd|th)\}|\^?(?:st|nd|rd|th))$"));
/// A number in E notation, `1.5e-3`, as the whole answer (after whitespace is gone).
static E_NOTATION: LazyLock<Regex> = LazyLock::new(|| re(r"^(-?\d+(?:\.\d+)?)[eE]([+-]?\d{1,3})$"));
/// A union written with the letter U between two intervals' brackets (after whitespace is gone).
static LETTER_UNION: LazyLock<Regex> = LazyLock::new(|| re(r"([)\]])U([(\[])"));

/// Normalises an answer string (spec §3). The result is compared as a string first, then parsed.
pub fn normalize(s: &str) -> String {
    let mut s = s.to_string();
    let in_matrix = s.contains("\\begin{");
    // Beyond the spec: mathematical Unicode characters written for their LaTeX (`−5`, `2π`, `√3`).
    if !s.is_ascii() {
        s = unicode_math(&s);
    }
    // 1. Delimiters: the currency sign first, then math delimiters, newlines and tabs.
    s = s.replace("\\$", "");
    for d in ["$", "\\(", "\\)", "\\[", "\\]", "\n", "\t", "\r"] {
        s = s.replace(d, if d.len() == 1 && d != "$" { " " } else { "" });
    }
    if !in_matrix {
        s = DOUBLE_BACKSLASH.replace_all(&s, "\\$1").into_owned();
    }
    // A thousands separator `,\!` or `{,}` (however spaced) is one before it is a comma (step 11).
    for _ in 0..8 {
        let next = THIN_THOUSANDS.replace_all(&s, "$1$2").into_owned();
        let next = BRACED_THOUSANDS.replace_all(&next, "$1$2").into_owned();
        if next == s {
            break;
        }
        s = next;
    }
    // 2. Spacing macros: the spec's, and (beyond its list, the same kind) LaTeX's named spaces and
    //    `\hspace{…}`, the negative ones before the positive (`\negthinspace` holds `\thinspace`, and
    //    `\neg` left behind would read as a negation).
    //    Every one of LaTeX's names ends in `space`: answers without one skip their pass.
    if s.contains("space") {
        s = HSPACE.replace_all(&s, "").into_owned();
        for m in [
            "\\negthinspace",
            "\\negmedspace",
            "\\negthickspace",
            "\\thinspace",
            "\\medspace",
            "\\thickspace",
            "\\enspace",
        ] {
            s = s.replace(m, "");
        }
    }
    for m in ["\\qquad", "\\quad", "\\!", "\\,", "\\;", "\\:", "~"] {
        s = s.replace(m, "");
    }
    // `\ ` (backslash-space), but not the second backslash of a row break `\\`.
    s = BACKSLASH_SPACE.replace_all(&s, "$1 ").into_owned();
    // 3. Sizing.
    for m in [
        "\\left.", "\\right.", "\\left", "\\right", "\\Biggl", "\\Biggr", "\\biggl", "\\biggr",
        "\\Bigg", "\\bigg", "\\Bigl", "\\Bigr", "\\bigl", "\\bigr", "\\Big", "\\big",
    ] {
        s = s.replace(m, "");
    }
    // 4. Fraction macros and relations.
    for m in ["\\dfrac", "\\tfrac", "\\cfrac"] {
        s = s.replace(m, "\\frac");
    }
    // The same for binomial coefficients (beyond the spec's list).
    if s.contains("binom") {
        s = s
            .replace("\\dbinom", "\\binom")
            .replace("\\tbinom", "\\binom");
    }
    s = REL_LE.replace_all(&s, "\\le").into_owned();
    s = REL_GE.replace_all(&s, "\\ge").into_owned();
    s = REL_NE.replace_all(&s, "\\ne").into_owned();
    s = s.replace("\\lt", "<").replace("\\gt", ">");
    // The empty set's two glyphs are one set (beyond the spec's list).
    s = s.replace("\\varnothing", "\\emptyset");
    // 5. Matrices: bmatrix and array are pmatrix.
    s = s.replace("bmatrix", "pmatrix");
    if let Some(i) = s.find("\\begin{array}") {
        let after = i + "\\begin{array}".len();
        let spec_end = if s[after..].starts_with('{') {
            s[after..].find('}').map(|j| after + j + 1).unwrap_or(after)
        } else {
            after
        };
        s = format!("{}\\begin{{pmatrix}}{}", &s[..i], &s[spec_end..]);
        s = s.replace("\\end{array}", "\\end{pmatrix}");
    }
    // A matrix inside brackets (`\left[\begin{array}…\end{array}\right]`) is the matrix.
    let t = s.trim();
    if t.len() >= 2
        && t.starts_with(['(', '['])
        && t.ends_with([')', ']'])
        && t[1..t.len() - 1].trim().starts_with("\\begin{pmatrix}")
        && t[1..t.len() - 1].trim().ends_with("\\end{pmatrix}")
    {
        s = t[1..t.len() - 1].trim().to_string();
    }
    // 7. Units on the right (before the text wrappers are unwrapped).
    s = UNIT_TEXT.replace(&s, "").into_owned();
    // 8. Degrees. Beyond the spec, an angle in degrees inside a trigonometric function is first its
    //    value in radians (`\sin 30^\circ` is 1/2, not sin 30).
    if s.contains(['^', '°']) && TRIG.is_match(&s) {
        s = DEGREES
            .replace_all(&s, "(\\frac{${1}\\pi}{180})")
            .into_owned();
    }
    for m in ["^{\\circ}", "^\\circ", "\\circ", "°", "\\degree"] {
        s = s.replace(m, "");
    }
    // 6. Text wrappers (innermost first; nesting deeper than 16 is left).
    for _ in 0..16 {
        let next = WRAPPER.replace_all(&s, "$1").into_owned();
        if next == s {
            break;
        }
        s = next;
    }
    s = UNIT_WORD.replace(&s, "$1").into_owned();
    // Beyond the spec, as Math-Verify: `1 \text{ and } -2`, `3 or 4` are lists.
    s = and_or_commas(&s);
    // 9. Percent (`pct` too); 10. currency.
    s = PCT.replace_all(&s, "$1").into_owned();
    for m in ["\\%", "%", " percentage", " percent", "¥", "€", "dollars"] {
        s = s.replace(m, "");
    }
    // 11. Thousands separators, outside tuples and intervals.
    s = s.replace("{,}", "");
    let t = s.trim();
    let bracketed = t.starts_with(['(', '[']) && t.ends_with([')', ']']);
    if !bracketed {
        s = strip_thousands(&s);
    }
    // 12. Prefixes: `v =` when the right side is a value (and, beyond the spec, `(a, b) =` before a
    //     tuple of values), `v \in`.
    if s.matches('=').count() == 1 {
        if let Some(c) = ASSIGN.captures(&s).or_else(|| TUPLE_ASSIGN.captures(&s)) {
            let rhs = c[1].to_string();
            let bare = MACRO.replace_all(&rhs, "");
            // A value followed by another relation (`x = 2\sqrt{2} \approx 2.83`) stays a chain, read
            // whole by the typed parser (`Value::parse`).
            let chained = RELATIONS.iter().any(|(token, _)| rhs.contains(token));
            if !bare.chars().any(|ch| ch.is_ascii_alphabetic()) && !chained {
                s = rhs;
            }
        }
    }
    s = IN_PREFIX.replace(&s, "").into_owned();
    // 13. Shorthand arguments, integer slashes, mixed numbers written with a space.
    s = brace_shorthand(&s);
    if let Some(c) = MIXED_SLASH.captures(s.trim()) {
        s = format!("{}\\frac{{{}}}{{{}}}", &c[1], &c[2], &c[3]);
    }
    if let Some(c) = INT_SLASH.captures(s.trim()) {
        s = format!("\\frac{{{}}}{{{}}}", &c[1], &c[2]);
    }
    s = SUB_BRACE.replace_all(&s, "_$1").into_owned();
    // 14. Decimals; 15. infinity.
    s = LEADING_DOT.replace_all(&s, "${1}0.$2").into_owned();
    s = INF_WORD.replace_all(&s, "\\infty").into_owned();
    s = s.replace('∞', "\\infty").replace("+\\infty", "\\infty");
    // 16. Whitespace.
    s.retain(|c| !c.is_whitespace());
    whole_answer_forms(s)
}

/// Unicode characters a model writes for LaTeX, each as its macro (a space after a macro's name so that
/// a letter after it stays a letter: `πr` is `\pi r`). `≤`, `≥`, `≠` and `∞` have their own steps.
const UNICODE_MATH: [(char, &str); 18] = [
    ('−', "-"),
    ('×', "\\times "),
    ('·', "\\cdot "),
    ('⋅', "\\cdot "),
    ('÷', "\\div "),
    ('√', "\\sqrt"),
    ('π', "\\pi "),
    ('θ', "\\theta "),
    ('α', "\\alpha "),
    ('β', "\\beta "),
    ('∈', "\\in "),
    ('∪', "\\cup "),
    ('∩', "\\cap "),
    ('∅', "\\emptyset "),
    ('≈', "\\approx "),
    ('²', "^2"),
    ('³', "^3"),
    ('±', "\\pm "),
];

fn unicode_math(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match UNICODE_MATH.iter().find(|(u, _)| *u == c) {
            Some((_, latex)) => out.push_str(latex),
            None => out.push(c),
        }
    }
    out
}

/// Beyond the spec, the other spellings of a few whole answers, once whitespace is gone: the empty
/// set `\{\}` is `\emptyset`; the real line `\mathbb{R}` (or "all real numbers") is `(-\infty,\infty)`;
/// an ordinal `5^{th}` (`5^{\text{th}}`, `5th`) is its number; E notation `1.5e3` is `1.5\times10^{3}`
/// (not 1.5·e·3); and, inside an answer, the ellipsis macros are `...` and a capital `U` between
/// intervals is `\cup`.
fn whole_answer_forms(mut s: String) -> String {
    if s.contains("dots") || s.contains('…') {
        for m in ["\\ldots", "\\cdots", "\\dotsc", "\\dotsb", "\\dots", "…"] {
            s = s.replace(m, "...");
        }
    }
    if s.contains('U') {
        s = LETTER_UNION.replace_all(&s, "$1\\cup$2").into_owned();
    }
    match s.as_str() {
        "\\{\\}" | "{}" => return "\\emptyset".to_string(),
        "\\mathbb{R}" | "\\mathbbR" => return "(-\\infty,\\infty)".to_string(),
        _ => {}
    }
    if ["allrealnumbers", "allreals", "allrealvalues"]
        .iter()
        .any(|w| s.eq_ignore_ascii_case(w))
    {
        return "(-\\infty,\\infty)".to_string();
    }
    // Both forms start with a digit or a sign (most answers do not reach their patterns).
    if !s.starts_with(|c: char| c.is_ascii_digit() || c == '-') {
        return s;
    }
    if s.ends_with(['t', 'h', 'd', '}']) {
        if let Some(c) = ORDINAL.captures(&s) {
            return c[1].to_string();
        }
    }
    if s.contains(['e', 'E']) {
        if let Some(c) = E_NOTATION.captures(&s) {
            return format!("{}\\times10^{{{}}}", &c[1], c[2].trim_start_matches('+'));
        }
    }
    s
}

/// A standalone `and` or `or` (no letter or backslash before it, no letter after it) as a list's
/// comma, an optional comma and the spaces before it with it: `x = 1 \text{ and } x = -2` lists two
/// solutions as `x=1,x=-2` does (Math-Verify's reading; the spec joins boxes on such glue but says
/// nothing of it inside one). One pass, left to right.
fn and_or_commas(s: &str) -> String {
    if !s.contains("and") && !s.contains("or") {
        return s.to_string();
    }
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    // `s[copied..i]` is still to be written.
    let (mut i, mut copied) = (0, 0);
    while i < b.len() {
        let word = if b[i..].starts_with(b"and") {
            3
        } else if b[i..].starts_with(b"or") {
            2
        } else {
            0
        };
        // Both words are ASCII, so `i` and `i + word` are character boundaries.
        let alone = word > 0
            && (i == 0 || !(b[i - 1].is_ascii_alphabetic() || b[i - 1] == b'\\'))
            && !b.get(i + word).is_some_and(u8::is_ascii_alphabetic);
        if !alone {
            i += 1;
            continue;
        }
        out.push_str(&s[copied..i]);
        out.truncate(out.trim_end().len());
        if !out.ends_with(',') {
            out.push(',');
        }
        i += word;
        copied = i;
    }
    out.push_str(&s[copied..]);
    out
}

/// Removes the commas of every run of digit groups written as thousands: one to three digits, then
/// groups of exactly three (`1,234,567,890`). Other runs (`1,2,3`, `1,2345`) are lists and stay.
fn strip_thousands(s: &str) -> String {
    DIGIT_GROUPS
        .replace_all(s, |c: &regex::Captures<'_>| {
            let run = &c[0];
            let mut groups = run.split(',');
            let first = groups.next().unwrap_or("");
            if (1..=3).contains(&first.len()) && groups.all(|g| g.len() == 3) {
                run.replace(',', "")
            } else {
                run.to_string()
            }
        })
        .into_owned()
}

/// `\frac12` → `\frac{1}{2}`, `\sqrt2` → `\sqrt{2}`: each braceless argument is one token (one digit,
/// one letter or one macro), at any depth: inside a braced argument too (`\frac{1}{\sqrt3}`,
/// `\sqrt{\frac12}`).
///
/// One pass, left to right, without recursion: a braced argument is entered rather than copied, and
/// the macro's arguments left to take wait on a stack until the scan reaches that argument's closing
/// brace (found beforehand for every brace, so that deeply nested input stays linear).
fn brace_shorthand(s: &str) -> String {
    if !s.contains("\\frac") && !s.contains("\\sqrt") {
        return s.to_string();
    }
    let close = closing_braces(s);
    let mut out = String::with_capacity(s.len() + 8);
    // Per entered argument: its closing brace's byte index, and its macro's arguments still to take.
    let mut waiting: Vec<(usize, usize)> = Vec::new();
    let mut i = 0;
    // The next backslash at or after `i` (kept, not searched for again at every step).
    let mut backslash = s.find('\\').unwrap_or(s.len());
    while i < s.len() {
        let waits_for = waiting.last().copied();
        if let Some((end, left)) = waits_for {
            if end == i {
                waiting.pop();
                out.push('}');
                i = take_args(s, i + 1, left, &close, &mut out, &mut waiting);
                continue;
            }
        }
        if backslash < i {
            backslash = s[i..].find('\\').map_or(s.len(), |j| i + j);
        }
        if backslash > i {
            // Plain text up to the next macro or the awaited closing brace, copied whole.
            let stop = match waits_for {
                Some((end, _)) if end > i => backslash.min(end),
                _ => backslash,
            };
            out.push_str(&s[i..stop]);
            i = stop;
            continue;
        }
        let rest = &s[i..];
        let args = if rest.starts_with("\\frac") {
            2
        } else if rest.starts_with("\\sqrt") {
            1
        } else {
            out.push('\\');
            i += 1;
            continue;
        };
        out.push_str(&rest[..5]);
        i += 5;
        // A following letter means another macro (`\fracs`): leave it.
        if s[i..].starts_with(|c: char| c.is_ascii_alphabetic()) {
            continue;
        }
        if args == 1 {
            let t = s[i..].trim_start();
            if t.starts_with('[') {
                let len = t.find(']').map_or(t.len(), |j| j + 1);
                out.push_str(&t[..len]);
                i = s.len() - t.len() + len;
            }
        }
        i = take_args(s, i, args, &close, &mut out, &mut waiting);
    }
    out
}

/// Takes up to `n` macro arguments from byte `i` of `s`: a one-token argument is written wrapped in
/// braces; at a braced one the scan enters it (its brace written, the arguments after it left
/// waiting for its close). Returns where the scan goes on. A brace never closed ends the arguments.
fn take_args(
    s: &str,
    mut i: usize,
    mut n: usize,
    close: &std::collections::HashMap<usize, usize>,
    out: &mut String,
    waiting: &mut Vec<(usize, usize)>,
) -> usize {
    while n > 0 {
        let t = s[i..].trim_start();
        let at = s.len() - t.len();
        // A closing brace of an enclosing argument ends this macro's arguments.
        if t.is_empty() || t.starts_with('}') {
            return i;
        }
        if t.starts_with('{') {
            let Some(&end) = close.get(&at) else {
                return i;
            };
            out.push('{');
            waiting.push((end, n - 1));
            return at + 1;
        }
        let len = match t.strip_prefix('\\') {
            Some(m) => 1 + m.chars().take_while(|c| c.is_ascii_alphabetic()).count(),
            None => t.chars().next().map_or(1, char::len_utf8),
        };
        out.push('{');
        out.push_str(&t[..len]);
        out.push('}');
        i = at + len;
        n -= 1;
    }
    i
}

/// The byte index of the brace closing each `{` of `s` that is closed, by the opening brace's index.
fn closing_braces(s: &str) -> std::collections::HashMap<usize, usize> {
    let mut open = Vec::new();
    let mut pairs = std::collections::HashMap::new();
    for (i, c) in s.char_indices() {
        match c {
            '{' => open.push(i),
            '}' => {
                if let Some(o) = open.pop() {
                    pairs.insert(o, i);
                }
            }
            _ => {}
        }
    }
    pairs
}

/// Byte index of the bracket closing the one `s` starts with.
pub(crate) fn matching(s: &str, open: char, close: char) -> Option<usize> {
    let mut depth = 0i32;
    for (i, c) in s.char_indices() {
        if c == open {
            depth += 1;
        } else if c == close {
            depth -= 1;
            if depth == 0 {
                return Some(i);
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalisation_steps() {
        assert_eq!(normalize("\\$18.90"), "18.90");
        assert_eq!(normalize("10,\\!080"), "10080");
        assert_eq!(normalize("1,234,567"), "1234567");
        assert_eq!(normalize("1,-2"), "1,-2");
        assert_eq!(normalize("(1,234)"), "(1,234)");
        assert_eq!(normalize("\\frac12"), "\\frac{1}{2}");
        assert_eq!(normalize("\\frac1{72}"), "\\frac{1}{72}");
        assert_eq!(normalize("\\frac 59"), "\\frac{5}{9}");
        assert_eq!(normalize("\\sqrt13"), "\\sqrt{1}3");
        assert_eq!(normalize("\\dfrac{\\sqrt{3}}{3}"), "\\frac{\\sqrt{3}}{3}");
        assert_eq!(normalize("864 \\mbox{ inches}^2"), "864");
        assert_eq!(normalize("\\frac{270}7\\text{ degrees}"), "\\frac{270}{7}");
        assert_eq!(normalize("(a+5)(b+2)"), "(a+5)(b+2)");
        assert_eq!(normalize("90^\\circ"), "90");
        assert_eq!(normalize("10\\%"), "10");
        assert_eq!(normalize("x = 5"), "5");
        assert_eq!(normalize("y = 2x + 3"), "y=2x+3");
        assert_eq!(normalize("x \\in [-2,7]"), "[-2,7]");
        assert_eq!(normalize("1/2"), "\\frac{1}{2}");
        assert_eq!(normalize("-.5"), "-0.5");
        assert_eq!(
            normalize("\\left( \\frac{3}{2}, -13 \\right)"),
            "(\\frac{3}{2},-13)"
        );
        assert_eq!(normalize("52_{8}"), "52_8");
        assert_eq!(normalize("\\text{(C)}"), "(C)");
        assert_eq!(normalize("137 1/2"), "137\\frac{1}{2}");
        assert_eq!(normalize("x \\leq 3"), "x\\le3");
        assert_eq!(normalize("+\\infty"), "\\infty");
    }

    #[test]
    fn a_tuple_of_variables_assigned_values_is_the_values() {
        assert_eq!(normalize("(a,b) = (2,3)"), "(2,3)");
        assert_eq!(
            normalize("\\left(x_1, y\\right) = \\left(\\frac12, -1\\right)"),
            "(\\frac{1}{2},-1)"
        );
        assert_eq!(normalize("(a, b, c) = (1, 2, 3)"), "(1,2,3)");
        assert_eq!(normalize("(r, \\theta) = (3, \\pi)"), "(3,\\pi)");
        assert_eq!(normalize("(\\pi, a) = (3, 1)"), "(\\pi,a)=(3,1)");
        // Kept: a right side with variables, a single letter in brackets, two `=`, no tuple.
        assert_eq!(normalize("(a,b) = (2,c)"), "(a,b)=(2,c)");
        assert_eq!(normalize("(a) = (2)"), "(a)=(2)");
        assert_eq!(normalize("(a,b) = (2,3) = (2,3)"), "(a,b)=(2,3)=(2,3)");
        assert_eq!(normalize("(a,b) = 5"), "(a,b)=5");
    }

    #[test]
    fn standalone_and_or_are_commas() {
        assert_eq!(normalize("1 \\text{ and } -2"), "1,-2");
        assert_eq!(normalize("1, and 2 or 3"), "1,2,3");
        assert_eq!(normalize("1and2and3"), "1,2,3");
        assert_eq!(normalize("x = 1 \\text{or} x = 2"), "x=1,x=2");
        // Inside words, after a backslash, or as a word's start: left.
        assert_eq!(normalize("\\text{North}"), "North");
        assert_eq!(normalize("\\text{Sandor}"), "Sandor");
        assert_eq!(normalize("a \\land b"), "a\\landb");
        assert_eq!(normalize("\\text{order}"), "order");
        assert_eq!(normalize("é and ü"), "é,ü");
    }

    #[test]
    fn shorthand_arguments_are_braced_at_any_depth() {
        assert_eq!(normalize("\\frac{1}{\\sqrt3}"), "\\frac{1}{\\sqrt{3}}");
        assert_eq!(normalize("\\frac{\\sqrt3}{3}"), "\\frac{\\sqrt{3}}{3}");
        assert_eq!(normalize("\\frac1{\\sqrt 3}"), "\\frac{1}{\\sqrt{3}}");
        assert_eq!(normalize("\\sqrt{\\frac12}"), "\\sqrt{\\frac{1}{2}}");
        assert_eq!(normalize("\\frac{\\frac12}3"), "\\frac{\\frac{1}{2}}{3}");
        assert_eq!(normalize("\\sqrt[3]{\\frac18}"), "\\sqrt[3]{\\frac{1}{8}}");
        assert_eq!(
            normalize("(\\sqrt2,\\frac{\\pi}2)"),
            "(\\sqrt{2},\\frac{\\pi}{2})"
        );
        // A brace closing an enclosing group ends a macro's arguments; one never closed is text.
        assert_eq!(normalize("{\\frac1}2"), "{\\frac{1}}2");
        assert_eq!(normalize("\\frac{1}{2"), "\\frac{1}{2");
        // Deep nesting stays linear and does not recurse.
        let deep = "\\sqrt{".repeat(20_000) + "2" + &"}".repeat(20_000);
        assert_eq!(normalize(&deep), deep);
    }
}
