//! Where weights come from: a GGUF file or a Hugging Face safetensors directory.
//!
//! The loader asks for tensors by their GGUF names (`blk.3.attn_q.weight`); the safetensors source
//! translates them to Hugging Face names (`model.layers.3.self_attn.q_proj.weight`). One loader then
//! serves both formats. Every failure names the file it came from.

use super::hf_config::HfConfig;
use super::shapes::check_shapes;
use crate::error::{candle_message, Error, Result};
use crate::loading::gguf_layout;
use crate::model::config::ModelConfig;
use candle_core::quantized::{gguf_file, GgmlDType, QStorage, QTensor};
use candle_core::{DType, Device, Shape, Tensor};
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

/// A tensor as stored: a GGUF tensor's own bytes, or a dense (safetensors) tensor.
pub enum RawTensor {
    /// The file's bytes of a GGUF tensor, its ggml type and its shape (`[rows, cols]`, candle's order).
    Gguf {
        dtype: GgmlDType,
        shape: Shape,
        bytes: crate::kernels::WeightBytes,
    },
    Dense(Tensor),
}

impl RawTensor {
    /// The tensor as candle's quantized tensor (candle's kernels, other devices).
    pub fn to_qtensor(&self, device: &Device) -> candle_core::Result<QTensor> {
        match self {
            RawTensor::Gguf {
                dtype,
                shape,
                bytes,
            } => QTensor::new(
                QStorage::from_data(std::borrow::Cow::Borrowed(bytes), device, *dtype)?,
                shape.clone(),
            ),
            RawTensor::Dense(t) => QTensor::quantize(&t.to_dtype(DType::F32)?, GgmlDType::F32),
        }
    }

    /// The tensor widened to f32 (norms, biases, `--weights f32`).
    pub fn to_dense(&self, device: &Device) -> candle_core::Result<Tensor> {
        match self {
            RawTensor::Gguf { .. } => self.to_qtensor(device)?.dequantize(device),
            RawTensor::Dense(t) => t.to_dtype(DType::F32),
        }
    }

    /// The tensor in its stored float type, when it is one (F32, F16, BF16): never widened.
    pub fn to_float(&self, device: &Device) -> candle_core::Result<Option<Tensor>> {
        match self {
            RawTensor::Gguf { dtype, shape, .. } => {
                let dt = match dtype {
                    GgmlDType::F32 => DType::F32,
                    GgmlDType::F16 => DType::F16,
                    GgmlDType::BF16 => DType::BF16,
                    _ => return Ok(None),
                };
                let q = self.to_qtensor(device)?;
                // candle widens F16/BF16 when dequantizing; narrow back to the stored type.
                Ok(Some(
                    q.dequantize(device)?.to_dtype(dt)?.reshape(shape.clone())?,
                ))
            }
            RawTensor::Dense(t) => Ok(Some(t.clone())),
        }
    }

    /// Rows and columns of a matrix.
    pub fn dims2(&self) -> candle_core::Result<(usize, usize)> {
        match self {
            RawTensor::Gguf { shape, .. } => shape.dims2(),
            RawTensor::Dense(t) => t.dims2(),
        }
    }
}

/// An opened weight container.
pub enum WeightSource {
    Gguf {
        path: PathBuf,
        content: gguf_file::Content,
        /// Each tensor's checked `(first byte, length)` in the file.
        extents: std::collections::HashMap<String, (u64, usize)>,
        reader: BufReader<File>,
    },
    Safetensors {
        dir: PathBuf,
        tensors: candle_core::safetensors::MmapedSafetensors,
    },
    /// Seeded random weights (no file): tensors are generated when asked for.
    Random(super::random::RandomSpec),
}

const GGUF_MAGIC: [u8; 4] = *b"GGUF";

/// Why a file given as a model is not a GGUF file, with what it is where that can be told: a file of a
/// Hugging Face checkpoint (the directory is the model), else its first bytes.
fn not_gguf(path: &Path, magic: &[u8; 4]) -> String {
    let dir = path.parent().filter(|d| d.join("config.json").is_file());
    let in_checkpoint = path
        .extension()
        .is_some_and(|e| e == "safetensors" || e == "json");
    match dir {
        Some(dir) if in_checkpoint => format!(
            "not a GGUF file but a file of a Hugging Face checkpoint: give its directory ({}) as \
             the model",
            dir.display()
        ),
        _ => format!(
            "not a GGUF file (it starts with \"{}\", a GGUF file with \"GGUF\")",
            magic.escape_ascii()
        ),
    }
}

