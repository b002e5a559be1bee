//! [`GpuKernels`] for [`CudaDevice`]: thin, shape-checked wrappers over the NVRTC kernels and
//! cuBLAS (contracts and shapes are documented on the trait), and the raw launchers they share
//! with the model.

use cudarc::cublas::{sys::cublasOperation_t, Gemm, GemmConfig};
use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

use super::backend::{AttnHeads, DeviceBuffer, GpuDevice, GpuKernels, RopeStyle};
use super::device::{cuda_err, elems_cfg, row_threads, rows_cfg, CudaDevice, GpuBuffer};
use super::sources::Kernel;
use crate::error::{ElmError, Result};

fn check_len(op: &str, what: &str, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(ElmError::shape(
            op,
            format!("{what} has {got} elements, expected {want}"),
        ));
    }
    Ok(())
}

fn i32_arg(op: &str, what: &str, v: usize) -> Result<i32> {
    i32::try_from(v).map_err(|_| ElmError::shape(op, format!("{what} = {v} exceeds i32")))
}

impl GpuKernels for CudaDevice {
    fn rmsnorm(
        &self,
        x: &GpuBuffer<f32>,
        weight: &GpuBuffer<f32>,
        out: &mut GpuBuffer<f32>,
        rows: usize,
        eps: f32,
    ) -> Result<()> {
        let cols = weight.len();
        check_len("rmsnorm", "x", x.len(), rows * cols)?;
        check_len("rmsnorm", "out", out.len(), rows * cols)?;
        raw::rmsnorm(
            self,
            &x.slice.as_view(),
            &weight.slice.as_view(),
            &mut out.slice.as_view_mut(),
            rows,
            cols,
            eps,
        )
    }

    fn rope(
        &self,
        x: &mut GpuBuffer<f32>,
        positions: &GpuBuffer<u32>,
        rows: usize,
        n_heads: usize,
        head_dim: usize,
        theta: f32,
        style: RopeStyle,
    ) -> Result<()> {
        if !head_dim.is_multiple_of(2) {
            return Err(ElmError::shape("rope", "head_dim must be even"));
        }
        check_len("rope", "x", x.len(), rows * n_heads * head_dim)?;
        check_len("rope", "positions", positions.len(), rows)?;
        raw::rope(
            self,
            &mut x.slice.as_view_mut(),
            &positions.slice.as_view(),
            rows,
            n_heads * head_dim,
            n_heads,
            head_dim,
            theta,
            style,
        )
    }

    fn swiglu(
        &self,
        gate: &GpuBuffer<f32>,
        up: &GpuBuffer<f32>,
        out: &mut GpuBuffer<f32>,
    ) -> Result<()> {
        let n = gate.len();
        check_len("swiglu", "up", up.len(), n)?;
        check_len("swiglu", "out", out.len(), n)?;
        raw::gated_activation(
            self,
            crate::model::config::Activation::SwiGlu,
            &gate.slice.as_view(),
            &up.slice.as_view(),
            &mut out.slice.as_view_mut(),
            1,
            n,
            n,
        )
    }

    fn add(&self, x: &mut GpuBuffer<f32>, y: &GpuBuffer<f32>) -> Result<()> {
        let n = x.len();
        check_len("add", "y", y.len(), n)?;
        raw::add(self, &mut x.slice.as_view_mut(), &y.slice.as_view(), n)
    }

    fn add_bias(&self, x: &mut GpuBuffer<f32>, bias: &GpuBuffer<f32>, rows: usize) -> Result<()> {
        check_len("add_bias", "x", x.len(), rows * bias.len())?;
        raw::add_bias(
            self,
            &mut x.slice.as_view_mut(),
            &bias.slice.as_view(),
            rows,
            bias.len(),
        )
    }

