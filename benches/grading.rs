//! Grading speed: every MATH-500 gold answer graded against itself, then against its neighbour (a
//! mostly-unequal pair), after a warm-up, as the median of repeats. A benchmark, not a test:
//! `cargo bench --bench grading` (reads `../shared/datasets/math500.jsonl`, or the file given as the
//! first argument).

use kvbench::eval::grade::equivalent;
use std::time::Instant;

fn main() {
    let path = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .unwrap_or_else(|| {
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../shared/datasets/math500.jsonl"
            )
            .into()
        });
    let Ok(text) = std::fs::read_to_string(&path) else {
        eprintln!("skipped: {path} not found (pass a MATH-500 JSON Lines file)");
        return;
    };
    let golds: Vec<String> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["answer"].as_str().map(String::from))
        .collect();
    let run = |pairs: &dyn Fn(usize) -> (usize, usize)| {
        let start = Instant::now();
        let mut equal = 0;
        for i in 0..golds.len() {
            let (a, b) = pairs(i);
            equal += usize::from(equivalent(&golds[a], &golds[b]));
        }
        (start.elapsed().as_secs_f64(), equal)
    };
    let n = golds.len();
    for (name, pairs) in [
        (
            "each gold against itself",
            &(|i| (i, i)) as &dyn Fn(usize) -> (usize, usize),
        ),
        ("each gold against the next", &(move |i| (i, (i + 1) % n))),
    ] {
        run(pairs); // warm-up
        let mut secs: Vec<f64> = (0..7).map(|_| run(pairs).0).collect();
        secs.sort_by(f64::total_cmp);
        let equal = run(pairs).1;
        println!(
            "{name}: {n} pairs, median {:.1} ms (min {:.1}, max {:.1}) over 7 runs, {equal} equal; {}",
            secs[3] * 1e3,
            secs[0] * 1e3,
            secs[6] * 1e3,
            kvbench::metrics::machine()
        );
    }
}
