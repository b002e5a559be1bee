//! Stub twin of the CUDA backend (built without the `cuda` feature): the same public API as
//! `src/cuda/`, so callers compile identically; every constructor returns `ElmError::Cuda`.
//! Device handles and buffers are uninhabited here, so functions taking them can never be reached.

use std::convert::Infallible;
use std::marker::PhantomData;

use ndarray::Array2;

use crate::error::{ElmError, Result};
use crate::model::{ModelConfig, ModelWeights};

#[path = "../cuda/bench.rs"]
pub mod bench;
#[path = "../cuda/device_spec.rs"]
mod device_spec;
#[path = "../cuda/sources.rs"]
mod sources;

pub use device_spec::DeviceSpec;

pub use sources::{kernel_sources, source_of, KernelSource, KERNEL_SOURCES};

/// Whether this build has the real CUDA backend (`true`) or the stub (`false`).
pub const ENABLED: bool = false;

/// Message of every error this stub returns.
pub const DISABLED_MSG: &str =
    "built without the `cuda` feature; rebuild with `cargo build --features cuda` to use the GPU";

fn disabled<T>() -> Result<T> {
    Err(ElmError::Cuda(DISABLED_MSG.to_string()))
}

/// Always `false` in this build.
pub fn is_available() -> bool {
    false
}

/// Always the "built without the `cuda` feature" error.
pub fn device_count() -> Result<usize> {
    disabled()
}

/// Always the "built without the `cuda` feature" error.
pub fn compile_all_kernels() -> Result<usize> {
    disabled()
}

/// Element types a [`GpuBuffer`] may hold.
pub trait GpuScalar: Copy + Default + Unpin + 'static {}
impl GpuScalar for f32 {}
impl GpuScalar for u32 {}

/// A device buffer (cannot exist in this build).
#[derive(Debug)]
pub struct GpuBuffer<T> {
    never: Infallible,
    _elem: PhantomData<T>,
}

impl<T> GpuBuffer<T> {
    /// Number of elements.
    pub fn len(&self) -> usize {
        match self.never {}
    }
    /// Whether the buffer holds no element.
    pub fn is_empty(&self) -> bool {
        match self.never {}
    }
}

/// A CUDA device handle (cannot exist in this build).
#[derive(Debug)]
pub struct CudaDevice {
    never: Infallible,
}

impl CudaDevice {
    /// Always the "built without the `cuda` feature" error.
    pub fn new(_ordinal: usize) -> Result<Self> {
        disabled()
    }
    pub fn ordinal(&self) -> usize {
        match self.never {}
    }
    pub fn name(&self) -> Result<String> {
        match self.never {}
    }
    pub fn set_tf32(&mut self, _on: bool) -> Result<()> {
        match self.never {}
    }
    pub fn tf32(&self) -> bool {
        match self.never {}
    }
    pub fn upload<T: GpuScalar>(&self, _host: &[T]) -> Result<GpuBuffer<T>> {
        match self.never {}
    }
    pub fn zeros<T: GpuScalar>(&self, _len: usize) -> Result<GpuBuffer<T>> {
        match self.never {}
    }
    pub fn write<T: GpuScalar>(&self, _host: &[T], _buf: &mut GpuBuffer<T>) -> Result<()> {
        match self.never {}
    }
    pub fn download<T: GpuScalar>(&self, _buf: &GpuBuffer<T>) -> Result<Vec<T>> {
        match self.never {}
    }
    pub fn synchronize(&self) -> Result<()> {
        match self.never {}
    }
}

/// GPU-resident decoder (cannot be constructed in this build).
#[derive(Debug)]
pub struct CudaModel {
    never: Infallible,
}

impl CudaModel {
    /// Always the "built without the `cuda` feature" error.
    pub fn new(
        _weights: &ModelWeights,
        _ordinal: usize,
        _max_batch: usize,
        _max_seq: usize,
    ) -> Result<Self> {
        disabled()
    }
    pub fn config(&self) -> &ModelConfig {
        match self.never {}
    }
    pub fn device(&self) -> &CudaDevice {
        match self.never {}
    }
    pub fn device_mut(&mut self) -> &mut CudaDevice {
        match self.never {}
    }
    pub fn seq_lens(&self) -> &[usize] {
        match self.never {}
    }
    pub fn reset(&mut self) {
        match self.never {}
    }
    pub fn prefill(&mut self, _tokens: &[Vec<u32>]) -> Result<Array2<f32>> {
        match self.never {}
    }
    pub fn decode(&mut self, _tokens: &[u32]) -> Result<Array2<f32>> {
        match self.never {}
    }
}

/// Pairing of the rotated coordinates in RoPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// HF layout: `(i, i + D/2)`.
    HalfSplit,
    /// GGUF / Meta layout: `(2i, 2i + 1)`.
    Interleaved,
}

