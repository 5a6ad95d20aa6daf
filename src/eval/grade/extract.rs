//! Isolating the answer region of an output and extracting the answer string (grading spec §1–§2).

/// What extraction found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Extracted {
    Answer(String),
    /// A thinking block was opened and never closed: cut at the token limit or never finished.
    Truncated,
    /// No box, no "answer is" phrase, or a box whose braces never close.
    NoAnswer,
}

/// The answer region: after the last `</think>`; the whole output when no thinking block was opened;
/// `None` (truncated) when a block was opened (by the prompt, or by a `<think>` in the output) and
/// never closed.
pub fn answer_region(output: &str, prompt_opened_thinking: bool) -> Option<&str> {
    if let Some(i) = output.rfind("</think>") {
        return Some(&output[i + "</think>".len()..]);
    }
    if prompt_opened_thinking || output.contains("<think>") {
        return None;
    }
    Some(output)
}

/// Extracts the final answer from a whole output (spec §1–§2).
pub fn extract(output: &str, prompt_opened_thinking: bool) -> Extracted {
    extract_with(output, prompt_opened_thinking, false)
}

/// [`extract`], or in `lenient` mode (never the default) what Qwen's and Math-Verify's evaluators
/// do: an unclosed thinking block is searched as it is, and with no box or phrase the last number
/// of the region is taken.
pub fn extract_with(output: &str, prompt_opened_thinking: bool, lenient: bool) -> Extracted {
    let region = match answer_region(output, prompt_opened_thinking) {
        Some(r) => r,
        None if lenient => output,
        None => return Extracted::Truncated,
    };
    let found = match boxed(region) {
        BoxResult::Found(s) => Some(s),
        BoxResult::Unbalanced if !lenient => return Extracted::NoAnswer,
        BoxResult::Unbalanced | BoxResult::None => {
            phrase(region).or_else(|| lenient.then(|| last_number(region)).flatten())
        }
    };
    match found.map(|s| tidy(&s)) {
        Some(s) if !s.is_empty() => Extracted::Answer(s),
        _ => Extracted::NoAnswer,
    }
}

enum BoxResult {
    Found(String),
    Unbalanced,
    None,
}

/// Start offsets of every `\boxed` / `\fbox` macro, with the offset right after its name.
fn box_starts(text: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for name in ["\\boxed", "\\fbox"] {
        let mut from = 0;
        while let Some(i) = text[from..].find(name) {
            let at = from + i;
            out.push((at, at + name.len()));
            from = at + name.len();
        }
    }
    out.sort();
    out
}

/// The content of one box starting right after its macro name, and where the box ends.
fn box_content(text: &str, after: usize) -> Option<(String, usize)> {
    let rest = &text[after..];
    let skipped = rest.len() - rest.trim_start().len();
    let rest = rest.trim_start();
    if let Some(body) = rest.strip_prefix('{') {
        let mut depth = 1usize;
        let mut prev_backslash = false;
        for (i, c) in body.char_indices() {
            if prev_backslash {
                prev_backslash = false;
                continue;
            }
            match c {
                '\\' => prev_backslash = true,
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some((body[..i].to_string(), after + skipped + 1 + i + 1));
                    }
                }
                _ => {}
            }
        }
        return None;
    }
    let token: String = rest
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != '$')
        .collect();
    let end = after + skipped + token.len();
    (!token.is_empty()).then_some((token, end))
}

/// At most this many boxes, counted back from the last, are joined into one answer. The spec sets no
/// limit; a list of answers is a few boxes, and a degenerate output writing tens of thousands of boxes in
/// a row would otherwise cost a normalisation each on every comparison (a deviation, in docs/deviations.md).
pub const MAX_JOINED_BOXES: usize = 64;

