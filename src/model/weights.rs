//! Weight storage formats and the linear layer that uses them.
//!
//! On a 2-core CPU the weight format decides speed more than anything else: candle's Q4_1 kernel is a
//! scalar loop, its Q8_0 kernel uses AVX2, and its f32 gemm wins as soon as many rows share the
//! weights (prefill). [`WeightFormat::Auto`] keeps, for calls of few rows (decoding), the file's Q4_1
//! blocks in kvbench's own kernel ([`crate::model::q4`]; other formats requantized to Q8_0 for
//! [`crate::model::q8`]), and an f32 copy for calls of many rows; the choice was measured (see the
//! README's speed section).

use crate::model::q4::Q41Matrix;
use crate::model::q8::Q8Matrix;
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
    /// For calls of fewer than 64 rows (decoding) the file's Q4_1 blocks in kvbench's kernel (other
    /// formats requantized to Q8_0); f32 for larger ones (prefill). Fast, more memory.
    #[default]
    Auto,
    /// Keep the file's own quantization (Q4_1 for the default model) in candle's kernels: the reference
    /// path, equal to candle-transformers' quantized_llama, and slow (candle's Q4_1 kernel is scalar).
    Native,
    /// Requantize every matrix to Q8_0 at load time.
    Q8,
    /// Dequantize every matrix to f32: exact reference arithmetic, used by equality tests.
    F32,
}

/// Rows at or above which [`WeightFormat::Auto`] switches from the small-batch kernel to f32 gemm.
/// Measured on the default model with 2 threads (`kvbench perf`, decode aggregate tokens/s, medians of 3):
/// with candle's Q8_0 kernel, threshold 2 → batch 8: 83, batch 32: 125; 16 → 112 and 157; 64 → 102 and 115.
/// With kvbench's own Q8_0 kernel ([`crate::model::q8`]), 16 → batch 8: 184, batch 32 (f32): 143; 64 →
/// 193 and 201. Prefill (hundreds of rows) is 2.3× faster in f32 than in Q8_0.
const AUTO_F32_MIN_ROWS: usize = 64;

/// The kernel for calls with few rows (decoding).
#[derive(Debug, Clone)]
enum SmallKernel {
    /// candle's quantized product (native formats; Q8_0 on CPUs without AVX2 and on other devices).
    Candle(QMatMul),
    /// kvbench's weight-stationary Q8_0 product (CPU with AVX2): see [`crate::model::q8`].
    Own(Q8Matrix),
    /// kvbench's weight-stationary Q4_1 product on the file's own blocks (CPU with AVX2): see
    /// [`crate::model::q4`].
    OwnQ41(Q41Matrix),
}

impl SmallKernel {
    /// Q8_0 copy of `w` in the fastest kernel this device and CPU have.
    fn q8(w: &QTensor, device: &Device) -> Result<Self> {
        if device.is_cpu() && crate::model::q8::has_avx2() {
            let (n, k) = w.shape().dims2()?;
            let dense = w.dequantize(device)?.flatten_all()?.to_vec1::<f32>()?;
            return Ok(SmallKernel::Own(Q8Matrix::quantize(&dense, n, k)));
        }
        Ok(SmallKernel::Candle(QMatMul::from_arc(Arc::new(
            QTensor::quantize(&w.dequantize(device)?, GgmlDType::Q8_0)?,
        ))?))
    }

    /// The file's own Q4_1 blocks in kvbench's kernel when this device and CPU can run it.
    fn q4_1(w: &QTensor, device: &Device) -> Result<Option<Self>> {
        if w.dtype() != GgmlDType::Q4_1 || !device.is_cpu() || !crate::model::q8::has_avx2() {
            return Ok(None);
        }
        let (n, k) = w.shape().dims2()?;
        Ok(Q41Matrix::from_ggml(&w.data()?, n, k).map(SmallKernel::OwnQ41))
    }

    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let own = |matmul: &dyn Fn(&[f32], usize) -> Vec<f32>, n: usize| {
            let rows = x.dim(0)?;
            let input = x.contiguous()?.flatten_all()?.to_vec1::<f32>()?;
            Tensor::from_vec(matmul(&input, rows), (rows, n), x.device())
        };
        match self {
            SmallKernel::Candle(q) => q.forward(x),
            SmallKernel::Own(q) => own(&|x, m| q.matmul(x, m), q.rows()),
            SmallKernel::OwnQ41(q) => own(&|x, m| q.matmul(x, m), q.rows()),
        }
    }

    fn bytes(&self) -> usize {
        match self {
            SmallKernel::Candle(QMatMul::QTensor(t)) => t.storage_size_in_bytes(),
            SmallKernel::Candle(QMatMul::Tensor(t))
            | SmallKernel::Candle(QMatMul::TensorF16(t)) => {
                t.elem_count() * t.dtype().size_in_bytes()
            }
            SmallKernel::Own(q) => q.bytes(),
            SmallKernel::OwnQ41(q) => q.bytes(),
        }
    }
}

