//! Attention of one new token over a sequence's cache, on the CPU, straight from the cache buffers.
//!
//! Decoding attends one query per head over the cache. Through candle ops that is several tiny matrix
//! products per sequence and layer (three query rows per KV head for SmolLM2), each paying thread-pool
//! dispatch: `perf` showed them at 22% of batch-8 decode time. This loop reads each cached key and value
//! once per KV head for all query heads of its GQA group, and runs inside the per-sequence parallel loop
//! of the forward pass. Other devices, and prefill, use the generic candle path in `llama.rs`.

use crate::cache::quant::Blocks;
use crate::cache::LayerCache;
use crate::kernels::dispatch::Path;
use crate::policy::score::dot_body;
#[cfg(target_arch = "x86_64")]
use crate::policy::score::dots_avx;
#[cfg(target_arch = "x86_64")]
use crate::policy::score::KeyChunks;
use candle_core::{DType, Result, Storage, Tensor};

/// Output of [`attend_one`]: the attention output `[heads·d]` and, when asked, the probabilities
/// `[kv_heads, group, n]`.
pub struct OneTokenAttention {
    pub out: Vec<f32>,
    pub probs: Option<Vec<f32>>,
}

/// Attention of one token's queries (`q`: `[heads·d]`, after RoPE) over the cache of `layer`: every
/// entry, or for each cache head only the entries `subset[h]` (sparse attention; probabilities of the
/// others are 0). Reads the cache in place in its stored type (f32, f16, bf16, Q8_0, Q4_0 or KIVI's:
/// each key and value row converted to f32 as it is read, never the whole cache), on the widest
/// instructions this CPU has. Returns `None` when the cache is not on the CPU in one of those types
/// (the caller then uses candle ops).
pub fn attend_one(
    layer: &LayerCache,
    q: &[f32],
    group: usize,
    scale: f32,
    want_probs: bool,
    subset: Option<&[Vec<usize>]>,
) -> Option<OneTokenAttention> {
    attend_one_on(Path::best(), layer, q, group, scale, want_probs, subset)
}

/// [`attend_one`] on `path` (or the widest path below it this CPU runs): every path computes the same
/// operations in the same order, so the same bits; tests and the attention benchmark compare them.
pub fn attend_one_on(
    path: Path,
    layer: &LayerCache,
    q: &[f32],
    group: usize,
    scale: f32,
    want_probs: bool,
    subset: Option<&[Vec<usize>]>,
) -> Option<OneTokenAttention> {
    let path = path.supported();
    let shape = Shape {
        hkv: layer.kv_heads(),
        d: layer.head_dim(),
        n: layer.len(),
        group,
        scale,
    };
    // KIVI's rows live on the host in a layout of their own: read a row at a time from there.
    if let Some(store) = layer.kivi() {
        let (out, probs) = attend_heads(path, store, q, &shape, subset);
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
                    path,
                    &rows!($keys, &v_cpu.as_slice::<f32>().ok()?[vo..]),
                    q,
                    &shape,
                    subset,
                ),
                DType::F16 => attend_heads(
                    path,
                    &rows!($keys, &v_cpu.as_slice::<half::f16>().ok()?[vo..]),
                    q,
                    &shape,
                    subset,
                ),
                DType::BF16 => attend_heads(
                    path,
                    &rows!($keys, &v_cpu.as_slice::<half::bf16>().ok()?[vo..]),
                    q,
                    &shape,
                    subset,
                ),
                DType::U8 if blocks.1.is_some() => attend_heads(
                    path,
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

/// Where [`attend_heads`] reads the key and value of entry `j` of cache head `h`. Every
/// implementation is inlined into the head's loop, so that it is compiled for the instructions that
/// loop runs on; `AVX` says that loop is one compiled for AVX2 or AVX-512 (see [`attend_head`]), so
/// that the conversions' vector steps may be written into it rather than called.
trait CacheRows: Sync {
    /// Entry `j`'s key as f32: in place when stored as f32, else converted (or dequantized) into
    /// `buf` (`d` values).
    fn key<'a, const AVX: bool>(&'a self, h: usize, j: usize, buf: &'a mut [f32]) -> &'a [f32];
    /// Entry `j`'s value as f32 widened to f64 into `out` (`d` values; `buf` as for [`Self::key`]),
    /// exactly, straight from the stored type where that saves a pass.
    fn value_wide<const AVX: bool>(&self, h: usize, j: usize, buf: &mut [f32], out: &mut [f64]);
    /// Asks for the bytes of entry `j`'s key (`keys`) or value to be brought into L1 (a hint).
    fn prefetch(&self, h: usize, j: usize, keys: bool);
    /// Entry `j`'s key as [`dots_avx`] reads it in the AVX2 and AVX-512 loops: as [`Self::key`]
    /// gives it (`AVX` as there), unless its stored rows convert as they are loaded.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn key_chunks<'a, const AVX: bool>(
        &'a self,
        h: usize,
        j: usize,
        buf: &'a mut [f32],
    ) -> impl KeyChunks + 'a {
        self.key::<AVX>(h, j, buf)
    }
}

