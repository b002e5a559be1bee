//! Stub twin of the CUDA backend, compiled without the `cuda` feature.
//!
//! It implements the same traits as `src/cuda/` (the shared `src/cuda/backend.rs`), so the
//! compiler checks that both builds offer the same API: a trait method missing here does not
//! compile. Probing and every constructor return the typed "built without the `cuda` feature"
//! error. Device handles, buffers and models are uninhabited, so methods taking them can never
//! be reached (`match self.never {}`).

use std::convert::Infallible;
use std::marker::PhantomData;

use ndarray::Array2;

use crate::error::{ElmError, Result};
use crate::model::{ModelConfig, ModelWeights};

#[path = "../cuda/backend.rs"]
mod backend;
#[path = "../cuda/bench.rs"]
pub mod bench;
#[path = "../cuda/decoder.rs"]
mod decoder;
#[path = "../cuda/device_spec.rs"]
mod device_spec;
#[path = "../cuda/sources.rs"]
mod sources;

pub use backend::*;
pub use decoder::GpuDecoder;
pub use device_spec::DeviceSpec;
pub use sources::{Kernel, KernelFile};

/// Message of every error this stub returns.
pub const DISABLED_MSG: &str =
    "built without the `cuda` feature; rebuild with `cargo build --features cuda` to use the GPU";

fn disabled<T>() -> Result<T> {
    Err(ElmError::Cuda(DISABLED_MSG.to_string()))
}

/// Element types a device buffer may hold.
pub trait GpuScalar: Copy + Default + Unpin + Send + Sync + std::fmt::Debug + 'static {}
impl GpuScalar for f32 {}
impl GpuScalar for u32 {}

/// The backend of a build without the `cuda` feature: no device can exist.
#[derive(Debug)]
pub struct DisabledBackend;

/// The backend this build binds the public API to.
pub type ActiveBackend = DisabledBackend;

impl GpuBackend for DisabledBackend {
    const ENABLED: bool = false;
    type Device = DisabledDevice;
    type Model = DisabledModel;

    fn is_available() -> bool {
        false
    }
    fn device_count() -> Result<usize> {
        disabled()
    }
    fn compile_all_kernels() -> Result<usize> {
        disabled()
    }
}

/// A device buffer (cannot exist in this build).
#[derive(Debug)]
pub struct DisabledBuffer<T> {
    never: Infallible,
    _elem: PhantomData<T>,
}

impl<T: GpuScalar> DeviceBuffer for DisabledBuffer<T> {
    fn len(&self) -> usize {
        match self.never {}
    }
    fn is_empty(&self) -> bool {
        match self.never {}
    }
}

/// A device handle (cannot exist in this build).
#[derive(Debug)]
pub struct DisabledDevice {
    never: Infallible,
}

impl GpuDevice for DisabledDevice {
    type Buffer<T: GpuScalar> = DisabledBuffer<T>;

    fn new(_ordinal: usize) -> Result<Self> {
        disabled()
    }
    fn ordinal(&self) -> usize {
        match self.never {}
    }
    fn name(&self) -> Result<String> {
        match self.never {}
    }
    fn set_tf32(&mut self, _on: bool) -> Result<()> {
        match self.never {}
    }
    fn tf32(&self) -> bool {
        match self.never {}
    }
    fn upload<T: GpuScalar>(&self, _host: &[T]) -> Result<DisabledBuffer<T>> {
        match self.never {}
    }
    fn zeros<T: GpuScalar>(&self, _len: usize) -> Result<DisabledBuffer<T>> {
        match self.never {}
    }
    fn write<T: GpuScalar>(&self, _host: &[T], _buf: &mut DisabledBuffer<T>) -> Result<()> {
        match self.never {}
    }
    fn download<T: GpuScalar>(&self, _buf: &DisabledBuffer<T>) -> Result<Vec<T>> {
        match self.never {}
    }
    fn synchronize(&self) -> Result<()> {
        match self.never {}
    }
}

