//! Kernel speed: `y = x Wᵀ` on a 1536 × 8960 matrix (Qwen2.5-1.5B's MLP shape) in every block format,
//! at 1, 8, 32 and 256 activation rows, after a warm-up, as the median of repeats, with the weight bytes
//! read per second and the multiply-adds per second. A benchmark, not a test: `cargo bench --bench kernels`
//! (`-- --threads N`, default 2; `-- --formats Q4K,Q6K` for some formats only).

use candle_core::quantized::QTensor;
use candle_core::{Device, Tensor};
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
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global()
        .ok();
    let (n, k) = (1536, 8960);
    let w: Vec<f32> = (0..n * k)
        .map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0)
        .collect();
    let w = Tensor::from_vec(w, (n, k), &Device::Cpu).unwrap();
    println!("{n} × {k} weights, {threads} threads, median of 7 after a warm-up");
    println!("| format | rows | ms | weight GB/s | GMAC/s |");
    println!("|---|---:|---:|---:|---:|");
    for format in BlockFormat::ALL {
        if only
            .as_ref()
            .is_some_and(|o| !o.contains(&format!("{format:?}")))
        {
            continue;
        }
        let q = QTensor::quantize(&w, format.to_ggml()).unwrap();
        let m = QMatrix::new(format, q.data().unwrap().into_owned(), n, k).unwrap();
        for rows in [1, 8, 32, 256] {
            let x: Vec<f32> = (0..rows * k)
                .map(|i| ((i * 31) % 97) as f32 / 97.0 - 0.5)
                .collect();
            std::hint::black_box(m.matmul(&x, rows));
            let mut times: Vec<f64> = (0..7)
                .map(|_| {
                    let t = Instant::now();
                    std::hint::black_box(m.matmul(&x, rows));
                    t.elapsed().as_secs_f64()
                })
                .collect();
            times.sort_by(f64::total_cmp);
            let t = times[3];
            println!(
                "| {format:?} | {rows} | {:.2} | {:.1} | {:.1} |",
                t * 1e3,
                m.bytes() as f64 / t / 1e9,
                (n * k * rows) as f64 / t / 1e9
            );
        }
    }
}
