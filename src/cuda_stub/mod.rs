//! Stub twin of the CUDA backend: same API, every entry point returns `ElmError::Cuda`.
