//! Weight storage formats and the layers that use them: linear layers and the token embedding.
//!
//! By default ([`WeightFormat::Auto`]) every GGUF matrix stays in the file's own quantized blocks,
//! resident once, and kvbench's kernels ([`crate::kernels`]) multiply from them for decoding and prefill
//! alike; float tensors keep their stored type (bf16 and f16 ones on the CPU in kvbench's 16-bit
//! product, [`crate::kernels::float16`]). No f32 or requantized copy is made unless asked for
//! (`--weights f32|q8`). candle's quantized product serves the formats kvbench has no kernel for, other
//! devices, and `--weights native` (the reference path, equal to candle-transformers' models).

use crate::kernels::float16::{Float16, Float16Matrix};
use crate::kernels::{BlockFormat, QMatrix, WeightBytes};
use crate::loading::source::RawTensor;
use crate::model::matmul::matmul;
use candle_core::quantized::{GgmlDType, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Result, Tensor};
use std::sync::Arc;

/// How linear-layer weights are held in memory after loading.
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
#[serde(rename_all = "kebab-case")]
pub enum WeightFormat {
    /// The file's own blocks in kvbench's kernels (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K) on the
    /// CPU; candle's kernels for other formats and devices; float tensors in their stored type.
    #[default]
    Auto,
    /// The file's own quantization in candle's kernels: the reference path, equal to
    /// candle-transformers' quantized models (embedding dequantized to f32, as they do).
    Native,
    /// Every matrix requantized to Q8_0 at load time (kvbench's kernel on the CPU).
    Q8,
    /// Every matrix dequantized to f32: exact reference arithmetic, used by equality tests.
    F32,
}

/// One stored weight of a linear layer: `[out, in]`.
#[derive(Debug, Clone)]
enum Weight {
    /// The file's blocks in kvbench's kernels.
    Own(Arc<QMatrix>),
    /// candle's quantized product.
    Candle(QMatMul),
    /// A float matrix transposed to `[in, out]` in its stored type: gemm reads it in place.
    Dense(Tensor),
    /// A bf16 or f16 matrix `[out, in]` on the CPU, in kvbench's product
    /// ([`crate::kernels::float16`]): candle's 16-bit products there were most of a decoding step.
    Float16(Arc<Float16Matrix>),
}

impl Weight {
    /// Builds the weight of `raw` in `format` on `device`.
    fn new(raw: RawTensor, format: WeightFormat, device: &Device) -> Result<Self> {
        let own_kernels = device.is_cpu();
        let (_, in_features) = raw.dims2()?;
        if format == WeightFormat::F32 {
            return Weight::dense(raw.to_dense(device)?);
        }
        if format == WeightFormat::Q8 {
            if in_features % 32 != 0 {
                return Weight::dense(raw.to_dense(device)?);
            }
            let q = QTensor::quantize(&raw.to_dense(device)?, GgmlDType::Q8_0)?;
            if own_kernels {
                return Self::own(
                    BlockFormat::Q8_0,
                    q.data()?.into_owned(),
                    q.shape().dims2()?,
                );
            }
            return Ok(Weight::Candle(QMatMul::from_arc(Arc::new(q))?));
        }
        if let Some(t) = raw.to_float(device)? {
            if format == WeightFormat::Auto && own_kernels {
                use half::vec::HalfFloatVecExt;
                let (n, k) = t.dims2()?;
                let flat = t.flatten_all()?;
                let (kind, bits) = match t.dtype() {
                    DType::BF16 => (
                        Float16::Bf16,
                        flat.to_vec1::<half::bf16>()?.reinterpret_into(),
                    ),
                    DType::F16 => (
                        Float16::F16,
                        flat.to_vec1::<half::f16>()?.reinterpret_into(),
                    ),
                    _ => return Weight::dense(t),
                };
                let m = Float16Matrix::new(kind, bits, n, k).map_err(candle_core::Error::Msg)?;
                return Ok(Weight::Float16(Arc::new(m)));
            }
            return Weight::dense(t);
        }
        let dims = raw.dims2()?;
        match (&raw, format == WeightFormat::Auto && own_kernels) {
            (RawTensor::Gguf { dtype, .. }, true) if BlockFormat::from_ggml(*dtype).is_some() => {
                let RawTensor::Gguf { dtype, bytes, .. } = raw else {
                    unreachable!("matched just above")
                };
                let f = BlockFormat::from_ggml(dtype).expect("checked just above");
                Self::own(f, bytes, dims)
            }
            _ => Ok(Weight::Candle(QMatMul::from_arc(Arc::new(
                raw.to_qtensor(device)?,
            ))?)),
        }
    }

