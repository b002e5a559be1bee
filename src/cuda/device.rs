//! Driver probing, the per-device handle (context, stream, cuBLAS, kernel cache) and device buffers.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::cublas::CudaBlas;
use cudarc::driver::{
    CudaContext, CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig, ValidAsZeroBits,
};
use cudarc::nvrtc::Ptx;

use super::backend::{DeviceBuffer, GpuDevice};
use super::sources::{Kernel, KernelFile};
use crate::error::{ElmError, Result};

/// Message of the error returned on machines without a usable CUDA driver.
pub(crate) const NO_DRIVER: &str = "no CUDA driver found (libcuda.so could not be loaded)";

/// Wraps any cudarc error with what we were doing.
pub(crate) fn cuda_err<E: std::fmt::Debug>(what: &str) -> impl FnOnce(E) -> ElmError + '_ {
    move |e| ElmError::Cuda(format!("{what}: {e:?}"))
}

/// Text of a caught panic payload.
fn panic_text(payload: Box<dyn std::any::Any + Send>) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// Runs a cudarc call that may panic (cudarc panics when a library or symbol is missing).
pub(crate) fn guarded<T>(what: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(ElmError::Cuda(format!("{what}: {}", panic_text(p)))),
    }
}

/// Number of devices, or why there are none. Probed once per process.
fn probe() -> &'static std::result::Result<usize, String> {
    static PROBE: OnceLock<std::result::Result<usize, String>> = OnceLock::new();
    PROBE.get_or_init(|| {
        // dlopen first: cudarc's lazy loader panics if libcuda is absent.
        // SAFETY: only tries to load the library; no symbol is called.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(NO_DRIVER.to_string());
        }
        // Second guard: a present but broken driver (missing symbols) must not panic either.
        match catch_unwind(CudaContext::device_count) {
            Ok(Ok(n)) => Ok(n.max(0) as usize),
            Ok(Err(e)) => Err(format!(
                "CUDA driver present but cuInit/cuDeviceGetCount failed: {e:?}"
            )),
            Err(p) => Err(format!("{NO_DRIVER}: {}", panic_text(p))),
        }
    })
}

/// Whether a CUDA driver is present and reports at least one device. Never panics.
pub(super) fn is_available() -> bool {
    matches!(probe(), Ok(n) if *n > 0)
}

/// Number of CUDA devices; `ElmError::Cuda("no CUDA driver found ...")` without a driver.
pub(super) fn device_count() -> Result<usize> {
    probe().clone().map_err(ElmError::Cuda)
}

/// Compiles one kernel file to PTX with NVRTC, once per process (PTX for the default virtual
/// architecture is JIT-compiled by the driver for whatever device loads it, so one PTX serves all).
fn ptx_for(file: KernelFile) -> Result<Ptx> {
    static CACHE: OnceLock<Mutex<HashMap<KernelFile, Ptx>>> = OnceLock::new();
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(p) = cache.lock().map_err(cuda_err("ptx cache"))?.get(&file) {
        return Ok(p.clone());
    }
    // SAFETY: only dlopen; no symbol is called.
    if !unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        return Err(ElmError::Cuda(
            "NVRTC library (libnvrtc.so) not found: install the CUDA runtime compiler".into(),
        ));
    }
    let ptx = guarded(&format!("nvrtc compile kernels/{}", file.name()), || {
        let opts = cudarc::nvrtc::CompileOptions {
            name: Some(file.name().to_string()),
            ..Default::default()
        };
        cudarc::nvrtc::compile_ptx_with_opts(file.source(), opts).map_err(|e| {
            let log = match &e {
                cudarc::nvrtc::CompileError::CompileError { log, .. } => {
                    log.to_string_lossy().into_owned()
                }
                other => format!("{other:?}"),
            };
            ElmError::Cuda(format!("nvrtc failed on kernels/{}: {log}", file.name()))
        })
    })?;
    cache
        .lock()
        .map_err(cuda_err("ptx cache"))?
        .insert(file, ptx.clone());
    Ok(ptx)
}

/// Compiles every embedded kernel file with NVRTC (needs libnvrtc, not a GPU or driver).
/// Returns the number of files compiled. Used by tests and `--device cuda` start-up checks.
pub(super) fn compile_all_kernels() -> Result<usize> {
    for file in KernelFile::ALL {
        ptx_for(file)?;
    }
    Ok(KernelFile::ALL.len())
}

/// Element types a device buffer may hold.
pub trait GpuScalar:
    DeviceRepr + ValidAsZeroBits + Copy + Default + Unpin + Send + Sync + std::fmt::Debug + 'static
{
}
impl GpuScalar for f32 {}
impl GpuScalar for u32 {}

/// A device allocation of `len` elements of `T`, owned by one [`CudaDevice`].
#[derive(Debug)]
pub struct GpuBuffer<T> {
    pub(crate) slice: CudaSlice<T>,
}

impl<T: GpuScalar> DeviceBuffer for GpuBuffer<T> {
    fn len(&self) -> usize {
        self.slice.len()
    }
    fn is_empty(&self) -> bool {
        self.slice.len() == 0
    }
}

/// One CUDA device: context, a single stream, a cuBLAS handle and the loaded kernels.
///
/// All work is issued on one stream, so launches are ordered and no events are needed.
pub struct CudaDevice {
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) stream: Arc<CudaStream>,
    pub(crate) blas: CudaBlas,
    functions: Mutex<HashMap<Kernel, CudaFunction>>,
    tf32: bool,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("ordinal", &self.ctx.ordinal())
            .field("tf32", &self.tf32)
            .finish()
    }
}