/// How many entries ahead of the one it converts [`attend_head`] asks for the next rows. At a few
/// thousand tokens a step's caches no longer fit in L2 (SmolLM2's f16 cache at 3,072 tokens is 69 MiB
/// over its 30 layers), and `perf` showed a seventh of a step waiting on the loads of f16 rows.
const AHEAD: usize = 8;

/// Prefetches `len` elements of `s` from `start` (nothing when they are not all inside it).
#[inline(always)]
fn prefetch_slice<T>(s: &[T], start: usize, len: usize) {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (s, start, len);
    #[cfg(target_arch = "x86_64")]
    if let Some(row) = s.get(start..start + len) {
        // SAFETY: a prefetch never faults; the bytes are inside `s` anyway.
        unsafe {
            crate::kernels::x86::loads::prefetch_lines(
                row.as_ptr().cast(),
                std::mem::size_of_val(row),
            )
        }
    }
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
    fn key<'a, const AVX: bool>(&'a self, h: usize, j: usize, buf: &'a mut [f32]) -> &'a [f32] {
        let w = self.widths.0;
        K::as_f32::<AVX>(&self.k[(h * self.cap + j) * w..][..w], self.blocks.0, buf)
    }

    #[inline(always)]
    fn value_wide<const AVX: bool>(&self, h: usize, j: usize, buf: &mut [f32], out: &mut [f64]) {
        let w = self.widths.1;
        V::as_f64::<AVX>(
            &self.v[(h * self.cap + j) * w..][..w],
            self.blocks.1,
            buf,
            out,
        )
    }

    #[inline(always)]
    fn prefetch(&self, h: usize, j: usize, keys: bool) {
        let (wk, wv) = self.widths;
        match keys {
            true => prefetch_slice(self.k, (h * self.cap + j) * wk, wk),
            false => prefetch_slice(self.v, (h * self.cap + j) * wv, wv),
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn key_chunks<'a, const AVX: bool>(
        &'a self,
        h: usize,
        j: usize,
        buf: &'a mut [f32],
    ) -> impl KeyChunks + 'a {
        let w = self.widths.0;
        K::chunks::<AVX>(&self.k[(h * self.cap + j) * w..][..w], self.blocks.0, buf)
    }
}

impl CacheRows for crate::cache::kivi::KiviStore {
    #[inline(always)]
    fn key<'a, const AVX: bool>(&'a self, h: usize, j: usize, buf: &'a mut [f32]) -> &'a [f32] {
        self.key_into(h, j, buf);
        buf
    }

    #[inline(always)]
    fn value_wide<const AVX: bool>(&self, h: usize, j: usize, buf: &mut [f32], out: &mut [f64]) {
        self.value_into(h, j, buf);
        widen(buf, out)
    }

    #[inline(always)]
    fn prefetch(&self, h: usize, j: usize, keys: bool) {
        #[cfg(not(target_arch = "x86_64"))]
        let _ = (h, j, keys);
        #[cfg(target_arch = "x86_64")]
        if let Some((at, len)) = self.row_at(h, j, keys) {
            // SAFETY: a prefetch never faults.
            unsafe { crate::kernels::x86::loads::prefetch_lines(at, len) }
        }
    }
}

/// An element type the cache stores, read back a row at a time (`AVX` as for [`CacheRows`]).
trait Stored: Copy + Send + Sync + candle_core::WithDType {
    /// `row` as f32: itself when stored as f32 (no copy, the reference path's exact reads), else
    /// converted (or, for bytes of `blocks`, dequantized) into `buf` (its length).
    fn as_f32<'a, const AVX: bool>(
        row: &'a [Self],
        blocks: Option<Blocks>,
        buf: &'a mut [f32],
    ) -> &'a [f32];
    /// `row` as f32 widened to f64 into `out`; the 16-bit types skip the f32 row (the same values).
    #[inline(always)]
    fn as_f64<const AVX: bool>(
        row: &[Self],
        blocks: Option<Blocks>,
        buf: &mut [f32],
        out: &mut [f64],
    ) {
        widen(Self::as_f32::<AVX>(row, blocks, buf), out)
    }
    /// A stored key `row` as [`dots_avx`] reads it: as f32 ([`Self::as_f32`]).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn chunks<'a, const AVX: bool>(
        row: &'a [Self],
        blocks: Option<Blocks>,
        buf: &'a mut [f32],
    ) -> impl KeyChunks + 'a {
        Self::as_f32::<AVX>(row, blocks, buf)
    }
}

