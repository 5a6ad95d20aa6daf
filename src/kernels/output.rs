//! The output of one product, written by parallel tasks that own disjoint columns.

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

/// A new `m × n` output, every element of which `write` sets (through [`Out::set`]) before it returns.
/// The buffer is not zeroed first: the kernels overwrite it all, and zeroing a 512-token prefill's
/// outputs was about 0.5% of its time (profile, Qwen2.5-Coder-1.5B). With debug assertions (the test
/// profile) it starts as NaN instead, so an element a kernel leaves unset fails the tests' comparisons.
///
/// # Safety
/// `write` sets every element of the `m × n` output.
pub unsafe fn written(m: usize, n: usize, write: impl FnOnce(&Out)) -> Vec<f32> {
    let len = m * n;
    let mut buf = Vec::<f32>::with_capacity(len);
    if cfg!(debug_assertions) {
        buf.resize(len, f32::NAN);
    }
    // The pointer is valid for the whole capacity, whatever the length.
    write(&Out(buf.as_mut_ptr(), n));
    // SAFETY: `write` set all `len` elements (the caller's contract).
    unsafe { buf.set_len(len) };
    buf
}