    fn own(
        format: BlockFormat,
        bytes: impl Into<WeightBytes>,
        (n, k): (usize, usize),
    ) -> Result<Self> {
        let m = QMatrix::new(format, bytes, n, k)
            .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
        Ok(Weight::Own(Arc::new(m)))
    }

    fn dense(w: Tensor) -> Result<Self> {
        Ok(Weight::Dense(w.t()?.contiguous()?))
    }

    /// `x Wᵀ`, plus `bias` (`[out]`) when given: added here for kvbench's kernels (in place, before
    /// the tensor is made), by the caller for the others. The result is in `x`'s type: f32, or a float
    /// matrix's own 16-bit type when the activations are kept in it (no conversion either side).
    fn forward(&self, x: &Tensor, bias: Option<&Tensor>) -> Result<Tensor> {
        let dtype = x.dtype();
        match self {
            // kvbench's and candle's quantized products take and give f32.
            Weight::Own(_) | Weight::Candle(_) if dtype != DType::F32 => self
                .forward(&x.to_dtype(DType::F32)?, bias)?
                .to_dtype(dtype),
            Weight::Own(q) => {
                let rows = x.dim(0)?;
                let mut y = match super::ops::with_f32_slice(x, |input| q.matmul(input, rows)) {
                    Some(y) => y,
                    None => q.matmul(&x.contiguous()?.flatten_all()?.to_vec1::<f32>()?, rows),
                };
                if let Some(b) = bias {
                    let b = b.to_dtype(DType::F32)?.flatten_all()?.to_vec1::<f32>()?;
                    super::ops::add_rows(&mut y, &b)?;
                }
                Tensor::from_vec(y, (rows, q.rows()), x.device())
            }
            Weight::Candle(q) => q.forward(x),
            Weight::Float16(m) => {
                let rows = x.dim(0)?;
                let x32 = x.to_dtype(DType::F32)?;
                let y = match super::ops::with_f32_slice(&x32, |input| m.matmul(input, rows)) {
                    Some(y) => y,
                    None => m.matmul(&x32.contiguous()?.flatten_all()?.to_vec1::<f32>()?, rows),
                };
                Tensor::from_vec(y, (rows, m.rows()), x.device())?.to_dtype(dtype)
            }
            Weight::Dense(wt) if wt.dtype() == dtype => matmul(x, wt),
            Weight::Dense(wt) => matmul(&x.to_dtype(wt.dtype())?, wt)?.to_dtype(dtype),
        }
    }

    fn out_features(&self) -> Result<usize> {
        Ok(match self {
            Weight::Own(q) => q.rows(),
            Weight::Candle(QMatMul::QTensor(t)) => t.shape().dims2()?.0,
            Weight::Candle(QMatMul::Tensor(t)) | Weight::Candle(QMatMul::TensorF16(t)) => {
                t.dims2()?.0
            }
            Weight::Dense(wt) => wt.dims2()?.1,
            Weight::Float16(m) => m.rows(),
        })
    }

    fn bytes(&self) -> usize {
        match self {
            Weight::Own(q) => q.bytes(),
            Weight::Candle(QMatMul::QTensor(t)) => t.storage_size_in_bytes(),
            Weight::Candle(QMatMul::Tensor(t)) | Weight::Candle(QMatMul::TensorF16(t)) => {
                t.elem_count() * t.dtype().size_in_bytes()
            }
            Weight::Dense(t) => t.elem_count() * t.dtype().size_in_bytes(),
            Weight::Float16(m) => m.bytes(),
        }
    }
}

/// A linear layer `y = x Wᵀ + b`; several projections of one input may be stacked by rows, each part
/// in its own format (a Q4_K_M file stores q and k in Q4_K and v in Q6_K). Consecutive parts that can be
/// one matrix are (kvbench's blocks of one kind, float matrices of one type).
#[derive(Debug, Clone)]
pub struct Linear {
    parts: Vec<Weight>,
    bias: Option<Tensor>,
    out_features: usize,
}

