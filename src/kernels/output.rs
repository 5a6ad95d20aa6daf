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
            *self.0.add(r * self.1 + j) = v;
        }
    }
}
