//! The GPU backend contract, shared verbatim by the real CUDA backend (`src/cuda/`) and the stub
//! compiled without the `cuda` feature (`src/cuda_stub/`).
//!
//! The public API of `elm::cuda` *is* these traits plus the aliases and free functions at the end
//! of this file, written once. Each build binds them to its own types through
//! `super::ActiveBackend: GpuBackend`, so a method added to a trait and not implemented by one of
//! the twins is a compile error (E0046), and the backends add no public inherent methods.
//! (Candle's "dummy backend" pattern: one trait, a real implementation and a stub whose
//! constructors return the typed "built without the `cuda` feature" error.)

use std::fmt::Debug;

use ndarray::Array2;

use super::{ActiveBackend, GpuScalar};
use crate::error::{ElmError, Result};
use crate::model::{ModelConfig, ModelWeights};

/// A compute backend: probing, and the types of its devices and models.
pub trait GpuBackend {
    /// Whether this is the real CUDA backend (`true`) or the stub (`false`).
    const ENABLED: bool;
    /// One device handle (context, stream, BLAS handle, loaded kernels).
    type Device: GpuDevice + GpuKernels;
    /// A GPU-resident decoder living on one `Device`.
    type Model: GpuModel<Device = Self::Device>;

    /// Whether a driver is present and reports at least one device. Never panics.
    fn is_available() -> bool;
    /// Number of devices, or the typed `ElmError::Cuda` saying why there are none.
    fn device_count() -> Result<usize>;
    /// Compiles every embedded kernel file; returns the number of files compiled.
    fn compile_all_kernels() -> Result<usize>;
}

/// A device allocation of `len()` elements.
pub trait DeviceBuffer: Send + Debug {
    /// Number of elements.
    fn len(&self) -> usize;
    /// Whether the buffer holds no element.
    fn is_empty(&self) -> bool;
}

/// One device: opening it, its settings, and moving data to and from it.
pub trait GpuDevice: Sized + Send + Debug {
    /// An owned allocation of `T`s on this device.
    type Buffer<T: GpuScalar>: DeviceBuffer;

    /// Opens device `ordinal`. Errors (never panics) without a driver, with an ordinal out of
    /// range, or without the BLAS library.
    fn new(ordinal: usize) -> Result<Self>;
    /// Device ordinal.
    fn ordinal(&self) -> usize;
    /// Marketing name of the device.
    fn name(&self) -> Result<String>;
    /// Lets GEMMs use TF32 tensor cores (about 1e-3 relative error; off by default).
    fn set_tf32(&mut self, on: bool) -> Result<()>;
    /// Whether TF32 GEMMs are enabled.
    fn tf32(&self) -> bool;
    /// Copies a non-empty host slice into a new device buffer.
    fn upload<T: GpuScalar>(&self, host: &[T]) -> Result<Self::Buffer<T>>;
    /// A new zero-filled device buffer of `len > 0` elements.
    fn zeros<T: GpuScalar>(&self, len: usize) -> Result<Self::Buffer<T>>;
    /// Overwrites the first `host.len()` elements of `buf`.
    fn write<T: GpuScalar>(&self, host: &[T], buf: &mut Self::Buffer<T>) -> Result<()>;
    /// Copies a device buffer back to the host (waits for all queued work).
    fn download<T: GpuScalar>(&self, buf: &Self::Buffer<T>) -> Result<Vec<T>>;
    /// Waits for all queued work; surfaces asynchronous kernel errors.
    fn synchronize(&self) -> Result<()>;
}

/// Pairing of the rotated coordinates in RoPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RopeStyle {
    /// HF layout: `(i, i + D/2)`.
    HalfSplit,
    /// GGUF / Meta layout: `(2i, 2i + 1)`.
    Interleaved,
}

/// A layer's attention heads: `n_heads` query heads sharing `n_kv_heads` key/value heads (GQA),
/// each `head_dim` wide (not always the model width over the heads: Gemma 3's are 256 wide).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttnHeads {
    pub n_heads: usize,
    pub n_kv_heads: usize,
    pub head_dim: usize,
}

impl AttnHeads {
    /// Width of a row of query (or output) heads, `H·D`.
    pub fn q_width(&self) -> usize {
        self.n_heads * self.head_dim
    }

    /// Width of a row of key (or value) heads, `KV·D`.
    pub fn kv_width(&self) -> usize {
        self.n_kv_heads * self.head_dim
    }

    /// Refuses K/V heads that do not divide the query heads evenly (`op` names the kernel).
    pub fn check(&self, op: &str) -> Result<()> {
        if self.n_kv_heads == 0 || !self.n_heads.is_multiple_of(self.n_kv_heads) {
            return Err(ElmError::shape(
                op,
                format!(
                    "{} KV heads do not divide {} query heads",
                    self.n_kv_heads, self.n_heads
                ),
            ));
        }
        Ok(())
    }
}