/// Shorthand for the stub's f32 buffer in the kernel signatures below.
type Buf = DisabledBuffer<f32>;

impl GpuKernels for DisabledDevice {
    fn rmsnorm(&self, _: &Buf, _: &Buf, _: &mut Buf, _: usize, _: f32) -> Result<()> {
        match self.never {}
    }
    fn rope(
        &self,
        _: &mut Buf,
        _: &DisabledBuffer<u32>,
        _: usize,
        _: usize,
        _: usize,
        _: f32,
        _: RopeStyle,
    ) -> Result<()> {
        match self.never {}
    }
    fn swiglu(&self, _: &Buf, _: &Buf, _: &mut Buf) -> Result<()> {
        match self.never {}
    }
    fn add(&self, _: &mut Buf, _: &Buf) -> Result<()> {
        match self.never {}
    }
    fn add_bias(&self, _: &mut Buf, _: &Buf, _: usize) -> Result<()> {
        match self.never {}
    }
    fn embedding(&self, _: &Buf, _: usize, _: &[u32], _: &mut Buf) -> Result<()> {
        match self.never {}
    }
    fn attention_prefill(
        &self,
        _: &Buf,
        _: &Buf,
        _: &Buf,
        _: &mut Buf,
        _: usize,
        _: AttnHeads,
    ) -> Result<()> {
        match self.never {}
    }
    fn attention_decode(
        &self,
        _: &Buf,
        _: &Buf,
        _: &Buf,
        _: &mut Buf,
        _: &[u32],
        _: &[u32],
        _: AttnHeads,
        _: usize,
    ) -> Result<()> {
        match self.never {}
    }
    fn softmax(&self, _: &Buf, _: &mut Buf, _: usize, _: f32) -> Result<()> {
        match self.never {}
    }
    fn argmax(&self, _: &Buf, _: &mut DisabledBuffer<u32>, _: usize) -> Result<()> {
        match self.never {}
    }
    fn sample(&self, _: &Buf, _: &Buf, _: &mut DisabledBuffer<u32>, _: usize) -> Result<()> {
        match self.never {}
    }
    fn matmul_wt(
        &self,
        _: &Buf,
        _: &Buf,
        _: &mut Buf,
        _: usize,
        _: usize,
        _: usize,
        _: bool,
    ) -> Result<()> {
        match self.never {}
    }
    fn fixed_point_projection(
        &self,
        _: &Buf,
        _: &Buf,
        _: &Buf,
        _: &Buf,
        _: Option<&Buf>,
        _: &mut Buf,
        _: usize,
        _: usize,
        _: usize,
        _: usize,
    ) -> Result<()> {
        match self.never {}
    }
    fn anderson_mix(&self, _: &Buf, _: &Buf, _: &Buf, _: &mut Buf, _: f32) -> Result<()> {
        match self.never {}
    }
}

/// GPU-resident decoder (cannot be constructed in this build).
#[derive(Debug)]
pub struct DisabledModel {
    never: Infallible,
}

impl GpuModel for DisabledModel {
    type Device = DisabledDevice;

    fn new(_: &ModelWeights, _: usize, _: usize, _: usize) -> Result<Self> {
        disabled()
    }
    fn config(&self) -> &ModelConfig {
        match self.never {}
    }
    fn device(&self) -> &DisabledDevice {
        match self.never {}
    }
    fn device_mut(&mut self) -> &mut DisabledDevice {
        match self.never {}
    }
    fn seq_lens(&self) -> &[usize] {
        match self.never {}
    }
    fn reset(&mut self) {
        match self.never {}
    }
    fn prefill(&mut self, _: &[Vec<u32>]) -> Result<Array2<f32>> {
        match self.never {}
    }
    fn decode(&mut self, _: &[u32]) -> Result<Array2<f32>> {
        match self.never {}
    }
}