    fn embedding(
        &self,
        table: &GpuBuffer<f32>,
        dim: usize,
        tokens: &[u32],
        out: &mut GpuBuffer<f32>,
    ) -> Result<()> {
        if dim == 0 || !table.len().is_multiple_of(dim) {
            return Err(ElmError::shape(
                "embedding",
                format!("table of {} elements is not [V, {dim}]", table.len()),
            ));
        }
        let vocab = table.len() / dim;
        if let Some(&t) = tokens.iter().find(|&&t| t as usize >= vocab) {
            return Err(ElmError::InvalidArgument(format!(
                "token id {t} out of range for vocabulary of {vocab}"
            )));
        }
        check_len("embedding", "out", out.len(), tokens.len() * dim)?;
        let idx = self.upload(tokens)?;
        raw::gather_rows(
            self,
            &table.slice.as_view(),
            &idx.slice.as_view(),
            &mut out.slice.as_view_mut(),
            tokens.len(),
            dim,
            1.0,
        )
    }

    fn attention_prefill(
        &self,
        q: &GpuBuffer<f32>,
        k: &GpuBuffer<f32>,
        v: &GpuBuffer<f32>,
        out: &mut GpuBuffer<f32>,
        seq_len: usize,
        heads: AttnHeads,
    ) -> Result<()> {
        heads.check("attention_prefill")?;
        let (q_rows, kv_rows) = (seq_len * heads.q_width(), seq_len * heads.kv_width());
        for (name, len, want) in [
            ("q", q.len(), q_rows),
            ("k", k.len(), kv_rows),
            ("v", v.len(), kv_rows),
            ("out", out.len(), q_rows),
        ] {
            check_len("attention_prefill", name, len, want)?;
        }
        let AttnHeads {
            n_heads,
            n_kv_heads,
            head_dim,
        } = heads;
        let pos: Vec<u32> = (0..seq_len as u32).collect();
        let slots = vec![0u32; seq_len];
        let pos_d = self.upload(&pos)?;
        let slot_d = self.upload(&slots)?;
        let geom = raw::AttnGeometry {
            rows: seq_len,
            q_stride: n_heads * head_dim,
            out_stride: n_heads * head_dim,
            n_heads,
            n_kv_heads,
            head_dim,
            slot_stride: 0,
            head_stride: head_dim,
            key_stride: n_kv_heads * head_dim,
            max_len: seq_len,
            window: None,
        };
        raw::attention(
            self,
            &q.slice.as_view(),
            &k.slice.as_view(),
            &v.slice.as_view(),
            &mut out.slice.as_view_mut(),
            &slot_d.slice.as_view(),
            &pos_d.slice.as_view(),
            &geom,
        )
    }

    fn attention_decode(
        &self,
        q: &GpuBuffer<f32>,
        k_cache: &GpuBuffer<f32>,
        v_cache: &GpuBuffer<f32>,
        out: &mut GpuBuffer<f32>,
        slots: &[u32],
        positions: &[u32],
        heads: AttnHeads,
        max_seq: usize,
    ) -> Result<()> {
        heads.check("attention_decode")?;
        let rows = slots.len();
        check_len("attention_decode", "positions", positions.len(), rows)?;
        check_len("attention_decode", "q", q.len(), rows * heads.q_width())?;
        check_len("attention_decode", "out", out.len(), rows * heads.q_width())?;
        let AttnHeads {
            n_heads,
            n_kv_heads,
            head_dim,
        } = heads;
        let per_slot = n_kv_heads * max_seq * head_dim;
        if per_slot == 0
            || !k_cache.len().is_multiple_of(per_slot)
            || v_cache.len() != k_cache.len()
        {
            return Err(ElmError::shape(
                "attention_decode",
                format!(
                    "caches of {} / {} elements are not [B, {n_kv_heads}, {max_seq}, {head_dim}]",
                    k_cache.len(),
                    v_cache.len()
                ),
            ));
        }
        let batch = k_cache.len() / per_slot;
        for (&s, &p) in slots.iter().zip(positions) {
            if s as usize >= batch || p as usize >= max_seq {
                return Err(ElmError::InvalidArgument(format!(
                    "slot {s} / position {p} outside cache of batch {batch}, max_seq {max_seq}"
                )));
            }
        }
        let max_len = positions.iter().map(|&p| p as usize + 1).max().unwrap_or(1);
        let pos_d = self.upload(positions)?;
        let slot_d = self.upload(slots)?;
        let geom = raw::AttnGeometry {
            rows,
            q_stride: n_heads * head_dim,
            out_stride: n_heads * head_dim,
            n_heads,
            n_kv_heads,
            head_dim,
            slot_stride: per_slot,
            head_stride: max_seq * head_dim,
            key_stride: head_dim,
            max_len,
            window: None,
        };
        raw::attention(
            self,
            &q.slice.as_view(),
            &k_cache.slice.as_view(),
            &v_cache.slice.as_view(),
            &mut out.slice.as_view_mut(),
            &slot_d.slice.as_view(),
            &pos_d.slice.as_view(),
            &geom,
        )
    }

