//! A problem set kvbench generates itself, so the main command runs on a fresh machine with no
//! download: arithmetic and short word problems at three difficulty levels, each with an exact integer
//! answer. Multi-step problems (long sums, several purchases) make the model write a reasoning trace
//! long enough for a KV budget to matter. The same seed always gives the same problems.

use super::Problem;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// The default seed of the built-in set.
pub const DEFAULT_SEED: u64 = 2026;

/// `n` problems from `seed`, cycling through levels 1, 2, 3.
pub fn problems(n: usize, seed: u64) -> Vec<Problem> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let level = i % 3 + 1;
            let (problem, answer) = match level {
                1 => level1(&mut rng),
                2 => level2(&mut rng),
                _ => level3(&mut rng),
            };
            Problem {
                id: format!("builtin-{seed}-{i:04}-L{level}"),
                problem,
                answer: answer.to_string(),
            }
        })
        .collect()
}

/// Two-operand arithmetic.
fn level1(rng: &mut ChaCha8Rng) -> (String, i64) {
    let a = rng.random_range(12..99);
    let b = rng.random_range(12..99);
    match rng.random_range(0..3) {
        0 => (format!("What is {a} + {b}?"), a + b),
        1 => (format!("What is {a} - {b}?"), a - b),
        _ => (format!("What is {a} \\times {b}?"), a * b),
    }
}

/// A long sum or a bracketed expression: several steps to keep track of.
fn level2(rng: &mut ChaCha8Rng) -> (String, i64) {
    if rng.random_bool(0.5) {
        let terms: Vec<i64> = (0..rng.random_range(6..10))
            .map(|_| rng.random_range(11..99))
            .collect();
        let text = terms
            .iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(" + ");
        (format!("Compute {text}."), terms.iter().sum())
    } else {
        let (a, b, c, d) = (
            rng.random_range(3..20),
            rng.random_range(3..20),
            rng.random_range(10..60),
            rng.random_range(2..9),
        );
        (
            format!("Compute ({a} \\times {b} - {c}) \\times {d}."),
            (a * b - c) * d,
        )
    }
}

/// A word problem with several purchases and change.
fn level3(rng: &mut ChaCha8Rng) -> (String, i64) {
    const NAMES: [&str; 6] = ["Maria", "Tom", "Aisha", "Kenji", "Lena", "Omar"];
    const ITEMS: [(&str, &str); 5] = [
        ("pencil", "pencils"),
        ("notebook", "notebooks"),
        ("apple", "apples"),
        ("ticket", "tickets"),
        ("card", "cards"),
    ];
    let name = NAMES[rng.random_range(0..NAMES.len())];
    let k = rng.random_range(2..4);
    let mut parts = Vec::new();
    let mut total = 0i64;
    let mut used = Vec::new();
    while parts.len() < k {
        let idx = rng.random_range(0..ITEMS.len());
        if used.contains(&idx) {
            continue;
        }
        used.push(idx);
        let (one, many) = ITEMS[idx];
        let count = rng.random_range(2..9);
        let price = rng.random_range(2..15);
        total += count * price;
        parts.push(format!("{count} {many} at {price} dollars per {one}"));
    }
    let paid = (total / 50 + 1) * 50 + if rng.random_bool(0.5) { 50 } else { 0 };
    let list = match parts.len() {
        2 => format!("{} and {}", parts[0], parts[1]),
        _ => format!("{}, {} and {}", parts[0], parts[1], parts[2]),
    };
    (
        format!("{name} buys {list}. {name} pays with {paid} dollars. How many dollars of change does {name} get back?"),
        paid - total,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_varied() {
        let a = problems(30, 1);
        assert_eq!(a, problems(30, 1));
        assert_ne!(a, problems(30, 2));
        let ids: std::collections::HashSet<_> = a.iter().map(|p| &p.id).collect();
        assert_eq!(ids.len(), 30);
    }

    #[test]
    fn answers_are_right() {
        for p in problems(60, 9) {
            let ans: i64 = p.answer.parse().unwrap();
            if let Some(rest) = p
                .problem
                .strip_prefix("Compute ")
                .filter(|r| !r.starts_with('('))
            {
                let sum: i64 = rest
                    .trim_end_matches('.')
                    .split(" + ")
                    .map(|t| t.parse::<i64>().unwrap())
                    .sum();
                assert_eq!(sum, ans, "{}", p.problem);
            }
            if p.problem.contains("change") {
                assert!(ans >= 0, "{}", p.problem);
            }
        }
    }
}