/// The last box, joined with the boxes just before it when only short glue separates them. Boxes
/// whose contents normalise alike count once (spec §2 rule 2: a model caught in a loop that writes
/// `\boxed{2}. \boxed{2}` has answered `2`); only distinct answers make a list.
fn boxed(region: &str) -> BoxResult {
    let starts = box_starts(region);
    let Some(&(_, after)) = starts.last() else {
        return BoxResult::None;
    };
    let Some((last, _)) = box_content(region, after) else {
        return BoxResult::Unbalanced;
    };
    let mut parts = vec![last];
    let mut next_start = starts.last().map(|s| s.0).unwrap_or(0);
    for &(start, after) in starts.iter().rev().skip(1).take(MAX_JOINED_BOXES - 1) {
        let Some((content, end)) = box_content(region, after) else {
            break;
        };
        if end > next_start {
            break;
        }
        let glue = plain_glue(&region[end..next_start]);
        let glue = glue.as_str();
        let joins = glue.chars().count() < 10
            || (glue.chars().count() < 70
                && [",", ";", "and", "or"]
                    .iter()
                    .any(|w| glue.split_whitespace().any(|t| t.trim_matches('$') == *w)));
        if !joins {
            break;
        }
        parts.push(content);
        next_start = start;
    }
    parts.reverse();
    let mut seen = std::collections::HashSet::with_capacity(parts.len());
    parts.retain(|p| seen.insert(super::normalize::normalize(&tidy(p))));
    BoxResult::Found(parts.join(","))
}

/// The text between two boxes as words: math delimiters, spacing macros (`\quad`, `\,`, `~`) and
/// text wrappers (`\text{ and }`) removed, so that `\quad \text{and} \quad` reads `and`.
fn plain_glue(glue: &str) -> String {
    static WRAPPED: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"\\(?:text|textnormal|textrm|textit|textbf|mbox|mathrm)\s*\{([^{}]*)\}")
            .expect("static pattern")
    });
    let mut g = WRAPPED.replace_all(glue, " $1 ").into_owned();
    for m in [
        "\\qquad", "\\quad", "\\,", "\\;", "\\:", "\\!", "\\ ", "~", "$",
    ] {
        g = g.replace(m, " ");
    }
    g.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The "final answer is X", "The answer is X", "answer: X" and Minerva fallbacks (last occurrence).
fn phrase(region: &str) -> Option<String> {
    // ASCII lowering keeps byte offsets valid in `region`.
    let lower = region.to_ascii_lowercase();
    for key in ["final answer is", "the answer is", "answer:"] {
        if let Some(i) = lower.rfind(key) {
            let tail = &region[i + key.len()..];
            let line = trim_answer(tail.lines().next().unwrap_or(""));
            // The sentence ends at ". " or at "I hope it is correct" (Minerva).
            let line = line.split("I hope it is correct").next().unwrap_or(line);
            let line = match line.find(". ") {
                Some(j) => &line[..j],
                None => line,
            };
            let s = unwrap_math(line);
            if !s.is_empty() {
                return Some(s);
            }
        }
    }
    None
}

/// The last number in the text (lenient mode only).
fn last_number(text: &str) -> Option<String> {
    static NUMBER: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r"-?\d+(?:,\d{3})*(?:\.\d+)?").expect("static pattern")
    });
    NUMBER
        .find_iter(text)
        .last()
        .map(|m| m.as_str().to_string())
}

/// Removes one level of `$…$`, `\(…\)` or `\[…\]` around the whole string.
fn unwrap_math(s: &str) -> String {
    let mut s = trim_answer(s);
    while ends_with_punctuation(s) {
        s = trim_answer(&s[..s.len() - 1]);
    }
    for (open, close) in [("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")] {
        if let Some(inner) = s.strip_prefix(open).and_then(|r| r.strip_suffix(close)) {
            return trim_answer(inner).to_string();
        }
    }
    s.to_string()
}

/// Spec §2.5: one trailing `.`, `,` or `;`, a leading `:`, surrounding whitespace, `\displaystyle`,
/// and a nested `\boxed{…}`.
pub fn tidy(s: &str) -> String {
    let mut s = trim_answer(s).to_string();
    if let Some(rest) = s.strip_prefix(':') {
        s = trim_answer(rest).to_string();
    }
    if ends_with_punctuation(&s) {
        s.pop();
    }
    s = s.replace("\\displaystyle", "");
    let head = s.trim_start();
    if head.starts_with("\\boxed") || head.starts_with("\\fbox") {
        if let BoxResult::Found(inner) = boxed(&s) {
            s = inner;
        }
    }
    trim_answer(&s).to_string()
}

