//! The grader error classes a comparison with the peers' own equivalence suites found (issue 13),
//! each with cases of its own beyond the examples named there: thousands separators, boxes joined by
//! spaced words, ASCII relations, `array` matrices, units in `\textnormal`, `pct`, bare-brace sets,
//! subscripted assignment lists, trigonometric and other functions in identity tests, `\pm` sets,
//! function arguments written without parentheses, (grader 6) shorthand arguments inside braced
//! ones, inequalities against zero and `\approx` values, and (grader 7) `and` and `or` inside one
//! answer as a list's commas, binomial coefficients' values, `(a, b) =` before an ordered pair, and
//! (grader 8) inequality golds met by their intervals, repeating decimals, the empty set's and the real
//! line's spellings, ordinals, ellipses, a letter `U` for a union, `f(x) =` before a value, Unicode
//! mathematics, degrees inside trigonometric functions, and (grader 9) quantities named on an
//! equation's left side, chains of equalities, floors and ceilings.

use kvbench::eval::grade::{equivalent, grade_output};

fn same(pred: &str, gold: &str) {
    assert!(equivalent(pred, gold), "{pred:?} should equal {gold:?}");
    assert!(equivalent(gold, pred), "{gold:?} should equal {pred:?}");
}

fn differ(pred: &str, gold: &str) {
    assert!(
        !equivalent(pred, gold),
        "{pred:?} should differ from {gold:?}"
    );
    assert!(
        !equivalent(gold, pred),
        "{gold:?} should differ from {pred:?}"
    );
}

#[test]
fn thousands_separators_in_every_spelling() {
    same("32,\\! 349", "32349");
    same("11,\\! 111,\\! 111,\\! 100", "11111111100");
    differ("11,\\! 111,\\! 111,\\! 100", "100, 111, 111, 11");
    same("1,234,567,890", "1234567890");
    same("14{,}916", "14916");
    same("1{,}000{,}000", "10^6");
    // The braced separator however spaced (issue 40).
    same("14 {, }916", "14916");
    same("14{ ,}916", "14916");
    same("1 { , } 000 {,} 000", "1000000");
    same("\\$1 {,} 234.50", "1234.5");
    same("2,\\!000", "2000");
    same("\\$1,\\!234.50", "1234.5");
    same("-12,345", "-12345");
    // Lists stay lists: groups that are not all three digits long, or spaced commas.
    same("1,2,3", "3,2,1");
    same("1, 234", "234, 1");
    differ("1,2345", "12345");
}

#[test]
fn boxes_joined_by_spaced_words() {
    let out = "So $x = \\boxed{2} \\quad \\text{and} \\quad \\boxed{5}$.";
    assert!(grade_output(out, "2, 5", false).1.is_correct());
    let out = "The solutions are \\boxed{-1} \\text{ or } \\boxed{3}.";
    assert!(grade_output(out, "3,-1", false).1.is_correct());
    let out = "\\boxed{4}\\qquad\\textrm{and}\\qquad\\boxed{7}";
    assert!(grade_output(out, "4,7", false).1.is_correct());
}

/// Spec §2 rule 2: boxes whose contents normalise alike count once, however many and whatever the
/// glue between them; only distinct answers make a list (issue 40: LazyEviction's looping outputs).
#[test]
fn identical_boxes_count_once_and_distinct_ones_make_a_list() {
    for out in [
        "\\boxed{2}. \\boxed{2}",
        "\\boxed{2}.\\boxed{2}.\\boxed{2}.\\boxed{2}",
        "so \\(\\boxed{2}\\) and \\(\\boxed{2}\\)",
        "\\boxed{2} \\quad \\text{or} \\quad \\boxed{ 2 }",
        "\\boxed{2}; \\boxed{$2$}",
    ] {
        assert!(grade_output(out, "2", false).1.is_correct(), "{out}");
    }
    let looped = "\\boxed{(a + 5)(b + 2)}. ".repeat(12);
    assert!(grade_output(&looped, "(a+5)(b+2)", false).1.is_correct());
    let out = "\\boxed{\\frac{1}{2}}, \\boxed{\\dfrac12}, \\boxed{\\tfrac{1}{2}}";
    assert!(grade_output(out, "\\frac12", false).1.is_correct());
    // Distinct answers still make a list, and a list is not one of its members.
    let out = "\\boxed{1} and \\boxed{-2} and \\boxed{1}";
    assert!(grade_output(out, "1,-2", false).1.is_correct());
    assert!(!grade_output(out, "1", false).1.is_correct());
}

