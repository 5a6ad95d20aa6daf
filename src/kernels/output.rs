//! The output of one product, written by parallel tasks that own disjoint columns.

use std::mem::MaybeUninit;

/// The output matrix (`m × n`, row-major), written by tasks that own disjoint columns.
pub struct Out(*mut f32, usize);
// SAFETY: tasks write disjoint columns of the output through this pointer.
unsafe impl Sync for Out {}
unsafe impl Send for Out {}

impl Out {
    /// The output `buf` of `n` columns.
    pub fn new(buf: &mut [f32], n: usize) -> Self {
        Self(buf.as_mut_ptr(), n)
    }

    /// Writes element (`r`, `j`).
    ///
    /// # Safety
    /// (`r`, `j`) is inside the `m × n` output and column `j` is written by the caller's task only.
    #[inline(always)]
    pub unsafe fn set(&self, r: usize, j: usize, v: f32) {
        unsafe {
            self.0.add(r * self.1 + j).write(v);
        }
    }
}

/// A new buffer of `len` values that `fill` writes whole before it returns. Not zeroed first (zeroing
/// the outputs a 512-token prefill overwrites was ~0.5% of its time, profile of Qwen2.5-Coder-1.5B).
/// With debug assertions (the test profile, where CI runs the kernel and fused-operation tests) it
/// starts as NaN instead, so a value left unwritten fails the tests' comparisons.
///
/// # Safety
/// `fill` writes every value of the slice it is given.
pub unsafe fn unzeroed(len: usize, fill: impl FnOnce(&mut [MaybeUninit<f32>])) -> Vec<f32> {
    let mut buf = Vec::<f32>::with_capacity(len);
    if cfg!(debug_assertions) {
        buf.resize(len, f32::NAN);
        buf.clear();
    }
    fill(&mut buf.spare_capacity_mut()[..len]);
    // SAFETY: `fill` wrote all `len` values (the caller's contract).
    unsafe { buf.set_len(len) };
    buf
}

/// A new `m × n` output, every element of which `write` sets (through [`Out::set`]) before it
/// returns ([`unzeroed`]).
///
/// # Safety
/// `write` sets every element of the `m × n` output.
pub unsafe fn written(m: usize, n: usize, write: impl FnOnce(&Out)) -> Vec<f32> {
    // SAFETY: `write` sets every element (the caller's contract).
    unsafe { unzeroed(m * n, |buf| write(&Out(buf.as_mut_ptr().cast(), n))) }
}
