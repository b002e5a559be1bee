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
//!
//! Pieces:
//! - [`is_available`], [`device_count`]: probing (cached per process).
//! - [`CudaDevice`]: context + one stream + cuBLAS handle; kernels are compiled by NVRTC once per
//!   process (PTX cache) and loaded into a device's context on first use.
//! - [`GpuBuffer`]: an owned device allocation (`upload`, `zeros`, `write`, `download`).
//! - [`kernels_api`]: shape-checked wrappers of every kernel (the GPU tests call these).
//! - [`CudaModel`]: the inference path (`prefill(&[Vec<u32>])`, `decode(&[u32])`, `reset()`).
//! - [`bench`]: prefill/decode throughput, driven by `scripts/gpu-bench.sh`.
//! - [`DeviceSpec`]: parses `--device cpu|cuda|cuda:N`.

pub mod bench;
mod device;
mod device_spec;
pub mod kernels_api;
mod model;
mod sources;

pub use device::{
    compile_all_kernels, device_count, is_available, CudaDevice, GpuBuffer, GpuScalar,
};
pub use device_spec::DeviceSpec;
pub use kernels_api::RopeStyle;
pub use model::CudaModel;
pub use sources::{kernel_sources, source_of, KernelSource, KERNEL_SOURCES};

/// Whether this build has the real CUDA backend (`true`) or the stub (`false`).
pub const ENABLED: bool = true;
