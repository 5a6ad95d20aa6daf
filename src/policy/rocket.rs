//! RocketKV (arXiv 2502.14051): stage 1 evicts prompt entries once at prefill (SnapKV++: the last
//! `window` prompt queries, softmax over all keys with a causal window, summed over queries and over
//! the GQA group, max-pooled, kept sorted); stage 2 attends, at every decode step, only to the top-k
//! entries of an approximate score built from chunk-wise key bounds on the query's largest dimensions
//! (spec §3(b)). Generated entries are never evicted.
//!
//! The budget `B` is memory *traffic* per decode step in token equivalents: a fraction is taken of the
//! full sequence `S = prompt + max_new_tokens`. The split (capacity `C`, prompt budget `P`, top-k,
//! chunk size, kept dimensions) follows spec §3(f). In the reasoning regime (short prompt, long
//! generation) `C = S` and stage 1 evicts nothing: storage is the full cache and only the bandwidth
//! falls; the report shows this. Deviation: the reference prefills `prompt[..-1]` and feeds the last
//! prompt token as a decode step; kvbench prefills the whole prompt.

use super::params::{GqaAgg, Params, Pool, QueryReduce, RocketSplit, SoftmaxDomain};
use super::score::{pool, top_k, window_scores, GroupLogits};
use super::{AttentionView, Budget, BuildContext, Capabilities, Policy, StepInfo};
use crate::cache::LayerCache;
use crate::error::Result;

#[derive(Debug, Clone)]
pub struct Config {
    budget: Budget,
    window: usize,
    pool: Pool,
    skip_layers: usize,
    split: RocketSplit,
}

impl Config {
    pub fn parse(p: &mut Params, budget: Budget) -> Result<Self> {
        let window = p.positive("window", 32)?;
        Ok(Self {
            budget,
            window,
            pool: p.get("pool", Pool::max(63))?,
            skip_layers: p.get("skip_layers", 0usize)?,
            split: p.get("split", RocketSplit::Hf)?,
        })
    }

    /// The fewest entries kept: the prompt's observation window.
    pub fn floor(&self) -> usize {
        self.window
    }
}

/// Stage 1's window score of every candidate (the first `n_cand` entries) of each cache head: the
/// `window` queries' softmax over all keys with a causal window, summed over queries and over the GQA
/// group. `on_device`: computed where the keys are ([`super::device_score`]), only the scores copied
/// to the host (at an 8K-token prompt and R1-Distill-Qwen-7B's shapes the host version copies the
/// layer's keys out and does about 235 million multiply-adds per head); otherwise, or where the
/// device version does not apply, on the host.
fn stage1_scores(
    window: &candle_core::Tensor,
    cache: &LayerCache,
    n_cand: usize,
    on_device: bool,
) -> candle_core::Result<Vec<Vec<f32>>> {
    let (agg, domain, reduce) = (GqaAgg::SumProb, SoftmaxDomain::AllCausal, QueryReduce::Sum);
    if on_device {
        let keys = cache.keys()?;
        if let Some(s) =
            super::device_score::window_scores(window, &keys, n_cand, agg, domain, reduce)?
        {
            return Ok(s);
        }
    }
    let (hq, w, d) = window.dims3()?;
    let q = crate::host_copy::flat_f32(window)?;
    let heads = cache.kv_heads();
    let g = hq / heads;
    let scale = 1.0 / (d as f32).sqrt();
    cache.with_host_keys(|kv| {
        (0..heads)
            .map(|h| {
                let z = GroupLogits::compute(
                    &q[h * g * w * d..(h + 1) * g * w * d],
                    kv.keys(h),
                    g,
                    d,
                    scale,
                );
                window_scores(&z, n_cand, agg, domain, reduce).swap_remove(0)
            })
            .collect()
    })
}

/// RocketKV's budget split for one sequence (spec §3(f)).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Split {
    /// Storage capacity `C`.
    pub capacity: usize,
    /// Prompt entries kept by stage 1, `P`.
    pub prompt: usize,
    /// Stage-2 top-k.
    pub top_k: usize,
    /// Chunk size `s`.
    pub chunk: usize,
    /// Head dimensions kept, `r_dims`.
    pub dims: usize,
}