impl GpuDevice for CudaDevice {
    type Buffer<T: GpuScalar> = GpuBuffer<T>;

    fn new(ordinal: usize) -> Result<Self> {
        let count = device_count()?;
        if ordinal >= count {
            return Err(ElmError::Cuda(format!(
                "device ordinal {ordinal} out of range: {count} CUDA device(s) present"
            )));
        }
        // SAFETY: only dlopen; no symbol is called.
        if !unsafe { cudarc::cublas::sys::is_culib_present() } {
            return Err(ElmError::Cuda(
                "cuBLAS library (libcublas.so) not found: install the CUDA toolkit libraries"
                    .into(),
            ));
        }
        guarded("creating CUDA context", || {
            let ctx = CudaContext::new(ordinal).map_err(cuda_err("cuCtx create"))?;
            // One stream only: cudarc's per-slice event tracking would just add two event records
            // per kernel argument.
            // SAFETY: called before any allocation or launch on this context.
            unsafe { ctx.disable_event_tracking() };
            let stream = ctx.default_stream();
            let blas = CudaBlas::new(stream.clone()).map_err(cuda_err("cublasCreate"))?;
            Ok(CudaDevice {
                ctx,
                stream,
                blas,
                functions: Mutex::new(HashMap::new()),
                tf32: false,
            })
        })
    }

    fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    fn name(&self) -> Result<String> {
        self.ctx.name().map_err(cuda_err("cuDeviceGetName"))
    }

    fn set_tf32(&mut self, on: bool) -> Result<()> {
        use cudarc::cublas::sys::{cublasMath_t, cublasSetMathMode};
        let mode = if on {
            cublasMath_t::CUBLAS_TF32_TENSOR_OP_MATH
        } else {
            cublasMath_t::CUBLAS_DEFAULT_MATH
        };
        // SAFETY: valid handle owned by self.blas.
        let status = unsafe { cublasSetMathMode(*self.blas.handle(), mode) };
        if status != cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
            return Err(ElmError::Cuda(format!("cublasSetMathMode: {status:?}")));
        }
        self.tf32 = on;
        Ok(())
    }

    fn tf32(&self) -> bool {
        self.tf32
    }

    fn upload<T: GpuScalar>(&self, host: &[T]) -> Result<GpuBuffer<T>> {
        if host.is_empty() {
            return Err(ElmError::InvalidArgument(
                "zero-length device buffer".into(),
            ));
        }
        let slice = self
            .stream
            .clone_htod(host)
            .map_err(cuda_err("host->device copy"))?;
        Ok(GpuBuffer { slice })
    }

    fn zeros<T: GpuScalar>(&self, len: usize) -> Result<GpuBuffer<T>> {
        if len == 0 {
            return Err(ElmError::InvalidArgument(
                "zero-length device buffer".into(),
            ));
        }
        let slice = self
            .stream
            .alloc_zeros(len)
            .map_err(cuda_err("device alloc"))?;
        Ok(GpuBuffer { slice })
    }

    fn write<T: GpuScalar>(&self, host: &[T], buf: &mut GpuBuffer<T>) -> Result<()> {
        if host.len() > buf.len() {
            return Err(ElmError::shape(
                "cuda write",
                format!(
                    "{} host elements into a buffer of {}",
                    host.len(),
                    buf.len()
                ),
            ));
        }
        let mut view = buf.slice.slice_mut(0..host.len());
        self.stream
            .memcpy_htod(host, &mut view)
            .map_err(cuda_err("host->device copy"))
    }

    fn download<T: GpuScalar>(&self, buf: &GpuBuffer<T>) -> Result<Vec<T>> {
        let v = self
            .stream
            .clone_dtoh(&buf.slice)
            .map_err(cuda_err("device->host copy"))?;
        self.synchronize()?;
        Ok(v)
    }

    fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(cuda_err("stream synchronize"))
    }
}

impl CudaDevice {
    /// The loaded `kernel`, compiling and loading its file on first use.
    pub(crate) fn function(&self, kernel: Kernel) -> Result<CudaFunction> {
        let mut map = self.functions.lock().map_err(cuda_err("kernel cache"))?;
        if let Some(f) = map.get(&kernel) {
            return Ok(f.clone());
        }
        let file = kernel.file();
        let ptx = ptx_for(file)?;
        let module = self
            .ctx
            .load_module(ptx)
            .map_err(cuda_err(&format!("loading module kernels/{}", file.name())))?;
        for k in file.kernels() {
            let f = module
                .load_function(k.name())
                .map_err(cuda_err(&format!("loading kernel {}", k.name())))?;
            map.insert(k, f);
        }
        map.get(&kernel).cloned().ok_or_else(|| {
            ElmError::Cuda(format!(
                "kernel `{}` missing from its module",
                kernel.name()
            ))
        })
    }
}

/// Launch geometry helpers.
pub(crate) fn rows_cfg(rows: usize, threads: u32, shared_mem_bytes: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes,
    }
}

/// Grid-stride 1-D launch over `n` elements.
pub(crate) fn elems_cfg(n: usize) -> LaunchConfig {
    let threads = 256u32;
    let blocks = n.div_ceil(threads as usize).clamp(1, 65_535) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Threads for a row kernel over `cols` values: a multiple of 32 in [32, 256].
pub(crate) fn row_threads(cols: usize) -> u32 {
    (cols.div_ceil(32) * 32).clamp(32, 256) as u32
}