impl Linear {
    /// Stacks `parts` (each `[out_i, in]`) into one layer in the chosen format. Parts that kvbench's
    /// kernels hold become one matrix, so the stacked product is one parallel call.
    pub fn new(
        parts: Vec<RawTensor>,
        bias: Option<Tensor>,
        format: WeightFormat,
        device: &Device,
    ) -> Result<Self> {
        let mut built: Vec<Weight> = Vec::with_capacity(parts.len());
        for raw in parts {
            match (built.pop(), Weight::new(raw, format, device)?) {
                (Some(Weight::Own(prev)), Weight::Own(next)) if prev.stacks_with(&next) => {
                    let owned =
                        |m: Arc<QMatrix>| Arc::try_unwrap(m).unwrap_or_else(|m| (*m).clone());
                    let stacked = QMatrix::stack(vec![owned(prev), owned(next)])
                        .map_err(|e| candle_core::Error::Msg(e.to_string()))?;
                    built.push(Weight::Own(Arc::new(stacked)));
                }
                (Some(Weight::Float16(prev)), Weight::Float16(next))
                    if prev.kind() == next.kind() && prev.cols() == next.cols() =>
                {
                    let prev = Arc::try_unwrap(prev).unwrap_or_else(|m| (*m).clone());
                    let stacked = prev.stacked(&next).map_err(candle_core::Error::Msg)?;
                    built.push(Weight::Float16(Arc::new(stacked)));
                }
                // Float matrices of one type (a checkpoint's separate q, k and v, or gate and up),
                // `[in, out]` each, side by side: one product, not one per part and a concatenation
                // of their outputs (on a GPU, five launches a layer fewer; the small k and v
                // products were the least efficient). Not 16-bit ones on the CPU (there only
                // `--weights native` keeps them in candle's product, the others being kvbench's,
                // above): candle's 16-bit product was slower on the wider matrix (measured in bf16,
                // random:qwen2.5-coder-0.5b, batch 1: 1.3 tok/s against 2.1-2.2 apart; f32 the
                // same either way).
                (Some(Weight::Dense(prev)), Weight::Dense(next))
                    if dense_parts_join(&prev, &next, device.is_cpu())? =>
                {
                    built.push(Weight::Dense(Tensor::cat(&[&prev, &next], 1)?));
                }
                (prev, next) => {
                    built.extend(prev);
                    built.push(next);
                }
            }
        }
        Self::from_weights(built, bias)
    }

    /// A layer over a matrix shared with the embedding (tied output head).
    pub fn shared(matrix: Arc<QMatrix>) -> Result<Self> {
        Self::from_weights(vec![Weight::Own(matrix)], None)
    }

    fn from_weights(parts: Vec<Weight>, bias: Option<Tensor>) -> Result<Self> {
        let out_features = parts
            .iter()
            .map(Weight::out_features)
            .sum::<Result<usize>>()?;
        Ok(Self {
            parts,
            bias,
            out_features,
        })
    }

    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// The type of its matrices when they are all float matrices of one type (a checkpoint's bf16),
    /// `None` when any is quantized.
    pub fn float_dtype(&self) -> Option<DType> {
        let mut types = self.parts.iter().map(|p| match p {
            Weight::Dense(t) => Some(t.dtype()),
            Weight::Float16(m) => Some(match m.kind() {
                Float16::Bf16 => DType::BF16,
                Float16::F16 => DType::F16,
            }),
            _ => None,
        });
        let first = types.next()??;
        types.all(|t| t == Some(first)).then_some(first)
    }

    /// Keeps the bias in `dtype`, the activations' type (it is added to the product in that type).
    pub fn set_bias_dtype(&mut self, dtype: DType) -> Result<()> {
        if let Some(b) = &self.bias {
            self.bias = Some(b.to_dtype(dtype)?);
        }
        Ok(())
    }

    /// `x`: `[rows, in]` → `[rows, out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let y = match self.parts.as_slice() {
            [one @ Weight::Own(_)] => return one.forward(x, self.bias.as_ref()),
            [one] => one.forward(x, None)?,
            parts => {
                let ys = parts
                    .iter()
                    .map(|p| p.forward(x, None))
                    .collect::<Result<Vec<_>>>()?;
                Tensor::cat(&ys, 1)?
            }
        };
        match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }

    /// Bytes of weight memory held: also what one forward call reads.
    pub fn weight_bytes(&self) -> usize {
        self.parts.iter().map(Weight::bytes).sum()
    }
}