impl Split {
    /// `s_total = prompt + max_new`, traffic budget `b`, head dim `d`.
    pub fn compute(s_total: usize, max_new: usize, b: usize, d: usize, path: RocketSplit) -> Self {
        let (s, b) = (s_total as f64, b.max(1) as f64);
        let c = (s / b).max(1.0);
        let e = (0.2 + 0.06 * c.log2()).min(0.8);
        let mut capacity = (s / c.powf(e)).floor() as usize;
        let prompt = match path {
            RocketSplit::Hf => {
                capacity = capacity.max((2 * max_new).min(s_total));
                capacity.saturating_sub(max_new)
            }
            RocketSplit::GptFast => {
                (s_total.saturating_sub(max_new)).min(capacity.saturating_sub(max_new))
            }
        };
        let c2 = (capacity as f64 / b).max(1.0);
        let root = c2.sqrt().ceil();
        let chunk = match path {
            RocketSplit::Hf => {
                if root <= c2 {
                    root as usize
                } else {
                    1
                }
            }
            RocketSplit::GptFast => c2.floor().min(root) as usize,
        }
        .max(1);
        let dims = d as f64 * chunk as f64 / c2;
        let dims = match path {
            RocketSplit::Hf => dims as usize,
            RocketSplit::GptFast => dims.round() as usize,
        }
        .clamp(1, d);
        Self {
            capacity,
            prompt,
            top_k: (b as usize / 2).max(1),
            chunk,
            dims,
        }
    }
}

#[derive(Clone)]
pub struct RocketKv {
    config: Config,
    max_new: usize,
    head_dim: usize,
    /// Set at prefill.
    split: Option<Split>,
    /// Per layer, per KV head: the chunk summaries of stage 2.
    summaries: Vec<Vec<ChunkSummary>>,
    /// Bytes the last stage-2 selection read from the summaries.
    last_read: usize,
}

impl RocketKv {
    pub fn new(config: Config, ctx: &BuildContext) -> Self {
        Self {
            config,
            max_new: ctx.max_new_tokens,
            head_dim: ctx.head_dim,
            split: None,
            summaries: Vec::new(),
            last_read: 0,
        }
    }

    /// Prompt entries stage 1 keeps.
    fn stage1_keep(&self, split: &Split) -> usize {
        split.prompt.max(self.config.window)
    }
}

/// Per-chunk, per-dimension maxima and minima of one cache head's keys, kept up to date as entries
/// are appended (stage 2 runs after stage 1, when storage only grows), so that a decode step reads
/// `n / chunk` summaries instead of every key. The sign-aware bound `max_j σ_c·k[j,c]` is the maximum
/// for a positive sign and minus the minimum for a negative one.
///
/// Held per dimension (`max[c][b]`, chunk `b` of dimension `c`), so that a step's scores run over
/// each kept dimension's chunks in one contiguous, vectorised pass: held per chunk, each score
/// gathered its bounds one dimension at a time, and the selection cost more than the attention it
/// saved (measured in `docs/speed.md`). The arithmetic is the same, in the same order.
#[derive(Debug, Clone, Default)]
pub struct ChunkSummary {
    chunk: usize,
    d: usize,
    max: Vec<Vec<f32>>,
    min: Vec<Vec<f32>>,
    /// Entries summarised so far.
    covered: usize,
}

impl ChunkSummary {
    /// Bytes of the element-wise maxima and minima held.
    pub fn bytes(&self) -> usize {
        self.max
            .iter()
            .chain(&self.min)
            .map(|v| super::vec_bytes(v))
            .sum()
    }

    pub fn new(chunk: usize, d: usize) -> Self {
        Self {
            chunk: chunk.max(1),
            d,
            max: vec![Vec::new(); d],
            min: vec![Vec::new(); d],
            covered: 0,
        }
    }

    /// Entries summarised so far.
    pub fn covered(&self) -> usize {
        self.covered
    }