/// Whether `s` ends in a `.`, `,` or `;` that is punctuation: not the last character of a macro such
/// as the spacing macros `\,` and `\;`, which normalisation removes whole (spec §3 step 2). Taken
/// for punctuation, `5\,` lost its comma and kept a stray backslash, and a correct answer graded
/// wrong: a deviation from the letter of §2.5 ("one trailing `,`"), not from its intent.
fn ends_with_punctuation(s: &str) -> bool {
    s.ends_with(['.', ',', ';']) && trailing_backslashes(&s[..s.len() - 1]).is_multiple_of(2)
}

/// `s` without surrounding whitespace, except the space of a trailing `\ ` (backslash-space, a
/// spacing macro that normalisation removes whole; trimming its space alone left a stray backslash).
fn trim_answer(s: &str) -> &str {
    let start = s.trim_start();
    let t = start.trim_end();
    match (trailing_backslashes(t) % 2, start[t.len()..].chars().next()) {
        (1, Some(space)) => &start[..t.len() + space.len_utf8()],
        _ => t,
    }
}

/// How many backslashes `s` ends with.
fn trailing_backslashes(s: &str) -> usize {
    s.len() - s.trim_end_matches('\\').len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(s: &str) -> Option<String> {
        match extract(s, false) {
            Extracted::Answer(a) => Some(a),
            _ => None,
        }
    }

    #[test]
    fn boxes_and_fallbacks() {
        assert_eq!(
            answer("a \\boxed{3} was my first guess but it is \\boxed{4}.").as_deref(),
            Some("4")
        );
        assert_eq!(
            answer("the roots are \\boxed{1} and \\boxed{-2}").as_deref(),
            Some("1,-2")
        );
        assert_eq!(answer("so $\\boxed 5$.").as_deref(), Some("5"));
        // Identical boxes count once, however many, whatever the glue; distinct ones make a list.
        assert_eq!(answer("\\boxed{2}. \\boxed{2}").as_deref(), Some("2"));
        let looped = "\\boxed{(a + 5)(b + 2)}. ".repeat(12);
        assert_eq!(answer(&looped).as_deref(), Some("(a + 5)(b + 2)"));
        assert_eq!(
            answer("\\boxed{\\frac12} and $\\boxed{\\dfrac{1}{2}}$").as_deref(),
            Some("\\frac12")
        );
        assert_eq!(
            answer("\\boxed{1}, \\boxed{2}, \\boxed{1}").as_deref(),
            Some("1,2")
        );
        assert_eq!(answer("\\boxed{\\{1,2\\}}").as_deref(), Some("\\{1,2\\}"));
        assert_eq!(answer("x \\boxed{\\frac{1}{2}"), None);
        assert_eq!(answer("The answer is $7$.").as_deref(), Some("7"));
        assert_eq!(
            answer("Final Answer: The final answer is $12$. I hope it is correct.").as_deref(),
            Some("12")
        );
        assert_eq!(answer("we get 17 apples"), None, "no last-number fallback");
        assert_eq!(extract("<think>\nhmm 4", false), Extracted::Truncated);
        assert_eq!(extract("hmm 4", true), Extracted::Truncated);
        // Lenient mode: inside an unclosed block, and the last number.
        assert_eq!(
            extract_with("<think>\nso 3 then 17 apples", false, true),
            Extracted::Answer("17".into())
        );
        assert_eq!(
            extract_with("<think>\n\\boxed{5", false, true),
            Extracted::Answer("5".into())
        );
    }

    #[test]
    fn a_chain_of_boxes_joins_at_most_the_last_max_joined() {
        let chain: String = (0..100).map(|i| format!("\\boxed{{{i}}}, ")).collect();
        let want: Vec<String> = (100 - MAX_JOINED_BOXES..100)
            .map(|i| i.to_string())
            .collect();
        assert_eq!(answer(&chain), Some(want.join(",")));
        // A loop of one answer is still that answer, however long.
        assert_eq!(answer(&"\\boxed{7}. ".repeat(10_000)).as_deref(), Some("7"));
        // The cap holds inside `tidy` too (an extracted answer that is itself a chain of boxes).
        assert_eq!(tidy(&chain), want.join(","));
    }
}