#[test]
fn ascii_relations_equal_their_macros() {
    same("x >= 3", "x \\geq 3");
    same("x<=-1", "x \\le -1");
    same("a != 0", "a \\neq 0");
    same("y \\geqslant 2", "y >= 2");
    differ("x >= 3", "x > 3");
    differ("x <= 3", "x >= 3");
}

#[test]
fn array_matrices_in_sized_brackets() {
    same(
        "\\left[\\begin{array}{cc} 1 & 2 \\\\ 3 & 4 \\end{array}\\right]",
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
    );
    same(
        "\\left(\\begin{array}{c} -1 \\\\ \\frac{1}{2} \\end{array}\\right)",
        "\\begin{bmatrix} -1 \\\\ 0.5 \\end{bmatrix}",
    );
    differ(
        "\\left[\\begin{array}{cc} 1 & 2 \\\\ 3 & 5 \\end{array}\\right]",
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
    );
}

#[test]
fn units_percent_and_sets() {
    same("5\\textnormal{ cm}", "5");
    same("12 \\textnormal{inches}", "12");
    same("30 pct", "30\\%");
    same("{2, 3}", "\\{2, 3\\}");
    same("{3,2}", "\\{2,3\\}");
    differ("{2, 4}", "\\{2, 3\\}");
    same("a_{37} = 19, a_3 = 2", "a_3 = 2, a_{37} = 19");
    same("x_1 = 4, x_2 = -1", "x_2=-1, x_1=4");
    differ("a_{37} = 2, a_3 = 19", "a_3 = 2, a_{37} = 19");
}

#[test]
fn functions_beyond_sine_and_cosine_in_identities() {
    same("\\cot x", "\\frac{\\cos x}{\\sin x}");
    same("\\tan x", "\\frac{\\sin x}{\\cos x}");
    same("\\sec x", "\\frac{1}{\\cos x}");
    same("\\csc x", "\\frac{1}{\\sin x}");
    same("\\sec^2 x", "1 + \\tan^2 x");
    same("\\log_2 x", "\\frac{\\ln x}{\\ln 2}");
    differ("\\cot x", "\\tan x");
}

#[test]
fn plus_minus_sets_equal_their_elements() {
    same("\\{1 \\pm \\sqrt{2}\\}", "\\{1+\\sqrt{2}, 1-\\sqrt{2}\\}");
    same("\\pm 3", "3, -3");
    same("2 \\pm i", "2+i, 2-i");
    differ("\\{1 \\pm \\sqrt{2}\\}", "\\{1+\\sqrt{2}\\}");
}

#[test]
fn function_arguments_without_parentheses() {
    same("\\sin 2x", "2\\sin x \\cos x");
    same("\\sin 2x", "\\sin(2x)");
    differ("\\sin 2x", "\\sin(2) x");
    same("\\cos 3\\theta", "\\cos(3\\theta)");
    same("\\sin^2 x", "1 - \\cos^2 x");
    same("\\cos 2x", "\\cos^2 x - \\sin^2 x");
    same("\\ln 2x", "\\ln 2 + \\ln x");
}

/// A trailing spacing macro is spacing, not punctuation: `\,` and `\;` end in the characters §2.5
/// strips, and `\ ` in the space a trim removes. Stripping those left a stray backslash (`5\`), and a
/// correct answer was graded wrong, in a box, after "the answer is", and as an extracted answer.
#[test]
fn trailing_spacing_macros_are_not_punctuation() {
    for spacing in [
        "\\,", "\\;", "\\:", "\\!", "\\ ", "\\quad", "~", "\\,.", "\\;,", " \\ ",
    ] {
        let answer = format!("5{spacing}");
        same(&answer, "5");
        for output in [
            format!("So the answer is \\boxed{{{answer}}}"),
            format!("The answer is ${answer}$."),
            format!("The answer is {answer}"),
        ] {
            let (extracted, verdict) = grade_output(&output, "5", false);
            assert!(verdict.is_correct(), "{output:?}: {extracted:?}");
        }
    }
    // LaTeX's named spaces and `\hspace`, beyond the spec's list, are spacing too.
    for spacing in [
        "\\thinspace",
        "\\medspace",
        "\\thickspace",
        "\\enspace",
        "\\negthinspace",
        "\\hspace{1mm}",
        "\\hspace*{2em}",
    ] {
        same(&format!("5{spacing}"), "5");
        same(&format!("1{spacing}000"), "1000");
    }
    differ("\\negthinspace 5", "\\neg 5");
    same("\\varnothing", "\\emptyset");
    differ("\\varnothing", "\\{0\\}");
    same("\\frac{1}{2}\\,", "0.5");
    same("x = 3\\;", "3");
    // Punctuation after a spacing macro still goes; a macro's own character is not punctuation.
    differ("5\\,", "6");
    same("10.", "10");
}

