//! Kernel speed: `y = x Wᵀ` on a 1536 × 8960 matrix (Qwen2.5-1.5B's MLP shape) in every block format,
//! at 1, 8, 32 and 256 activation rows, after a warm-up, as the median of repeats, with the weight bytes
//! read per second and the multiply-adds per second. A benchmark, not a test: `cargo bench --bench kernels`
//! (`-- --threads N`, default 2; `-- --shape NxK` for another shape; `-- --formats Q4K,Q6K` for some
//! formats only, `-- --rows 1,8` for some counts of rows only, `-- --repeats N` for more or fewer than
//! 7, `-- --paths avx2,avx512` to time code paths in turn in one process, an A/B; default: the best this
//! CPU runs; `-- --team` to run the products on kvbench's spinning team, as a decoding step does).

use candle_core::quantized::QTensor;
use candle_core::{Device, Tensor};
use kvbench::kernels::dispatch::Path;
use kvbench::kernels::{BlockFormat, QMatrix};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads = args
        .iter()
        .position(|a| a == "--threads")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(2);
    // `--formats Q4K,Q6K` measures only those formats (names as `BlockFormat`'s Debug prints them).
    let only: Option<Vec<String>> = args
        .iter()
        .position(|a| a == "--formats")
        .and_then(|i| args.get(i + 1))
        .map(|s| s.split(',').map(str::to_string).collect());
    // `--repeats N` times each product N times (default 7; more for a profiler).
    let repeats: usize = args
        .iter()
        .position(|a| a == "--repeats")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .unwrap_or(7)
        .max(1);
    // `--rows 1,8` measures only those counts of activation rows.
    let rows_list: Vec<usize> = args
        .iter()
        .position(|a| a == "--rows")
        .and_then(|i| args.get(i + 1))
        .map(|s| s.split(',').filter_map(|r| r.parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 8, 32, 256]);
    // `--paths avx2,avx512` times each path in turn (a path this CPU lacks runs as the best below it).
    let paths: Vec<Path> = match args.iter().position(|a| a == "--paths") {
        None => vec![Path::best()],
        Some(i) => args
            .get(i + 1)
            .map(String::as_str)
            .unwrap_or("")
            .split(',')
            .map(|p| match p {
                "portable" => Path::Portable,
                "avx2" => Path::Avx2,
                "avx512" => Path::Avx512,
                other => panic!("--paths: unknown path {other:?} (portable, avx2, avx512)"),
            })
            .collect(),
    };
    // `--team`: the products run as a decoding step runs them (kvbench's spinning team), not handed
    // to the pool from outside one by one.
    let team = args.iter().any(|a| a == "--team");
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .ok();
    // `--shape 576x1536` sets the weights' outputs × inputs (default Qwen2.5-1.5B's MLP, 1536 × 8960);
    // a small shape stays in cache between repeats and times the arithmetic alone.
    let (n, k) = args
        .iter()
        .position(|a| a == "--shape")
        .and_then(|i| {
            let (n, k) = args.get(i + 1)?.split_once('x')?;
            Some((n.parse().ok()?, k.parse().ok()?))
        })
        .unwrap_or((1536, 8960));
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0)
        .collect();
    let w = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
    println!("{n} × {k} weights, {threads} threads, median of {repeats} after a warm-up");
    println!("| format | rows | path | ms | weight GB/s | GMAC/s |");
    println!("|---|---:|---|---:|---:|---:|");
    for format in BlockFormat::ALL {
        if only
            .as_ref()
            .is_some_and(|o| !o.contains(&format!("{format:?}")))
        {
            continue;
        }
        let q = QTensor::quantize(&w, format.to_ggml()).unwrap();
        let m = QMatrix::new(format, q.data().unwrap().into_owned(), n, k).unwrap();
        for &rows in &rows_list {
            let x: Vec<f32> = (0..rows * k)
                .map(|i| ((i * 31) % 97) as f32 / 97.0 - 0.5)
                .collect();
            for &path in &paths {
                std::hint::black_box(m.matmul_with(&x, rows, path));
            }
            // The paths in turn, a repeat of each at a time: both under the same drift.
            let mut times = vec![Vec::with_capacity(repeats); paths.len()];
            let repeat_all = |times: &mut Vec<Vec<f64>>| {
                for _ in 0..repeats {
                    for (p, &path) in paths.iter().enumerate() {
                        let t = Instant::now();
                        std::hint::black_box(m.matmul_with(&x, rows, path));
                        times[p].push(t.elapsed().as_secs_f64());
                    }
                }
            };
            if team {
                // From a pool thread with the others spinning, as a decoding step runs its products.
                rayon::scope(|_| kvbench::parallel::with_team(true, || repeat_all(&mut times)));
            } else {
                repeat_all(&mut times);
            }
            for (times, path) in times.iter_mut().zip(&paths) {
                times.sort_by(f64::total_cmp);
                let t = times[repeats / 2];
                println!(
                    "| {format:?} | {rows} | {:?} | {:.3} | {:.1} | {:.1} |",
                    path.supported(),
                    t * 1e3,
                    m.bytes() as f64 / t / 1e9,
                    (n * k * rows) as f64 / t / 1e9
                );
            }
        }
    }
}
