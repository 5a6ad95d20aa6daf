//! Grading speed: every MATH-500 gold answer graded against itself, then against its neighbour (a
//! mostly-unequal pair), after a warm-up, as the median of repeated samples. A benchmark, not a test:
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
    // One timed sample grades the set `passes` times (about 50 ms of work), so that a scheduler tick
    // on this shared 2-core machine moves one sample, not the median.
    let grade_all = |pairs: &dyn Fn(usize) -> (usize, usize)| {
        let mut equal = 0;
        for i in 0..golds.len() {
            let (a, b) = pairs(i);
            equal += usize::from(equivalent(&golds[a], &golds[b]));
        }
        equal
    };
    let n = golds.len();
    for (name, pairs) in [
        (
            "each gold against itself",
            &(|i| (i, i)) as &dyn Fn(usize) -> (usize, usize),
        ),
        ("each gold against the next", &(move |i| (i, (i + 1) % n))),
    ] {
        let start = Instant::now();
        let equal = grade_all(pairs); // warm-up
        let passes = (0.05 / start.elapsed().as_secs_f64().max(1e-6))
            .ceil()
            .max(1.0) as usize;
        let mut ms: Vec<f64> = (0..SAMPLES)
            .map(|_| {
                let start = Instant::now();
                for _ in 0..passes {
                    std::hint::black_box(grade_all(pairs));
                }
                start.elapsed().as_secs_f64() * 1e3 / passes as f64
            })
            .collect();
        ms.sort_by(f64::total_cmp);
        println!(
            "{name}: {n} pairs, median {:.1} ms per pass (min {:.1}, max {:.1}) over {SAMPLES} samples of {passes} passes, {equal} equal; {}",
            ms[SAMPLES / 2],
            ms[0],
            ms[SAMPLES - 1],
            kvbench::metrics::machine()
        );
    }
}

/// Timed samples per pairing; odd, so that the median is one of them.
const SAMPLES: usize = 15;
