//! Which kernel families ran, counted per thread in test builds only (nothing in a release binary):
//! a test that checks a path asserts that path ran, rather than passing where the CPU lacks its
//! instructions or the dispatch fell back to another path.

use std::cell::Cell;

/// A family of kernels, by the instructions it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    Portable,
    Avx2,
    Avx512,
    Vnni,
    Gfni,
}

impl Kernel {
    /// The name `KVBENCH_REQUIRE` uses.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Portable => "portable",
            Kernel::Avx2 => "avx2",
            Kernel::Avx512 => "avx512",
            Kernel::Vnni => "vnni",
            Kernel::Gfni => "gfni",
        }
    }
}

thread_local! {
    static COUNTS: Cell<[usize; 5]> = const { Cell::new([0; 5]) };
}

/// Counts one call of a `kernel` on this thread.
pub fn mark(kernel: Kernel) {
    COUNTS.with(|c| {
        let mut a = c.get();
        a[kernel as usize] += 1;
        c.set(a);
    });
}

/// This thread's counts since the last call, indexed by `Kernel as usize`.
pub fn take() -> [usize; 5] {
    COUNTS.with(|c| c.replace([0; 5]))
}