impl Stored for f32 {
    #[inline(always)]
    fn as_f32<'a, const AVX: bool>(
        row: &'a [f32],
        _: Option<Blocks>,
        _: &'a mut [f32],
    ) -> &'a [f32] {
        row
    }
}

/// 16-bit types: the row converted as it is read, eight values an instruction where the CPU has
/// AVX2 (`cache::rows`), in the loop's own instructions in the AVX2 and AVX-512 loops: a conversion
/// called per row stayed a call (`perf`: a tenth of a call to attention over an f16 cache).
impl<T: crate::cache::rows::Half + candle_core::WithDType> Stored for T {
    #[inline(always)]
    fn as_f32<'a, const AVX: bool>(
        row: &'a [Self],
        _: Option<Blocks>,
        buf: &'a mut [f32],
    ) -> &'a [f32] {
        // SAFETY: `AVX` only in the loops compiled for AVX2 or AVX-512 (with F16C), which run only
        // where the CPU has them.
        unsafe { crate::cache::rows::halves_in::<T, AVX>(row, buf) };
        buf
    }

    #[inline(always)]
    fn as_f64<const AVX: bool>(
        row: &[Self],
        blocks: Option<Blocks>,
        buf: &mut [f32],
        out: &mut [f64],
    ) {
        #[cfg(target_arch = "x86_64")]
        if AVX {
            // SAFETY: as above.
            return unsafe { crate::cache::rows::halves_wide_avx2(row, out) };
        }
        widen(Self::as_f32::<AVX>(row, blocks, buf), out)
    }

    /// The key's 16-bit values, converted as [`dots_avx`] loads them, never written out as f32.
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    fn chunks<'a, const AVX: bool>(
        row: &'a [Self],
        _: Option<Blocks>,
        _: &'a mut [f32],
    ) -> impl KeyChunks + 'a {
        row
    }
}

impl Stored for u8 {
    #[inline(always)]
    fn as_f32<'a, const AVX: bool>(
        row: &'a [u8],
        blocks: Option<Blocks>,
        buf: &'a mut [f32],
    ) -> &'a [f32] {
        blocks
            .expect("a byte cache holds blocks")
            .dequantize_into(row, buf);
        buf
    }
}

/// Every cache head's attention (see [`attend_one`]) over the rows `rows` reads, on `path`: the
/// output `[heads·d]` and the probabilities `[kv_heads, group, n]`.
fn attend_heads<R: CacheRows>(
    path: Path,
    rows: &R,
    q: &[f32],
    s: &Shape,
    subset: Option<&[Vec<usize>]>,
) -> (Vec<f32>, Vec<f32>) {
    let Shape {
        hkv, d, n, group, ..
    } = *s;
    let mut out = vec![0f32; hkv * group * d];
    let mut probs = vec![0f32; hkv * group * n];
    // The query rows (`hkv·group`, each cache head's `group` consecutive) are cut into parts that write
    // their own slices. Outside a decoding team's owner the parts are the cache heads, one after the
    // other; on a team they run in parallel (its threads spin between products anyway). When the
    // team's threads do not divide the heads (SmolLM2's 3 on 2 threads, or 2 heads on 16 threads), the
    // rows are cut into as many even parts as threads instead: a head split between two parts has its
    // rows read by both, but no thread waits while another does a second head. Each query row's
    // arithmetic is the same whatever the cut.
    let total = hkv * group;
    let team = crate::parallel::team_size();
    let parts = match team > 1 && hkv % team != 0 {
        true => team.min(total),
        false => hkv,
    };
    let bounds: Vec<usize> = (0..=parts).map(|p| p * total / parts).collect();
    let mut slices = Vec::with_capacity(parts);
    let (mut o_rest, mut p_rest) = (&mut out[..], &mut probs[..]);
    for w in bounds.windows(2) {
        let rows = w[1] - w[0];
        let (o, o_tail) = std::mem::take(&mut o_rest).split_at_mut(rows * d);
        let (p, p_tail) = std::mem::take(&mut p_rest).split_at_mut(rows * n);
        (o_rest, p_rest) = (o_tail, p_tail);
        slices.push(std::sync::Mutex::new((o, p)));
    }
    crate::parallel::for_each_init_on_team(parts, Scratch::default, |scratch, part| {
        let mut slot = slices[part].lock().unwrap_or_else(|e| e.into_inner());
        let (o_part, p_part) = &mut *slot;
        let (start, end) = (bounds[part], bounds[part + 1]);
        let mut r = start;
        // One call per cache head the part touches, over the rows of that head it holds.
        while r < end {
            let (h, first) = (r / group, r % group);
            let rows_here = (group - first).min(end - r);
            let o_h = &mut o_part[(r - start) * d..(r - start + rows_here) * d];
            let p_h = &mut p_part[(r - start) * n..(r - start + rows_here) * n];
            let sub = subset.map(|sub| sub[h].as_slice());
            let head = Head {
                h,
                first,
                rows: rows_here,
                sub,
            };
            match path {
                // SAFETY: `path` is supported by this CPU (`attend_one_on` asks `Path::supported`).
                #[cfg(target_arch = "x86_64")]
                Path::Avx512 => unsafe { attend_head_avx512(rows, q, s, head, scratch, p_h, o_h) },
                // SAFETY: as above.
                #[cfg(target_arch = "x86_64")]
                Path::Avx2 => unsafe { attend_head_avx2(rows, q, s, head, scratch, p_h, o_h) },
                _ => attend_head::<R, false>(rows, q, s, head, scratch, p_h, o_h),
            }
            r += rows_here;
        }
    });
    drop(slices);
    (out, probs)
}