/// The spec's shorthand (§3.13: `\\sqrt2` is `\\sqrt{2}`, `\\frac12` is `\\frac{1}{2}`) inside another
/// macro's braced argument: only the outermost level was braced, so `\\frac{1}{\\sqrt3}` did not parse
/// and was graded wrong against `\\frac{\\sqrt3}{3}` (the spec's own example against Hendrycks'
/// string matching).
#[test]
fn shorthand_inside_braced_arguments() {
    same("\\frac{1}{\\sqrt3}", "\\frac{\\sqrt{3}}{3}");
    same("\\frac{1}{\\sqrt3}", "\\frac{\\sqrt3}{3}");
    same("\\dfrac1{\\sqrt 3}", "\\frac{\\sqrt3}3");
    same("\\sqrt{\\frac12}", "\\frac{\\sqrt2}{2}");
    same("\\frac{\\frac12}{3}", "\\frac16");
    same("\\sqrt[3]{\\frac18}", "0.5");
    same("(\\frac{\\sqrt3}2, \\frac12)", "(\\frac{\\sqrt{3}}{2},0.5)");
    same("\\frac{\\pi}{\\sqrt2}", "\\frac{\\sqrt2\\pi}{2}");
    // One token an argument, at any depth: `\\sqrt13` is √1·3 inside braces too.
    same("\\frac{\\sqrt13}{2}", "\\frac32");
    differ("\\frac{\\sqrt13}{2}", "\\frac{\\sqrt{13}}{2}");
    differ("\\frac{1}{\\sqrt3}", "\\frac{1}{3}");
    let (extracted, verdict) = grade_output(
        "</think> So \\boxed{\\dfrac{1}{\\sqrt3}}.",
        "\\frac{\\sqrt3}{3}",
        true,
    );
    assert!(verdict.is_correct(), "{extracted:?}");
}

/// An inequality read as one side against zero, as Math-Verify reads it (the spec names equations
/// only): `-x > -1` is `x < 1`, with the direction and strictness kept and no scaling. `x \\approx 11`
/// states a value as `x = 11` does.
#[test]
fn inequalities_against_zero_and_approximate_values() {
    same("-x > -1", "x < 1");
    same("-x \\ge -1", "x \\le 1");
    same("x - 1 < 0", "x < 1");
    same("5 \\geq x", "x \\leq 5");
    same("2 - y \\ne 0", "y \\neq 2");
    differ("x > -1", "x < 1");
    differ("-x < -1", "x < 1");
    differ("-x \\ge -1", "x < 1");
    differ("2x < 2", "x < 1");
    same("x \\approx 11", "11");
    differ("x \\approx 11", "12");
    differ("x \\approx 3.14", "\\pi");
}

/// A standalone `and` or `or` inside one answer separates a list, as Math-Verify reads it (grader 7):
/// models box `1 \text{ and } -2` for the roots 1 and -2 (13 of the stored studies' answers did).
/// Words that merely contain the letters, and LaTeX's `\land`, are left alone.
#[test]
fn and_or_inside_one_answer_make_a_list() {
    same("1 \\text{ and } -2", "1, -2");
    same("-2 \\text{ or } 1", "1,-2");
    same("1, and -2", "1,-2");
    same("x = 3 \\text{ or } x = 5", "3, 5");
    same("(1,2) \\text{ and } (3,4)", "(1,2), (3,4)");
    same(
        "\\frac{\\pi}{6} \\text{ and } \\frac{5\\pi}{6}",
        "\\frac{5\\pi}{6}, \\frac{\\pi}{6}",
    );
    differ("2 \\text{ and } 3", "2");
    differ("1 \\text{ and } -2", "1, 2");
    same("\\text{North}", "\\text{North}");
    differ("\\text{North}", "\\text{N}, \\text{th}");
    differ("1 \\land 2", "1, 2");
    same("\\text{odd}", "\\text{odd}");
}

