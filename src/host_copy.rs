//! Copies of tensors into host memory, counted. On a GPU each is a transfer and a wait for the
//! device, and the GPU path's rule is that no decoding step copies the cache or a full attention
//! matrix to the host: the engine, the cache and the policies copy through these functions, so
//! `perf` can show the copies and bytes of a decoding step on a device, and a test can hold a step
//! to what it must copy (the tokens it chose). Counted where data is read into host memory, on
//! every device (on the CPU, running the path a GPU takes, a "copy" is a tensor read into a `Vec`),
//! in totals for the whole process. A tensor moved to the CPU as a tensor (`to_device`) is counted
//! where it is read, once; read in parts, it counts its parts as copies: the bytes are exact, the
//! count of transfers may be higher than a GPU's.

use candle_core::{Tensor, WithDType};
use std::sync::atomic::{AtomicU64, Ordering};

static COPIES: AtomicU64 = AtomicU64::new(0);
static BYTES: AtomicU64 = AtomicU64::new(0);

/// Copies made and bytes copied, since the process started or between two [`counted`] readings.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Copies {
    pub copies: u64,
    pub bytes: u64,
}

impl std::ops::Sub for Copies {
    type Output = Copies;

    fn sub(self, earlier: Copies) -> Copies {
        Copies {
            copies: self.copies.saturating_sub(earlier.copies),
            bytes: self.bytes.saturating_sub(earlier.bytes),
        }
    }
}

/// The totals so far.
pub fn counted() -> Copies {
    Copies {
        copies: COPIES.load(Ordering::Relaxed),
        bytes: BYTES.load(Ordering::Relaxed),
    }
}

fn note(t: &Tensor) {
    COPIES.fetch_add(1, Ordering::Relaxed);
    let bytes = t.elem_count() * t.dtype().size_in_bytes();
    BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// `t` (any shape) as a flat vector of `T`, its element type.
pub fn flat<T: WithDType>(t: &Tensor) -> candle_core::Result<Vec<T>> {
    let t = t.flatten_all()?;
    note(&t);
    t.to_vec1()
}

/// `t` (any shape) as a flat vector of f32, converted where it is before the copy.
pub fn flat_f32(t: &Tensor) -> candle_core::Result<Vec<f32>> {
    flat(&t.to_dtype(candle_core::DType::F32)?)
}

/// A matrix `t` as rows of `T`.
pub fn rows<T: WithDType>(t: &Tensor) -> candle_core::Result<Vec<Vec<T>>> {
    note(t);
    t.to_vec2()
}

#[cfg(test)]
mod tests {
    use candle_core::{DType, Device, Tensor};

    #[test]
    fn copies_count_their_bytes_in_the_copied_type() {
        let before = super::counted();
        let t = Tensor::ones((3, 4), DType::BF16, &Device::Cpu).unwrap();
        assert_eq!(super::flat_f32(&t).unwrap().len(), 12);
        assert_eq!(super::rows::<half::bf16>(&t).unwrap().len(), 3);
        let d = super::counted() - before;
        // Other tests of this process may copy meanwhile: at least these two.
        assert!(d.copies >= 2 && d.bytes >= 12 * 4 + 12 * 2, "{d:?}");
    }
}