/// Which cache head [`attend_head`] computes, for which of its query rows (`rows` from `first`), over
/// all its entries or only `sub`.
#[derive(Clone, Copy)]
struct Head<'a> {
    h: usize,
    first: usize,
    rows: usize,
    sub: Option<&'a [usize]>,
}

/// Buffers a thread reuses from head to head: a row as f32, a block of value rows widened to f64 and
/// their weights per query head (`[group][BLOCK]`), the f64 sums.
#[derive(Default)]
struct Scratch {
    row: Vec<f32>,
    wide: Vec<f64>,
    weights: Vec<f64>,
    acc: Vec<f64>,
}

/// Entries whose weighted values are added together: each sum is loaded and stored once per block, not
/// once per entry (the additions themselves, and their order, are those of one entry at a time).
const BLOCK: usize = 8;

/// [`attend_head`] compiled for an instruction set: the same operations, so the same bits.
macro_rules! attend_head_for {
    ($name:ident, $features:literal) => {
        /// [`attend_head`] compiled for the target features named here (the same operations, so
        /// the same bits).
        ///
        /// # Safety
        /// The CPU must support those features.
        #[cfg(target_arch = "x86_64")]
        #[target_feature(enable = $features)]
        unsafe fn $name<R: CacheRows>(
            rows: &R,
            q: &[f32],
            s: &Shape,
            head: Head<'_>,
            scratch: &mut Scratch,
            p_h: &mut [f32],
            o_h: &mut [f32],
        ) {
            // These instances run only where the CPU has the features (AVX among them).
            attend_head::<R, true>(rows, q, s, head, scratch, p_h, o_h)
        }
    };
}
attend_head_for!(attend_head_avx2, "avx2,fma,f16c");
attend_head_for!(attend_head_avx512, "avx512f,avx512bw,avx2,fma,f16c");

