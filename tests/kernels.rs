//! kvbench's kernels on real tensors of the built-in models: every block format the files hold
//! dequantizes exactly as candle does, and the product equals the f32 product of candle's dequantized
//! weights up to the rounding of the activations (each moves by at most half its block's scale). A
//! wrong nibble order, a lost minimum or a misplaced sub-block scale is off by far more.

mod common;

use candle_core::quantized::gguf_file;
use candle_core::Device;
use kvbench::kernels::{BlockFormat, QMatrix};
use std::collections::BTreeMap;

/// Up to `rows` rows of every distinct (format, shape) of matrix in the file, as (name, candle's
/// dequantized rows, our matrix).
fn samples(path: &std::path::Path, rows: usize) -> Vec<(String, Vec<f32>, QMatrix)> {
    let mut file = std::fs::File::open(path).unwrap();
    let content = gguf_file::Content::read(&mut file).unwrap();
    let mut seen = BTreeMap::new();
    let mut names: Vec<_> = content.tensor_infos.keys().cloned().collect();
    names.sort();
    for name in names {
        let info = &content.tensor_infos[&name];
        let Some(format) = BlockFormat::from_ggml(info.ggml_dtype) else {
            continue;
        };
        let Ok((n, k)) = info.shape.dims2() else {
            continue;
        };
        seen.entry((format_name(format), n, k)).or_insert(name);
    }
    seen.into_values()
        .map(|name| {
            let w = content.tensor(&mut file, &name, &Device::Cpu).unwrap();
            let (n, k) = w.shape().dims2().unwrap();
            let format = BlockFormat::from_ggml(w.dtype()).unwrap();
            let take = rows.min(n);
            let bytes = w.data().unwrap()[..take * format.row_bytes(k).unwrap()].to_vec();
            let dense = w
                .dequantize(&Device::Cpu)
                .unwrap()
                .flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap();
            (
                name,
                dense[..take * k].to_vec(),
                QMatrix::new(format, bytes, take, k).unwrap(),
            )
        })
        .collect()
}

fn format_name(f: BlockFormat) -> String {
    format!("{f:?}")
}

fn check_file(path: &std::path::Path, expect: &[BlockFormat]) {
    let samples = samples(path, 96);
    let found: std::collections::BTreeSet<String> = samples
        .iter()
        .map(|(_, _, q)| format_name(q.formats()[0]))
        .collect();
    for f in expect {
        assert!(
            found.contains(&format_name(*f)),
            "{} holds no {f:?} matrix",
            path.display()
        );
    }
    for (name, dense, q) in samples {
        let (n, k) = (q.rows(), q.cols());
        assert_eq!(
            q.dequantize(),
            dense,
            "{name}: dequantized rows differ from candle's"
        );
        let m = 5;
        let x: Vec<f32> = (0..m * k)
            .map(|i| ((i * 7919) % 2003) as f32 / 1001.0 - 1.0)
            .collect();
        let got = q.matmul(&x, m);
        let block = q.act_block();
        for r in 0..m {
            let xr = &x[r * k..(r + 1) * k];
            for j in 0..n {
                let wj = &dense[j * k..(j + 1) * k];
                let exact: f64 = wj.iter().zip(xr).map(|(w, x)| *w as f64 * *x as f64).sum();
                let bound: f64 = (0..k)
                    .map(|i| {
                        let b = i / block * block;
                        let dx = xr[b..b + block].iter().fold(0f32, |a, v| a.max(v.abs())) / 127.0;
                        (wj[i].abs() * dx / 2.0) as f64
                    })
                    .sum();
                let g = got[r * n + j] as f64;
                assert!(
                    (g - exact).abs() <= bound * 1.001 + 1e-4 * exact.abs().max(1.0),
                    "{name} ({:?}) row {r} column {j}: {g} vs {exact} (bound {bound})",
                    q.formats()[0]
                );
            }
        }
    }
}

#[test]
fn kernels_match_candle_on_smollm2_tensors() {
    check_file(
        &common::builtin_gguf("smollm2-135m"),
        &[BlockFormat::Q4_1, BlockFormat::Q8_0],
    );
}

#[test]
fn kernels_match_candle_on_qwen_1_5b_tensors() {
    check_file(
        &common::builtin_gguf("qwen2.5-coder-1.5b"),
        &[BlockFormat::Q4K, BlockFormat::Q6K],
    );
}
