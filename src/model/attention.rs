//! Attention of one new token over a sequence's cache, on the CPU, straight from the cache buffers.
//!
//! Decoding attends one query per head over the cache. Through candle ops that is several tiny matrix
//! products per sequence and layer (three query rows per KV head for SmolLM2), each paying thread-pool
//! dispatch: `perf` showed them at 22% of batch-8 decode time. This loop reads each cached key and value
//! once per KV head for all query heads of its GQA group, and runs inside the per-sequence parallel loop
//! of the forward pass. Other devices, and prefill, use the generic candle path in `llama.rs`.

use crate::cache::quant::Blocks;
use crate::cache::LayerCache;
use crate::policy::score::{add_scaled, dot};
use candle_core::{DType, Result, Storage, Tensor};

/// Output of [`attend_one`]: the attention output `[heads·d]` and, when asked, the probabilities
/// `[kv_heads, group, n]`.
pub struct OneTokenAttention {
    pub out: Vec<f32>,
    pub probs: Option<Vec<f32>>,
}

/// Attention of one token's queries (`q`: `[heads·d]`, after RoPE) over the cache of `layer`: every
/// entry, or for each cache head only the entries `subset[h]` (sparse attention; probabilities of the
/// others are 0). Reads the cache in place in its stored type (f32, f16 or bf16: each key and value
/// row converted to f32 as it is read, never the whole cache). Returns `None` when the cache is not a
/// CPU tensor of those types (the caller then uses candle ops).
pub fn attend_one(
    layer: &LayerCache,
    q: &[f32],
    group: usize,
    scale: f32,
    want_probs: bool,
    subset: Option<&[Vec<usize>]>,
) -> Option<OneTokenAttention> {
    let shape = Shape {
        hkv: layer.kv_heads(),
        d: layer.head_dim(),
        n: layer.len(),
        group,
        scale,
    };
    // KIVI's rows live on the host in a layout of their own: read a row at a time from there.
    if let Some(store) = layer.kivi() {
        let (out, probs) = attend_heads(store, q, &shape, subset);
        return Some(OneTokenAttention {
            out,
            probs: want_probs.then_some(probs),
        });
    }
    let (k_buf, v_buf) = layer.buffers();
    let (k_store, k_layout) = k_buf.storage_and_layout();
    let (v_store, v_layout) = v_buf.storage_and_layout();
    let (Storage::Cpu(k_cpu), Storage::Cpu(v_cpu)) = (&*k_store, &*v_store) else {
        return None;
    };
    let (_, cap, k_width) = k_buf.dims3().ok()?;
    let kv_type = layer.kv_type();
    let v_width = v_buf.dim(2).ok()?;
    let blocks = (kv_type.keys.blocks(), kv_type.values.blocks());
    let (ko, vo) = (k_layout.start_offset(), v_layout.start_offset());
    macro_rules! rows {
        ($k:expr, $v:expr) => {
            Buffers {
                k: $k,
                v: $v,
                cap,
                widths: (k_width, v_width),
                blocks,
            }
        };
    }
    // Keys and values may be stored in different types: one instance per pair of them.
    macro_rules! with_values {
        ($ek:ty, $keys:expr) => {
            match v_buf.dtype() {
                DType::F32 => attend_heads(
                    &rows!($keys, &v_cpu.as_slice::<f32>().ok()?[vo..]),
                    q,
                    &shape,
                    subset,
                ),
                DType::F16 => attend_heads(
                    &rows!($keys, &v_cpu.as_slice::<half::f16>().ok()?[vo..]),
                    q,
                    &shape,
                    subset,
                ),
                DType::BF16 => attend_heads(
                    &rows!($keys, &v_cpu.as_slice::<half::bf16>().ok()?[vo..]),
                    q,
                    &shape,
                    subset,
                ),
                DType::U8 if blocks.1.is_some() => attend_heads(
                    &rows!($keys, &v_cpu.as_slice::<u8>().ok()?[vo..]),
                    q,
                    &shape,
                    subset,
                ),
                _ => return None,
            }
        };
    }
    let out = match k_buf.dtype() {
        DType::F32 => with_values!(f32, &k_cpu.as_slice::<f32>().ok()?[ko..]),
        DType::F16 => with_values!(half::f16, &k_cpu.as_slice::<half::f16>().ok()?[ko..]),
        DType::BF16 => with_values!(half::bf16, &k_cpu.as_slice::<half::bf16>().ok()?[ko..]),
        DType::U8 if blocks.0.is_some() => with_values!(u8, &k_cpu.as_slice::<u8>().ok()?[ko..]),
        _ => return None,
    };
    let (out, probs) = out;
    Some(OneTokenAttention {
        out,
        probs: want_probs.then_some(probs),
    })
}

