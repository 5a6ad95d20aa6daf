//! Element-wise steps of the forward pass done in one pass over CPU memory instead of a chain of
//! candle ops.
//!
//! Why it exists: `silu(gate) · up` through candle is two strided views, a `silu` and a product, each
//! allocating its output; for a 512-token prefill of Qwen2.5-Coder-1.5B that is four passes over 18 MiB
//! per layer, and candle spreads each over its own spinning thread pool beside kvbench's. Here it is
//! one pass, on kvbench's pool, with candle's formula (`x / (1 + e^{-x})`, then the product), so the
//! values are the same bits. Likewise a projection's bias is added in place to the product kvbench's
//! kernels return.

use candle_core::{DType, Result, Storage, Tensor};
use rayon::prelude::*;

/// Runs `f` on a CPU tensor's f32 elements when they are contiguous; `None` otherwise (another
/// device or dtype, or a strided view), so that the caller falls back to candle ops.
pub fn with_f32_slice<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Option<R> {
    if t.dtype() != DType::F32 {
        return None;
    }
    let (storage, layout) = t.storage_and_layout();
    let Storage::Cpu(cpu) = &*storage else {
        return None;
    };
    let (start, end) = layout.contiguous_offsets()?;
    let data = cpu.as_slice::<f32>().ok()?;
    Some(f(&data[start..end]))
}

/// Rows processed per parallel task of [`swiglu`]: enough elements to pay for a task.
const MIN_PAR_ELEMS: usize = 16 * 1024;

/// `silu(x[:, ..ffn]) · x[:, ffn..]` for `x` = `[rows, 2·ffn]` (gate and up projections stacked).
pub fn swiglu(gate_up: &Tensor, ffn: usize) -> Result<Tensor> {
    let (rows, width) = gate_up.dims2()?;
    if width != 2 * ffn {
        candle_core::bail!("swiglu: {width} columns, expected 2 × {ffn}");
    }
    let fused = with_f32_slice(gate_up, |x| {
        let mut out = vec![0f32; rows * ffn];
        let row = |(o, x): (&mut [f32], &[f32])| {
            let (gate, up) = x.split_at(ffn);
            for ((o, &g), &u) in o.iter_mut().zip(gate).zip(up) {
                let s = g / (1.0 + (-g).exp());
                *o = s * u;
            }
        };
        let chunk = MIN_PAR_ELEMS.div_ceil(ffn.max(1)).max(1);
        if rows * ffn >= MIN_PAR_ELEMS {
            out.par_chunks_mut(chunk * ffn)
                .zip(x.par_chunks(chunk * width))
                .for_each(|(o, x)| o.chunks_mut(ffn).zip(x.chunks(width)).for_each(row));
        } else {
            out.chunks_mut(ffn).zip(x.chunks(width)).for_each(row);
        }
        out
    });
    match fused {
        Some(out) => Tensor::from_vec(out, (rows, ffn), gate_up.device()),
        None => candle_nn::ops::silu(&gate_up.narrow(1, 0, ffn)?)? * gate_up.narrow(1, ffn, ffn)?,
    }
}

/// Adds `bias` to every row of the row-major `y` (rows of `bias.len()`), in place: the same sums as
/// candle's `broadcast_add`, without its new tensor (or its thread pool, from 64K elements on).
pub fn add_rows(y: &mut [f32], bias: &[f32]) -> Result<()> {
    if bias.is_empty() || !y.len().is_multiple_of(bias.len()) {
        candle_core::bail!(
            "add_rows: {} values are not rows of {}",
            y.len(),
            bias.len()
        );
    }
    for row in y.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += *b;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;

    #[test]
    fn swiglu_equals_candles_ops_bit_for_bit() {
        let (rows, ffn) = (37, 700); // large enough for the parallel path, rows not a chunk multiple
        let data: Vec<f32> = (0..rows * 2 * ffn)
            .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) / 97.0)
            .collect();
        let x = Tensor::from_vec(data, (rows, 2 * ffn), &Device::Cpu).unwrap();
        let ours = swiglu(&x, ffn).unwrap().to_vec2::<f32>().unwrap();
        let theirs = (candle_nn::ops::silu(&x.narrow(1, 0, ffn).unwrap()).unwrap()
            * x.narrow(1, ffn, ffn).unwrap())
        .unwrap()
        .to_vec2::<f32>()
        .unwrap();
        assert_eq!(ours, theirs);
        // A strided view (the same columns inside a wider tensor) takes candle's path: the same.
        let wide = Tensor::cat(&[&x, &x.narrow(1, 0, 3).unwrap()], 1).unwrap();
        let view = wide.narrow(1, 0, 2 * ffn).unwrap();
        assert!(!view.is_contiguous());
        assert_eq!(
            swiglu(&view, ffn).unwrap().to_vec2::<f32>().unwrap(),
            theirs
        );
        assert!(swiglu(&x, ffn + 1).is_err());
    }

    #[test]
    fn add_rows_equals_broadcast_add() {
        let (rows, n) = (5, 7);
        let y: Vec<f32> = (0..rows * n).map(|i| i as f32 / 3.0 - 4.1).collect();
        let b: Vec<f32> = (0..n).map(|i| (i as f32).sin() * 1e3).collect();
        let dev = Device::Cpu;
        let theirs = Tensor::from_vec(y.clone(), (rows, n), &dev)
            .unwrap()
            .broadcast_add(&Tensor::from_vec(b.clone(), n, &dev).unwrap())
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let mut ours = y;
        add_rows(&mut ours, &b).unwrap();
        assert_eq!(ours, theirs);
        assert!(add_rows(&mut ours, &b[..3]).is_err());
    }
}