    /// Adds the entries that follow the ones summarised: `new` holds keys `covered..` (`[m][d]`).
    pub fn extend(&mut self, new: &[f32]) {
        let (s, d) = (self.chunk, self.d);
        let first = self.covered;
        let n = first + new.len() / d;
        for j in first..n {
            let b = j / s;
            let key = &new[(j - first) * d..(j - first + 1) * d];
            for ((hi, lo), &k) in self.max.iter_mut().zip(self.min.iter_mut()).zip(key) {
                if b == hi.len() {
                    hi.push(f32::NEG_INFINITY);
                    lo.push(f32::INFINITY);
                }
                hi[b] = hi[b].max(k);
                lo[b] = lo[b].min(k);
            }
        }
        self.covered = n;
    }

    /// Stage 2's approximate attention of the group's queries (`[g][d]`) per chunk: scores on the
    /// `dims` largest mean-|q| dimensions against the sign-aware chunk bounds, a SparQ temperature,
    /// softmax per query head over all tokens (a chunk's score counts once per token it holds), mean
    /// over the group. Returns the probability of each token of each chunk.
    pub fn chunk_probs(&self, q: &[f32], dims: usize) -> Vec<f32> {
        let d = self.d;
        let g = q.len() / d;
        let n = self.covered;
        let chunks = n.div_ceil(self.chunk);
        // 1. Sign of the group-summed query; 2. dimensions with the largest mean |q|.
        let (positive, kept) = query_dims(q, d, dims);
        // Each kept dimension's bound of every chunk: its maxima or its minima, by the sign.
        let bounds: Vec<&[f32]> = kept
            .iter()
            .map(|&c| match positive[c] {
                true => &self.max[c][..chunks],
                false => &self.min[c][..chunks],
            })
            .collect();
        let count = |b: usize| (n - b * self.chunk).min(self.chunk) as f32;
        let mut mean = vec![0f32; chunks];
        let (mut z, mut e) = (vec![0f32; chunks], Vec::with_capacity(chunks));
        for r in 0..g {
            let qr = &q[r * d..(r + 1) * d];
            let l1_kept: f32 = kept.iter().map(|&c| qr[c].abs()).sum();
            let l1_all: f32 = qr.iter().map(|x| x.abs()).sum();
            let tau = (d as f32 * l1_kept / l1_all.max(f32::MIN_POSITIVE))
                .sqrt()
                .max(f32::MIN_POSITIVE);
            // 3.–4. Chunk scores: Σ_c (σ_c q_c) · max_j σ_c k_jc = Σ_c q_c · (max or min), summed
            // over the kept dimensions in order, every chunk at once (the sum's neutral element is
            // the standard library's, −0).
            z.fill(-0.0);
            for (&c, bound) in kept.iter().zip(&bounds) {
                add_scaled(&mut z, bound, qr[c]);
            }
            z.iter_mut().for_each(|x| *x /= tau);
            // 5. Softmax over tokens, each chunk's score repeated for its tokens.
            let top = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            e.clear();
            e.extend(z.iter().map(|x| (x - top).exp()));
            let total: f32 = e.iter().enumerate().map(|(b, x)| x * count(b)).sum();
            for (m, x) in mean.iter_mut().zip(&e) {
                *m += x / total / g as f32;
            }
        }
        mean
    }

    /// The `k` tokens with the highest probability (ties: lower index), from the chunk probabilities.
    pub fn top_tokens(&self, probs: &[f32], k: usize) -> Vec<usize> {
        let mut out = Vec::with_capacity(k);
        // Every chunk holds at least one token: the best k chunks cover k tokens.
        for b in top_k(probs, k.min(probs.len())) {
            let end = ((b + 1) * self.chunk).min(self.covered);
            for j in b * self.chunk..end {
                if out.len() == k {
                    return out;
                }
                out.push(j);
            }
        }
        out
    }
}

