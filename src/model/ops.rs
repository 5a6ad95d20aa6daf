//! Element-wise steps of the forward pass done in one pass over CPU memory instead of a chain of
//! candle ops.
//!
//! Why it exists: `silu(gate) · up` through candle is two strided views, a `silu` and a product, each
//! allocating its output; for a 512-token prefill of Qwen2.5-Coder-1.5B that is four passes over 18 MiB
//! per layer, and candle spreads each over its own spinning thread pool beside kvbench's. Here it is
//! one pass, on kvbench's pool, with candle's formula (`x / (1 + e^{-x})`, then the product), so the
//! values are the same bits. Likewise a projection's bias is added in place to the product kvbench's
//! kernels return, and a prefill's attention scores are scaled, masked and softmaxed in one pass.

use crate::kernels::output::unzeroed;
use candle_core::{DType, Result, Storage, Tensor};
use std::mem::MaybeUninit;
use std::sync::Mutex;

/// Where [`in_parts`] runs its tasks.
#[derive(Clone, Copy)]
enum Spread {
    /// Rayon's pool (or the decoding team's threads, inside one).
    Pool,
    /// The decoding team's threads, or the calling thread alone outside a team.
    Team,
}

/// A new buffer made of consecutive parts of the given lengths, `fill(k, part)` writing part `k` in a
/// parallel task, not zeroed first ([`unzeroed`]).
///
/// # Safety
/// `fill` writes every value of the part it is given.
unsafe fn in_parts(
    lengths: impl Iterator<Item = usize>,
    spread: Spread,
    fill: impl Fn(usize, &mut [MaybeUninit<f32>]) + Sync + Send,
) -> Vec<f32> {
    let lengths: Vec<usize> = lengths.collect();
    let in_tasks = |mut rest: &mut [MaybeUninit<f32>]| {
        let parts: Vec<Mutex<&mut [MaybeUninit<f32>]>> = lengths
            .iter()
            .map(|&l| {
                let (part, tail) = std::mem::take(&mut rest).split_at_mut(l);
                rest = tail;
                Mutex::new(part)
            })
            .collect();
        let task = |_: &mut (), k: usize| {
            let mut part = parts[k].lock().unwrap_or_else(|e| e.into_inner());
            fill(k, &mut part);
        };
        match spread {
            Spread::Pool => crate::parallel::for_each_init(parts.len(), || (), task),
            Spread::Team => crate::parallel::for_each_init_on_team(parts.len(), || (), task),
        }
    };
    // SAFETY: the parts cover the buffer, and each is written whole (the caller's contract).
    unsafe { unzeroed(lengths.iter().sum(), in_tasks) }
}

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

/// Elements per parallel task of [`swiglu`]: a few microseconds of `exp` (about 4 ns an element).
const TASK_ELEMS: usize = 2048;

/// Elements from which [`swiglu`] hands its tasks to rayon outside a decoding team (below, the
/// calling thread does them all): enough to pay for waking the pool.
const MIN_PAR_ELEMS: usize = 16 * 1024;

/// `silu(x[:, ..ffn]) · x[:, ffn..]` for `x` = `[rows, 2·ffn]` (gate and up projections stacked).
///
/// In tasks of `TASK_ELEMS` of a row: on a decoding step's team (see [`crate::parallel`]) every
/// size runs on its threads, which would otherwise spin while one of them did it alone (at batch 1 of
/// Qwen2.5-Coder-1.5B, 8,960 `exp` a layer, about 1 ms a token); elsewhere rayon takes large calls and
/// the caller does small ones. Measured in one `kvbench perf --batch 1` process of that model, the two
/// ways alternating every four layers (Zen 4, 2 threads): 36.3 µs a layer alone, 23.6 on the team
/// (tasks of 1,024 elements: 41.3 against 27.1).
pub fn swiglu(gate_up: &Tensor, ffn: usize) -> Result<Tensor> {
    let (rows, width) = gate_up.dims2()?;
    if width != 2 * ffn {
        candle_core::bail!("swiglu: {width} columns, expected 2 × {ffn}");
    }
    let fused = with_f32_slice(gate_up, |x| {
        // Part `t`: row `t / per_row`, columns from `TASK_ELEMS · (t % per_row)`.
        let per_row = ffn.div_ceil(TASK_ELEMS).max(1);
        let spread = if rows * ffn >= MIN_PAR_ELEMS {
            Spread::Pool
        } else {
            Spread::Team
        };
        let parts = (0..rows).flat_map(|_| {
            (0..ffn)
                .step_by(TASK_ELEMS)
                .map(|c| (ffn - c).min(TASK_ELEMS))
        });
        let fill = |t: usize, o: &mut [MaybeUninit<f32>]| {
            let (r, c0) = (t / per_row, TASK_ELEMS * (t % per_row));
            let gate = &x[r * width + c0..];
            let up = &x[r * width + ffn + c0..];
            for ((o, &g), &u) in o.iter_mut().zip(gate).zip(up) {
                let s = g / (1.0 + (-g).exp());
                o.write(s * u);
            }
        };
        // SAFETY: each task writes every value of its part (`o` is at most as long as `gate` and
        // `up`, the rest of their row).
        unsafe { in_parts(parts, spread, fill) }
    });
    match fused {
        Some(out) => Tensor::from_vec(out, (rows, ffn), gate_up.device()),
        None => candle_nn::ops::silu(&gate_up.narrow(1, 0, ffn)?)? * gate_up.narrow(1, ffn, ffn)?,
    }
}