    fn softmax(
        &self,
        x: &GpuBuffer<f32>,
        out: &mut GpuBuffer<f32>,
        rows: usize,
        temperature: f32,
    ) -> Result<()> {
        if !(temperature.is_finite() && temperature > 0.0) {
            return Err(ElmError::InvalidArgument(format!(
                "softmax temperature {temperature} must be finite and > 0"
            )));
        }
        if rows == 0 || !x.len().is_multiple_of(rows) {
            return Err(ElmError::shape("softmax", "x is not [rows, cols]"));
        }
        let cols = x.len() / rows;
        check_len("softmax", "out", out.len(), x.len())?;
        let f = self.function(Kernel::Softmax)?;
        let cols_i = i32_arg("softmax", "cols", cols)?;
        let inv_t = 1.0f32 / temperature;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&x.slice).arg(&mut out.slice).arg(&cols_i).arg(&inv_t);
        // SAFETY: lengths checked above; one block per row.
        unsafe { b.launch(rows_cfg(rows, 256, 0)) }.map_err(cuda_err(Kernel::Softmax.name()))?;
        Ok(())
    }

    fn argmax(&self, x: &GpuBuffer<f32>, out: &mut GpuBuffer<u32>, rows: usize) -> Result<()> {
        if rows == 0 || !x.len().is_multiple_of(rows) {
            return Err(ElmError::shape("argmax", "x is not [rows, cols]"));
        }
        check_len("argmax", "out", out.len(), rows)?;
        let cols_i = i32_arg("argmax", "cols", x.len() / rows)?;
        let f = self.function(Kernel::Argmax)?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&x.slice).arg(&mut out.slice).arg(&cols_i);
        // SAFETY: lengths checked above; 256 threads ≤ the kernel's 1024-entry shared arrays.
        unsafe { b.launch(rows_cfg(rows, 256, 0)) }.map_err(cuda_err(Kernel::Argmax.name()))?;
        Ok(())
    }

    fn sample(
        &self,
        probs: &GpuBuffer<f32>,
        uniforms: &GpuBuffer<f32>,
        out: &mut GpuBuffer<u32>,
        rows: usize,
    ) -> Result<()> {
        if rows == 0 || !probs.len().is_multiple_of(rows) {
            return Err(ElmError::shape("sample", "probs is not [rows, cols]"));
        }
        check_len("sample", "uniforms", uniforms.len(), rows)?;
        check_len("sample", "out", out.len(), rows)?;
        let cols_i = i32_arg("sample", "cols", probs.len() / rows)?;
        let f = self.function(Kernel::Sample)?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&probs.slice)
            .arg(&uniforms.slice)
            .arg(&mut out.slice)
            .arg(&cols_i);
        // SAFETY: lengths checked; blockDim 256 is a power of two ≤ 1024.
        unsafe { b.launch(rows_cfg(rows, 256, 0)) }.map_err(cuda_err(Kernel::Sample.name()))?;
        Ok(())
    }

    fn matmul_wt(
        &self,
        x: &GpuBuffer<f32>,
        w: &GpuBuffer<f32>,
        out: &mut GpuBuffer<f32>,
        rows: usize,
        in_dim: usize,
        out_dim: usize,
        accumulate: bool,
    ) -> Result<()> {
        check_len("matmul_wt", "x", x.len(), rows * in_dim)?;
        check_len("matmul_wt", "w", w.len(), out_dim * in_dim)?;
        check_len("matmul_wt", "out", out.len(), rows * out_dim)?;
        raw::gemm_wt(
            self,
            &x.slice.as_view(),
            &w.slice.as_view(),
            &mut out.slice.as_view_mut(),
            rows,
            in_dim,
            out_dim,
            if accumulate { 1.0 } else { 0.0 },
        )
    }

    fn fixed_point_projection(
        &self,
        z: &GpuBuffer<f32>,
        h: &GpuBuffer<f32>,
        w_z: &GpuBuffer<f32>,
        w_h: &GpuBuffer<f32>,
        bias: Option<&GpuBuffer<f32>>,
        out: &mut GpuBuffer<f32>,
        rows: usize,
        z_dim: usize,
        h_dim: usize,
        out_dim: usize,
    ) -> Result<()> {
        self.matmul_wt(z, w_z, out, rows, z_dim, out_dim, false)?;
        self.matmul_wt(h, w_h, out, rows, h_dim, out_dim, true)?;
        if let Some(b) = bias {
            check_len("fixed_point_projection", "bias", b.len(), out_dim)?;
            self.add_bias(out, b, rows)?;
        }
        Ok(())
    }

    fn anderson_mix(
        &self,
        x_hist: &GpuBuffer<f32>,
        f_hist: &GpuBuffer<f32>,
        alpha: &GpuBuffer<f32>,
        out: &mut GpuBuffer<f32>,
        beta: f32,
    ) -> Result<()> {
        let m = alpha.len();
        let n = out.len();
        check_len("anderson_mix", "x_hist", x_hist.len(), m * n)?;
        check_len("anderson_mix", "f_hist", f_hist.len(), m * n)?;
        let m_i = i32_arg("anderson_mix", "m", m)?;
        let n_i = i32_arg("anderson_mix", "n", n)?;
        let f = self.function(Kernel::AndersonMix)?;
        let mut b = self.stream.launch_builder(&f);
        b.arg(&x_hist.slice)
            .arg(&f_hist.slice)
            .arg(&alpha.slice)
            .arg(&mut out.slice)
            .arg(&m_i)
            .arg(&n_i)
            .arg(&beta);
        // SAFETY: lengths checked above.
        unsafe { b.launch(elems_cfg(n)) }.map_err(cuda_err(Kernel::AndersonMix.name()))?;
        Ok(())
    }
}