/// Stage 2's first two steps for a group's queries (`[g][d]`): the sign of each dimension of the
/// group-summed query, and the `dims` dimensions with the largest mean |q|.
fn query_dims(q: &[f32], d: usize, dims: usize) -> (Vec<bool>, Vec<usize>) {
    let g = q.len() / d;
    let positive: Vec<bool> = (0..d)
        .map(|c| (0..g).map(|r| q[r * d + c]).sum::<f32>() > 0.0)
        .collect();
    let mag: Vec<f32> = (0..d)
        .map(|c| (0..g).map(|r| q[r * d + c].abs()).sum::<f32>() / g as f32)
        .collect();
    (positive, top_k(&mag, dims))
}

/// `z += a·x`, element by element (a product, then a sum: the same bits on every path).
#[inline]
fn add_scaled(z: &mut [f32], x: &[f32], a: f32) {
    #[cfg(target_arch = "x86_64")]
    if crate::kernels::dispatch::has_avx2() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked just above).
        return unsafe { add_scaled_avx2(z, x, a) };
    }
    add_scaled_body(z, x, a)
}

/// [`add_scaled`] compiled for AVX2, eight elements an instruction.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn add_scaled_avx2(z: &mut [f32], x: &[f32], a: f32) {
    add_scaled_body(z, x, a)
}

#[inline(always)]
fn add_scaled_body(z: &mut [f32], x: &[f32], a: f32) {
    for (zb, &k) in z.iter_mut().zip(x) {
        *zb += a * k;
    }
}

/// Stage 2's approximate probability of every token of one KV head's `keys` (`[n][d]`) for its
/// group's queries (`[g][d]`); see [`ChunkSummary::chunk_probs`].
#[cfg(test)]
pub fn approximate_scores(
    q: &[f32],
    keys: &[f32],
    d: usize,
    chunk: usize,
    dims: usize,
) -> Vec<f32> {
    let mut summary = ChunkSummary::new(chunk, d);
    summary.extend(keys);
    let per_chunk = summary.chunk_probs(q, dims);
    (0..keys.len() / d).map(|j| per_chunk[j / chunk]).collect()
}

impl Policy for RocketKv {
    fn fork(&self) -> Option<Box<dyn Policy>> {
        Some(Box::new(self.clone()))
    }

