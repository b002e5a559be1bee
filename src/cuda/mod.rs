//! CUDA backend (feature `cuda`): NVRTC-compiled f32 kernels, cuBLAS GEMMs and a GPU-resident
//! Llama/Qwen2 inference path ([`CudaModel`]).
//!
//! Loads the driver, NVRTC and cuBLAS dynamically (cudarc `fallback-dynamic-loading`), so the
//! crate builds without a CUDA toolkit. Without a driver every entry point returns
//! `ElmError::Cuda("no CUDA driver found ...")`; nothing panics ([`is_available`] probes with
//! `dlopen` first and guards the first driver call with `catch_unwind`).
//!
//! `src/cuda_stub/mod.rs` is the twin compiled without the feature: same public API, every
//! constructor returns "built without the `cuda` feature".

pub mod bench;
mod device;
pub mod kernels_api;
mod model;
mod sources;

pub use device::{
    compile_all_kernels, device_count, is_available, CudaDevice, GpuBuffer, GpuScalar,
};
pub use kernels_api::RopeStyle;
pub use model::CudaModel;
pub use sources::{kernel_sources, source_of, KernelSource, KERNEL_SOURCES};

/// Whether this build has the real CUDA backend (`true`) or the stub (`false`).
pub const ENABLED: bool = true;