/// The sizes [`attend_heads`] works with.
struct Shape {
    hkv: usize,
    d: usize,
    /// Entries held per head.
    n: usize,
    group: usize,
    scale: f32,
}

/// Where [`attend_heads`] reads the key and value of entry `j` of cache head `h`, as f32: in place
/// when stored as f32, else converted (or dequantized) into `buf`.
trait CacheRows: Sync {
    fn key<'a>(&'a self, h: usize, j: usize, buf: &'a mut Vec<f32>) -> &'a [f32];
    fn value<'a>(&'a self, h: usize, j: usize, buf: &'a mut Vec<f32>) -> &'a [f32];
}

/// The cache's own buffers: head `h`'s rows start at `h·cap`; a row is `widths` elements (`d`
/// values, or its blocks' bytes).
struct Buffers<'a, K, V> {
    k: &'a [K],
    v: &'a [V],
    cap: usize,
    widths: (usize, usize),
    blocks: (Option<Blocks>, Option<Blocks>),
}

impl<K: Stored, V: Stored> CacheRows for Buffers<'_, K, V> {
    #[inline(always)]
    fn key<'a>(&'a self, h: usize, j: usize, buf: &'a mut Vec<f32>) -> &'a [f32] {
        let w = self.widths.0;
        K::as_f32(&self.k[(h * self.cap + j) * w..][..w], self.blocks.0, buf)
    }

    #[inline(always)]
    fn value<'a>(&'a self, h: usize, j: usize, buf: &'a mut Vec<f32>) -> &'a [f32] {
        let w = self.widths.1;
        V::as_f32(&self.v[(h * self.cap + j) * w..][..w], self.blocks.1, buf)
    }
}

impl CacheRows for crate::cache::kivi::KiviStore {
    fn key<'a>(&'a self, h: usize, j: usize, buf: &'a mut Vec<f32>) -> &'a [f32] {
        crate::cache::kivi::KiviStore::key(self, h, j, buf)
    }

    fn value<'a>(&'a self, h: usize, j: usize, buf: &'a mut Vec<f32>) -> &'a [f32] {
        crate::cache::kivi::KiviStore::value(self, h, j, buf)
    }
}

/// An element type the cache stores, read back as f32 a row at a time.
trait Stored: Copy + Send + Sync + candle_core::WithDType {
    /// `row` as f32: itself when stored as f32 (no copy, the reference path's exact reads), else
    /// converted (or, for bytes of `blocks`, dequantized) into `buf`.
    fn as_f32<'a>(row: &'a [Self], blocks: Option<Blocks>, buf: &'a mut Vec<f32>) -> &'a [f32];
}

impl Stored for f32 {
    #[inline(always)]
    fn as_f32<'a>(row: &'a [f32], _: Option<Blocks>, _: &'a mut Vec<f32>) -> &'a [f32] {
        row
    }
}

/// 16-bit types: the row converted as it is read, a slice at a time (half's slice conversion uses F16C
/// eight values an instruction where the CPU has it, chosen at run time; converting value by value
/// checked the CPU and called the conversion once per value).
macro_rules! converted {
    ($($t:ty),*) => {$(
        impl Stored for $t {
            #[inline(always)]
            fn as_f32<'a>(row: &'a [Self], _: Option<Blocks>, buf: &'a mut Vec<f32>) -> &'a [f32] {
                use half::slice::HalfFloatSliceExt;
                buf.resize(row.len(), 0.0);
                row.convert_to_f32_slice(buf);
                buf
            }
        }
    )*};
}
converted!(half::f16, half::bf16);

impl Stored for u8 {
    #[inline(always)]
    fn as_f32<'a>(row: &'a [u8], blocks: Option<Blocks>, buf: &'a mut Vec<f32>) -> &'a [f32] {
        blocks
            .expect("a byte cache holds blocks")
            .dequantize(row, buf);
        buf
    }
}