/// An ordered pair written with its variables, `(a, b) = (2, 3)`, is the pair, as `x = 5` is 5 (the
/// spec drops one letter's `x =`; grader 7 the tuple's): MATH asks for ordered pairs and triples.
#[test]
fn tuples_of_variables_assigned_values_are_the_values() {
    same("(a,b) = (2,3)", "(2,3)");
    same(
        "(x, y, z) = \\left(1, \\frac{1}{2}, -3\\right)",
        "(1,\\frac12,-3)",
    );
    same(
        "(r,\\theta) = (3, \\frac{\\pi}{2})",
        "\\left( 3, \\frac{\\pi}{2} \\right)",
    );
    differ("(a,b) = (2,3)", "(3,2)");
    differ("(a,b) = (2,3)", "2,3,4");
}

/// `\binom{n}{k}` (and `\dbinom`, `\tbinom`) has its value, as in Math-Verify (sympy's binomial): a
/// counting answer boxed unevaluated equals its number (grader 7).
#[test]
fn binomial_coefficients_have_their_values() {
    same("\\binom{5}{2}", "10");
    same("\\dbinom{10}{3}", "120");
    same("\\tbinom{6}{0}", "1");
    same("\\binom{50}{25}", "126410606437752");
    same("2\\binom{4}{2}", "12");
    same("\\frac{\\binom{4}{2}}{\\binom{6}{3}}", "\\frac{3}{10}");
    same("\\binom{3}{5}", "0");
    differ("\\binom{5}{2}", "20");
    differ("\\binom{5}{3}", "5");
    // Huge arguments give up (beyond the cap) or overflow quickly, never equal to a small number.
    differ("\\binom{10^{9}}{3}", "5");
    differ("\\binom{10^{6}}{500000}", "5");
}