    fn name(&self) -> &str {
        "rocket"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            sparse_attention: true,
            ..Default::default()
        }
    }

    fn reset(&mut self) {
        self.split = None;
        self.summaries.clear();
    }

    fn after_attention(
        &mut self,
        step: &StepInfo<'_>,
        view: &AttentionView<'_>,
        cache: &mut LayerCache,
    ) -> candle_core::Result<()> {
        if !step.is_prefill {
            return Ok(());
        }
        let prompt = step.tokens.len();
        let s_total = prompt + self.max_new;
        let b = self.config.budget.entries(s_total);
        let split = Split::compute(s_total, self.max_new, b, self.head_dim, self.config.split);
        self.split = Some(split);
        let keep = self.stage1_keep(&split);
        let n = cache.len();
        if view.layer < self.config.skip_layers || n <= keep {
            return Ok(());
        }
        // Stage 1, SnapKV++: the last `window` prompt queries over every prompt key.
        let t = view.queries.dim(1)?;
        let w = self.config.window.min(t);
        let window = view.queries.narrow(1, t - w, w)?;
        let on_device = !cache.buffers().0.device().is_cpu();
        let n_cand = n - w;
        let kept: Vec<Vec<usize>> = stage1_scores(&window, cache, n_cand, on_device)?
            .iter()
            .map(|s| {
                let mut top = top_k(&pool(s, self.config.pool), keep - w);
                top.sort_unstable();
                top.extend(n_cand..n);
                top
            })
            .collect();
        cache.gather(&kept)
    }

    fn select_attention(
        &mut self,
        _step: &StepInfo<'_>,
        layer: usize,
        query: &[f32],
        cache: &LayerCache,
    ) -> candle_core::Result<Option<Vec<Vec<usize>>>> {
        let Some(split) = self.split else {
            return Ok(None);
        };
        let n = cache.len();
        if layer < self.config.skip_layers || split.top_k >= n {
            return Ok(None);
        }
        let heads = cache.kv_heads();
        let d = cache.head_dim();
        let g = query.len() / (heads * d);
        let summaries = super::layer_slot(&mut self.summaries, layer);
        if summaries.len() != heads || summaries.iter().any(|s| s.covered > n) {
            *summaries = vec![ChunkSummary::new(split.chunk, d); heads];
        }
        // Stage 2 reads, per head, one bound (max or min) of each kept dimension of every chunk.
        self.last_read = heads * n.div_ceil(split.chunk) * split.dims * 4;
        // Only the keys appended since the last step are read (converted from the cache's type), every
        // head's in one read (on a GPU one copy and one wait a layer, not one a head): the heads'
        // summaries are made and extended together, so they cover the same entries.
        let covered = summaries[0].covered();
        debug_assert!(summaries.iter().all(|s| s.covered() == covered));
        let new_keys = cache.key_rows(0..heads, covered..n)?;
        let per_head = (n - covered) * d;
        let picked = summaries
            .iter_mut()
            .enumerate()
            .map(|(h, summary)| {
                summary.extend(&new_keys[h * per_head..(h + 1) * per_head]);
                let probs = summary.chunk_probs(&query[h * g * d..(h + 1) * g * d], split.dims);
                summary.top_tokens(&probs, split.top_k)
            })
            .collect();
        Ok(Some(picked))
    }

    fn selection_bytes_read(&self) -> usize {
        self.last_read
    }

    fn state_bytes(&self) -> usize {
        self.summaries
            .iter()
            .flatten()
            .map(ChunkSummary::bytes)
            .sum()
    }

    fn entry_limit(&self, layer: usize, seen: usize, prompt_len: usize) -> Option<usize> {
        let split = self.split?;
        let prompt = if layer < self.config.skip_layers {
            prompt_len
        } else {
            prompt_len.min(self.stage1_keep(&split))
        };
        Some(prompt + seen.saturating_sub(prompt_len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Stage 1 scored where the keys are (a GPU's path, here on the CPU's tensors) gives the host's
    /// scores, with GQA groups of two and a causal window.
    #[test]
    fn stage1_scores_on_the_device_are_the_host_s() {
        use candle_core::{Device, Tensor};
        let (heads, g, w, n, d) = (2, 2, 6, 48, 16);
        let keys = Tensor::from_vec(
            crate::policy::tests::random(heads * n * d, 31),
            (heads, n, d),
            &Device::Cpu,
        )
        .unwrap();
        let mut cache = LayerCache::new(heads, d, crate::cache::KvType::F32, &Device::Cpu).unwrap();
        cache.append(&keys, &keys, 0).unwrap();
        let q: Vec<f32> = crate::policy::tests::random(heads * g * w * d, 32)
            .iter()
            .map(|x| 8.0 * x)
            .collect();
        let window = Tensor::from_vec(q, (heads * g, w, d), &Device::Cpu).unwrap();
        let host = stage1_scores(&window, &cache, n - w, false).unwrap();
        let device = stage1_scores(&window, &cache, n - w, true).unwrap();
        assert_eq!(host.len(), heads);
        for (a, b) in host.iter().zip(&device) {
            assert_eq!(a.len(), n - w);
            for (x, y) in a.iter().zip(b) {
                assert!((x - y).abs() < 1e-6, "{x} against {y}");
            }
        }
    }

    #[test]
    fn budget_split_matches_the_worked_examples() {
        // S = 32768, B = 256, d = 128 (spec §3(f)), 128 new tokens.
        let s = Split::compute(32768, 128, 256, 128, RocketSplit::Hf);
        assert_eq!(s.capacity, 1618);
        assert_eq!(s.prompt, 1490);
        assert_eq!((s.top_k, s.chunk, s.dims), (128, 3, 60));
        let s = Split::compute(32768, 128, 256, 128, RocketSplit::GptFast);
        assert_eq!(s.dims, 61);
        let s = Split::compute(32768, 128, 1024, 128, RocketSplit::Hf);
        assert_eq!(
            (s.capacity, s.prompt, s.top_k, s.chunk, s.dims),
            (5792, 5664, 512, 3, 67)
        );
        // The reasoning regime: 2·max_new ≥ S makes C = S and stage 1 keeps the whole prompt.
        let s = Split::compute(200 + 16384, 16384, 256, 128, RocketSplit::Hf);
        assert_eq!(s.capacity, 200 + 16384);
        assert_eq!(s.prompt, 200);
    }

    /// The summaries extended a few keys at a time give, bit for bit, what the bounds computed
    /// directly from the keys give through the formula summed dimension by dimension per chunk (the
    /// layout before the summaries were held per dimension), for the same kept dimensions: every
    /// group size, chunk size (a last chunk short or full) and number of kept dimensions.
    #[test]
    fn chunk_probs_are_the_direct_formula_s_bit_for_bit() {
        let d = 16;
        for (g, chunk, n, dims) in [(1, 1, 7, 16), (2, 3, 50, 5), (6, 2, 64, 9), (4, 5, 33, 1)] {
            let keys = crate::policy::tests::random(n * d, 40 + n as u32);
            let q = crate::policy::tests::random(g * d, 41 + g as u32);
            let mut summary = ChunkSummary::new(chunk, d);
            for part in keys.chunks(3 * d) {
                summary.extend(part);
            }
            let got = summary.chunk_probs(&q, dims);
            // The formula, directly.
            let chunks = n.div_ceil(chunk);
            let bound = |b: usize, c: usize, positive: bool| {
                let rows = (b * chunk..((b + 1) * chunk).min(n)).map(|j| keys[j * d + c]);
                match positive {
                    true => rows.fold(f32::NEG_INFINITY, f32::max),
                    false => rows.fold(f32::INFINITY, f32::min),
                }
            };
            let (positive, kept) = query_dims(&q, d, dims);
            let mut want = vec![0f32; chunks];
            for r in 0..g {
                let qr = &q[r * d..(r + 1) * d];
                let l1_kept: f32 = kept.iter().map(|&c| qr[c].abs()).sum();
                let l1_all: f32 = qr.iter().map(|x| x.abs()).sum();
                let tau = (d as f32 * l1_kept / l1_all).sqrt();
                let z: Vec<f32> = (0..chunks)
                    .map(|b| {
                        kept.iter()
                            .map(|&c| qr[c] * bound(b, c, positive[c]))
                            .sum::<f32>()
                            / tau
                    })
                    .collect();
                let top = z.iter().copied().fold(f32::NEG_INFINITY, f32::max);
                let e: Vec<f32> = z.iter().map(|x| (x - top).exp()).collect();
                let total: f32 = e
                    .iter()
                    .enumerate()
                    .map(|(b, x)| x * (n - b * chunk).min(chunk) as f32)
                    .sum();
                for (m, x) in want.iter_mut().zip(&e) {
                    *m += x / total / g as f32;
                }
            }
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&got),
                bits(&want),
                "g {g}, chunk {chunk}, n {n}, dims {dims}"
            );
        }
    }

    #[test]
    fn approximate_scores_favour_the_matching_chunk() {
        // d = 2, one query head along +x; keys: 4 along −x, then 2 along +x. Chunk 2, both dims.
        let q = [1.0, 0.1];
        let keys = [
            -1.0, 0.0, -1.0, 0.0, -1.0, 0.0, -1.0, 0.0, 1.0, 0.0, 1.0, 0.0,
        ];
        let s = approximate_scores(&q, &keys, 2, 2, 2);
        assert_eq!(s.len(), 6);
        assert!((s.iter().sum::<f32>() - 1.0).abs() < 1e-5);
        assert_eq!(top_k(&s, 2), vec![4, 5]);
        assert_eq!(s[0], s[1], "chunk scores are broadcast to their tokens");
        // Incremental summaries equal a fresh one, and token top-k expands chunks in index order.
        let mut inc = ChunkSummary::new(2, 2);
        inc.extend(&keys[..6]);
        inc.extend(&keys[6..]);
        let probs = inc.chunk_probs(&q, 2);
        assert_eq!(inc.top_tokens(&probs, 3), vec![4, 5, 0]);
        assert_eq!(top_k(&s, 3), vec![4, 5, 0]);
    }
}
