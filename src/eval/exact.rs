//! A deliberately simple grader for the engine's first command: the last `\boxed{…}` (or an "answer is
//! X" phrase), normalised lightly, compared as text or as an exact number. The full grader of the
//! grading spec replaces it.

/// The content of the last `\boxed{…}` / `\fbox{…}` with balanced braces, else the text after the last
/// "answer is". `None` when neither exists or the last box never closes.
pub fn extract_answer(text: &str) -> Option<String> {
    let box_at = ["\\boxed", "\\fbox"]
        .iter()
        .filter_map(|m| text.rfind(m).map(|i| (i, m.len())))
        .max();
    if let Some((start, len)) = box_at {
        let rest = text[start + len..].trim_start();
        if let Some(body) = rest.strip_prefix('{') {
            let mut depth = 1usize;
            for (i, c) in body.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            return Some(body[..i].to_string());
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
        return (!token.is_empty()).then_some(token);
    }
    let lower = text.to_lowercase();
    let i = lower.rfind("answer is")?;
    let tail = text[i + "answer is".len()..].trim_start_matches([':', ' ']);
    let ans: String = tail.lines().next().unwrap_or("").to_string();
    let ans = ans
        .trim()
        .trim_end_matches('.')
        .trim_matches('$')
        .to_string();
    (!ans.is_empty()).then_some(ans)
}

fn normalise(s: &str) -> String {
    let s: String = s
        .chars()
        .filter(|c| !c.is_whitespace() && *c != '$')
        .collect();
    s.trim_end_matches('.')
        .replace("\\dfrac", "\\frac")
        .replace("{,}", "")
        .to_string()
}

/// Whether an extracted answer equals the gold answer (text equality after normalisation, or equal
/// numbers when both parse as such).
pub fn is_correct(pred: &str, gold: &str) -> bool {
    let (p, g) = (normalise(pred), normalise(gold));
    if p == g {
        return true;
    }
    match (
        p.replace(',', "").parse::<f64>(),
        g.replace(',', "").parse::<f64>(),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extracts_last_balanced_box() {
        assert_eq!(
            extract_answer("x \\boxed{3} then \\boxed{\\frac{1}{2}}.").as_deref(),
            Some("\\frac{1}{2}")
        );
        assert_eq!(extract_answer("\\boxed{12").as_deref(), None);
        assert_eq!(
            extract_answer("so the answer is 42.").as_deref(),
            Some("42")
        );
        assert_eq!(extract_answer("no answer here"), None);
    }

    #[test]
    fn compares_numbers_exactly() {
        assert!(is_correct("1,234", "1234"));
        assert!(is_correct(" 25.0", "25"));
        assert!(!is_correct("300", "3"));
    }
}