/// Additive mask `[t, n]` for `t` new tokens appended at the end of a cache of `n` entries (0 where a
/// token may attend, −∞ where not): candle's way to the causal mask [`scaled_causal_softmax`] applies.
/// Built where it is used from two index vectors (`t + n` numbers copied, not `t·n` floats): on a GPU
/// a mask built on the host was 4 MiB written and copied per layer of a 1,024-token prefill.
pub fn causal_mask(t: usize, n: usize, device: &candle_core::Device) -> Result<Tensor> {
    let past = (n - t) as u32;
    let entries = Tensor::arange(0u32, n as u32, device)?.reshape((1, n))?;
    // Row i sees entries 0 ..= past + i.
    let last_seen = Tensor::arange(past, past + t as u32, device)?.reshape((t, 1))?;
    let fill = |x: f32| Tensor::new(x, device)?.broadcast_as((t, n));
    entries
        .broadcast_le(&last_seen)?
        .where_cond(&fill(0.0)?, &fill(f32::NEG_INFINITY)?)
}

/// Rows per parallel task of [`scaled_causal_softmax`] (a prefill's rows are hundreds of entries).
const SOFTMAX_TASK_ROWS: usize = 16;

/// `softmax(scores · scale + mask)` over the last dimension for a prefill's scores `[heads, group·t,
/// n]` (each head's rows a group of query heads, `t` tokens each, the last `t` of the `n` entries
/// new): token `i`'s row sees entries `0 ..= n − t + i`, the causal mask. The same operations, in the
/// same order, as candle's `scores * scale`, `broadcast_add(mask)` and `softmax_last_dim` (its max and
/// sum reductions called as it calls them), so the same bits; but one pass over the scores and one
/// tensor, where those are three passes, each allocating a tensor of the scores' size (6 MiB a KV
/// head and layer at a 512-token prefill of Qwen2.5-Coder-1.5B). Measured (`kvbench perf
/// --prompt-tokens 512`, alternated with the three operations): SmolLM2-135M 4% faster (four rounds,
/// medians 351.5 → 365.7 tokens/s), Qwen2.5-Coder-1.5B the same within the noise (five rounds, 98.2 →
/// 97.4). `None` off the CPU, or for scores that are not contiguous f32 of that shape: the caller
/// then uses candle's operations.
pub fn scaled_causal_softmax(scores: &Tensor, scale: f32, t: usize) -> Option<Result<Tensor>> {
    use candle_core::cpu::kernels::VecOps;
    let (heads, rows, n) = scores.dims3().ok()?;
    if t == 0 || rows % t != 0 || n < t {
        return None;
    }
    let past = n - t;
    let out = with_f32_slice(scores, |src| {
        let total = heads * rows;
        let parts = (0..total)
            .step_by(SOFTMAX_TASK_ROWS)
            .map(|r| (total - r).min(SOFTMAX_TASK_ROWS) * n);
        let fill = |k: usize, part: &mut [MaybeUninit<f32>]| {
            for (o, d) in part.chunks_exact_mut(n).enumerate() {
                let r = k * SOFTMAX_TASK_ROWS + o;
                // Rows run over heads, then query heads, then tokens: this row's token is `r % t`.
                let seen = past + r % t + 1;
                let s = &src[r * n..(r + 1) * n];
                // `x · scale + 0` (candle's affine), then the mask's 0 or −∞.
                for (j, (d, &x)) in d.iter_mut().zip(s).enumerate() {
                    let mask = if j < seen { 0.0 } else { f32::NEG_INFINITY };
                    d.write((x * scale + 0.0) + mask);
                }
                // SAFETY: all `n` values of the row were written just above.
                let d = unsafe { &mut *(d as *mut [MaybeUninit<f32>] as *mut [f32]) };
                let mut max = f32::NEG_INFINITY;
                // SAFETY: `d` holds `n` values.
                unsafe { f32::vec_reduce_max(d.as_ptr(), &mut max, n) };
                for v in d.iter_mut() {
                    *v = (*v - max).exp();
                }
                let mut sum = 0f32;
                // SAFETY: as above.
                unsafe { f32::vec_reduce_sum(d.as_ptr(), &mut sum, n) };
                for v in d.iter_mut() {
                    *v /= sum;
                }
            }
        };
        // SAFETY: each task writes every value of its rows (before it reads them).
        unsafe { in_parts(parts, Spread::Pool, fill) }
    })?;
    Some(Tensor::from_vec(out, (heads, rows, n), scores.device()))
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

    /// candle's `silu(gate) · up`, the reference.
    fn candle_swiglu(x: &Tensor, ffn: usize) -> Vec<Vec<f32>> {
        (candle_nn::ops::silu(&x.narrow(1, 0, ffn).unwrap()).unwrap()
            * x.narrow(1, ffn, ffn).unwrap())
        .unwrap()
        .to_vec2::<f32>()
        .unwrap()
    }

    fn gate_up(rows: usize, ffn: usize) -> Tensor {
        let data: Vec<f32> = (0..rows * 2 * ffn)
            .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) / 97.0)
            .collect();
        Tensor::from_vec(data, (rows, 2 * ffn), &Device::Cpu).unwrap()
    }

    #[test]
    fn the_causal_mask_lets_each_new_token_see_the_past_and_itself() {
        for (t, n) in [(1, 1), (1, 9), (4, 4), (3, 10)] {
            let mask = causal_mask(t, n, &Device::Cpu).unwrap();
            let rows = mask.to_vec2::<f32>().unwrap();
            for (i, row) in rows.iter().enumerate() {
                for (j, &x) in row.iter().enumerate() {
                    let seen = j <= n - t + i;
                    assert_eq!(x, if seen { 0.0 } else { f32::NEG_INFINITY }, "t {t} n {n}");
                }
            }
        }
    }

    /// A prefill's scores scaled, masked and softmaxed in one pass give candle's three operations'
    /// bits: heads of several groups, with and without earlier entries, tasks cut inside a head.
    #[test]
    fn scaled_causal_softmax_equals_candles_ops_bit_for_bit() {
        for (heads, group, t, past) in [(2, 3, 5, 4), (1, 6, 40, 0), (3, 1, 7, 100), (2, 2, 2, 1)] {
            let n = past + t;
            let data: Vec<f32> = (0..heads * group * t * n)
                .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) / 37.0)
                .collect();
            let raw = Tensor::from_vec(data, (heads, group * t, n), &Device::Cpu).unwrap();
            let scale = 1.0 / (128f64).sqrt();
            let mask = causal_mask(t, n, &Device::Cpu).unwrap();
            let theirs = candle_nn::ops::softmax_last_dim(
                &(raw.clone() * scale)
                    .unwrap()
                    .reshape((heads, group, t, n))
                    .unwrap()
                    .broadcast_add(&mask)
                    .unwrap()
                    .reshape((heads, group * t, n))
                    .unwrap(),
            )
            .unwrap();
            let ours = scaled_causal_softmax(&raw, scale as f32, t)
                .unwrap()
                .unwrap();
            let bits = |x: &Tensor| -> Vec<u32> {
                x.flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits())
                    .collect()
            };
            assert_eq!(
                bits(&ours),
                bits(&theirs),
                "{heads} × {group} × {t}, {past} before"
            );
        }
        // Not its shape (rows not whole groups of t): left to candle's operations.
        let raw = Tensor::zeros((1, 5, 8), DType::F32, &Device::Cpu).unwrap();
        assert!(scaled_causal_softmax(&raw, 1.0, 2).is_none());
    }

    #[test]
    fn swiglu_equals_candles_ops_bit_for_bit() {
        // Rayon's path (rows not a chunk multiple), the caller's alone, rows of several tasks (the
        // last one short) both ways.
        for (rows, ffn) in [(37, 700), (3, 500), (1, 4500), (5, 4500)] {
            let x = gate_up(rows, ffn);
            let ours = swiglu(&x, ffn).unwrap().to_vec2::<f32>().unwrap();
            assert_eq!(ours, candle_swiglu(&x, ffn), "{rows} × {ffn}");
        }
        let (rows, ffn) = (37, 700);
        let x = gate_up(rows, ffn);
        let theirs = candle_swiglu(&x, ffn);
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

    /// On a decoding team (small calls split among its threads): the same bits.
    #[test]
    fn swiglu_on_a_team_equals_candles_ops() {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        for (rows, ffn) in [(1, 8960), (2, 2049)] {
            let x = gate_up(rows, ffn);
            let ours = pool.install(|| crate::parallel::with_team(true, || swiglu(&x, ffn)));
            let ours = ours.unwrap().to_vec2::<f32>().unwrap();
            assert_eq!(ours, candle_swiglu(&x, ffn), "{rows} × {ffn}");
        }
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