/// Whether two float parts `[in, out_i]` of one layer become one matrix ([`Linear::new`]): the same
/// type and input width, and not 16-bit ones on the CPU (`on_cpu`), where candle's 16-bit product
/// was slower on the wider matrix.
fn dense_parts_join(a: &Tensor, b: &Tensor, on_cpu: bool) -> Result<bool> {
    Ok(a.dtype() == b.dtype() && a.dim(0)? == b.dim(0)? && (!on_cpu || a.dtype() == DType::F32))
}

/// The token embedding: rows of the file's quantized matrix dequantized on lookup (kvbench's kernels),
/// or a dense table.
#[derive(Debug, Clone)]
pub enum Embedding {
    Own(Arc<QMatrix>),
    Dense(Tensor),
}

impl Embedding {
    /// Builds the embedding of `raw` (`[vocab, hidden]`) in `format` on `device`.
    pub fn new(raw: RawTensor, format: WeightFormat, device: &Device) -> Result<Self> {
        let kernel_format = match &raw {
            RawTensor::Gguf { dtype, .. } => BlockFormat::from_ggml(*dtype).is_some(),
            RawTensor::Dense(_) => false,
        };
        let in_features = raw.dims2()?.1;
        let own = device.is_cpu()
            && match format {
                WeightFormat::Auto => kernel_format,
                WeightFormat::Q8 => in_features % 32 == 0,
                WeightFormat::Native | WeightFormat::F32 => false,
            };
        if !own {
            // A float table keeps its stored type (rows are widened on lookup) unless f32 is asked for.
            let table = match (format, raw.to_float(device)?) {
                (WeightFormat::F32, _) | (_, None) => raw.to_dense(device)?,
                (_, Some(t)) => t,
            };
            return Ok(Embedding::Dense(table));
        }
        match Weight::new(raw, format, device)? {
            Weight::Own(m) => Ok(Embedding::Own(m)),
            _ => Err(candle_core::Error::Msg(
                "embedding: expected a matrix in kvbench's kernels".into(),
            )),
        }
    }

    /// The rows of `ids`, `[ids.len(), hidden]` in `dtype` (the activations' type).
    pub fn lookup(&self, ids: &[u32], device: &Device, dtype: DType) -> Result<Tensor> {
        match self {
            Embedding::Own(m) => {
                let k = m.cols();
                let mut out = vec![0f32; ids.len() * k];
                for (row, &id) in out.chunks_exact_mut(k).zip(ids) {
                    let id = id as usize;
                    if id >= m.rows() {
                        return Err(candle_core::Error::Msg(format!(
                            "token id {id} outside the embedding of {} rows",
                            m.rows()
                        )));
                    }
                    m.dequantize_row(id, row);
                }
                Tensor::from_vec(out, (ids.len(), k), device)?.to_dtype(dtype)
            }
            Embedding::Dense(t) => {
                let ids = Tensor::from_slice(ids, ids.len(), device)?;
                t.index_select(&ids, 0)?.to_dtype(dtype)
            }
        }
    }

    /// The matrix, when held in kvbench's kernels (shared with a tied output head).
    pub fn matrix(&self) -> Option<Arc<QMatrix>> {
        match self {
            Embedding::Own(m) => Some(m.clone()),
            Embedding::Dense(_) => None,
        }
    }

    pub fn bytes(&self) -> usize {
        match self {
            Embedding::Own(m) => m.bytes(),
            Embedding::Dense(t) => t.elem_count() * t.dtype().size_in_bytes(),
        }
    }
}

