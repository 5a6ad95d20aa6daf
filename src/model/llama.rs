//! The decoder forward pass for the Llama family (Llama 2/3, SmolLM2, DeepSeek-R1-Distill-Llama), Qwen2
//! (q/k/v biases; DeepSeek-R1-Distill-Qwen, Qwen2.5) and Qwen3 (QK-norm), over a cache kvbench owns.
//!
//! candle-transformers keeps its caches private and exposes no attention probabilities, so this file
//! reimplements the forward pass from candle ops. One call processes any mix of sequences: their new
//! tokens are stacked for the projections and MLP (where batching pays), and each sequence attends over
//! its own cache, whose length and contents its own policy decides.

use crate::error::{Error, Result};
use crate::loading::source::WeightSource;
use crate::model::attention;
use crate::model::config::{apply_rope_freq_factors, ModelConfig};
use crate::model::profile::Phase;
use crate::model::state::SeqState;
use crate::model::weights::{Embedding, Linear, RmsNorm, WeightFormat};
use crate::policy::{AttentionView, StepInfo};
use candle_core::{DType, Device, Tensor};
use rayon::prelude::*;

mod accumulated;
mod batched;
mod deferred;
mod dense;

struct Block {
    attn_norm: RmsNorm,
    /// q, k and v projections stacked: `[(heads + 2·kv_heads)·head_dim, hidden]`.
    qkv: Linear,
    wo: Linear,
    q_norm: Option<RmsNorm>,
    k_norm: Option<RmsNorm>,
    ffn_norm: RmsNorm,
    /// gate and up projections stacked: `[2·intermediate, hidden]`.
    gate_up: Linear,
    down: Linear,
}

/// The GGUF tensor of per-pair RoPE frequency factors (llama.cpp's Llama 3.1 scaling).
const ROPE_FREQS: &str = "rope_freqs.weight";

/// The most prompt tokens prefilled in one pass off the CPU by default
/// ([`Transformer::set_prefill_batch_tokens`]): a pass's widest activations (the MLP's gate and up
/// projections) then hold at most about 1.2 GB in f32 at R1-Distill-Qwen-7B's shapes, while a
/// reasoning benchmark's prompts (a few hundred tokens) go a dozen or more a pass.
pub const PREFILL_BATCH_TOKENS: usize = 8192;

/// A loaded decoder: weights and shape. Immutable; all per-sequence state is in [`SeqState`].
pub struct Transformer {
    pub config: ModelConfig,
    embed: Embedding,
    blocks: Vec<Block>,
    norm: RmsNorm,
    lm_head: Linear,
    inv_freq: Vec<f32>,
    device: Device,
    weight_bytes: usize,
    /// Attention through candle's operations even on the CPU: the path other devices take, so that
    /// tests can check it against the CPU's own loop without a GPU.
    generic_attention: bool,
    /// A decoding batch attends through its pooled caches in one set of operations (off: one
    /// sequence at a time, the reference the pooled path is checked against).
    batched_attention: bool,
    /// A pooled batch's compressions are done together on the device: the observation-window
    /// policies' scores (`batched::batch_scores`) and every policy's gathers
    /// (`cache::pool::defer_gathers`). By default where the caches are not on the CPU (whose
    /// policies score on the host); on for the CPU too in tests of the path a GPU takes.
    batch_compressions: bool,
    /// The most bytes of f32 scores one KV head's chunk of a prefill holds (`dense`).
    prefill_score_bytes: usize,
    /// The most prompt tokens [`crate::generate`] prefills in one pass of several sequences; 0: one
    /// sequence a pass ([`Self::set_prefill_batch_tokens`]).
    prefill_batch_tokens: usize,
    /// How each sequence's cache stores keys and values.
    kv_type: crate::cache::KvType,
    /// The pooled path's scatter index and padding mask, kept from layer to layer of a step.
    pool_inputs: std::sync::Mutex<Option<batched::PoolInputs>>,
    /// An accumulating batch's index tensors, likewise ([`accumulated`]).
    accumulate_inputs: std::sync::Mutex<Option<accumulated::Inputs>>,
    /// The activations' type between operations: f32, or (off the CPU's own loop) the float
    /// weights' 16-bit type, as GPU engines keep them ([`Activations`]).
    activations: DType,
    /// The decoding steps' phase clock (`kvbench perf --profile`), off unless turned on.
    profiler: super::profile::Profiler,
}

/// The type activations are kept in between the forward pass's operations.
#[derive(
    Debug,
    Clone,
    Copy,
    PartialEq,
    Eq,
    Default,
    clap::ValueEnum,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Activations {
    /// f32 throughout, each 16-bit matrix's product converting its input and output (exact reference
    /// arithmetic; kvbench's default).
    #[default]
    F32,
    /// The float matrices' own type (bf16 or f16, as a checkpoint comes), as transformers and other
    /// GPU engines keep them: no conversion around each product, attention scores and softmax in f32.
    /// f32 when any matrix is quantized. Off the CPU's own decoding loop only.
    Weights,
}

impl std::fmt::Display for Activations {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Activations::F32 => "f32",
            Activations::Weights => "weights",
        })
    }
}

/// One sequence's part of a forward call.
pub struct SeqInput<'a> {
    pub tokens: &'a [u32],
    pub state: &'a mut SeqState,
}