/// Every cache head's attention (see [`attend_one`]) over the rows `rows` reads: the output
/// `[heads·d]` and the probabilities `[kv_heads, group, n]`.
fn attend_heads<R: CacheRows>(
    rows: &R,
    q: &[f32],
    s: &Shape,
    subset: Option<&[Vec<usize>]>,
) -> (Vec<f32>, Vec<f32>) {
    let Shape {
        hkv,
        d,
        n,
        group,
        scale,
    } = *s;
    let mut out = vec![0f32; hkv * group * d];
    let mut probs = vec![0f32; hkv * group * n];
    // Each cache head writes its own slices; on a decoding team's owner the heads run in parallel (the
    // team's threads spin between products anyway), elsewhere one after the other.
    let slices: Vec<std::sync::Mutex<(&mut [f32], &mut [f32])>> = out
        .chunks_mut(group * d)
        .zip(probs.chunks_mut(group * n))
        .map(std::sync::Mutex::new)
        .collect();
    let init = || (Vec::<f64>::new(), Vec::<f32>::new());
    crate::parallel::for_each_init_on_team(hkv, init, |(acc, conv), h| {
        let mut slot = slices[h].lock().unwrap_or_else(|e| e.into_inner());
        let (o_h, p_h) = &mut *slot;
        if let Some(sub) = subset {
            attend_subset(rows, q, h, (group, d, scale), &sub[h], p_h, o_h);
            return;
        }
        // 1. Scores of every query head of the group, reading each key once.
        for j in 0..n {
            let key = rows.key(h, j, conv);
            for r in 0..group {
                let qr = &q[(h * group + r) * d..(h * group + r + 1) * d];
                p_h[r * n + j] = dot(qr, key) * scale;
            }
        }
        // 2. Softmax per query head. Sums are accumulated in f64 so that the result does not depend
        //    on the order of the entries (policies store kept entries in score order).
        for row in p_h.chunks_exact_mut(n) {
            let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let mut sum = 0f64;
            for x in row.iter_mut() {
                *x = (*x - max).exp();
                sum += *x as f64;
            }
            let inv = 1.0 / sum;
            row.iter_mut().for_each(|x| *x = (*x as f64 * inv) as f32);
        }
        // 3. Weighted values, reading each value once, accumulated in f64 (order-independent).
        acc.clear();
        acc.resize(group * d, 0.0);
        for j in 0..n {
            let value = rows.value(h, j, conv);
            for r in 0..group {
                add_scaled(&mut acc[r * d..(r + 1) * d], p_h[r * n + j] as f64, value);
            }
        }
        o_h.iter_mut()
            .zip(acc.iter())
            .for_each(|(o, &a)| *o = a as f32);
    });
    drop(slices);
    (out, probs)
}

/// One cache head's attention over the entries `idx` only: scores, softmax over them, weighted values.
/// `p_h` (`[group][n]`) receives the probabilities, zero elsewhere.
fn attend_subset<R: CacheRows>(
    rows: &R,
    q: &[f32],
    h: usize,
    (group, d, scale): (usize, usize, f32),
    idx: &[usize],
    p_h: &mut [f32],
    o_h: &mut [f32],
) {
    let n = p_h.len() / group;
    let mut row = Vec::new();
    for r in 0..group {
        let qr = &q[(h * group + r) * d..(h * group + r + 1) * d];
        let mut s: Vec<f32> = idx
            .iter()
            .map(|&j| dot(qr, rows.key(h, j, &mut row)) * scale)
            .collect();
        crate::policy::score::softmax(&mut s);
        let mut acc = vec![0f64; d];
        for (&j, &p) in idx.iter().zip(&s) {
            p_h[r * n + j] = p;
            add_scaled(&mut acc, p as f64, rows.value(h, j, &mut row));
        }
        for (o, a) in o_h[r * d..(r + 1) * d].iter_mut().zip(acc) {
            *o = a as f32;
        }
    }
}

/// Keys and values of the entries `subset[h]` of every head, `[heads, m, d]` each (all heads select
/// the same number of entries): sparse attention on devices without the CPU loop.
pub fn gather_heads(layer: &LayerCache, subset: &[Vec<usize>]) -> Result<(Tensor, Tensor)> {
    let (keys, values) = (layer.keys()?, layer.values()?);
    let mut ks = Vec::with_capacity(subset.len());
    let mut vs = Vec::with_capacity(subset.len());
    for (h, idx) in subset.iter().enumerate() {
        let idx: Vec<u32> = idx.iter().map(|&j| j as u32).collect();
        let idx = Tensor::from_vec(idx.clone(), idx.len(), keys.device())?;
        ks.push(keys.get(h)?.index_select(&idx, 0)?);
        vs.push(values.get(h)?.index_select(&idx, 0)?);
    }
    Ok((Tensor::stack(&ks, 0)?, Tensor::stack(&vs, 0)?))
}

/// Wraps probabilities from [`attend_one`] as the `[kv_heads, group, 1, n]` tensor policies receive.
pub fn probs_tensor(
    probs: Vec<f32>,
    hkv: usize,
    group: usize,
    n: usize,
    device: &candle_core::Device,
) -> Result<Tensor> {
    Tensor::from_vec(probs, (hkv, group, 1, n), device)
}