/// RMSNorm with a weight in the activations' type (f32 unless they are kept in 16 bits).
#[derive(Debug, Clone)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    pub fn new(weight: Tensor, eps: f64) -> Result<Self> {
        Ok(Self {
            weight: weight.to_dtype(DType::F32)?,
            eps: eps as f32,
        })
    }

    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        candle_nn::ops::rms_norm(x, &self.weight, self.eps)
    }

    /// Keeps the weight in `dtype`, the activations' type (candle's RMSNorm takes both in one type).
    pub fn set_dtype(&mut self, dtype: DType) -> Result<()> {
        self.weight = self.weight.to_dtype(dtype)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::loading::source::RawTensor;

    fn part(out: usize, inp: usize, seed: usize, dtype: DType) -> RawTensor {
        let data: Vec<f32> = (0..out * inp)
            .map(|i| (((i + seed * 7919) * 2654435761usize % 1999) as f32 - 999.0) / 1000.0)
            .collect();
        let t = Tensor::from_vec(data, (out, inp), &Device::Cpu).unwrap();
        RawTensor::Dense(t.to_dtype(dtype).unwrap())
    }

    /// Float parts of one type become one matrix whose product is the parts' products side by
    /// side; parts of different types stay apart.
    #[test]
    fn float_parts_of_one_type_are_one_matrix_with_the_parts_products() {
        let inp = 24;
        let x = Tensor::from_vec(
            (0..3 * inp)
                .map(|i| (i as f32 * 0.37).sin())
                .collect::<Vec<_>>(),
            (3, inp),
            &Device::Cpu,
        )
        .unwrap();
        // On the CPU f32 parts join as one dense matrix, bf16 and f16 ones as one matrix of
        // kvbench's 16-bit product.
        for dtype in [DType::F32, DType::BF16, DType::F16] {
            let parts = || {
                vec![
                    part(16, inp, 1, dtype),
                    part(4, inp, 2, dtype),
                    part(4, inp, 3, dtype),
                ]
            };
            let bias = Tensor::arange(0f32, 24.0, &Device::Cpu).unwrap();
            let one = Linear::new(
                parts(),
                Some(bias.clone()),
                WeightFormat::Auto,
                &Device::Cpu,
            )
            .unwrap();
            assert_eq!(one.parts.len(), 1, "{dtype:?}");
            assert_eq!(one.out_features(), 24);
            assert_eq!(one.float_dtype(), Some(dtype));
            let apart: Vec<Tensor> = parts()
                .into_iter()
                .map(|p| {
                    Linear::new(vec![p], None, WeightFormat::Auto, &Device::Cpu)
                        .unwrap()
                        .forward(&x)
                        .unwrap()
                })
                .collect();
            let want = Tensor::cat(&apart, 1)
                .unwrap()
                .broadcast_add(&bias)
                .unwrap();
            let got = one.forward(&x).unwrap();
            let diff = (got - want)
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert!(diff <= 1e-5, "{dtype:?}: {diff}");
        }
        // Which parts join: one type and input width; 16-bit ones only off the CPU (a GPU).
        let t = |rows: usize, dtype: DType| Tensor::zeros((rows, 8), dtype, &Device::Cpu).unwrap();
        let joins = |a: &Tensor, b: &Tensor, on_cpu: bool| dense_parts_join(a, b, on_cpu).unwrap();
        assert!(joins(&t(24, DType::F32), &t(24, DType::F32), true));
        assert!(joins(&t(24, DType::BF16), &t(24, DType::BF16), false));
        assert!(joins(&t(24, DType::F16), &t(24, DType::F16), false));
        assert!(!joins(&t(24, DType::BF16), &t(24, DType::BF16), true));
        assert!(!joins(&t(24, DType::F32), &t(24, DType::BF16), false));
        assert!(!joins(&t(24, DType::F32), &t(12, DType::F32), false));
        let mixed = Linear::new(
            vec![part(8, inp, 1, DType::F32), part(8, inp, 2, DType::BF16)],
            None,
            WeightFormat::Auto,
            &Device::Cpu,
        )
        .unwrap();
        assert_eq!(mixed.parts.len(), 2);
        assert_eq!(mixed.float_dtype(), None);
        // bf16 and f16 parts are both kvbench's 16-bit product, but not one matrix.
        let kinds = Linear::new(
            vec![part(8, inp, 1, DType::BF16), part(8, inp, 2, DType::F16)],
            None,
            WeightFormat::Auto,
            &Device::Cpu,
        )
        .unwrap();
        assert_eq!(kinds.parts.len(), 2);
        assert_eq!(kinds.float_dtype(), None);
        assert_eq!(kinds.forward(&x).unwrap().dims2().unwrap(), (3, 16));
    }
}