/// Launchers on raw views, used by the wrappers above and by the model (which works on
/// sub-views of fused buffers). Callers guarantee the lengths.
pub(crate) mod raw {
    use super::*;

    pub(crate) fn rmsnorm(
        dev: &CudaDevice,
        x: &CudaView<f32>,
        w: &CudaView<f32>,
        y: &mut CudaViewMut<f32>,
        rows: usize,
        cols: usize,
        eps: f32,
    ) -> Result<()> {
        let f = dev.function(Kernel::RmsNorm)?;
        let cols_i = i32_arg("rmsnorm", "cols", cols)?;
        let mut b = dev.stream.launch_builder(&f);
        b.arg(x).arg(w).arg(y).arg(&cols_i).arg(&eps);
        // SAFETY: x, y hold rows*cols, w holds cols (checked by callers).
        unsafe { b.launch(rows_cfg(rows, row_threads(cols), 0)) }
            .map_err(cuda_err(Kernel::RmsNorm.name()))?;
        Ok(())
    }

    /// In place: RMSNorm of each of the `n_heads` heads (`head_dim` floats, gain `w`) at the
    /// start of every row of `row_stride` floats in `x` (a sub-view starting at the first head).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rmsnorm_heads(
        dev: &CudaDevice,
        x: &mut CudaViewMut<f32>,
        w: &CudaView<f32>,
        rows: usize,
        row_stride: usize,
        n_heads: usize,
        head_dim: usize,
        eps: f32,
    ) -> Result<()> {
        let f = dev.function(Kernel::RmsNormHeads)?;
        let stride_i = i32_arg("rmsnorm_heads", "row_stride", row_stride)?;
        let dim_i = i32_arg("rmsnorm_heads", "head_dim", head_dim)?;
        let mut b = dev.stream.launch_builder(&f);
        b.arg(x).arg(w).arg(&stride_i).arg(&dim_i).arg(&eps);
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: (rows as u32, n_heads as u32, 1),
            block_dim: (row_threads(head_dim), 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: callers guarantee rows rows of row_stride floats holding n_heads heads, w head_dim.
        unsafe { b.launch(cfg) }.map_err(cuda_err(Kernel::RmsNormHeads.name()))?;
        Ok(())
    }

    /// `x` rows of `row_stride` floats; the first `n_heads * head_dim` of each row are rotated.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn rope(
        dev: &CudaDevice,
        x: &mut CudaViewMut<f32>,
        pos: &CudaView<u32>,
        rows: usize,
        row_stride: usize,
        n_heads: usize,
        head_dim: usize,
        theta: f32,
        style: RopeStyle,
    ) -> Result<()> {
        let kernel = match style {
            RopeStyle::HalfSplit => Kernel::RopeHalf,
            RopeStyle::Interleaved => Kernel::RopeInterleaved,
        };
        let f = dev.function(kernel)?;
        let stride_i = i32_arg("rope", "row_stride", row_stride)?;
        let heads_i = i32_arg("rope", "n_heads", n_heads)?;
        let dim_i = i32_arg("rope", "head_dim", head_dim)?;
        let mut b = dev.stream.launch_builder(&f);
        b.arg(x)
            .arg(pos)
            .arg(&stride_i)
            .arg(&heads_i)
            .arg(&dim_i)
            .arg(&theta);
        // SAFETY: callers guarantee rows*row_stride elements and rows positions.
        unsafe { b.launch(rows_cfg(rows, row_threads(n_heads * head_dim / 2), 0)) }
            .map_err(cuda_err(kernel.name()))?;
        Ok(())
    }

    /// The MLP's gate: `out = act(gate) · up` with the model's activation.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gated_activation(
        dev: &CudaDevice,
        activation: crate::model::config::Activation,
        gate: &CudaView<f32>,
        up: &CudaView<f32>,
        out: &mut CudaViewMut<f32>,
        rows: usize,
        cols: usize,
        in_stride: usize,
    ) -> Result<()> {
        let kernel = match activation {
            crate::model::config::Activation::SwiGlu => Kernel::Swiglu,
            crate::model::config::Activation::GeGluTanh => Kernel::GegluTanh,
        };
        let f = dev.function(kernel)?;
        let op = kernel.name();
        let rows_i = i32_arg(op, "rows", rows)?;
        let cols_i = i32_arg(op, "cols", cols)?;
        let stride_i = i32_arg(op, "in_stride", in_stride)?;
        let mut b = dev.stream.launch_builder(&f);
        b.arg(gate)
            .arg(up)
            .arg(out)
            .arg(&rows_i)
            .arg(&cols_i)
            .arg(&stride_i);
        // SAFETY: callers guarantee the strided extents.
        unsafe { b.launch(elems_cfg(rows * cols)) }.map_err(cuda_err(kernel.name()))?;
        Ok(())
    }

    pub(crate) fn add(
        dev: &CudaDevice,
        x: &mut CudaViewMut<f32>,
        y: &CudaView<f32>,
        n: usize,
    ) -> Result<()> {
        let f = dev.function(Kernel::AddInplace)?;
        let n_i = i32_arg("add", "n", n)?;
        let mut b = dev.stream.launch_builder(&f);
        b.arg(x).arg(y).arg(&n_i);
        // SAFETY: both hold n elements.
        unsafe { b.launch(elems_cfg(n)) }.map_err(cuda_err(Kernel::AddInplace.name()))?;
        Ok(())
    }

    pub(crate) fn add_bias(
        dev: &CudaDevice,
        x: &mut CudaViewMut<f32>,
        bias: &CudaView<f32>,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        let f = dev.function(Kernel::AddBias)?;
        let rows_i = i32_arg("add_bias", "rows", rows)?;
        let cols_i = i32_arg("add_bias", "cols", cols)?;
        let mut b = dev.stream.launch_builder(&f);
        b.arg(x).arg(bias).arg(&rows_i).arg(&cols_i);
        // SAFETY: x holds rows*cols, bias cols.
        unsafe { b.launch(elems_cfg(rows * cols)) }.map_err(cuda_err(Kernel::AddBias.name()))?;
        Ok(())
    }

    pub(crate) fn gather_rows(
        dev: &CudaDevice,
        table: &CudaView<f32>,
        index: &CudaView<u32>,
        out: &mut CudaViewMut<f32>,
        rows: usize,
        cols: usize,
        scale: f32,
    ) -> Result<()> {
        let f = dev.function(Kernel::GatherRows)?;
        let cols_i = i32_arg("gather_rows", "cols", cols)?;
        let mut b = dev.stream.launch_builder(&f);
        b.arg(table).arg(index).arg(out).arg(&cols_i).arg(&scale);
        // SAFETY: indices validated on the host; out holds rows*cols.
        unsafe { b.launch(rows_cfg(rows, row_threads(cols), 0)) }
            .map_err(cuda_err(Kernel::GatherRows.name()))?;
        Ok(())
    }

    /// Copies the K and V parts of fused rows `src: [rows, src_stride]` into the caches.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn kv_cache_write(
        dev: &CudaDevice,
        src: &CudaView<f32>,
        src_stride: usize,
        k_off: usize,
        v_off: usize,
        k_cache: &mut CudaViewMut<f32>,
        v_cache: &mut CudaViewMut<f32>,
        slot: &CudaView<u32>,
        pos: &CudaView<u32>,
        rows: usize,
        n_kv_heads: usize,
        head_dim: usize,
        max_seq: usize,
    ) -> Result<()> {
        let f = dev.function(Kernel::KvCacheWrite)?;
        let op = "kv_cache_write";
        let args = [
            i32_arg(op, "src_stride", src_stride)?,
            i32_arg(op, "k_off", k_off)?,
            i32_arg(op, "v_off", v_off)?,
            i32_arg(op, "n_kv_heads", n_kv_heads)?,
            i32_arg(op, "head_dim", head_dim)?,
            i32_arg(op, "max_seq", max_seq)?,
        ];
        let mut b = dev.stream.launch_builder(&f);
        b.arg(src)
            .arg(&args[0])
            .arg(&args[1])
            .arg(&args[2])
            .arg(k_cache)
            .arg(v_cache)
            .arg(slot)
            .arg(pos)
            .arg(&args[3])
            .arg(&args[4])
            .arg(&args[5]);
        // SAFETY: slots/positions validated on the host against the cache extents.
        unsafe { b.launch(rows_cfg(rows, row_threads(n_kv_heads * head_dim), 0)) }
            .map_err(cuda_err(Kernel::KvCacheWrite.name()))?;
        Ok(())
    }

    /// Strides (in floats) that place queries, keys and outputs; see kernels/attention.cu.
    pub(crate) struct AttnGeometry {
        pub rows: usize,
        pub q_stride: usize,
        pub out_stride: usize,
        pub n_heads: usize,
        pub n_kv_heads: usize,
        pub head_dim: usize,
        pub slot_stride: usize,
        pub head_stride: usize,
        pub key_stride: usize,
        /// Upper bound on `pos[r] + 1`: sizes the shared-memory score buffer.
        pub max_len: usize,
        /// A local layer's sliding window (only the last `window` keys are seen); `None`: all.
        pub window: Option<usize>,
    }

    /// Largest dynamic shared memory we request without opting in to the >48 KiB carve-out.
    pub(crate) const MAX_ATTN_SMEM_BYTES: usize = 48 * 1024;

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn attention(
        dev: &CudaDevice,
        q: &CudaView<f32>,
        k: &CudaView<f32>,
        v: &CudaView<f32>,
        out: &mut CudaViewMut<f32>,
        slot: &CudaView<u32>,
        pos: &CudaView<u32>,
        g: &AttnGeometry,
    ) -> Result<()> {
        let smem = (g.head_dim + g.max_len) * std::mem::size_of::<f32>();
        if smem > MAX_ATTN_SMEM_BYTES {
            return Err(ElmError::Unsupported(format!(
                "attention over {} keys with head_dim {} needs {smem} B of shared memory (max {MAX_ATTN_SMEM_BYTES})",
                g.max_len, g.head_dim
            )));
        }
        let f = dev.function(Kernel::Attention)?;
        let op = "attention";
        let q_stride = i32_arg(op, "q_stride", g.q_stride)?;
        let out_stride = i32_arg(op, "out_stride", g.out_stride)?;
        let n_heads = i32_arg(op, "n_heads", g.n_heads)?;
        let n_kv = i32_arg(op, "n_kv_heads", g.n_kv_heads)?;
        let head_dim = i32_arg(op, "head_dim", g.head_dim)?;
        let slot_stride = g.slot_stride as i64;
        let head_stride = g.head_stride as i64;
        let key_stride = g.key_stride as i64;
        let scale = 1.0f32 / (g.head_dim as f32).sqrt();
        let window = i32_arg(op, "window", g.window.unwrap_or(0))?;
        let mut b = dev.stream.launch_builder(&f);
        b.arg(q)
            .arg(&q_stride)
            .arg(k)
            .arg(v)
            .arg(out)
            .arg(&out_stride)
            .arg(slot)
            .arg(pos)
            .arg(&n_heads)
            .arg(&n_kv)
            .arg(&head_dim)
            .arg(&slot_stride)
            .arg(&head_stride)
            .arg(&key_stride)
            .arg(&scale)
            .arg(&window);
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: (g.rows as u32, g.n_heads as u32, 1),
            block_dim: (128, 1, 1),
            shared_mem_bytes: smem as u32,
        };
        // SAFETY: callers validate slots/positions against the key extents; smem sized above.
        unsafe { b.launch(cfg) }.map_err(cuda_err(Kernel::Attention.name()))?;
        Ok(())
    }

    /// Row-major `out[rows, out_dim] = x[rows, in_dim] · w[out_dim, in_dim]ᵀ + beta * out`.
    ///
    /// cuBLAS is column-major: the row-major `out` is the column-major `outᵀ = w · xᵀ`, where the
    /// row-major `w` buffer read column-major is `wᵀ` (hence `transa = T`) and `x` read
    /// column-major is `xᵀ` (`transb = N`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemm_wt(
        dev: &CudaDevice,
        x: &CudaView<f32>,
        w: &CudaView<f32>,
        out: &mut CudaViewMut<f32>,
        rows: usize,
        in_dim: usize,
        out_dim: usize,
        beta: f32,
    ) -> Result<()> {
        let op = "gemm";
        let cfg = GemmConfig {
            transa: cublasOperation_t::CUBLAS_OP_T,
            transb: cublasOperation_t::CUBLAS_OP_N,
            m: i32_arg(op, "out_dim", out_dim)?,
            n: i32_arg(op, "rows", rows)?,
            k: i32_arg(op, "in_dim", in_dim)?,
            alpha: 1.0f32,
            lda: i32_arg(op, "in_dim", in_dim)?,
            ldb: i32_arg(op, "in_dim", in_dim)?,
            beta,
            ldc: i32_arg(op, "out_dim", out_dim)?,
        };
        // SAFETY: callers guarantee x: rows*in_dim, w: out_dim*in_dim, out: rows*out_dim.
        unsafe { dev.blas.gemm(cfg, w, x, out) }.map_err(cuda_err("cublasSgemm"))
    }
}