impl Transformer {
    /// Builds the model from an opened weight source.
    pub fn load(
        source: &mut WeightSource,
        config: ModelConfig,
        format: WeightFormat,
        device: &Device,
    ) -> Result<Self> {
        // Several projections of the same input, stacked into one layer (one product instead of several).
        let stacked = |src: &mut WeightSource, names: &[&str], bias: bool| -> Result<Linear> {
            let mut ws = Vec::with_capacity(names.len());
            let mut bs = Vec::new();
            for name in names {
                ws.push(src.get(&format!("{name}.weight"), device)?);
                if bias {
                    bs.push(src.get(&format!("{name}.bias"), device)?.to_dense(device)?);
                }
            }
            let b = if bias {
                Some(Tensor::cat(&bs, 0)?)
            } else {
                None
            };
            Ok(Linear::new(ws, b, format, device)?)
        };
        let linear = |src: &mut WeightSource, name: &str, bias: bool| stacked(src, &[name], bias);
        let norm = |src: &mut WeightSource, name: &str| -> Result<RmsNorm> {
            Ok(RmsNorm::new(
                src.get(name, device)?.to_dense(device)?,
                config.rms_norm_eps,
            )?)
        };
        let mut blocks = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let p = format!("blk.{i}");
            blocks.push(Block {
                attn_norm: norm(source, &format!("{p}.attn_norm.weight"))?,
                qkv: stacked(
                    source,
                    &[
                        &format!("{p}.attn_q"),
                        &format!("{p}.attn_k"),
                        &format!("{p}.attn_v"),
                    ],
                    config.qkv_bias,
                )?,
                wo: linear(source, &format!("{p}.attn_output"), false)?,
                q_norm: if config.qk_norm {
                    Some(norm(source, &format!("{p}.attn_q_norm.weight"))?)
                } else {
                    None
                },
                k_norm: if config.qk_norm {
                    Some(norm(source, &format!("{p}.attn_k_norm.weight"))?)
                } else {
                    None
                },
                ffn_norm: norm(source, &format!("{p}.ffn_norm.weight"))?,
                gate_up: stacked(
                    source,
                    &[&format!("{p}.ffn_gate"), &format!("{p}.ffn_up")],
                    false,
                )?,
                down: linear(source, &format!("{p}.ffn_down"), false)?,
            });
        }
        let embed = Embedding::new(source.get("token_embd.weight", device)?, format, device)?;
        let tied = config.tie_word_embeddings || !source.contains("output.weight");
        let lm_head = match (tied, embed.matrix()) {
            // One copy of the tied matrix serves the lookup and the output head.
            (true, Some(m)) => Linear::shared(m)?,
            (true, None) => linear(source, "token_embd", false)?,
            (false, _) => linear(source, "output", false)?,
        };
        let norm = norm(source, "output_norm.weight")?;
        let weight_bytes = blocks
            .iter()
            .flat_map(|b| [&b.qkv, &b.wo, &b.gate_up, &b.down])
            .map(Linear::weight_bytes)
            .sum::<usize>()
            + if tied && embed.matrix().is_some() {
                0
            } else {
                lm_head.weight_bytes()
            }
            + embed.bytes();
        let mut inv_freq = config.rope_inv_freq();
        if source.is_gguf() && source.contains(ROPE_FREQS) {
            let factors = source
                .get(ROPE_FREQS, device)?
                .to_dense(device)?
                .flatten_all()?
                .to_vec1::<f32>()?;
            let refuse = |e: String| Error::model(source.path(), e);
            if config.rope_scaling.is_some() {
                return Err(refuse(format!(
                    "{ROPE_FREQS} and Llama 3 scaling in the metadata would both scale RoPE"
                )));
            }
            apply_rope_freq_factors(&mut inv_freq, &factors).map_err(refuse)?;
        }
        Ok(Self {
            config,
            embed,
            blocks,
            norm,
            lm_head,
            inv_freq,
            device: device.clone(),
            weight_bytes,
            generic_attention: false,
            batched_attention: true,
            // `KVBENCH_COMPRESS_EACH=1`: each policy scores and gathers on its own, as before, to
            // measure the difference on a GPU (the check does).
            batch_compressions: !device.is_cpu() && !crate::switches::COMPRESS_EACH.is_on(),
            prefill_score_bytes: dense::PREFILL_SCORE_BYTES,
            // `KVBENCH_PREFILL_EACH=1`: one sequence a pass, as before, to measure the difference
            // on a GPU.
            prefill_batch_tokens: match device.is_cpu() || crate::switches::PREFILL_EACH.is_on() {
                true => 0,
                false => PREFILL_BATCH_TOKENS,
            },
            kv_type: crate::cache::KvType::F32,
            pool_inputs: std::sync::Mutex::new(None),
            accumulate_inputs: std::sync::Mutex::new(None),
            activations: DType::F32,
            profiler: Default::default(),
        })
    }

    /// Keeps activations in f32 or in the float weights' type ([`Activations`]); returns the type
    /// chosen. The norms' weights and the projections' biases are converted to it once, here.
    pub fn set_activations(&mut self, activations: Activations) -> Result<DType> {
        let dtype = match activations {
            Activations::F32 => DType::F32,
            Activations::Weights => {
                let linears = self
                    .blocks
                    .iter()
                    .flat_map(|b| [&b.qkv, &b.wo, &b.gate_up, &b.down])
                    .chain([&self.lm_head]);
                let types: Vec<Option<DType>> = linears.map(Linear::float_dtype).collect();
                match types[0] {
                    Some(t @ (DType::BF16 | DType::F16)) if types.iter().all(|&x| x == Some(t)) => {
                        t
                    }
                    _ => DType::F32,
                }
            }
        };
        for b in &mut self.blocks {
            for n in [&mut b.attn_norm, &mut b.ffn_norm]
                .into_iter()
                .chain(b.q_norm.as_mut())
                .chain(b.k_norm.as_mut())
            {
                n.set_dtype(dtype)?;
            }
            for l in [&mut b.qkv, &mut b.wo, &mut b.gate_up, &mut b.down] {
                l.set_bias_dtype(dtype)?;
            }
        }
        self.norm.set_dtype(dtype)?;
        self.lm_head.set_bias_dtype(dtype)?;
        self.activations = dtype;
        Ok(dtype)
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The decoding steps' phase clock: [`super::profile::Profiler::set`] turns it on.
    pub fn profiler(&self) -> &super::profile::Profiler {
        &self.profiler
    }

    /// The activations' type chosen by [`set_activations`](Self::set_activations).
    pub fn activation_dtype(&self) -> DType {
        self.activations
    }

    /// How every new sequence's cache stores keys and values (f32 unless set).
    pub fn set_kv_type(&mut self, kv_type: crate::cache::KvType) {
        self.kv_type = kv_type;
    }

    /// How the cache stores keys and values.
    pub fn kv_type(&self) -> crate::cache::KvType {
        self.kv_type
    }

    /// Runs attention through candle's operations on every device, as a GPU does (the CPU's own
    /// decoding loop otherwise): for checking the device path's semantics on a machine without one.
    pub fn set_generic_attention(&mut self, on: bool) {
        self.generic_attention = on;
    }

    /// The most bytes of f32 attention scores one KV head's chunk of a prefill's tokens holds (256
    /// MiB by default): a prompt whose scores pass it is attended in chunks of tokens, each over the
    /// entries it sees. Smaller, for tests of the chunks or a tighter memory bound.
    pub fn set_prefill_score_bytes(&mut self, bytes: usize) {
        self.prefill_score_bytes = bytes.max(1);
    }

    /// The most prompt tokens prefilled in one pass of several sequences (a prompt longer than that
    /// goes alone); 0 or 1: one sequence a pass. Off the CPU [`PREFILL_BATCH_TOKENS`] by default: each
    /// pass reads every weight and launches every operation once, and a short prompt alone fills
    /// little of a GPU. On the CPU 0: its products cost the same per token either way, and each
    /// sequence's time to first token stays its own prefill's.
    pub fn set_prefill_batch_tokens(&mut self, tokens: usize) {
        self.prefill_batch_tokens = tokens;
    }

    /// See [`Self::set_prefill_batch_tokens`].
    pub fn prefill_batch_tokens(&self) -> usize {
        self.prefill_batch_tokens
    }

    /// Whether a decoding batch off the CPU loop attends for all its sequences at once, through
    /// caches pooled per layer (the default), or one sequence at a time.
    pub fn set_batched_attention(&mut self, on: bool) {
        self.batched_attention = on;
    }

    /// Whether a pooled batch's compressions are scored and gathered together with the device's
    /// operations (as on a GPU) rather than by each policy on its own.
    pub fn set_batch_compressions(&mut self, on: bool) {
        self.batch_compressions = on;
    }

    /// Whether a decoding step's logits are chosen from where they are computed
    /// ([`crate::generate::device_greedy`]) rather than copied to the host first: off the CPU's own
    /// loop (on a GPU, or the path it takes run on the CPU), unless `KVBENCH_HOST_LOGITS=1` (to compare
    /// the two in one call).
    pub fn greedy_on_device(&self) -> bool {
        !self.cpu_loop() && !crate::switches::HOST_LOGITS.is_on()
    }

    /// Whether this model attends with the CPU's own loop (which reads f32 activations).
    fn cpu_loop(&self) -> bool {
        self.device.is_cpu() && !self.generic_attention && self.activations == DType::F32
    }

    /// The rotary frequencies in use, one per pair of a head's dimensions, after any scaling.
    pub fn rope_inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    /// Bytes of weights one forward step reads (the matrices; embedding rows looked up are
    /// negligible): what memory bandwidth a decode step needs besides the cache.
    pub fn weight_bytes_read(&self, _rows: usize) -> usize {
        self.blocks
            .iter()
            .flat_map(|b| [&b.qkv, &b.wo, &b.gate_up, &b.down])
            .map(Linear::weight_bytes)
            .sum::<usize>()
            + self.lm_head.weight_bytes()
    }

    /// Bytes of weight memory held.
    pub fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    /// New per-sequence state for this model, its cache in the model's storage type.
    pub fn new_state(&self, policy: Box<dyn crate::policy::Policy>) -> Result<SeqState> {
        self.new_state_with(policy, self.kv_type)
    }

    /// New per-sequence state whose cache stores keys and values as `kv_type` (fidelity's reference
    /// is always the exact f32 cache).
    pub fn new_state_with(
        &self,
        policy: Box<dyn crate::policy::Policy>,
        kv_type: crate::cache::KvType,
    ) -> Result<SeqState> {
        Ok(SeqState::new(&self.config, policy, kv_type, &self.device)?)
    }

    /// cos/sin tables `[n, head_dim/2]` for the given logical positions, as plain vectors.
    fn rope_table_vecs(&self, positions: &[usize]) -> (Vec<f32>, Vec<f32>) {
        let half = self.inv_freq.len();
        let mut cos = Vec::with_capacity(positions.len() * half);
        let mut sin = Vec::with_capacity(positions.len() * half);
        for &p in positions {
            for &f in &self.inv_freq {
                let angle = p as f32 * f;
                cos.push(angle.cos());
                sin.push(angle.sin());
            }
        }
        (cos, sin)
    }

    fn rope(&self, x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
        if self.config.rope_interleaved {
            candle_nn::rotary_emb::rope_i(x, cos, sin)
        } else {
            candle_nn::rotary_emb::rope(x, cos, sin)
        }
    }

    /// Runs one forward pass over every sequence's new tokens and returns the logits of each
    /// sequence's last new token, `[batch, vocab]`. Each sequence's cache grows by its tokens and its
    /// policy runs after every layer's attention.
    pub fn forward(&self, batch: &mut [SeqInput<'_>]) -> Result<Tensor> {
        self.forward_inner(batch, false)
    }

    /// Like [`forward`](Self::forward) but returns the logits of every new token, `[total_tokens, vocab]`
    /// (teacher forcing).
    pub fn forward_all_logits(&self, batch: &mut [SeqInput<'_>]) -> Result<Tensor> {
        self.forward_inner(batch, true)
    }

    /// Runs the pass on a thread of the compute pool. Called from outside the pool, every parallel
    /// product would hand its work to the pool and put the caller to sleep until it is done: two
    /// thread wake-ups per product, about five products per layer. From inside, the caller takes part
    /// in each product and the pool's other threads are still looking for work between them.
    fn forward_inner(&self, batch: &mut [SeqInput<'_>], all_logits: bool) -> Result<Tensor> {
        if rayon::current_thread_index().is_none() && self.device.is_cpu() {
            // A decoding step (one new token per sequence) is many short products: the pool's
            // threads spin between them instead of sleeping (see `crate::parallel`).
            let decoding = batch
                .iter()
                .all(|s| s.tokens.len() == 1 && s.state.seen > 0);
            return rayon::scope(|_| {
                crate::parallel::with_team(decoding, || self.forward_on_pool(batch, all_logits))
            });
        }
        self.forward_on_pool(batch, all_logits)
    }

    /// Runs `f` as phase `p` of a decoding step, timed when `recording` ([`super::profile`]).
    fn phase<R, E: From<candle_core::Error>>(
        &self,
        recording: bool,
        p: Phase,
        f: impl FnOnce() -> std::result::Result<R, E>,
    ) -> std::result::Result<R, E> {
        super::profile::timed(&self.profiler, &self.device, recording, p, f)
    }

    fn forward_on_pool(&self, batch: &mut [SeqInput<'_>], all_logits: bool) -> Result<Tensor> {
        let cfg = &self.config;
        let (hq, hkv, d) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);

        // 1. Gather token ids and logical positions of every new token.
        let mut ids = Vec::new();
        let mut positions = Vec::new();
        let mut spans = Vec::with_capacity(batch.len());
        let mut steps = Vec::with_capacity(batch.len());
        for s in batch.iter_mut() {
            if s.tokens.is_empty() {
                return Err(candle_core::Error::Msg(
                    "forward: a sequence was given no tokens".into(),
                )
                .into());
            }
            let st = &mut s.state;
            let is_prefill = st.seen == 0;
            if is_prefill {
                st.prompt_len = s.tokens.len();
            } else {
                st.generated += s.tokens.len();
            }
            steps.push(StepInfo {
                seen_before: st.seen,
                tokens: s.tokens,
                generated: st.generated,
                prompt_len: st.prompt_len,
                is_prefill,
            });
            spans.push((ids.len(), s.tokens.len()));
            positions.extend(st.seen..st.seen + s.tokens.len());
            ids.extend_from_slice(s.tokens);
        }
        let n_tok = ids.len();
        cfg.check_pass_elements(n_tok, all_logits)
            .map_err(|e| Error::Input(format!("forward: {e}")))?;
        // A decoding step's phases are timed when profiling is on (`kvbench perf --profile`).
        let recording =
            self.profiler.is_on() && steps.iter().all(|s| !s.is_prefill && s.tokens.len() == 1);
        let (cos_v, sin_v) = self.rope_table_vecs(&positions);
        let half = d / 2;
        let act = self.activations;
        let mut x = self.phase(recording, Phase::Embed, || {
            self.embed.lookup(&ids, &self.device, act)
        })?;
        // Decoding on the CPU takes a path with fewer, larger steps (see `decode_attention_cpu`); the
        // generic path needs the tables as tensors.
        let decode_cpu = self.cpu_loop() && !cfg.qk_norm && spans.iter().all(|&(_, t)| t == 1);
        let batched = !decode_cpu && self.can_batch_attention(batch);
        let tables = match decode_cpu {
            true => None,
            false => Some(self.phase(recording, Phase::Rope, || {
                candle_core::Result::Ok((
                    Tensor::from_slice(&cos_v, (n_tok, half), &self.device)?.to_dtype(act)?,
                    Tensor::from_slice(&sin_v, (n_tok, half), &self.device)?.to_dtype(act)?,
                ))
            })?),
        };

        // Policies' calls left for the end of a decoding step (`deferred`).
        let mut deferred = Vec::new();
        for (l, block) in self.blocks.iter().enumerate() {
            // 2. Project queries, keys and values for all new tokens at once.
            let h = self.phase(recording, Phase::Norms, || block.attn_norm.forward(&x))?;
            let qkv = self.phase(recording, Phase::Qkv, || block.qkv.forward(&h))?;
            let attn = if decode_cpu {
                self.phase(recording, Phase::Attention, || {
                    self.decode_attention_cpu(l, &qkv, &cos_v, &sin_v, batch, &steps)
                })?
            } else {
                // 3. Rotate at logical positions. Every head's rows at once, `[q heads + 2·kv heads,
                //    tokens, d]`: one copy (none for a single token), then views. Queries and keys
                //    are rotated in one operation where no norm comes between them; splitting q, k
                //    and v into their own tensors first took five copies and two rotations a layer.
                let (cos, sin) = tables
                    .as_ref()
                    .expect("rope tables are built for the generic path");
                let rotated = |x: &Tensor| -> candle_core::Result<Tensor> {
                    self.rope(&x.unsqueeze(0)?, cos, sin)?.squeeze(0)
                };
                let (q, k, v) =
                    self.phase(recording, Phase::Rope, || -> candle_core::Result<_> {
                        let heads = hq + 2 * hkv;
                        let all = qkv
                            .reshape((n_tok, heads, d))?
                            .transpose(0, 1)?
                            .contiguous()?;
                        let v = all.narrow(0, hq + hkv, hkv)?;
                        let (q, k) = match (&block.q_norm, &block.k_norm) {
                            (Some(qn), Some(kn)) => (
                                rotated(&qn.forward(&all.narrow(0, 0, hq)?)?)?,
                                rotated(&kn.forward(&all.narrow(0, hq, hkv)?)?)?,
                            ),
                            _ => {
                                let qk = rotated(&all.narrow(0, 0, hq + hkv)?)?;
                                (qk.narrow(0, 0, hq)?, qk.narrow(0, hq, hkv)?)
                            }
                        };
                        Ok((q, k, v))
                    })?;

                // 4. A decoding batch attends at once through its pooled caches; otherwise per
                //    sequence (in parallel across a batch): cache, attend over its own cache, let its
                //    policy act.
                self.phase(recording, Phase::Attention, || match batched {
                    true => self.attend_batch(l, &q, &k, &v, batch, &steps, &mut deferred),
                    false => {
                        self.attend_each(l, (&q, &k, &v), batch, &spans, &steps, &mut deferred)
                    }
                })?
            };

            // 5. Output projection and MLP over all tokens.
            x = self.phase(recording, Phase::Output, || {
                x.add(&block.wo.forward(&attn)?)
            })?;
            let h = self.phase(recording, Phase::Norms, || block.ffn_norm.forward(&x))?;
            let gate_up = self.phase(recording, Phase::GateUp, || block.gate_up.forward(&h))?;
            let ffn = cfg.intermediate_size;
            let act = self.phase(recording, Phase::Swiglu, || {
                super::ops::swiglu(&gate_up, ffn)
            })?;
            x = self.phase(recording, Phase::Down, || x.add(&block.down.forward(&act)?))?;
        }

        // 6. The policies' deferred calls, bookkeeping (and the budget check), final norm and logits
        //    (of each sequence's last token unless all are wanted).
        if !deferred.is_empty() {
            self.phase(recording, Phase::Attention, || {
                self.run_deferred(batch, &steps, deferred)
            })?;
        }
        for (s, &(_, t)) in batch.iter_mut().zip(&spans) {
            s.state.seen += t;
            s.state.cache.end_step(s.state.seen);
            s.state.check_entry_limits()?;
        }
        let logits = self.phase(recording, Phase::Head, || -> Result<Tensor> {
            let x = if all_logits {
                x
            } else {
                let last: Vec<u32> = spans.iter().map(|&(off, t)| (off + t - 1) as u32).collect();
                let n = last.len();
                x.index_select(&Tensor::from_vec(last, n, &self.device)?, 0)?
            };
            let x = self.norm.forward(&x)?;
            Ok(self
                .lm_head
                .forward(&x)?
                .to_dtype(DType::F32)?
                .contiguous()?)
        })?;
        if recording {
            self.profiler.count_step();
        }
        Ok(logits)
    }
}

impl Transformer {
    /// Layer `l`'s attention one sequence at a time (in parallel across a batch): each appends its
    /// new keys and values, attends over its own cache and lets its policy act
    /// ([`Self::attend_sequence`]). `q`, `k`, `v` are every new token's, `[heads, tokens, d]`;
    /// `spans` each sequence's `(first token, tokens)`. Returns `[tokens, heads·d]`; policies whose
    /// calls wait for the end of the step are added to `deferred`.
    fn attend_each(
        &self,
        l: usize,
        (q, k, v): (&Tensor, &Tensor, &Tensor),
        batch: &mut [SeqInput<'_>],
        spans: &[(usize, usize)],
        steps: &[StepInfo],
        deferred: &mut Vec<deferred::Deferred>,
    ) -> candle_core::Result<Tensor> {
        let cfg = &self.config;
        let d = cfg.head_dim;
        let n_tok = q.dim(1)?;
        // Every new token's query on the host, once for the layer, where a decoding sequence needs
        // its own there (the CPU's loop, a sparse-attention policy): off the CPU one copy and one
        // wait for the device, not one per sequence.
        let host_query = |s: &SeqInput<'_>, t: usize| {
            t == 1 && (self.cpu_loop() || s.state.caps.sparse_attention)
        };
        // Likewise the new keys, off the CPU's loop, where a sparse-attention policy reads them
        // (RocketKV's chunk summaries): one copy for the layer instead of one per sequence, each
        // sequence's then kept by its cache (`LayerCache::keep_host_keys`).
        let host_keys = |s: &SeqInput<'_>, t: usize| {
            t == 1 && !self.cpu_loop() && s.state.caps.sparse_attention
        };
        let to_host = |x: &Tensor, wanted: &dyn Fn(&SeqInput<'_>, usize) -> bool| match batch
            .iter()
            .zip(spans)
            .any(|(s, &(_, t))| wanted(s, t))
        {
            true => Ok(Some(crate::host_copy::flat_f32(x)?)),
            false => candle_core::Result::Ok(None),
        };
        let (q_host, k_host) = (to_host(q, &host_query)?, to_host(k, &host_keys)?);
        let work = |((s, &(off, t)), step): ((&mut SeqInput<'_>, &(usize, usize)), &StepInfo)| {
            // This sequence's rows, `[heads][t][d]`, of a layer's `[heads, n_tok, d]` on the host:
            // its query, and its new keys.
            let own = |all: &[f32]| -> Vec<f32> {
                let heads = all.len() / (n_tok * d);
                (0..heads)
                    .flat_map(|h| &all[(h * n_tok + off) * d..][..t * d])
                    .copied()
                    .collect()
            };
            let q_vec = q_host.as_deref().filter(|_| host_query(s, t)).map(own);
            let k_vec = k_host.as_deref().filter(|_| host_keys(s, t)).map(own);
            self.attend_sequence(l, (q, q_vec, k_vec), k, v, off, t, step, &mut *s.state)
        };
        // A single sequence runs on this thread: handing it to the pool costs a wake-up per layer. So
        // do the sequences of a prefill pass off the CPU: each one's attention holds up to 256 MiB of
        // scores (and copies of them) on the device, alive for every thread at once in parallel,
        // while the device runs their work one after another anyway.
        let parallel =
            batch.len() > 1 && (self.device.is_cpu() || spans.iter().all(|&(_, t)| t == 1));
        let done: Vec<(Tensor, Option<(Tensor, Tensor)>)> = if parallel {
            batch
                .par_iter_mut()
                .zip(spans.par_iter())
                .zip(steps.par_iter())
                .map(work)
                .collect::<candle_core::Result<_>>()?
        } else {
            batch
                .iter_mut()
                .zip(spans.iter())
                .zip(steps.iter())
                .map(work)
                .collect::<candle_core::Result<_>>()?
        };
        let (mut outs, waiting): (Vec<Tensor>, Vec<_>) = done.into_iter().unzip();
        if waiting.iter().any(Option::is_some) {
            deferred.push(deferred::Deferred {
                l,
                probs: deferred::DeferredProbs::Each(waiting),
                window_extended: false,
            });
        }
        if outs.len() == 1 {
            Ok(outs.pop().expect("one output"))
        } else {
            Tensor::cat(&outs, 0)
        }
    }

    /// One sequence's part of layer `l`: append its new keys and values, attend over its cache, update
    /// its query window, run its policy. `q` is every new token's query, `[heads, tokens, d]`, with
    /// this sequence's own on the host (`[heads · d]`) where it decodes on the CPU's loop or under a
    /// sparse-attention policy, and its new keys there (`[kv_heads][t][d]`) where that policy reads
    /// them off the CPU's loop. Returns the attention output `[t, heads·d]`, and this sequence's query
    /// and probabilities when its policy's call waits for the end of the step
    /// ([`Self::defers_policy`]).
    #[allow(clippy::too_many_arguments)]
    fn attend_sequence(
        &self,
        l: usize,
        (q, q_vec, k_vec): (&Tensor, Option<Vec<f32>>, Option<Vec<f32>>),
        k: &Tensor,
        v: &Tensor,
        off: usize,
        t: usize,
        step: &StepInfo,
        st: &mut SeqState,
    ) -> candle_core::Result<(Tensor, Option<(Tensor, Tensor)>)> {
        let cfg = &self.config;
        let (hq, hkv, d) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let g = hq / hkv;
        let scale = 1.0 / (d as f64).sqrt();
        let q_s = q.narrow(1, off, t)?.contiguous()?; // [hq, t, d]
        let (k_s, v_s) = (k.narrow(1, off, t)?, v.narrow(1, off, t)?);
        // Per-query-head storage: each KV head's entries are stored once per query head of its group.
        let cache_heads = st.cache.layer(l).kv_heads();
        let (k_s, v_s) = if cache_heads == hkv {
            (k_s, v_s)
        } else {
            let rep = |x: Tensor| -> candle_core::Result<Tensor> {
                x.unsqueeze(1)?
                    .broadcast_as((hkv, g, t, d))?
                    .contiguous()?
                    .reshape((hq, t, d))
            };
            (rep(k_s)?, rep(v_s)?)
        };
        let (hkv, g) = (cache_heads, hq / cache_heads);
        st.cache.layer_mut(l).append(&k_s, &v_s, step.seen_before)?;
        if let (Some(keys), true) = (k_vec, cache_heads == cfg.num_kv_heads) {
            st.cache.layer_mut(l).keep_host_keys(keys)?;
        }
        let want_probs = st.caps.attention_probs;
        // `q_vec`: the query on the host, given only for the CPU loop or a sparse-attention policy.
        let subset = match &q_vec {
            Some(q) if st.caps.sparse_attention => st.select_attention(step, l, q)?,
            _ => None,
        };
        if t == 1 && !step.is_prefill {
            st.count_decode_read(l, subset.as_deref());
        }
        let layer = st.cache.layer(l);
        let n = layer.len();
        // Decoding on the CPU reads the cache in place; everything else goes through candle ops.
        let fast = match &q_vec {
            Some(q) if self.cpu_loop() => {
                attention::attend_one(layer, q, g, scale as f32, want_probs, subset.as_deref())
            }
            _ => None,
        };
        let (out, probs4) = match fast {
            Some(a) => {
                let probs = match a.probs {
                    Some(p) => Some(attention::probs_tensor(p, hkv, g, n, &self.device)?),
                    None => None,
                };
                (Tensor::from_vec(a.out, (1, hq * d), &self.device)?, probs)
            }
            None => {
                let (keys, values) = match &subset {
                    None => (layer.keys()?, layer.values()?),
                    Some(sub) => attention::gather_heads(layer, sub)?,
                };
                // The cache is read in the queries' type (a no-op when they agree: an f32 cache
                // under f32 activations, a bf16 one under bf16).
                let (keys, values) = (keys.to_dtype(q_s.dtype())?, values.to_dtype(q_s.dtype())?);
                let q3 = q_s.reshape((hkv, g * t, d))?;
                let kept = match (want_probs && subset.is_none(), st.caps.group_sum_probs) {
                    (false, _) => dense::KeptProbs::None,
                    (true, false) => dense::KeptProbs::Each,
                    (true, true) => dense::KeptProbs::GroupSum,
                };
                let (y, probs) = self.attend_dense(&q3, &keys, &values, (g, t), kept)?;
                let out = y
                    .reshape((hq, t, d))?
                    .transpose(0, 1)?
                    .reshape((t, hq * d))?;
                (out, probs)
            }
        };

        match probs4 {
            Some(p) if self.defers_policy(true, step, t) => Ok((out, Some((q_s, p)))),
            probs4 => {
                let handed = probs4.as_ref().map_or(Handed::Nothing, Handed::Probs);
                self.finish_layer(l, step, st, &q_s, handed, false)?;
                Ok((out, None))
            }
        }
    }

    /// The end of a sequence's layer step: update its query window (unless `window_extended`: the
    /// batch's windows were extended at once) and run its policy with what it is `handed`.
    fn finish_layer(
        &self,
        l: usize,
        step: &StepInfo,
        st: &mut SeqState,
        q_s: &Tensor,
        handed: Handed<'_>,
        window_extended: bool,
    ) -> candle_core::Result<()> {
        let (probs, scores, accumulated) = match handed {
            Handed::Nothing => (None, None, None),
            Handed::Probs(p) => (Some(p), None, None),
            Handed::Scores(s) => (None, Some(s), None),
            Handed::Accumulated(e) => (None, None, Some(e)),
        };
        let w = st.caps.query_window;
        if w > 0 && !window_extended {
            st.window_batches[l] = None;
            // The window's last `w − t` queries and the `t` new ones: one copy (joining, then
            // cutting, copied the window twice).
            let t = q_s.dim(1)?;
            let old = st.query_windows[l].take();
            let keep = match &old {
                Some(old) if t < w => old.dim(1)?.min(w - t),
                _ => 0,
            };
            st.query_windows[l] = Some(match old {
                Some(old) if keep > 0 => {
                    let n = old.dim(1)?;
                    Tensor::cat(&[&old.narrow(1, n - keep, keep)?, q_s], 1)?
                }
                _ if t > w => q_s.narrow(1, t - w, w)?.contiguous()?,
                _ => q_s.clone(),
            });
        }
        // Probabilities left on a GPU are copied to the host by the policy, which waits for the
        // device's queued work (this layer's computation): waited for here, so that the policy's time
        // is its own (the copy and its decision). No extra wait: the copy would make it.
        if probs.is_some_and(|p| !p.device().is_cpu()) {
            self.device.synchronize()?;
        }
        let started = std::time::Instant::now();
        let view = AttentionView {
            layer: l,
            queries: q_s,
            query_window: st.query_windows[l].as_ref(),
            probs,
            scores,
            accumulated,
        };
        let events_before = st.cache.layer(l).compressions();
        st.policy
            .after_attention(step, &view, st.cache.layer_mut(l))?;
        st.policy_time += started.elapsed();
        if st.trace.is_some() && st.cache.layer(l).compressions() != events_before {
            st.record_event(step, l);
        }
        Ok(())
    }

    /// Layer `l`'s attention for a decoding batch on the CPU (one new token per sequence), from the
    /// stacked q/k/v rows: RoPE is applied in place on plain vectors, each sequence appends and attends
    /// over its cache in parallel, and one `[batch, heads·d]` tensor comes back. Through candle ops the
    /// same work is about a dozen small tensor operations per sequence and layer, whose fixed costs
    /// dominated batch-1 decoding.
    fn decode_attention_cpu(
        &self,
        l: usize,
        qkv: &Tensor,
        cos: &[f32],
        sin: &[f32],
        batch: &mut [SeqInput<'_>],
        steps: &[StepInfo],
    ) -> candle_core::Result<Tensor> {
        let cfg = &self.config;
        let (hq, hkv, d) = (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim);
        let (g, half, width) = (hq / hkv, d / 2, (hq + 2 * hkv) * d);
        let scale = 1.0 / (d as f32).sqrt();
        let mut rows = qkv.flatten_all()?.to_vec1::<f32>()?;
        let interleaved = cfg.rope_interleaved;
        let dev = &self.device;
        let work =
            |(((row, s), step), b): (((&mut [f32], &mut SeqInput<'_>), &StepInfo), usize)| {
                let st = &mut *s.state;
                let (q, kv) = row.split_at_mut(hq * d);
                let (k, v) = kv.split_at_mut(hkv * d);
                let (c, sn) = (
                    &cos[b * half..(b + 1) * half],
                    &sin[b * half..(b + 1) * half],
                );
                rotate(q, d, c, sn, interleaved);
                rotate(k, d, c, sn, interleaved);
                // Per-query-head storage repeats each KV head for the query heads of its group.
                let heads = st.cache.layer(l).kv_heads();
                let (k_t, v_t) = if heads == hkv {
                    (
                        Tensor::from_slice(k, (hkv, 1, d), dev)?,
                        Tensor::from_slice(v, (hkv, 1, d), dev)?,
                    )
                } else {
                    let rep = |x: &[f32]| -> Vec<f32> {
                        (0..hq)
                            .flat_map(|r| x[(r / g) * d..(r / g + 1) * d].iter().copied())
                            .collect()
                    };
                    (
                        Tensor::from_vec(rep(k), (hq, 1, d), dev)?,
                        Tensor::from_vec(rep(v), (hq, 1, d), dev)?,
                    )
                };
                st.cache.layer_mut(l).append(&k_t, &v_t, step.seen_before)?;
                let subset = if st.caps.sparse_attention {
                    st.select_attention(step, l, q)?
                } else {
                    None
                };
                st.count_decode_read(l, subset.as_deref());
                let layer = st.cache.layer(l);
                let n = layer.len();
                let gc = hq / heads;
                let a = attention::attend_one(
                    layer,
                    q,
                    gc,
                    scale,
                    st.caps.attention_probs,
                    subset.as_deref(),
                )
                .ok_or_else(|| {
                    candle_core::Error::Msg("decode fast path needs an f32 CPU cache".into())
                })?;
                let probs = match a.probs {
                    Some(p) => Some(attention::probs_tensor(p, heads, gc, n, dev)?),
                    None => None,
                };
                let q_s = Tensor::from_slice(q, (hq, 1, d), dev)?;
                let handed = probs.as_ref().map_or(Handed::Nothing, Handed::Probs);
                self.finish_layer(l, step, st, &q_s, handed, false)?;
                Ok(a.out)
            };
        // As in the generic path, a single sequence stays on this thread.
        let outs: Vec<Vec<f32>> = if batch.len() > 1 {
            rows.par_chunks_mut(width)
                .zip(batch.par_iter_mut())
                .zip(steps.par_iter())
                .zip((0..steps.len()).into_par_iter())
                .map(work)
                .collect::<candle_core::Result<_>>()?
        } else {
            rows.chunks_mut(width)
                .zip(batch.iter_mut())
                .zip(steps.iter())
                .zip(0..)
                .map(work)
                .collect::<candle_core::Result<_>>()?
        };
        let n = outs.len();
        Tensor::from_vec(outs.concat(), (n, hq * d), dev)
    }
}

/// Rotates every head of `x` (`[heads·d]`) by the angles whose cos/sin are given (`d/2` each), in
/// place: pairs `(2i, 2i+1)` when `interleaved` (candle's `rope_i`), else `(i, i + d/2)` (`rope`).
fn rotate(x: &mut [f32], d: usize, cos: &[f32], sin: &[f32], interleaved: bool) {
    let half = d / 2;
    for head in x.chunks_exact_mut(d) {
        for i in 0..half {
            let (a, b) = if interleaved {
                (2 * i, 2 * i + 1)
            } else {
                (i, i + half)
            };
            let (x0, x1) = (head[a], head[b]);
            head[a] = x0 * cos[i] - x1 * sin[i];
            head[b] = x0 * sin[i] + x1 * cos[i];
        }
    }
}

/// What a layer's policy call is handed besides its query ([`AttentionView`]'s fields).
#[derive(Clone, Copy)]
pub(super) enum Handed<'a> {
    Nothing,
    /// The layer's attention probabilities, `[kv_heads, group, t, n]`.
    Probs(&'a Tensor),
    /// The scores of the compression it makes, computed for the batch.
    Scores(&'a crate::policy::WindowScores),
    /// The entry each cache head evicts, its attention accumulated in the cache
    /// ([`crate::policy::Policy::accumulation`]).
    Accumulated(&'a [u32]),
}

/// Attention probabilities as a policy reads them: each cache head's sum over its query group when
/// `group_sum` (all it reads: [`crate::policy::Capabilities::group_sum_probs`]), summed where they are
/// (on a GPU, before any copy to the host). The group is dimension 1 of a sequence's `[heads, g, t,
/// n]` and of a pool's `[batch·heads, g, n]`.
pub(crate) fn probs_for_policy(probs: Tensor, group_sum: bool) -> candle_core::Result<Tensor> {
    if group_sum && probs.dim(1)? > 1 {
        probs.sum_keepdim(1)
    } else {
        Ok(probs)
    }
}

/// Index of the largest logit (lowest index on ties): greedy decoding. NaNs never win (index 0 when
/// the first logit is one, as a running comparison against it would leave it).
///
/// In two passes that vectorize: the maximum (exact: a maximum does not round), then the first
/// 16-wide chunk holding it. One running comparison with a dependent branch per logit took 85 µs over
/// Qwen's 151,936; per sequence and token, so a batch of 32 paid it 32 times a step.
pub fn argmax(logits: &[f32]) -> u32 {
    const W: usize = 16;
    if logits.first().is_none_or(|x| x.is_nan()) {
        return 0;
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let at = logits
        .chunks(W)
        .position(|c| c.iter().fold(false, |hit, &x| hit | (x == max)))
        .unwrap_or(0);
    let within = logits[at * W..].iter().position(|&x| x == max).unwrap_or(0);
    (at * W + within) as u32
}