/// Shape-checked kernels on a device's buffers.
///
/// Every method only *queues* work on the device's stream; call [`GpuDevice::download`] or
/// [`GpuDevice::synchronize`] to wait. Shapes use `N` rows (tokens), `H` query heads, `KV`
/// key/value heads, `D` head dim, `T` sequence length.
#[allow(clippy::too_many_arguments)]
pub trait GpuKernels: GpuDevice {
    /// `[N, C] -> [N, C]`: `out = x / rms(x) * weight`, `C = weight.len()`.
    fn rmsnorm(
        &self,
        x: &Self::Buffer<f32>,
        weight: &Self::Buffer<f32>,
        out: &mut Self::Buffer<f32>,
        rows: usize,
        eps: f32,
    ) -> Result<()>;

    /// In place on `x: [N, H, D]`: rotates each row by its `positions[n]` (`positions: [N]`).
    fn rope(
        &self,
        x: &mut Self::Buffer<f32>,
        positions: &Self::Buffer<u32>,
        rows: usize,
        n_heads: usize,
        head_dim: usize,
        theta: f32,
        style: RopeStyle,
    ) -> Result<()>;

    /// `out = silu(gate) * up`, all `[n]`.
    fn swiglu(
        &self,
        gate: &Self::Buffer<f32>,
        up: &Self::Buffer<f32>,
        out: &mut Self::Buffer<f32>,
    ) -> Result<()>;

    /// Residual add `x += y`, both `[n]`.
    fn add(&self, x: &mut Self::Buffer<f32>, y: &Self::Buffer<f32>) -> Result<()>;

    /// `x[r, :] += bias` for `x: [rows, bias.len()]`.
    fn add_bias(
        &self,
        x: &mut Self::Buffer<f32>,
        bias: &Self::Buffer<f32>,
        rows: usize,
    ) -> Result<()>;

    /// Embedding gather: `out[n, :] = table[tokens[n], :]`, `table: [V, C]`, `out: [N, C]`.
    /// Token ids come from the host so they are range-checked before any device read.
    fn embedding(
        &self,
        table: &Self::Buffer<f32>,
        dim: usize,
        tokens: &[u32],
        out: &mut Self::Buffer<f32>,
    ) -> Result<()>;

    /// Causal GQA self-attention of one sequence: `q: [T, H, D]`, `k, v: [T, KV, D]` →
    /// `out: [T, H, D]`, query `t` attending to keys `0..=t`, scale `1/sqrt(D)`.
    fn attention_prefill(
        &self,
        q: &Self::Buffer<f32>,
        k: &Self::Buffer<f32>,
        v: &Self::Buffer<f32>,
        out: &mut Self::Buffer<f32>,
        seq_len: usize,
        heads: AttnHeads,
    ) -> Result<()>;

    /// Attention of `N` new query rows against a KV cache `[B, KV, T_max, D]`: row `n` belongs
    /// to sequence `slots[n]` at position `positions[n]` and attends to cached keys
    /// `0..=positions[n]` (its own K/V must already be in the cache). `q, out: [N, H, D]`.
    fn attention_decode(
        &self,
        q: &Self::Buffer<f32>,
        k_cache: &Self::Buffer<f32>,
        v_cache: &Self::Buffer<f32>,
        out: &mut Self::Buffer<f32>,
        slots: &[u32],
        positions: &[u32],
        heads: AttnHeads,
        max_seq: usize,
    ) -> Result<()>;

    /// Row-wise `softmax(x / temperature)`, `x, out: [rows, cols]`.
    fn softmax(
        &self,
        x: &Self::Buffer<f32>,
        out: &mut Self::Buffer<f32>,
        rows: usize,
        temperature: f32,
    ) -> Result<()>;

    /// Row-wise argmax (first maximum), `x: [rows, cols]`, `out: [rows]`.
    fn argmax(&self, x: &Self::Buffer<f32>, out: &mut Self::Buffer<u32>, rows: usize)
        -> Result<()>;

    /// Inverse-CDF sampling: `out[r]` = first `i` with
    /// `cumsum(probs[r, ..=i]) > u[r] * sum(probs[r, :])`. `probs: [rows, cols]` non-negative
    /// (need not be normalised), `uniforms: [rows]` in `[0, 1)`.
    fn sample(
        &self,
        probs: &Self::Buffer<f32>,
        uniforms: &Self::Buffer<f32>,
        out: &mut Self::Buffer<u32>,
        rows: usize,
    ) -> Result<()>;

    /// `out = x · wᵀ` (+ `out` when `accumulate`), `x: [rows, in_dim]`, `w: [out_dim, in_dim]`
    /// (PyTorch `nn.Linear` layout), `out: [rows, out_dim]`. f32 (TF32 if enabled).
    fn matmul_wt(
        &self,
        x: &Self::Buffer<f32>,
        w: &Self::Buffer<f32>,
        out: &mut Self::Buffer<f32>,
        rows: usize,
        in_dim: usize,
        out_dim: usize,
        accumulate: bool,
    ) -> Result<()>;