/// Kernel wrappers; unreachable in this build (they need a [`CudaDevice`]).
#[allow(clippy::too_many_arguments)]
pub mod kernels_api {
    pub use super::RopeStyle;
    use super::{CudaDevice, GpuBuffer};
    use crate::error::Result;

    pub fn rmsnorm(
        dev: &CudaDevice,
        _x: &GpuBuffer<f32>,
        _weight: &GpuBuffer<f32>,
        _out: &mut GpuBuffer<f32>,
        _rows: usize,
        _eps: f32,
    ) -> Result<()> {
        match dev.never {}
    }
    pub fn rope(
        dev: &CudaDevice,
        _x: &mut GpuBuffer<f32>,
        _positions: &GpuBuffer<u32>,
        _rows: usize,
        _n_heads: usize,
        _head_dim: usize,
        _theta: f32,
        _style: RopeStyle,
    ) -> Result<()> {
        match dev.never {}
    }
    pub fn swiglu(
        dev: &CudaDevice,
        _gate: &GpuBuffer<f32>,
        _up: &GpuBuffer<f32>,
        _out: &mut GpuBuffer<f32>,
    ) -> Result<()> {
        match dev.never {}
    }
    pub fn add(dev: &CudaDevice, _x: &mut GpuBuffer<f32>, _y: &GpuBuffer<f32>) -> Result<()> {
        match dev.never {}
    }
    pub fn add_bias(
        dev: &CudaDevice,
        _x: &mut GpuBuffer<f32>,
        _bias: &GpuBuffer<f32>,
        _rows: usize,
    ) -> Result<()> {
        match dev.never {}
    }
    pub fn embedding(
        dev: &CudaDevice,
        _table: &GpuBuffer<f32>,
        _dim: usize,
        _tokens: &[u32],
        _out: &mut GpuBuffer<f32>,
    ) -> Result<()> {
        match dev.never {}
    }
    pub fn attention_prefill(
        dev: &CudaDevice,
        _q: &GpuBuffer<f32>,
        _k: &GpuBuffer<f32>,
        _v: &GpuBuffer<f32>,
        _out: &mut GpuBuffer<f32>,
        _seq_len: usize,
        _n_heads: usize,
        _n_kv_heads: usize,
        _head_dim: usize,
    ) -> Result<()> {
        match dev.never {}
    }
    pub fn attention_decode(
        dev: &CudaDevice,
        _q: &GpuBuffer<f32>,
        _k_cache: &GpuBuffer<f32>,
        _v_cache: &GpuBuffer<f32>,
        _out: &mut GpuBuffer<f32>,
        _slots: &[u32],
        _positions: &[u32],
        _n_heads: usize,
        _n_kv_heads: usize,
        _head_dim: usize,
        _max_seq: usize,
    ) -> Result<()> {
        match dev.never {}
    }
    pub fn softmax(
        dev: &CudaDevice,
        _x: &GpuBuffer<f32>,
        _out: &mut GpuBuffer<f32>,
        _rows: usize,
        _temperature: f32,
    ) -> Result<()> {
        match dev.never {}
    }
    pub fn argmax(
        dev: &CudaDevice,
        _x: &GpuBuffer<f32>,
        _out: &mut GpuBuffer<u32>,
        _rows: usize,
    ) -> Result<()> {
        match dev.never {}
    }
    pub fn sample(
        dev: &CudaDevice,
        _probs: &GpuBuffer<f32>,
        _uniforms: &GpuBuffer<f32>,
        _out: &mut GpuBuffer<u32>,
        _rows: usize,
    ) -> Result<()> {
        match dev.never {}
    }
    pub fn matmul_wt(
        dev: &CudaDevice,
        _x: &GpuBuffer<f32>,
        _w: &GpuBuffer<f32>,
        _out: &mut GpuBuffer<f32>,
        _rows: usize,
        _in_dim: usize,
        _out_dim: usize,
        _accumulate: bool,
    ) -> Result<()> {
        match dev.never {}
    }
    pub fn fixed_point_projection(
        dev: &CudaDevice,
        _z: &GpuBuffer<f32>,
        _h: &GpuBuffer<f32>,
        _w_z: &GpuBuffer<f32>,
        _w_h: &GpuBuffer<f32>,
        _bias: Option<&GpuBuffer<f32>>,
        _out: &mut GpuBuffer<f32>,
        _rows: usize,
        _z_dim: usize,
        _h_dim: usize,
        _out_dim: usize,
    ) -> Result<()> {
        match dev.never {}
    }
    pub fn anderson_mix(
        dev: &CudaDevice,
        _x_hist: &GpuBuffer<f32>,
        _f_hist: &GpuBuffer<f32>,
        _alpha: &GpuBuffer<f32>,
        _out: &mut GpuBuffer<f32>,
        _beta: f32,
    ) -> Result<()> {
        match dev.never {}
    }
}
