//! CUDA backend (feature `cuda`): NVRTC-compiled f32 kernels, cuBLAS GEMMs and a GPU-resident
//! Llama / Qwen2 / Gemma 3 inference path ([`CudaModel`]).
//!
//! Loads the driver, NVRTC and cuBLAS dynamically (cudarc `fallback-dynamic-loading`), so the
//! crate builds without a CUDA toolkit. Without a driver every entry point returns
//! `ElmError::Cuda("no CUDA driver found ...")`; nothing panics ([`is_available`] probes with
//! `dlopen` first and guards the first driver call with `catch_unwind`).
//!
//! The public API is the traits of `backend.rs` ([`GpuBackend`], [`GpuDevice`], [`GpuKernels`],
//! [`GpuModel`]), shared verbatim with `src/cuda_stub/` (the twin compiled without the feature)
//! and implemented here by [`CudaBackend`]; the compiler keeps the two builds in step.
//!
//! Pieces:
//! - [`is_available`], [`device_count`]: probing (cached per process).
//! - [`CudaDevice`] ([`GpuDevice`]): context + one stream + cuBLAS handle; kernels are compiled
//!   by NVRTC once per process (PTX cache) and loaded into a device's context on first use.
//! - [`GpuBuffer`] ([`DeviceBuffer`]): an owned device allocation (`upload`, `zeros`, `write`,
//!   `download`).
//! - [`GpuKernels`]: shape-checked kernels on a device (the GPU tests call these).
//! - [`CudaModel`] ([`GpuModel`]): the inference path (`prefill`, `decode`, `reset`).
//! - [`bench`]: prefill/decode throughput, driven by `scripts/gpu-bench.sh`.
//! - [`DeviceSpec`]: parses `--device cpu|cuda|cuda:N`.

mod backend;
pub mod bench;
mod decoder;
mod device;
mod device_spec;
mod kernels;
mod model;
mod sources;

pub use backend::*;
pub use decoder::GpuDecoder;
pub use device::GpuScalar;
pub use device_spec::DeviceSpec;
pub use sources::{Kernel, KernelFile};

/// The real CUDA backend.
#[derive(Debug)]
pub struct CudaBackend;

/// The backend this build binds the public API to.
pub type ActiveBackend = CudaBackend;

impl GpuBackend for CudaBackend {
    const ENABLED: bool = true;
    type Device = device::CudaDevice;
    type Model = model::CudaModel;

    fn is_available() -> bool {
        device::is_available()
    }
    fn device_count() -> crate::error::Result<usize> {
        device::device_count()
    }
    fn compile_all_kernels() -> crate::error::Result<usize> {
        device::compile_all_kernels()
    }
}