/// A linear layer `y = x Wᵀ + b` whose weight may be held in up to two formats.
#[derive(Debug, Clone)]
pub struct Linear {
    small: Option<SmallKernel>,
    /// The weight transposed to `[in, out]` and made contiguous: gemm then reads it in place instead of
    /// repacking the whole matrix on every call (measured: packing took 40% of batch-8 decode time).
    dense: Option<Tensor>,
    bias: Option<Tensor>,
    out_features: usize,
}

impl Linear {
    /// Builds the layer from a quantized (or f32/f16) tensor of shape `[out, in]` in the chosen format.
    pub fn from_qtensor(
        w: QTensor,
        bias: Option<Tensor>,
        format: WeightFormat,
        device: &Device,
    ) -> Result<Self> {
        let (out_features, in_features) = w.shape().dims2()?;
        let is_float = matches!(w.dtype(), GgmlDType::F32 | GgmlDType::F16 | GgmlDType::BF16);
        // Q8_0 needs the row length to be a multiple of its 32-wide block.
        let can_q8 = in_features % 32 == 0;
        let (small, dense) = match format {
            WeightFormat::F32 => (None, Some(w.dequantize(device)?)),
            WeightFormat::Native if is_float => (None, Some(w.dequantize(device)?)),
            WeightFormat::Native => (
                Some(SmallKernel::Candle(QMatMul::from_arc(Arc::new(w))?)),
                None,
            ),
            WeightFormat::Q8 if !can_q8 => (None, Some(w.dequantize(device)?)),
            WeightFormat::Q8 => (Some(SmallKernel::q8(&w, device)?), None),
            WeightFormat::Auto => {
                let small = match SmallKernel::q4_1(&w, device)? {
                    Some(k) => Some(k),
                    None if can_q8 => Some(SmallKernel::q8(&w, device)?),
                    None => None,
                };
                (small, Some(w.dequantize(device)?))
            }
        };
        let dense = dense.map(|w| w.t()?.contiguous()).transpose()?;
        Ok(Self {
            small,
            dense,
            bias,
            out_features,
        })
    }

    /// Builds the layer from a dense `[out, in]` tensor (safetensors checkpoints).
    pub fn from_dense(w: Tensor, bias: Option<Tensor>, format: WeightFormat) -> Result<Self> {
        let device = w.device().clone();
        let w = w.to_dtype(DType::F32)?;
        match format {
            WeightFormat::F32 | WeightFormat::Native => {
                let out_features = w.dim(0)?;
                Ok(Self {
                    small: None,
                    dense: Some(w.t()?.contiguous()?),
                    bias,
                    out_features,
                })
            }
            _ => Self::from_qtensor(
                QTensor::quantize(&w, GgmlDType::F32)?,
                bias,
                format,
                &device,
            ),
        }
    }

    pub fn out_features(&self) -> usize {
        self.out_features
    }

    /// `x`: `[rows, in]` → `[rows, out]`.
    pub fn forward(&self, x: &Tensor) -> Result<Tensor> {
        let rows = x.dim(0)?;
        let y = match (&self.small, &self.dense) {
            (Some(k), Some(_)) if rows < AUTO_F32_MIN_ROWS => k.forward(x)?,
            (_, Some(wt)) => x.matmul(wt)?,
            (Some(k), None) => k.forward(x)?,
            (None, None) => unreachable!("a Linear always holds one weight format"),
        };
        match &self.bias {
            Some(b) => y.broadcast_add(b),
            None => Ok(y),
        }
    }

    /// Bytes of weights one call with `rows` rows reads: the copy [`forward`](Self::forward) uses.
    pub fn bytes_read(&self, rows: usize) -> usize {
        let small = self.small.as_ref().map(SmallKernel::bytes);
        let dense = self
            .dense
            .as_ref()
            .map(|t| t.elem_count() * t.dtype().size_in_bytes());
        match (small, dense) {
            (Some(k), Some(_)) if rows < AUTO_F32_MIN_ROWS => k,
            (_, Some(d)) => d,
            (Some(k), None) => k,
            (None, None) => 0,
        }
    }

    /// Bytes of weight memory held (all copies).
    pub fn weight_bytes(&self) -> usize {
        let small = self.small.as_ref().map_or(0, SmallKernel::bytes);
        let dense = self
            .dense
            .as_ref()
            .map_or(0, |t| t.elem_count() * t.dtype().size_in_bytes());
        small + dense
    }
}

/// RMSNorm with an f32 weight.
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
}