impl WeightSource {
    /// Opens a GGUF file, checking the magic and that every tensor lies inside the file.
    pub fn open_gguf(path: &Path) -> Result<Self> {
        let mut file =
            File::open(path).map_err(|e| Error::model(path, format!("cannot open: {e}")))?;
        let mut magic = [0u8; 4];
        file.read_exact(&mut magic)
            .map_err(|_| Error::model(path, "file is shorter than a GGUF header"))?;
        if magic != GGUF_MAGIC {
            return Err(Error::model(path, not_gguf(path, &magic)));
        }
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let file_len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let mut reader = BufReader::new(file);
        // Before candle's reader, which divides by the alignment.
        let alignment = gguf_layout::declared_alignment(&mut reader)
            .map_err(|e| Error::model(path, e))?
            .unwrap_or(gguf_layout::DEFAULT_ALIGNMENT);
        reader.rewind().map_err(|e| Error::io(path, e))?;
        let content = gguf_file::Content::read(&mut reader).map_err(|e| {
            Error::model(
                path,
                format!("unreadable GGUF header: {}", candle_message(&e)),
            )
        })?;
        let mut extents = std::collections::HashMap::with_capacity(content.tensor_infos.len());
        for (name, info) in &content.tensor_infos {
            let extent = gguf_layout::tensor_extent(
                name,
                info,
                content.tensor_data_offset,
                alignment,
                file_len,
            )
            .map_err(|e| Error::model(path, e))?;
            extents.insert(name.clone(), extent);
        }
        Ok(WeightSource::Gguf {
            path: path.to_path_buf(),
            content,
            extents,
            reader,
        })
    }

    /// Opens a Hugging Face model directory (`config.json` plus one or more `*.safetensors`).
    pub fn open_safetensors(dir: &Path) -> Result<(Self, ModelConfig)> {
        let config_path = dir.join("config.json");
        let text = crate::files::read_text(&config_path, crate::files::CONFIG_LIMIT)
            .map_err(|e| Error::model(&config_path, format!("cannot read: {e}")))?;
        let hf: HfConfig = serde_json::from_str(&text)
            .map_err(|e| Error::model(&config_path, format!("invalid config: {e}")))?;
        let config = hf
            .to_model_config()
            .map_err(|e| Error::model(&config_path, e))?;
        let files = safetensors_files(dir).map_err(|e| Error::io(dir, e))?;
        if files.is_empty() {
            return Err(Error::model(
                dir,
                "no *.safetensors files in the model directory",
            ));
        }
        // SAFETY: the files are memory-mapped read-only; kvbench never writes to them while mapped.
        let tensors = unsafe { candle_core::safetensors::MmapedSafetensors::multi(&files) }
            .map_err(|e| {
                Error::model(
                    dir,
                    format!("unreadable safetensors: {}", candle_message(&e)),
                )
            })?;
        // The first tensor the model reads whose type is not a float's (an integer tensor the size of
        // an f32 one passes every shape check and would fail only in the first product).
        let not_float = std::cell::RefCell::new(None);
        let shape = |n: &str| {
            let view = tensors.get(&hf_name(n)).ok()?;
            let float = matches!(
                DType::try_from(view.dtype()),
                Ok(DType::F16 | DType::BF16 | DType::F32 | DType::F64)
            );
            if !float && not_float.borrow().is_none() {
                *not_float.borrow_mut() = Some(format!(
                    "tensor {} is stored as {:?}; model weights must be F16, BF16, F32 or F64",
                    hf_name(n),
                    view.dtype()
                ));
            }
            Some(view.shape().to_vec())
        };
        check_shapes(&config, &shape, &hf_name).map_err(|e| Error::model(&config_path, e))?;
        if let Some(reason) = not_float.into_inner() {
            return Err(Error::model(dir, reason));
        }
        Ok((
            WeightSource::Safetensors {
                dir: dir.to_path_buf(),
                tensors,
            },
            config,
        ))
    }

    pub fn path(&self) -> &Path {
        match self {
            WeightSource::Gguf { path, .. } => path,
            WeightSource::Safetensors { dir, .. } => dir,
            WeightSource::Random(_) => Path::new("random weights"),
        }
    }

    /// Whether the source is a GGUF file (tensors that only llama.cpp's converter writes may be in it).
    pub fn is_gguf(&self) -> bool {
        matches!(self, WeightSource::Gguf { .. })
    }

    /// Whether a tensor (GGUF name) exists.
    pub fn contains(&self, name: &str) -> bool {
        match self {
            WeightSource::Gguf { content, .. } => content.tensor_infos.contains_key(name),
            WeightSource::Safetensors { tensors, .. } => tensors.get(&hf_name(name)).is_ok(),
            WeightSource::Random(spec) => super::random::tensor_names(&spec.config())
                .iter()
                .any(|n| n == name),
        }
    }