/// One cache head's attention: the query heads `head.rows` of its group, from `head.first`, over its
/// entries (or over `head.sub` only, whose probabilities are then a softmax over them, zero
/// elsewhere), reading each key and value once. `p_h` (`[rows][n]`) receives the probabilities, `o_h`
/// (`[rows][d]`) the output.
///
/// `AVX`: the CPU supports AVX (only the instances compiled for AVX2 and AVX-512 say so), and the
/// scores may take [`dots_avx`].
#[inline(always)]
fn attend_head<R: CacheRows, const AVX: bool>(
    rows: &R,
    q: &[f32],
    s: &Shape,
    head: Head<'_>,
    scratch: &mut Scratch,
    p_h: &mut [f32],
    o_h: &mut [f32],
) {
    let Shape {
        d, n, group, scale, ..
    } = *s;
    let h = head.h;
    // The query rows this call computes: `head.rows` of the group's, from `head.first`.
    let first = h * group + head.first;
    let group = head.rows;
    scratch.row.resize(d, 0.0);
    scratch.wide.resize(BLOCK * d, 0.0);
    scratch.weights.resize(group * BLOCK, 0.0);
    scratch.acc.clear();
    scratch.acc.resize(group * d, 0.0);
    let queries = &q[first * d..(first + group) * d];
    match head.sub {
        None => {
            // 1. Scores of every query head of the group, reading each key once.
            scores_into::<R, AVX>(rows, h, n, |k| k, queries, scale, &mut scratch.row, p_h);
            // 2. Softmax per query head. Sums are accumulated in f64 so that the result does not
            //    depend on the order of the entries (policies store kept entries in score order).
            for p in p_h.chunks_exact_mut(n) {
                let max = p.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let mut sum = 0f64;
                for x in p.iter_mut() {
                    *x = (*x - max).exp();
                    sum += *x as f64;
                }
                let inv = 1.0 / sum;
                p.iter_mut().for_each(|x| *x = (*x as f64 * inv) as f32);
            }
            // 3. Weighted values, reading each value once.
            add_values::<R, AVX>(rows, h, n, |k| k, p_h, scratch);
        }
        Some(idx) => {
            // Sparse attention: the scores of the entries `idx`, a softmax over them per query head
            // (f32 sums, as `policy::score::softmax`), placed at their entries; their weighted values.
            let m = idx.len();
            let mut scores = vec![0f32; group * m];
            scores_into::<R, AVX>(
                rows,
                h,
                m,
                |k| idx[k],
                queries,
                scale,
                &mut scratch.row,
                &mut scores,
            );
            for (s_r, p_r) in scores
                .chunks_exact_mut(m.max(1))
                .zip(p_h.chunks_exact_mut(n))
            {
                crate::policy::score::softmax(s_r);
                for (&p, &j) in s_r.iter().zip(idx) {
                    p_r[j] = p;
                }
            }
            add_values::<R, AVX>(rows, h, m, |k| idx[k], p_h, scratch);
        }
    }
    o_h.iter_mut()
        .zip(scratch.acc.iter())
        .for_each(|(o, &a)| *o = a as f32);
}

/// `out[r][k] = q_r · key(entry(k)) · scale` for the `count` entries, every query row `r` of `queries`
/// (`[rows][d]`), reading each key once (`out`: `[rows][count]`). With `AVX` (the CPU supports it)
/// the rows are scored eight at a time by [`dots_avx`], each chunk of the key loaded once for them;
/// without, one after the other by [`dot_body`]: the same operations, so the same bits.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
fn scores_into<R: CacheRows, const AVX: bool>(
    rows: &R,
    h: usize,
    count: usize,
    entry: impl Fn(usize) -> usize,
    queries: &[f32],
    scale: f32,
    row: &mut [f32],
    out: &mut [f32],
) {
    let d = row.len();
    for k in 0..count {
        if k + AHEAD < count {
            rows.prefetch(h, entry(k + AHEAD), true);
        }
        #[cfg(target_arch = "x86_64")]
        if AVX {
            let key = rows.key_chunks::<AVX>(h, entry(k), row);
            // SAFETY: `AVX` says the CPU supports it and this loop is compiled for it.
            unsafe { key_scores_avx(queries, key, scale, |r, s| out[r * count + k] = s) };
            continue;
        }
        let key = rows.key::<AVX>(h, entry(k), row);
        for (r, qr) in queries.chunks_exact(d).enumerate() {
            out[r * count + k] = dot_body(qr, key) * scale;
        }
    }
}

/// `emit(r, q_r · key · scale)` for every query row `r` of `queries` (`[rows][key.len()]`), eight
/// rows at a time by [`dots_avx`]: [`dot_body`]'s bits, each chunk of the key loaded (and, stored in
/// 16 bits, converted) once per group.
///
/// # Safety
/// As [`dots_avx`]: the CPU must support AVX2, FMA and F16C, the caller be compiled for them.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn key_scores_avx<K: KeyChunks>(
    queries: &[f32],
    key: K,
    scale: f32,
    mut emit: impl FnMut(usize, f32),
) {
    let d = key.len();
    let rows = queries.len() / d;
    let mut r = 0;
    while r < rows {
        let g = (rows - r).min(8);
        let qs = &queries[r * d..(r + g) * d];
        macro_rules! group_of {
            ($($n:literal)*) => {
                match g {
                    $($n => {
                        // SAFETY: the caller's promise.
                        let got = unsafe { dots_avx::<$n, K>(qs, key) };
                        for (i, s) in got.into_iter().enumerate() {
                            emit(r + i, s * scale);
                        }
                    })*
                    _ => unreachable!("groups of one to eight rows"),
                }
            };
        }
        group_of!(1 2 3 4 5 6 7 8);
        r += g;
    }
}

