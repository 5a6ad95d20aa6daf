//! Decoding attention's speed per cache type: one new token's attention (`model::attention::attend_one`)
//! over a cache of N entries, for every storage type, at two models' head shapes (SmolLM2-135M: 3 KV
//! heads of 64, 3 queries each; Qwen2.5-1.5B: 2 KV heads of 128, 6 queries each), after a warm-up, as
//! the median of repeats (every type and path timed in turn within each repeat), on one thread (a decoding step runs each layer's heads on its team; one
//! thread shows the work itself). Prints microseconds per call and the cache bytes read per second.
//! A benchmark, not a test: `cargo bench --bench attention` (`-- --lengths 2048,4096`, `-- --types
//! f16,q8_0`, `-- --repeats N`, default 15; `-- --paths portable,avx2,avx512` to time the code paths in
//! turn, default the best this CPU runs; `-- --layers L` gives each type L caches called in turn, a
//! call's time being their mean, so that the caches read are out of L2 as in a model's decoding step;
//! `-- --threads T` runs the calls on a decoding team of T threads, as a model's step does).

use candle_core::{Device, Tensor};
use kvbench::cache::{KvType, LayerCache};
use kvbench::kernels::dispatch::Path;
use kvbench::model::attention::attend_one_on;
use rand::{Rng, SeedableRng};
use std::time::Instant;

/// `--name a,b` as a list, or the default.
fn list(args: &[String], name: &str, default: &str) -> Vec<String> {
    let s = args
        .iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(String::as_str)
        .unwrap_or(default);
    s.split(',').map(str::to_string).collect()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let lengths: Vec<usize> = list(&args, "--lengths", "2048,4096")
        .iter()
        .map(|s| s.parse().expect("--lengths: numbers"))
        .collect();
    let types: Vec<KvType> = list(&args, "--types", "f32,f16,bf16,q8_0,q4_0,kivi4,kivi2")
        .iter()
        .map(|s| s.parse().expect("--types: cache types"))
        .collect();
    let repeats: usize = list(&args, "--repeats", "15")[0]
        .parse()
        .expect("--repeats: a number");
    let layers: usize = list(&args, "--layers", "1")[0]
        .parse()
        .expect("--layers: a number");
    let paths: Vec<Path> = match args.iter().any(|a| a == "--paths") {
        false => vec![Path::best()],
        true => list(&args, "--paths", "")
            .iter()
            .map(|p| match p.as_str() {
                "portable" => Path::Portable,
                "avx2" => Path::Avx2,
                "avx512" => Path::Avx512,
                other => panic!("--paths: unknown path {other:?} (portable, avx2, avx512)"),
            })
            .collect(),
    };
    let threads: usize = list(&args, "--threads", "1")[0]
        .parse()
        .ok()
        .filter(|&t| t >= 1)
        .expect("--threads: a number of threads, at least 1");
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .expect("a thread pool");
    pool.install(|| {
        kvbench::parallel::with_team(threads > 1, || {
            // A team forms only where the machine has the cores: say what the calls ran on.
            let team = kvbench::parallel::team_size();
            if team != threads {
                eprintln!("--threads {threads}: this machine runs the calls on {team} thread(s)");
            }
            time_all(&lengths, &types, repeats, layers, &paths)
        })
    });
}

/// Times every shape, length, type and path, printing a table row for each.
fn time_all(lengths: &[usize], types: &[KvType], repeats: usize, layers: usize, paths: &[Path]) {
    let shapes = [
        ("smollm2-135m", 3usize, 64usize, 3usize),
        ("qwen2.5-1.5b", 2, 128, 6),
    ];
    println!("| shape | entries | cache | path | µs per call (median) | min | cache MB/s |");
    println!("|---|---:|---|---|---:|---:|---:|");
    for &(name, hkv, d, group) in &shapes {
        for &n in lengths {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
            let mut random = |len: usize| -> Vec<f32> {
                (0..len).map(|_| rng.random_range(-2.0f32..2.0)).collect()
            };
            let keys = random(hkv * n * d);
            let values = random(hkv * n * d);
            let q = random(hkv * group * d);
            // Every (type, path) is timed in turn within each repeat, so that they share the
            // machine's state (a VM's speed drifts by tens of percent from second to second), in
            // the opposite order every other repeat: a run finds the caches the run before it
            // left in L3, and with one layer's caches the same code timed second read 0.84 of its
            // time first (f32 against itself, 2,048 entries, Zen 3).
            let caches: Vec<(KvType, Vec<LayerCache>)> = types
                .iter()
                .map(|&kv| {
                    let layer = || filled(kv, hkv, d, n, &keys, &values);
                    (kv, (0..layers).map(|_| layer()).collect())
                })
                .collect();
            let scale = 1.0 / (d as f32).sqrt();
            let runs: Vec<(usize, Path)> = (0..caches.len())
                .flat_map(|c| paths.iter().map(move |&p| (c, p)))
                .collect();
            let mut times = vec![Vec::with_capacity(repeats); runs.len()];
            for i in 0..repeats + 3 {
                for j in 0..runs.len() {
                    let k = if i % 2 == 0 { j } else { runs.len() - 1 - j };
                    let (c, path) = runs[k];
                    let t = &mut times[k];
                    let t0 = Instant::now();
                    for layer in &caches[c].1 {
                        let out = attend_one_on(path, layer, &q, group, scale, false, None)
                            .expect("a CPU cache");
                        std::hint::black_box(out.out);
                    }
                    if i >= 3 {
                        t.push(t0.elapsed().as_secs_f64() / layers as f64);
                    }
                }
            }
            for (t, &(c, path)) in times.iter_mut().zip(&runs) {
                t.sort_by(f64::total_cmp);
                let median = t[t.len() / 2];
                let kv = caches[c].0;
                let bytes = kv.head_bytes(n, d) * hkv;
                println!(
                    "| {name} | {n} | {kv} | {} | {:.1} | {:.1} | {:.0} |",
                    path.supported().name(),
                    median * 1e6,
                    t[0] * 1e6,
                    bytes as f64 / median / 1e6
                );
            }
        }
    }
}

/// A cache of type `kv` holding `n` entries of `keys` and `values` (`[hkv][n][d]` each), appended in
/// steps of 256 as a prompt and then tokens would arrive.
fn filled(kv: KvType, hkv: usize, d: usize, n: usize, keys: &[f32], values: &[f32]) -> LayerCache {
    let mut cache = LayerCache::new(hkv, d, kv, &Device::Cpu).expect("cache");
    let step = 256;
    for start in (0..n).step_by(step) {
        let t = step.min(n - start);
        let part = |x: &[f32]| -> Tensor {
            let rows: Vec<f32> = (0..hkv)
                .flat_map(|h| x[(h * n + start) * d..(h * n + start + t) * d].to_vec())
                .collect();
            Tensor::from_vec(rows, (hkv, t, d), &Device::Cpu).expect("tensor")
        };
        cache
            .append(&part(keys), &part(values), start)
            .expect("append");
    }
    cache
}
