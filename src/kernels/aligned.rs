//! Byte buffers that start on a 64-byte boundary, for the kernels' 32-byte loads.
//!
//! Why it exists: `Vec<u8>` starts wherever the allocator puts it (16-byte boundaries with glibc), so
//! half of the kernels' 32-byte loads of activations or decoded weights could straddle two cache
//! lines, or none, depending on what else the process had allocated before, and a change that only
//! removed an unrelated allocation moved decoding speed by a quarter (docs/kernels.md); with every
//! such buffer aligned, its speed no longer depends on the heap's layout.

use std::marker::PhantomData;

/// A 64-byte line: the unit of storage.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
struct Line([u8; 64]);

/// The element types an [`AlignedBytes`] holds: plain bytes, any bit pattern valid.
pub trait Byte: Copy + Default + 'static {}
impl Byte for u8 {}
impl Byte for i8 {}

/// A growable buffer of bytes (`u8` or `i8`) whose first element sits on a 64-byte boundary.
#[derive(Clone)]
pub struct AlignedBytes<T: Byte> {
    lines: Vec<Line>,
    len: usize,
    kind: PhantomData<T>,
}

impl<T: Byte> Default for AlignedBytes<T> {
    fn default() -> Self {
        Self {
            lines: Vec::new(),
            len: 0,
            kind: PhantomData,
        }
    }
}

impl<T: Byte> std::fmt::Debug for AlignedBytes<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBytes({} bytes)", self.len)
    }
}

impl<T: Byte> AlignedBytes<T> {
    /// `len` zero bytes.
    pub fn zeroed(len: usize) -> Self {
        let mut b = Self::default();
        b.resize(len);
        b
    }

    /// Grows (with zeros) or shrinks to `len` bytes; the start stays aligned.
    pub fn resize(&mut self, len: usize) {
        self.lines.resize(len.div_ceil(64), Line([0; 64]));
        if len > self.len {
            // Bytes past the old length may hold what a longer buffer left: zero them, as
            // `Vec::resize` would.
            let old = self.len;
            self.len = len;
            self[old..].fill(T::default());
        } else {
            self.len = len;
        }
    }
}

impl<T: Byte> std::ops::Deref for AlignedBytes<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: `lines` holds at least `len` initialised bytes, and `T` is a one-byte type for
        // which every bit pattern is valid.
        unsafe { std::slice::from_raw_parts(self.lines.as_ptr() as *const T, self.len) }
    }
}

impl<T: Byte> std::ops::DerefMut for AlignedBytes<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as for `deref`, uniquely borrowed.
        unsafe { std::slice::from_raw_parts_mut(self.lines.as_mut_ptr() as *mut T, self.len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starts_aligned_and_resizes_with_zeros() {
        let mut b = AlignedBytes::<i8>::zeroed(100);
        assert_eq!(b.as_ptr() as usize % 64, 0);
        assert_eq!(b.len(), 100);
        b.iter_mut().for_each(|v| *v = -1);
        b.resize(10);
        b.resize(130);
        assert_eq!(b.as_ptr() as usize % 64, 0);
        assert!(b[..10].iter().all(|&v| v == -1));
        assert!(b[10..].iter().all(|&v| v == 0), "grown bytes are zero");
    }
}