/// `acc[r] += p_h[r][j] · value(j)` in f64 for the `count` entries `j = entry(k)` in that order, every
/// query row `r` (`p_h`: `[rows][n]`, `acc`: `[rows][d]`, the scratch sized for them): each value
/// read once and widened once, a block of entries at a time (order-independent sums: `add_block`).
#[inline(always)]
fn add_values<R: CacheRows, const AVX: bool>(
    rows: &R,
    h: usize,
    count: usize,
    entry: impl Fn(usize) -> usize,
    p_h: &[f32],
    scratch: &mut Scratch,
) {
    let Scratch {
        row,
        wide,
        weights,
        acc,
    } = scratch;
    let d = row.len();
    let n = p_h.len() / (acc.len() / d);
    for k0 in (0..count).step_by(BLOCK) {
        let t = BLOCK.min(count - k0);
        for k in 0..t {
            if k0 + k + AHEAD < count {
                rows.prefetch(h, entry(k0 + k + AHEAD), false);
            }
            let j = entry(k0 + k);
            rows.value_wide::<AVX>(h, j, row, &mut wide[k * d..(k + 1) * d]);
            for (r, p_r) in p_h.chunks_exact(n).enumerate() {
                weights[r * BLOCK + k] = p_r[j] as f64;
            }
        }
        add_block(acc, d, &wide[..t * d], weights, t);
    }
}

/// `x` as f64 into `out` (exact), so that each value row is widened once, not once per query head.
#[inline(always)]
fn widen(x: &[f32], out: &mut [f64]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = v as f64;
    }
}

/// For every query head `r`, `acc[r] += Σₖ weights[r][k] · wide[k]` over the block's `t` entries in
/// order, in f64 (the value rows already widened, exactly): attention's weighted values as
/// order-independent sums. Each run of [`RUN`] sums stays in registers over the block (enough
/// independent additions in flight to hide their latency).
#[inline(always)]
fn add_block(acc: &mut [f64], d: usize, wide: &[f64], weights: &[f64], t: usize) {
    for (a_r, w_r) in acc.chunks_exact_mut(d).zip(weights.chunks_exact(BLOCK)) {
        let w_r = &w_r[..t];
        let mut runs = a_r.chunks_exact_mut(RUN);
        for (c, run) in runs.by_ref().enumerate() {
            let mut a = [0f64; RUN];
            a.copy_from_slice(run);
            for (k, &p) in w_r.iter().enumerate() {
                let v = &wide[k * d + c * RUN..][..RUN];
                for i in 0..RUN {
                    a[i] += p * v[i];
                }
            }
            run.copy_from_slice(&a);
        }
        let done = d - d % RUN;
        for (i, o) in runs.into_remainder().iter_mut().enumerate() {
            for (k, &p) in w_r.iter().enumerate() {
                *o += p * wide[k * d + done + i];
            }
        }
    }
}

/// Sums [`add_block`] keeps in registers at once.
const RUN: usize = 32;

/// Keys and values of the entries `subset[h]` of every head, `[heads, m, d]` each (all heads select
/// the same number of entries): sparse attention on devices without the CPU loop.
pub fn gather_heads(layer: &LayerCache, subset: &[Vec<usize>]) -> Result<(Tensor, Tensor)> {
    // Every head selecting as many entries from a cache of plain rows (RocketKV's top-k): one
    // selection per buffer, from its heads' rows one after another. Head by head it was an index
    // copy and two selections per head, then two joins: about fourteen launches a layer on a GPU.
    let (kb, vb) = layer.buffers();
    let m = subset.first().map_or(0, Vec::len);
    if layer.kv_type().plain_rows()
        && m > 0
        && subset.len() == layer.kv_heads()
        && subset.iter().all(|s| s.len() == m)
        && kb.is_contiguous()
        && vb.is_contiguous()
    {
        let (heads, cap, d) = kb.dims3()?;
        if let Some(j) = subset.iter().flatten().find(|&&j| j >= layer.len()) {
            candle_core::bail!("gather_heads: entry {j} of a cache of {}", layer.len());
        }
        let index: Vec<u32> = subset
            .iter()
            .enumerate()
            .flat_map(|(h, s)| s.iter().map(move |&j| (h * cap + j) as u32))
            .collect();
        let index = Tensor::from_vec(index, heads * m, kb.device())?;
        let take = |b: &Tensor| {
            b.reshape((heads * cap, d))?
                .index_select(&index, 0)?
                .reshape((heads, m, d))
        };
        return Ok((take(kb)?, take(vb)?));
    }
    gather_each_head(layer, subset)
}