/// `kvbench grade --pred 5 --gold -5`: a value that starts with a hyphen (a negative number, `-\infty`)
/// is the flag's value, not an unknown flag (it was refused with exit 2).
#[test]
fn grade_takes_answers_that_start_with_a_hyphen() {
    for (pred, gold, correct) in [
        ("-5", "-5", true),
        ("5", "-5", false),
        ("-\\infty", "-\\infty", true),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_kvbench"))
            .args(["grade", "--pred", pred, "--gold", gold])
            .output()
            .unwrap();
        assert!(out.status.success(), "{pred} {gold}: {out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["correct"], correct, "{pred} {gold}: {v}");
    }
}

/// An answer that is nothing once tidied is "no_answer" (as an output's empty `\boxed{}` is), not an
/// incorrect answer; a gold answer that is nothing is refused (exit 2) from the flag and from a cases
/// file, naming the line, before any verdict is printed.
#[test]
fn blank_answers_are_none_and_blank_gold_is_refused() {
    let grade = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_kvbench"))
            .arg("grade")
            .args(args)
            .output()
            .unwrap()
    };
    for pred in ["", "  ", "$$", "."] {
        let out = grade(&["--pred", pred, "--gold", "3"]);
        assert!(out.status.success(), "{pred:?}: {out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["verdict"], "no_answer", "{pred:?}: {v}");
        assert_eq!(v["correct"], false, "{pred:?}: {v}");
    }
    let out = grade(&["--pred", "3", "--gold", " "]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--gold"));
    let dir = std::env::temp_dir().join(format!("kvbench-blank-gold-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let cases = dir.join("cases.jsonl");
    std::fs::write(
        &cases,
        "{\"pred\":\"3\",\"gold\":\"3\"}\n{\"pred\":\"3\",\"gold\":\"$ $\"}\n",
    )
    .unwrap();
    let out = grade(&["--cases", cases.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(err.contains("cases.jsonl:2"), "{err}");
    assert!(out.stdout.is_empty(), "{out:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Grader 8, spec §4.4's "the reverse may be accepted": an inequality gold in one variable is met by
/// the interval (or union) it describes, one- or two-sided, either way round, strict or not, `≠` and
/// `or`; an interval gold is never met by an inequality, and the closedness, direction and variable
/// must agree.
#[test]
fn an_inequality_gold_is_met_by_its_interval() {
    let meets = |pred: &str, gold: &str| {
        assert!(equivalent(pred, gold), "{pred:?} should meet {gold:?}");
        assert!(
            !equivalent(gold, pred),
            "the inequality {gold:?} should not meet the interval gold {pred:?}"
        );
    };
    let misses = |pred: &str, gold: &str| {
        assert!(!equivalent(pred, gold), "{pred:?} should miss {gold:?}");
    };
    meets("(0, \\infty)", "x > 0");
    meets("(-\\infty, 3]", "x \\le 3");
    meets("(-\\infty, 3]", "3 \\geq x");
    meets("[-1, \\frac{1}{2})", "-1 \\le t < \\frac12");
    meets("(1, 5]", "5 \\ge x > 1");
    meets(
        "\\left(\\frac{3}{5},\\frac{8}{3}\\right]",
        "\\frac35 < x \\le \\frac83",
    );
    meets(
        "(-\\infty, 2) \\cup (3, \\infty)",
        "x < 2 \\text{ or } x > 3",
    );
    meets("(3,\\infty)\\cup(-\\infty,2)", "x<2 \\text{ or } x>3");
    meets("(-\\infty,0)\\cup(0,\\infty)", "x \\ne 0");
    meets("(0.5, \\infty)", "x > \\frac12");
    misses("(-\\infty, 3)", "x \\le 3");
    misses("(2, 5]", "2 \\le x < 5");
    misses("(5, 1)", "5 > x > 1");
    misses("(1, 5)", "1 < x > 5");
    misses(
        "(-\\infty, 2) \\cup (3, \\infty)",
        "x < 2 \\text{ or } y > 3",
    );
    misses("(0, \\infty)", "x > y");
    misses("(0, \\infty)", "x + 1 > 1");
    misses("(0, 1)", "x > 0");
}

/// Grader 8, beyond the spec: a repeating decimal is its exact value; the empty set's spellings are one;
/// the real line is its interval; an ordinal is its number; E notation is a power of ten (not e); the
/// ellipsis macros are one; a capital `U`
/// between intervals is a union; `f(x) =` before a value is dropped as `y =` is.
#[test]
fn other_spellings_of_the_same_answer() {
    same("0.\\overline{3}", "\\frac13");
    same("0.1\\overline{6}", "\\frac{1}{6}");
    same("-1.\\overline{142857}", "-\\frac87");
    same("0.\\overline9", "1");
    same(".\\overline{27}", "\\frac{3}{11}");
    same("0.\\bar{3}", "\\frac13");
    same("0.\\overline{3}", "0.333333");
    differ("0.\\overline{3}", "0.3");
    differ("0.\\overline{3}", "0.333");
    differ("0.1\\overline{6}", "\\frac16 + 1");
    same("\\emptyset", "\\{\\}");
    same("\\varnothing", "\\{ \\}");
    differ("\\emptyset", "\\{0\\}");
    same("\\mathbb{R}", "(-\\infty, \\infty)");
    same("\\mathbb R", "(-\\infty,\\infty)");
    same("\\text{all real numbers}", "(-\\infty,\\infty)");
    differ("\\mathbb{R}^2", "(-\\infty,\\infty)");
    differ("\\mathbb{R}", "(0,\\infty)");
    same("5^{\\text{th}}", "5");
    same("21^{st}", "21");
    same("2nd", "2");
    differ("2^{nd}", "3");
    differ("5\\theta", "5");
    same("1e3", "1000");
    same("1.5e-3", "0.0015");
    same("-2E+2", "-200");
    differ("1e3", "3e");
    differ("1e3", "100");
    same("1, 2, \\ldots, 10", "1,2,...,10");
    same("1,2,\\cdots,10", "1, 2, \\dots, 10");
    same(
        "(-\\infty,2) U (3,\\infty)",
        "(-\\infty, 2) \\cup (3, \\infty)",
    );
    same("f(x) = 2x + 1", "2x+1");
    same("p(x)=x^2-1", "(x-1)(x+1)");
    same("f(x) = 2x + 1", "f(x) = 1 + 2x");
    differ("f(x) = 2x + 1", "2x + 2");
    differ("f(x) = 2x + 1", "y = 2x + 1");
    differ("g(t) = t^2", "x^2");
}

/// Grader 8, beyond the spec: the Unicode a model writes for LaTeX (`−`, `×`, `·`, `π`, `√`, `∈`, `∪`,
/// `²`…) reads as the macros, and an angle in degrees inside a trigonometric function is its value in
/// radians, while a bare angle in degrees still never equals radians (spec §3.8).
#[test]
fn unicode_math_and_degrees_inside_trigonometry() {
    same("−5", "-5");
    same("2π", "2\\pi");
    same("πr²", "\\pi r^2");
    same("√2", "\\sqrt{2}");
    same("3√{5}", "3\\sqrt5");
    same("\\frac{1}{2}π", "\\frac{\\pi}{2}");
    same("1.5 × 10^3", "1500");
    same("2·3", "6");
    same("x ∈ [0,1]", "[0,1]");
    same("(-∞, 2) ∪ (3, ∞)", "(-\\infty,2)\\cup(3,\\infty)");
    same("θ", "\\theta");
    differ("−5", "5");
    differ("2π", "2");
    same("\\tan 45^\\circ", "1");
    same("\\cos 60^{\\circ}", "\\frac12");
    same("\\sin(30°)", "0.5");
    same("2\\sin 22.5^\\circ\\cos 22.5^\\circ", "\\frac{\\sqrt2}{2}");
    differ("\\sin 30^\\circ", "\\sin 30");
    differ("30^\\circ", "\\frac{\\pi}{6}");
    same("30^\\circ", "30");
}

/// Grader 9, beyond the spec's one-letter `v =`, as Math-Verify reads an equation against a value:
/// a prediction may name its quantity as any expression of variables with no number in it (a
/// segment `AB` or an angle `\angle ABC`, a sum `m+n`, a function's value `f(2)`), and a chain of
/// equalities states its first name's value (the last operand, or an exact value with its rounding
/// before an `\approx`); a true computation states its result (`3 + 4 = 7`), a true rounding to
/// decimal places either value (`2\sqrt{2} \approx 2.83`). A gold equation keeps its left side
/// unless that is one variable, so `x+y = 6` is not met by 6; `2x = 6` names no quantity.
#[test]
fn named_quantities_and_chains_of_equalities() {
    let accepted = |pred: &str, gold: &str| {
        assert!(equivalent(pred, gold), "{pred:?} should equal {gold:?}");
    };
    for (pred, gold) in [
        ("AB = 6", "6"),
        ("AB=2\\sqrt{3}", "2\\sqrt3"),
        ("\\angle ABC = 30^\\circ", "30"),
        ("m\\angle A = 45^\\circ", "45"),
        ("\\overline{AB} = 5", "5"),
        ("m+n = 7", "7"),
        ("a+b+c=\\frac{1}{2}", "0.5"),
        ("f(2) = 6", "6"),
        ("g(-1)=\\frac{3}{4}", "\\frac34"),
        ("x = y = 2", "2"),
        ("AB = BC = 6", "6"),
        ("x = 3 + 4 = 7", "7"),
        ("x = 2\\sqrt{2} \\approx 2.83", "2\\sqrt2"),
        ("x = y = 2", "x = 2"),
        ("\\lfloor \\frac{100}{5} \\rfloor = 20", "20"),
        ("3 + 4 = 7", "7"),
        ("2\\sqrt{2} \\approx 2.83", "2\\sqrt2"),
        ("x = 2\\sqrt{2} \\approx 2.83", "2.83"),
        ("x = \\frac{\\pi}{4} \\approx 0.785", "x=\\frac{\\pi}{4}"),
        ("2\\sqrt{2} \\approx 2.83", "2.83"),
        ("\\frac{\\pi}{4} \\approx 0.785", "\\frac{\\pi}{4}"),
    ] {
        accepted(pred, gold);
    }
    for (pred, gold) in [
        ("6", "x + y = 6"),
        ("6", "AB = 6"),
        ("2x = 6", "6"),
        ("x^2 = 4", "2"),
        ("x = y = 2", "3"),
        ("2\\sqrt{2} \\approx 2.5", "2.5"),
        ("2\\sqrt{2} \\approx 2.5", "2\\sqrt2"),
        ("2\\sqrt{2} \\approx 3", "3"),
        ("3 + 3 = 7", "7"),
        ("x=1, x=-2", "-2"),
    ] {
        assert!(
            !equivalent(pred, gold),
            "{pred:?} should differ from {gold:?}"
        );
    }
    same("x=1, x=-2", "1, -2");
    same("f(2) = 6", "f(2)=6");
}

/// Grader 9: `\lfloor x \rfloor` and `\lceil x \rceil` have their values (spec §4's expressions name
/// neither; Math-Verify's parser reads both), an integer computed in floating point staying itself.
#[test]
fn floors_and_ceilings_have_their_values() {
    same("\\lfloor 3.7 \\rfloor", "3");
    same("\\left\\lceil \\frac{7}{2} \\right\\rceil", "4");
    same("\\lfloor -\\frac{1}{2} \\rfloor", "-1");
    same(
        "\\lfloor \\sqrt{9} \\rfloor + \\lceil 0.1 \\cdot 30 \\rceil",
        "6",
    );
    differ("\\lfloor 3.7 \\rfloor", "4");
    differ("\\lceil 3.2 \\rceil", "3");
    differ("\\lfloor x \\rfloor", "x");
}