    /// The fixed-point module's input projection `u = z W_zᵀ + h W_hᵀ + b`.
    /// `z: [rows, z_dim]`, `h: [rows, h_dim]`, `w_z: [out_dim, z_dim]`, `w_h: [out_dim, h_dim]`,
    /// `bias: [out_dim]`, `out: [rows, out_dim]`.
    fn fixed_point_projection(
        &self,
        z: &Self::Buffer<f32>,
        h: &Self::Buffer<f32>,
        w_z: &Self::Buffer<f32>,
        w_h: &Self::Buffer<f32>,
        bias: Option<&Self::Buffer<f32>>,
        out: &mut Self::Buffer<f32>,
        rows: usize,
        z_dim: usize,
        h_dim: usize,
        out_dim: usize,
    ) -> Result<()>;

    /// Anderson mixing: `out[j] = Σ_i alpha[i] ((1-β) x_hist[i, j] + β f_hist[i, j])`,
    /// `x_hist, f_hist: [m, n]`, `alpha: [m]`, `out: [n]`.
    fn anderson_mix(
        &self,
        x_hist: &Self::Buffer<f32>,
        f_hist: &Self::Buffer<f32>,
        alpha: &Self::Buffer<f32>,
        out: &mut Self::Buffer<f32>,
        beta: f32,
    ) -> Result<()>;
}

/// A Llama / Qwen2 / Gemma 3 decoder whose weights, KV cache and activations live on one device.
///
/// Usage: [`GpuModel::prefill`] with up to `max_batch` prompts (this resets the cache), then
/// [`GpuModel::decode`] with one token per prompt, repeatedly.
pub trait GpuModel: Sized + Send + Debug {
    /// The device the model lives on.
    type Device: GpuDevice;

    /// Uploads `weights` to device `ordinal` and allocates a KV cache for `max_batch` sequences
    /// of up to `max_seq` tokens. Malformed weights give `ElmError::Tensor`/`Config` naming the
    /// field, bad sizes `InvalidArgument`; then, without a device, `ElmError::Cuda`.
    fn new(
        weights: &ModelWeights,
        ordinal: usize,
        max_batch: usize,
        max_seq: usize,
    ) -> Result<Self>;
    /// The model's configuration.
    fn config(&self) -> &ModelConfig;
    /// The device the model lives on (e.g. to enable TF32 or read its name).
    fn device(&self) -> &Self::Device;
    /// Mutable device access (e.g. [`GpuDevice::set_tf32`]).
    fn device_mut(&mut self) -> &mut Self::Device;
    /// Tokens held in the cache for each active sequence.
    fn seq_lens(&self) -> &[usize];
    /// Forgets all sequences (the cache memory is kept and overwritten by the next prefill).
    fn reset(&mut self);
    /// Starts `tokens.len() ≤ max_batch` new sequences (discarding any previous ones) and runs
    /// their prompts. Returns the logits at each prompt's last position, `[B, V]`.
    fn prefill(&mut self, tokens: &[Vec<u32>]) -> Result<Array2<f32>>;
    /// Appends one token to each active sequence; returns the next-token logits `[B, V]`.
    fn decode(&mut self, tokens: &[u32]) -> Result<Array2<f32>>;
}

// ------------------------------------------------------------------------------------------------
// The public names of `elm::cuda`, bound to this build's backend.
// ------------------------------------------------------------------------------------------------

/// Whether this build has the real CUDA backend (`true`) or the stub (`false`).
pub const ENABLED: bool = <ActiveBackend as GpuBackend>::ENABLED;

/// This build's device handle.
pub type CudaDevice = <ActiveBackend as GpuBackend>::Device;

/// This build's device buffer of `T`s.
pub type GpuBuffer<T> = <CudaDevice as GpuDevice>::Buffer<T>;

/// This build's GPU-resident decoder.
pub type CudaModel = <ActiveBackend as GpuBackend>::Model;

/// Whether a CUDA driver is present and reports at least one device. Never panics.
pub fn is_available() -> bool {
    <ActiveBackend as GpuBackend>::is_available()
}

/// Number of CUDA devices; a typed `ElmError::Cuda` without a driver (or in the stub build).
pub fn device_count() -> Result<usize> {
    <ActiveBackend as GpuBackend>::device_count()
}

/// Compiles every embedded kernel file with NVRTC (needs libnvrtc, not a GPU or driver).
/// Returns the number of files compiled.
pub fn compile_all_kernels() -> Result<usize> {
    <ActiveBackend as GpuBackend>::compile_all_kernels()
}

/// The kernel API under its historical path (`elm::cuda::kernels_api`).
pub mod kernels_api {
    pub use super::{GpuKernels, RopeStyle};
}