/// [`gather_heads`] a head at a time (any cache type, any subset sizes).
fn gather_each_head(layer: &LayerCache, subset: &[Vec<usize>]) -> Result<(Tensor, Tensor)> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::KvType;
    use candle_core::Device;
    use rand::{Rng, SeedableRng};

    /// A cache of `kv` holding `n` random entries of `hkv` heads of `d`, appended in two parts.
    fn cache(kv: KvType, hkv: usize, d: usize, n: usize) -> LayerCache {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(11);
        let mut layer = LayerCache::new(hkv, d, kv, &Device::Cpu).unwrap();
        for (start, t) in [(0, n / 3), (n / 3, n - n / 3)] {
            let mut part = || {
                let x: Vec<f32> = (0..hkv * t * d)
                    .map(|_| rng.random_range(-3.0f32..3.0))
                    .collect();
                Tensor::from_vec(x, (hkv, t, d), &Device::Cpu).unwrap()
            };
            let (k, v) = (part(), part());
            layer.append(&k, &v, start).unwrap();
        }
        layer
    }

    /// Queries for `hkv·group` heads of `d`, and for each cache head a subset of its `n` entries
    /// (two in three, in reverse: sparse attention reads them in any order).
    fn queries_and_subset(
        hkv: usize,
        group: usize,
        d: usize,
        n: usize,
        seed: u64,
    ) -> (Vec<f32>, Vec<Vec<usize>>) {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let q = (0..hkv * group * d)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect();
        let subset = (0..hkv)
            .map(|h| (0..n).filter(|j| (j + h) % 3 != 0).rev().collect())
            .collect();
        (q, subset)
    }

    /// One selection per buffer gives every head its entries as a head at a time does, for every
    /// cache type (block formats and KIVI take the head-by-head path), from buffers with room past
    /// the entries held; an entry past them is refused, not read from that room.
    #[test]
    fn gathered_heads_are_each_head_s_entries() {
        let (hkv, d, n) = (3, 64, 300);
        let (_, subset) = queries_and_subset(hkv, 1, d, n, 6);
        for kv in ["f32", "f16", "bf16", "q8_0", "q4_0", "kivi4:64"] {
            let layer = cache(kv.parse().unwrap(), hkv, d, n);
            if kv == "f32" {
                assert!(
                    layer.buffers().0.dim(1).unwrap() > n,
                    "no room past the entries"
                );
            }
            let bits = |t: Tensor| {
                let v: Vec<Vec<Vec<f32>>> = t.to_dtype(DType::F32).unwrap().to_vec3().unwrap();
                v.into_iter()
                    .flatten()
                    .flatten()
                    .map(f32::to_bits)
                    .collect::<Vec<_>>()
            };
            let (k, v) = gather_heads(&layer, &subset).unwrap();
            let (k1, v1) = gather_each_head(&layer, &subset).unwrap();
            assert_eq!(k.dims(), &[hkv, subset[0].len(), d], "{kv}");
            assert_eq!(bits(k), bits(k1), "{kv}: keys");
            assert_eq!(bits(v), bits(v1), "{kv}: values");
        }
        let layer = cache(KvType::F32, hkv, d, n);
        let mut past = subset.clone();
        past[1][0] = n;
        assert!(gather_heads(&layer, &past).is_err());
    }

    /// The portable, AVX2 and AVX-512 loops give the same bits (outputs and probabilities), over all
    /// entries and over a subset, for every storage type (paths this CPU lacks run as the best below).
    #[test]
    fn every_path_gives_the_same_bits_for_every_cache_type() {
        let (hkv, d, group, n) = (2, 64, 3, 300);
        let (q, subset) = queries_and_subset(hkv, group, d, n, 5);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for kv in ["f32", "f16", "bf16", "q8_0", "q4_0", "kivi4:64", "kivi2:64"] {
            let kv: KvType = kv.parse().unwrap();
            let layer = cache(kv, hkv, d, n);
            for sub in [None, Some(&subset[..])] {
                let run = |path| {
                    let a = attend_one_on(path, &layer, &q, group, 0.125, true, sub).unwrap();
                    (bits(&a.out), bits(&a.probs.unwrap()))
                };
                let portable = run(Path::Portable);
                assert!(portable.0.iter().all(|&b| f32::from_bits(b).is_finite()));
                for path in [Path::Avx2, Path::Avx512] {
                    assert!(
                        run(path) == portable,
                        "{kv}, subset {}: {path:?} differs from the portable loop",
                        sub.is_some()
                    );
                }
            }
        }
    }

    /// The same across GQA group sizes from one query head per cache head to more than eight (the
    /// AVX paths score a key's query heads eight at a time) and head sizes with and without a tail
    /// past the last eight values.
    #[test]
    fn every_path_gives_the_same_bits_for_every_group_size() {
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for (d, kv) in [(20, "f32"), (128, "f16"), (36, "bf16")] {
            let kv: KvType = kv.parse().unwrap();
            let (hkv, n) = (2, 70);
            let layer = cache(kv, hkv, d, n);
            for group in 1..=11 {
                let (q, subset) = queries_and_subset(hkv, group, d, n, group as u64);
                for sub in [None, Some(&subset[..])] {
                    let run = |path| {
                        let a = attend_one_on(path, &layer, &q, group, 0.3, true, sub).unwrap();
                        (bits(&a.out), bits(&a.probs.unwrap()))
                    };
                    let portable = run(Path::Portable);
                    for path in [Path::Avx2, Path::Avx512] {
                        assert!(
                            run(path) == portable,
                            "{kv}, d {d}, group {group}, subset {}: {path:?} differs",
                            sub.is_some()
                        );
                    }
                }
            }
        }
    }

    /// On a decoding team whose threads do not divide the cache heads, the query rows are cut into even
    /// parts across heads: the same bits as one head after the other, for every cache type.
    #[test]
    fn rows_cut_across_heads_on_a_team_give_the_same_bits() {
        let (hkv, d, group, n) = (3, 64, 3, 200);
        let (q, subset) = queries_and_subset(hkv, group, d, n, 8);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        for kv in ["f32", "f16", "q8_0", "kivi2:64"] {
            let layer = cache(kv.parse().unwrap(), hkv, d, n);
            for sub in [None, Some(&subset[..])] {
                let run = || {
                    let a = attend_one(&layer, &q, group, 0.125, true, sub).unwrap();
                    (a.out, a.probs.unwrap())
                };
                let alone = run();
                let (on_team, team) = pool.install(|| {
                    crate::parallel::with_team(true, || (run(), crate::parallel::team_size()))
                });
                let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
                assert_eq!(team, if cores >= 2 { 2 } else { 1 }, "the team formed");
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(
                    bits(&alone.0),
                    bits(&on_team.0),
                    "{kv}, subset {}",
                    sub.is_some()
                );
                assert_eq!(
                    bits(&alone.1),
                    bits(&on_team.1),
                    "{kv}, subset {}",
                    sub.is_some()
                );
            }
        }
    }

    /// The weighted values, summed a block of entries at a time with the sums in registers, are the
    /// sums of one entry at a time in f64 (all entries, or the subset's) rounded to f32, to the bit:
    /// for head sizes and entry counts that are and are not multiples of the block and of the run.
    #[test]
    fn blocked_sums_equal_entry_by_entry_sums() {
        for (d, n) in [(64, 300), (48, 37), (40, 8), (32, 5)] {
            let (hkv, group) = (2, 3);
            let (q, subset) = queries_and_subset(hkv, group, d, n, d as u64);
            for kv in ["f32", "f16"] {
                let layer = cache(kv.parse().unwrap(), hkv, d, n);
                let values: Vec<f32> = layer
                    .values()
                    .unwrap()
                    .to_dtype(DType::F32)
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .to_vec1()
                    .unwrap();
                let all: Vec<Vec<usize>> = vec![(0..n).collect(); hkv];
                for sub in [None, Some(&subset[..])] {
                    let a =
                        attend_one_on(Path::best(), &layer, &q, group, 0.125, true, sub).unwrap();
                    let probs = a.probs.unwrap();
                    let order = sub.unwrap_or(&all);
                    for h in 0..hkv {
                        for r in 0..group {
                            for c in 0..d {
                                let mut sum = 0f64;
                                for &j in &order[h] {
                                    let p = probs[(h * group + r) * n + j] as f64;
                                    sum += p * values[(h * n + j) * d + c] as f64;
                                }
                                let got = a.out[(h * group + r) * d + c];
                                assert_eq!(
                                    got.to_bits(),
                                    (sum as f32).to_bits(),
                                    "{kv}, d {d}, n {n}, subset {}: head {h}, query {r}, channel {c}",
                                    sub.is_some()
                                );
                            }
                        }
                    }
                }
            }
        }
    }
}
