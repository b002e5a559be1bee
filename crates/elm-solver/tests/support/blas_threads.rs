//! Test setup shared by the test files that build the canonical problems (included with
//! `#[path]`).

#[cfg(feature = "lapack")]
extern "C" {
    fn openblas_set_num_threads(n: std::os::raw::c_int);
}

/// With `lapack` (the workspace build, where ndarray calls the system OpenBLAS): that OpenBLAS
/// (pthreads build) crashes (SIGSEGV) when several test threads call it concurrently with its own
/// thread pool on; single-threaded BLAS is safe. Every test that builds a problem calls this
/// first.
pub fn setup() {
    #[cfg(feature = "lapack")]
    {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| unsafe { openblas_set_num_threads(1) });
    }
}