    /// Loads a tensor by its GGUF name; a missing tensor is an error naming the file and tensor.
    pub fn get(&mut self, name: &str, device: &Device) -> Result<RawTensor> {
        match self {
            WeightSource::Gguf {
                path,
                content,
                extents,
                reader,
            } => {
                let _ = device; // GGUF bytes are read to host memory; layers move them where they run.
                let (Some(info), Some(&(start, size))) =
                    (content.tensor_infos.get(name), extents.get(name))
                else {
                    return Err(Error::model(&*path, format!("missing tensor '{name}'")));
                };
                // The file's bytes, read once: kvbench's kernels use them as they are.
                let mut bytes = crate::kernels::WeightBytes::zeroed(size);
                reader
                    .seek(SeekFrom::Start(start))
                    .and_then(|_| reader.read_exact(&mut bytes))
                    .map_err(|e| Error::model(&*path, format!("tensor '{name}': {e}")))?;
                Ok(RawTensor::Gguf {
                    dtype: info.ggml_dtype,
                    // candle's reader already turned GGUF's dimension order into `[rows, cols]`.
                    shape: info.shape.clone(),
                    bytes,
                })
            }
            WeightSource::Safetensors { dir, tensors } => {
                let hf = hf_name(name);
                let t = tensors.load(&hf, device).map_err(|e| {
                    Error::model(
                        &*dir,
                        format!(
                            "missing or unreadable tensor '{hf}': {}",
                            candle_message(&e)
                        ),
                    )
                })?;
                Ok(RawTensor::Dense(t))
            }
            WeightSource::Random(spec) => match spec.tensor(name, device)? {
                Some(t) => Ok(RawTensor::Dense(t)),
                None => Err(Error::Input(format!(
                    "{}: no tensor '{name}' in this shape",
                    spec.label()
                ))),
            },
        }
    }

    /// Reads the model shape from GGUF metadata.
    pub fn gguf_config(&self) -> Result<ModelConfig> {
        let WeightSource::Gguf { path, content, .. } = self else {
            unreachable!("gguf_config is only called on GGUF sources")
        };
        super::gguf_config::model_config(path, content)
    }

    /// GGUF metadata, when the source is a GGUF file.
    pub fn gguf_metadata(&self) -> Option<&std::collections::HashMap<String, gguf_file::Value>> {
        match self {
            WeightSource::Gguf { content, .. } => Some(&content.metadata),
            WeightSource::Safetensors { .. } | WeightSource::Random(_) => None,
        }
    }
}

/// Translates a GGUF tensor name to the Hugging Face name of the same weight (Llama, Qwen2, Qwen3).
pub fn hf_name(gguf: &str) -> String {
    match gguf {
        "token_embd.weight" => return "model.embed_tokens.weight".into(),
        "output_norm.weight" => return "model.norm.weight".into(),
        "output.weight" => return "lm_head.weight".into(),
        _ => {}
    }
    let Some(rest) = gguf.strip_prefix("blk.") else {
        return gguf.to_string();
    };
    let Some((layer, tail)) = rest.split_once('.') else {
        return gguf.to_string();
    };
    let tail = match tail {
        "attn_norm.weight" => "input_layernorm.weight",
        "ffn_norm.weight" => "post_attention_layernorm.weight",
        "attn_q.weight" => "self_attn.q_proj.weight",
        "attn_k.weight" => "self_attn.k_proj.weight",
        "attn_v.weight" => "self_attn.v_proj.weight",
        "attn_q.bias" => "self_attn.q_proj.bias",
        "attn_k.bias" => "self_attn.k_proj.bias",
        "attn_v.bias" => "self_attn.v_proj.bias",
        "attn_output.weight" => "self_attn.o_proj.weight",
        "attn_q_norm.weight" => "self_attn.q_norm.weight",
        "attn_k_norm.weight" => "self_attn.k_norm.weight",
        "ffn_gate.weight" => "mlp.gate_proj.weight",
        "ffn_up.weight" => "mlp.up_proj.weight",
        "ffn_down.weight" => "mlp.down_proj.weight",
        other => other,
    };
    format!("model.layers.{layer}.{tail}")
}

/// A model directory's weight files, `*.safetensors`, in name order.
pub(crate) fn safetensors_files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    Ok(files)
}

#[cfg(test)]
mod tests {
    #[test]
    fn hf_names_follow_the_transformers_layout() {
        assert_eq!(
            super::hf_name("blk.12.attn_q.bias"),
            "model.layers.12.self_attn.q_proj.bias"
        );
        assert_eq!(
            super::hf_name("blk.0.ffn_down.weight"),
            "model.layers.0.mlp.down_proj.weight"
        );
        assert_eq!(
            super::hf_name("token_embd.weight"),
            "model.embed_tokens.weight"
        );
    }
}
