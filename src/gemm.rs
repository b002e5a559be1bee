//! f32 matrix multiply `C = α·A·B + β·C` for the training and prefill shapes, with an AVX-512
//! kernel of our own and the BLAS path kept.
//!
//! Why our own: Debian's OpenBLAS 0.3.21 predates its Zen 4 kernels and runs its AVX2 (Haswell)
//! kernel on this AVX-512 machine; the profile of an ELM training step spends ~70% of its time
//! in that kernel. And OpenBLAS's own thread pool competes with rayon's for the same two
//! cores, while this one runs on rayon's.
//!
//! The layout is the usual one of BLIS/GotoBLAS: `B` is packed in `KC × NR` column slivers
//! (kept in L1 while a sliver of `A` streams past), `A` in `MR × KC` row slivers (an `MC × KC`
//! block stays in L2), and a register-blocked micro-kernel keeps an `MR × NR` tile of `C` in
//! 24 zmm registers (12 rows × 2 × 16 columns): one `k` step is two loads of `B`, twelve
//! broadcasts of `A` and 24 FMAs. Edges are zero-padded in the packed panels and written back
//! through a bounds-checked tile. Work is split over rayon's threads along the longer of `M`
//! and `N`, each thread running the whole blocked loop on its part.
//!
//! [`sgemm`] picks the kernel at run time: AVX-512F when the CPU has it and the product is
//! large enough to pay for packing, else `ndarray`'s `general_mat_mul` (BLAS). `ELM_GEMM=blas`
//! forces the BLAS path (to measure one against the other).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

use ndarray::linalg::general_mat_mul;
use ndarray::{ArrayView2, ArrayViewMut2};

use crate::error::{ElmError, Result};

/// Which kernel [`sgemm`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmKernel {
    /// The linked BLAS through `ndarray`.
    Blas,
    /// This module's AVX-512F kernel.
    Avx512,
    /// This module's AVX-512 BF16 kernel: inputs rounded to bf16 (nearest even) as they are
    /// packed, products summed in f32 (`vdpbf16ps`), output f32.
    Avx512Bf16,
}

impl GemmKernel {
    pub fn name(self) -> &'static str {
        match self {
            GemmKernel::Blas => "blas",
            GemmKernel::Avx512 => "avx512",
            GemmKernel::Avx512Bf16 => "avx512-bf16",
        }
    }
}

/// The kernel large products use on this machine (`ELM_GEMM=blas` forces BLAS).
pub fn detected_kernel() -> GemmKernel {
    static KERNEL: OnceLock<GemmKernel> = OnceLock::new();
    *KERNEL.get_or_init(|| {
        if std::env::var("ELM_GEMM").is_ok_and(|v| v == "blas") {
            return GemmKernel::Blas;
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx512f") {
            return GemmKernel::Avx512;
        }
        GemmKernel::Blas
    })
}

/// The number format the large products read their inputs in; accumulation and outputs stay
/// f32, and so do the weights, gradients and optimiser state they come from (bf16 is only
/// the packed copy a product reads), as in mixed-precision training. Products smaller than
/// `MIN_WORK` multiply-adds (and the attention's per-head products, which go through BLAS)
/// stay f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    F32,
    Bf16,
}

impl std::str::FromStr for Precision {
    type Err = ElmError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "f32" => Ok(Precision::F32),
            "bf16" => Ok(Precision::Bf16),
            _ => Err(ElmError::config(
                "precision",
                format!("`{s}`: expected f32 or bf16"),
            )),
        }
    }
}

static BF16: AtomicBool = AtomicBool::new(false);

/// Whether this CPU has AVX-512 BF16 dot products.
pub fn has_avx512_bf16() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Sets the precision of every large product from now on (process-wide: the CLI's
/// `--precision`). `bf16` is refused on a CPU without AVX-512 BF16: emulating it would be
/// slower than f32 and defeat its purpose.
pub fn set_precision(p: Precision) -> Result<()> {
    if p == Precision::Bf16 && !has_avx512_bf16() {
        return Err(ElmError::config(
            "precision",
            "bf16 needs a CPU with AVX-512 BF16 (avx512_bf16); this one lacks it: use f32",
        ));
    }
    BF16.store(p == Precision::Bf16, Ordering::Relaxed);
    Ok(())
}

/// The precision set by [`set_precision`] (f32 unless changed).
pub fn precision() -> Precision {
    if BF16.load(Ordering::Relaxed) {
        Precision::Bf16
    } else {
        Precision::F32
    }
}

/// Below this many multiply-adds packing costs more than it saves: BLAS (or its small-matrix
/// path) is used.
const MIN_WORK: usize = 32 * 32 * 64;

/// `c = alpha · a · b + beta · c` with `a: [M, K]`, `b: [K, N]`, `c: [M, N]`, any strides
/// (transposed views included). Panics on mismatched shapes, like `general_mat_mul`.
pub fn sgemm(
    alpha: f32,
    a: &ArrayView2<f32>,
    b: &ArrayView2<f32>,
    beta: f32,
    c: &mut ArrayViewMut2<f32>,
) {
    sgemm_with(precision_kernel(), alpha, a, b, beta, c)
}

/// The kernel [`precision`] selects for large products.
fn precision_kernel() -> GemmKernel {
    match precision() {
        Precision::Bf16 => GemmKernel::Avx512Bf16,
        Precision::F32 => detected_kernel(),
    }
}

/// [`sgemm`] with the kernel chosen by the caller (tests and benchmarks compare them); a kernel
/// the CPU lacks falls back to BLAS.
pub fn sgemm_with(
    kernel: GemmKernel,
    alpha: f32,
    a: &ArrayView2<f32>,
    b: &ArrayView2<f32>,
    beta: f32,
    c: &mut ArrayViewMut2<f32>,
) {
    let ((m, k), (k2, n)) = (a.dim(), b.dim());
    assert!(
        k == k2 && c.dim() == (m, n),
        "sgemm: [{m}, {k}] · [{k2}, {n}] into {:?}",
        c.dim()
    );
    let negative = [a.strides(), b.strides(), c.strides()]
        .iter()
        .any(|s| s.iter().any(|&x| x < 0));
    #[cfg(target_arch = "x86_64")]
    if !negative && m * n * k >= MIN_WORK {
        if kernel == GemmKernel::Avx512 && std::arch::is_x86_feature_detected!("avx512f") {
            avx512::gemm(false, alpha, a, b, beta, c);
            return;
        }
        if kernel == GemmKernel::Avx512Bf16 && has_avx512_bf16() {
            avx512::gemm(true, alpha, a, b, beta, c);
            return;
        }
    }
    let _ = (kernel, negative);
    general_mat_mul(alpha, a, b, beta, c);
}

extern "C" {
    fn openblas_get_num_threads() -> std::os::raw::c_int;
    fn openblas_set_num_threads(n: std::os::raw::c_int);
}

/// Threads OpenBLAS uses per call.
pub fn blas_threads() -> usize {
    // SAFETY: plain getter of the linked system OpenBLAS, no arguments.
    unsafe { openblas_get_num_threads() as usize }
}

/// Sets OpenBLAS's threads per call (process-wide).
///
/// `1` is fastest for inference on small machines (measured by `elm bench`): batch-1
/// matvecs are then split over the decode's spin team instead, and a 2-thread OpenBLAS
/// oversubscribes the cores when anything else runs.
pub fn set_blas_threads(n: usize) {
    // SAFETY: plain setter of the linked system OpenBLAS.
    unsafe { openblas_set_num_threads(n.max(1) as std::os::raw::c_int) }
}

/// When this module's kernel carries the large products, OpenBLAS is left with small ones
/// (attention heads, decode batches) that run inside rayon's parallel loops: its own thread
/// pool then only spins against rayon's threads (a training step lost half its time to
/// `sched_yield` that way), so it is made single-threaded, unless `OPENBLAS_NUM_THREADS`
/// says otherwise. Process-wide: the binaries call it at startup. Returns the kernel.
pub fn prefer_own_threads() -> GemmKernel {
    let kernel = detected_kernel();
    if kernel != GemmKernel::Blas && std::env::var_os("OPENBLAS_NUM_THREADS").is_none() {
        set_blas_threads(1);
    }
    kernel
}

/// `a · b` into a new array (the `dot` of the training paths).
pub fn matmul(a: &ArrayView2<f32>, b: &ArrayView2<f32>) -> ndarray::Array2<f32> {
    matmul_with(precision_kernel(), a, b)
}

/// [`matmul`] in f32 whatever [`precision`] says.
pub fn matmul_f32(a: &ArrayView2<f32>, b: &ArrayView2<f32>) -> ndarray::Array2<f32> {
    matmul_with(detected_kernel(), a, b)
}

fn matmul_with(
    kernel: GemmKernel,
    a: &ArrayView2<f32>,
    b: &ArrayView2<f32>,
) -> ndarray::Array2<f32> {
    let mut c = ndarray::Array2::<f32>::zeros((a.nrows(), b.ncols()));
    sgemm_with(kernel, 1.0, a, b, 0.0, &mut c.view_mut());
    c
}

/// Peak f32 multiply-add rate of one core in GFLOP/s (2 flops per FMA lane), measured with
/// independent FMA chains in registers: what "fraction of peak" is a fraction of. Multiply by
/// the threads for the machine.
pub fn peak_fma_gflops_per_core() -> f64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F is present (checked above).
        return unsafe { avx512::peak_fma() };
    }
    // Portable estimate: the compiler's vectorised FMA loop.
    let mut acc = [1.0f32; 64];
    let t = std::time::Instant::now();
    let reps = 2_000_000usize;
    for _ in 0..reps {
        for a in acc.iter_mut() {
            *a = a.mul_add(0.999_999, 1e-7);
        }
    }
    std::hint::black_box(&acc);
    (reps * 64 * 2) as f64 / t.elapsed().as_secs_f64() / 1e9
}

/// A `B` packed whole: per `KC`-block of its rows, every `NR`-column sliver (f32, or bf16
/// k-pairs in one u32).
pub(crate) enum Panels {
    F32(Vec<Vec<f32>>),
    Bf16(Vec<Vec<u32>>),
}

impl Panels {
    fn bytes(&self) -> u64 {
        // Both element types are 4 bytes (a bf16 pair in one u32).
        4 * match self {
            Panels::F32(v) => v.iter().map(Vec::len).sum::<usize>(),
            Panels::Bf16(v) => v.iter().map(Vec::len).sum::<usize>(),
        } as u64
    }
}

/// Weights registered as unchanging (see [`FrozenWeights`]) and the packed forms built from
/// them: a product whose `B` lies inside one of them packs it once and reuses it.
mod frozen {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, LazyLock, Mutex, OnceLock};

    use ndarray::ArrayView2;

    use super::Panels;

    /// One packed form of one view: where it starts, its shape and strides, the format.
    #[derive(Clone, Copy, PartialEq, Eq, Hash)]
    struct Key {
        ptr: usize,
        dim: (usize, usize),
        strides: (isize, isize),
        bf16: bool,
    }

    pub(super) type Slot = Arc<OnceLock<Panels>>;

    #[derive(Default)]
    struct Registry {
        next_owner: u64,
        /// `[start, end)` byte ranges of registered weights and their owner.
        ranges: Vec<(usize, usize, u64)>,
        packs: HashMap<Key, (u64, Slot)>,
    }

    static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(Default::default);
    /// Registered ranges, read without the lock: products skip the lookup while there are none.
    static RANGES: AtomicUsize = AtomicUsize::new(0);

    fn registry() -> std::sync::MutexGuard<'static, Registry> {
        // A panic elsewhere while holding the lock leaves the registry consistent (every
        // change is one push or retain).
        REGISTRY.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(super) fn new_owner() -> u64 {
        let mut r = registry();
        r.next_owner += 1;
        r.next_owner
    }

    pub(super) fn register(owner: u64, start: usize, bytes: usize) {
        if bytes == 0 {
            return;
        }
        registry().ranges.push((start, start + bytes, owner));
        RANGES.fetch_add(1, Ordering::Relaxed);
    }

    pub(super) fn release(owner: u64) {
        let mut r = registry();
        let before = r.ranges.len();
        r.ranges.retain(|&(_, _, o)| o != owner);
        RANGES.fetch_sub(before - r.ranges.len(), Ordering::Relaxed);
        r.packs.retain(|_, (o, _)| *o != owner);
    }

    /// Bytes of the packed forms built so far, of one owner or (`None`) of all.
    pub(super) fn packed_bytes(owner: Option<u64>) -> u64 {
        registry()
            .packs
            .values()
            .filter(|(o, _)| owner.is_none_or(|w| w == *o))
            .filter_map(|(_, slot)| slot.get().map(Panels::bytes))
            .sum()
    }

    pub(super) fn registered_bytes(owner: u64) -> u64 {
        registry()
            .ranges
            .iter()
            .filter(|(_, _, o)| *o == owner)
            .map(|&(s, e, _)| (e - s) as u64)
            .sum()
    }

    /// The packed form of `b` if `b` lies wholly inside a registered weight (made empty here,
    /// filled by the caller through `OnceLock::get_or_init`, so concurrent products build it once).
    pub(super) fn lookup(bf16: bool, b: &ArrayView2<f32>) -> Option<Slot> {
        if RANGES.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let (rows, cols) = b.dim();
        let (rs, cs) = (b.strides()[0], b.strides()[1]);
        if rows == 0 || cols == 0 || rs < 0 || cs < 0 {
            return None;
        }
        let start = b.as_ptr() as usize;
        let last = (rows - 1) * rs as usize + (cols - 1) * cs as usize;
        let end = start + (last + 1) * std::mem::size_of::<f32>();
        let mut r = registry();
        let owner = r
            .ranges
            .iter()
            .find(|&&(s, e, _)| s <= start && end <= e)
            .map(|&(_, _, o)| o)?;
        let key = Key {
            ptr: start,
            dim: (rows, cols),
            strides: (rs, cs),
            bf16,
        };
        Some(
            r.packs
                .entry(key)
                .or_insert_with(|| (owner, Slot::default()))
                .1
                .clone(),
        )
    }
}

/// Weights that stay unchanged while this value lives (borrowed for `'a`, or shared through an
/// `Arc` it keeps a clone of): large products reading one of them as `B` (`x·Wᵀ`, `g·W`) pack
/// it once, in the product's precision, and reuse the packed form until this is dropped,
/// instead of packing it again on every call. The packed forms take memory ([`Self::packed_bytes`]):
/// the weight's size in f32, half of it in bf16, per layout used.
pub struct FrozenWeights<'a> {
    owner: u64,
    shared: Vec<std::sync::Arc<ndarray::ArrayD<f32>>>,
    _borrow: std::marker::PhantomData<&'a f32>,
}

impl Default for FrozenWeights<'_> {
    fn default() -> Self {
        Self::new()
    }
}

impl<'a> FrozenWeights<'a> {
    pub fn new() -> Self {
        FrozenWeights {
            owner: frozen::new_owner(),
            shared: Vec::new(),
            _borrow: std::marker::PhantomData,
        }
    }

    fn register_slice(&self, w: Option<&[f32]>) {
        if let Some(w) = w {
            frozen::register(self.owner, w.as_ptr() as usize, std::mem::size_of_val(w));
        }
    }

    /// Registers a weight borrowed for this value's life (a non-contiguous one is skipped).
    pub fn borrow<S, D>(&mut self, w: &'a ndarray::ArrayBase<S, D>) -> &mut Self
    where
        S: ndarray::Data<Elem = f32>,
        D: ndarray::Dimension,
    {
        self.register_slice(w.as_slice_memory_order());
        self
    }

    /// Registers a shared weight, keeping it alive (and, being shared, unchanged).
    pub fn share(&mut self, w: &std::sync::Arc<ndarray::ArrayD<f32>>) -> &mut Self {
        self.register_slice(w.as_slice_memory_order());
        self.shared.push(w.clone());
        self
    }

    /// Bytes of the packed forms built so far.
    pub fn packed_bytes(&self) -> u64 {
        frozen::packed_bytes(Some(self.owner))
    }

    /// What the packed forms will take once every registered weight has been read in
    /// `layouts` layouts (1: `x·Wᵀ` only, as in inference; 2: `g·W` too, as in training
    /// through a frozen layer) at the current precision: f32 packs are the weight's size,
    /// bf16 ones half of it.
    pub fn expected_packed_bytes(&self, layouts: u64) -> u64 {
        let f32_bytes = frozen::registered_bytes(self.owner);
        let per_layout = match precision() {
            Precision::F32 => f32_bytes,
            Precision::Bf16 => f32_bytes / 2,
        };
        per_layout * layouts
    }
}

/// Bytes of every frozen weight's packed forms built so far (all [`FrozenWeights`] alive).
pub fn frozen_packed_bytes() -> u64 {
    frozen::packed_bytes(None)
}

impl Drop for FrozenWeights<'_> {
    fn drop(&mut self) {
        frozen::release(self.owner);
    }
}

thread_local! {
    /// Packing buffers of this thread (rayon's workers persist, so steps reuse them).
    static PACK: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
    /// The bf16 kernel's packed pairs (two bf16 along k in one u32).
    static PACK_BF16: RefCell<(Vec<u32>, Vec<u32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use ndarray::{s, ArrayView2, ArrayViewMut2};
    use rayon::prelude::*;

    use super::{Panels, PACK, PACK_BF16};

    const MR: usize = 12;
    const NR: usize = 32;
    const KC: usize = 256;
    const MC: usize = 120;
    const NC: usize = 2048;

    /// A raw view of `C` a thread may write (its own disjoint part).
    #[derive(Clone, Copy)]
    struct CPtr {
        ptr: *mut f32,
        rs: isize,
        cs: isize,
    }
    // SAFETY: each thread writes a disjoint range of rows or columns of C.
    unsafe impl Send for CPtr {}
    unsafe impl Sync for CPtr {}

    pub fn gemm(
        bf16: bool,
        alpha: f32,
        a: &ArrayView2<f32>,
        b: &ArrayView2<f32>,
        beta: f32,
        c: &mut ArrayViewMut2<f32>,
    ) {
        let ((m, k), n) = (a.dim(), b.ncols());
        if k == 0 {
            c.map_inplace(|x| *x = if beta == 0.0 { 0.0 } else { beta * *x });
            return;
        }
        // A frozen weight as B: its panels packed once (the Arc keeps them alive through
        // this call even if the registration ends meanwhile).
        let frozen = super::frozen::lookup(bf16, b);
        if let Some(slot) = &frozen {
            slot.get_or_init(|| pack_whole_b(bf16, b));
        }
        let threads = rayon::current_num_threads().max(1);
        let cp = CPtr {
            ptr: c.as_mut_ptr(),
            rs: c.strides()[0],
            cs: c.strides()[1],
        };
        // Split the longer side so each part still fills whole micro-tiles.
        let split_n = n >= m;
        let (len, unit) = if split_n { (n, NR) } else { (m, MR) };
        let parts = threads.min(len.div_ceil(unit)).max(1);
        let per = len.div_ceil(parts).div_ceil(unit) * unit;
        let shared = &cp;
        let run = |i: usize| {
            // The whole (Send + Sync) struct, not its raw-pointer field, goes to the threads.
            let cp = *shared;
            let (lo, hi) = (i * per, ((i + 1) * per).min(len));
            if lo >= hi {
                return;
            }
            let (a_p, b_p, off) = if split_n {
                (a.view(), b.slice(s![.., lo..hi]), lo as isize * cp.cs)
            } else {
                (a.slice(s![lo..hi, ..]), b.view(), lo as isize * cp.rs)
            };
            // The part's first column in the whole packed B (a multiple of NR).
            let col0 = if split_n { lo } else { 0 };
            let packed = frozen
                .as_ref()
                .and_then(|slot| slot.get())
                .map(|p| (p, col0));
            let c_p = CPtr {
                // SAFETY: `off` is inside C (lo < the split dimension).
                ptr: unsafe { cp.ptr.offset(off) },
                ..cp
            };
            // SAFETY: the caller detected AVX-512F (and BF16 for `bf16`); c_p covers the
            // part's rows/columns.
            unsafe {
                match packed {
                    Some((Panels::Bf16(p), col0)) => {
                        gemm_serial_bf16(alpha, &a_p, &b_p, beta, c_p, Some((p, col0)))
                    }
                    Some((Panels::F32(p), col0)) => {
                        gemm_serial(alpha, &a_p, &b_p, beta, c_p, Some((p, col0)))
                    }
                    None if bf16 => gemm_serial_bf16(alpha, &a_p, &b_p, beta, c_p, None),
                    None => gemm_serial(alpha, &a_p, &b_p, beta, c_p, None),
                }
            };
        };
        // From outside rayon's pool (the training and prefill steps' main thread) the parts
        // go to the spinning team, whose helpers are still awake from the previous product:
        // a rayon join parks the caller and wakes a sleeping worker every time, which cost
        // ~10% of a training step on this VM. Inside rayon's pool (per-head attention,
        // batches scored in parallel), or while another thread holds the team, rayon.
        let team = crate::team::SpinTeam::global();
        let on_team = parts > 1
            && parts == team.parts()
            && rayon::current_thread_index().is_none()
            && team.try_run(&run).is_some();
        if parts == 1 {
            run(0);
        } else if !on_team {
            (0..parts).into_par_iter().for_each(run);
        }
    }

    /// A micro-kernel `$kernel::<R>(args)` with the fewest rows `R` of 4, 8 and `MR` that cover
    /// `mr`: a short last tile of rows (m not a multiple of `MR`) no longer pays for twelve (the
    /// LM head's 75 rows: 7 tiles of work instead of 6⅓). Each row's sums are those of the full
    /// kernel.
    macro_rules! by_rows {
        ($mr:expr, $kernel:ident, $($arg:expr),*) => {
            match $mr {
                0..=4 => $kernel::<4>($($arg),*),
                5..=8 => $kernel::<8>($($arg),*),
                _ => $kernel::<MR>($($arg),*),
            }
        };
    }

    /// Largest all-of-`K` packed `A` the few-rows order keeps (in bytes): it is reread for every
    /// `NR`-sliver of `B`, so it must stay in the 1 MB L2 beside `B`'s slivers.
    const WHOLE_A_BYTES: usize = 512 << 10;

    /// The GotoBLAS loop nest both kernels share: a `B` panel per (jc, pc) (packed into `pb`,
    /// or found already packed: `pack_b` returns where it is), an `A` block per ic, the
    /// micro-kernel over the tiles. `depth(kc)` is a packed sliver's depth (k values, or
    /// k-pairs for bf16); `tile(depth, a, b, c_ij, mr, nr, β)` one micro-tile.
    ///
    /// A pre-packed `B` (`b_prepacked`: `pack_b` only finds panels) with few rows in `A` (all
    /// of it, every `K` block, packed within [`WHOLE_A_BYTES`]) takes another order: all of
    /// `A` packed once, then per `NR`-sliver of `B` every `K` block. Goto's order passes over
    /// `C` once per `K` block, and with few rows and many columns (the LM head: 75 × 49152,
    /// 14.7 MB) each pass goes to memory: `C` was read and written 3 times for k = 576 beside
    /// one read of `B`. Here a sliver's `C` strip (m × NR) stays in L1 across the `K` blocks.
    /// Every element still sums its `K` blocks in the same order, so the result is the same
    /// bit for bit.
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn blocked<P: Copy + Default>(
        (m, n, k): (usize, usize, usize),
        c: CPtr,
        beta: f32,
        b_prepacked: bool,
        pa: &mut Vec<P>,
        pb: &mut [P],
        depth: impl Fn(usize) -> usize,
        mut pack_b: impl FnMut(usize, usize, usize, usize, &mut [P]) -> *const P,
        mut pack_a: impl FnMut(usize, usize, usize, usize, &mut [P]),
        tile: impl Fn(usize, *const P, *const P, *mut f32, usize, usize, f32),
    ) {
        let whole_a = m.div_ceil(MR) * MR * depth(KC) * k.div_ceil(KC);
        if b_prepacked && whole_a * std::mem::size_of::<P>() <= WHOLE_A_BYTES {
            let block = m.div_ceil(MR) * MR * depth(KC);
            pa.resize(whole_a, P::default());
            for (bi, pc) in (0..k).step_by(KC).enumerate() {
                pack_a(
                    0,
                    m,
                    pc,
                    KC.min(k - pc),
                    &mut pa[bi * block..(bi + 1) * block],
                );
            }
            for jc in (0..n).step_by(NC) {
                let nc = NC.min(n - jc);
                for jr in (0..nc).step_by(NR) {
                    let nr = NR.min(nc - jr);
                    for (bi, pc) in (0..k).step_by(KC).enumerate() {
                        let d = depth(KC.min(k - pc));
                        let bp = pack_b(pc, KC.min(k - pc), jc, nc, pb).add(jr / NR * NR * d);
                        let beta_k = if pc == 0 { beta } else { 1.0 };
                        for ir in (0..m).step_by(MR) {
                            let ap = pa.as_ptr().add(bi * block + ir / MR * MR * d);
                            let cij = c.ptr.offset(ir as isize * c.rs + (jc + jr) as isize * c.cs);
                            tile(d, ap, bp, cij, MR.min(m - ir), nr, beta_k);
                        }
                    }
                }
            }
            return;
        }
        pa.resize(MC.div_ceil(MR) * MR * depth(KC), P::default());
        for jc in (0..n).step_by(NC) {
            let nc = NC.min(n - jc);
            for pc in (0..k).step_by(KC) {
                let kc = KC.min(k - pc);
                let d = depth(kc);
                let panel = pack_b(pc, kc, jc, nc, pb);
                // β applies once: on the first K block; later blocks accumulate.
                let beta_k = if pc == 0 { beta } else { 1.0 };
                for ic in (0..m).step_by(MC) {
                    let mc = MC.min(m - ic);
                    pack_a(ic, mc, pc, kc, pa);
                    for jr in (0..nc).step_by(NR) {
                        let nr = NR.min(nc - jr);
                        let bp = panel.add(jr / NR * NR * d);
                        for ir in (0..mc).step_by(MR) {
                            let mr = MR.min(mc - ir);
                            let ap = pa.as_ptr().add(ir / MR * MR * d);
                            let cij = c
                                .ptr
                                .offset((ic + ir) as isize * c.rs + (jc + jr) as isize * c.cs);
                            tile(d, ap, bp, cij, mr, nr, beta_k);
                        }
                    }
                }
            }
        }
    }

    /// Where a `K`-block's panel of a pre-packed `B` starts for columns from `jc`: the
    /// K-blocks' panels of the whole `B` and the first column of this part of it.
    #[inline(always)]
    fn prepacked<P>(
        (panels, col0): (&[Vec<P>], usize),
        pc: usize,
        jc: usize,
        d: usize,
    ) -> *const P {
        // SAFETY (of the caller's reads): the panel holds every NR-sliver of the whole B.
        panels[pc / KC][(col0 + jc) / NR * NR * d..].as_ptr()
    }

    /// The blocked loop on one thread; `packed`: `B`'s panels packed already (a frozen weight).
    #[target_feature(enable = "avx512f")]
    unsafe fn gemm_serial(
        alpha: f32,
        a: &ArrayView2<f32>,
        b: &ArrayView2<f32>,
        beta: f32,
        c: CPtr,
        packed: Option<(&[Vec<f32>], usize)>,
    ) {
        let ((m, k), n) = (a.dim(), b.ncols());
        PACK.with(|pack| {
            let mut pack = pack.borrow_mut();
            let (pa, pb) = &mut *pack;
            if packed.is_none() {
                pb.resize(NC.div_ceil(NR) * NR * KC, 0.0);
            }
            blocked(
                (m, n, k),
                c,
                beta,
                packed.is_some(),
                pa,
                pb,
                |kc| kc,
                |pc, kc, jc, nc, pb| match packed {
                    Some(p) => prepacked(p, pc, jc, kc),
                    None => {
                        pack_b(b, pc, kc, jc, nc, pb);
                        pb.as_ptr()
                    }
                },
                |ic, mc, pc, kc, pa| pack_a(a, ic, mc, pc, kc, pa),
                |d, ap, bp, cij, mr, nr, bk| {
                    by_rows!(mr, kernel, d, ap, bp, cij, c.rs, c.cs, mr, nr, alpha, bk)
                },
            );
        });
    }

    /// `A[ic.., pc..]` (`mc × kc`) into `MR`-row slivers, `k`-major, zero-padded rows.
    fn pack_a(a: &ArrayView2<f32>, ic: usize, mc: usize, pc: usize, kc: usize, out: &mut [f32]) {
        let (rs, cs) = (a.strides()[0], a.strides()[1]);
        let base = a.as_ptr();
        for (sl, i0) in (0..mc).step_by(MR).enumerate() {
            let rows = MR.min(mc - i0);
            let dst = &mut out[sl * MR * kc..(sl + 1) * MR * kc];
            if cs == 1 {
                // SAFETY: rows ic+i0 .. +rows, columns pc .. pc+kc are inside A, each row
                // contiguous; packing runs only where AVX-512F was detected.
                unsafe {
                    pack_transposed(rows, kc, MR, dst, |i| {
                        base.offset((ic + i0 + i) as isize * rs + pc as isize)
                    })
                };
                continue;
            }
            for p in 0..kc {
                let d = &mut dst[p * MR..(p + 1) * MR];
                for (i, x) in d.iter_mut().enumerate() {
                    *x = if i < rows {
                        // SAFETY: (ic+i0+i, pc+p) is inside A.
                        unsafe {
                            *base.offset((ic + i0 + i) as isize * rs + (pc + p) as isize * cs)
                        }
                    } else {
                        0.0
                    };
                }
            }
        }
    }

    /// `dst[p · w + r] = row(r)[p]` for `p < kc`, `r < w` (zero for `r ≥ n`): `n` source rows
    /// contiguous along `p` into a `w`-wide sliver, 16 × 16 blocks transposed in registers.
    #[target_feature(enable = "avx512f")]
    unsafe fn pack_transposed(
        n: usize,
        kc: usize,
        w: usize,
        dst: &mut [f32],
        row: impl Fn(usize) -> *const f32,
    ) {
        let chunks = kc / 16;
        transpose_into(n, chunks, w, dst.as_mut_ptr() as *mut u32, |i, c| {
            // SAFETY: 16 values from 16·c are inside row i (c < kc / 16).
            unsafe { _mm512_castps_si512(_mm512_loadu_ps(row(i).add(16 * c))) }
        });
        for p in 16 * chunks..kc {
            for r in 0..w {
                dst[p * w + r] = if r < n { *row(r).add(p) } else { 0.0 };
            }
        }
    }

    /// `B[pc.., jc..]` (`kc × nc`) into `NR`-column slivers, `k`-major, zero-padded columns.
    fn pack_b(b: &ArrayView2<f32>, pc: usize, kc: usize, jc: usize, nc: usize, out: &mut [f32]) {
        let (rs, cs) = (b.strides()[0], b.strides()[1]);
        let base = b.as_ptr();
        for (sl, j0) in (0..nc).step_by(NR).enumerate() {
            let cols = NR.min(nc - j0);
            let dst = &mut out[sl * NR * kc..(sl + 1) * NR * kc];
            if cs == 1 {
                for p in 0..kc {
                    let d = &mut dst[p * NR..(p + 1) * NR];
                    // SAFETY: row pc+p, columns jc+j0 .. +cols are inside B and contiguous.
                    let src = unsafe {
                        std::slice::from_raw_parts(
                            base.offset((pc + p) as isize * rs + (jc + j0) as isize),
                            cols,
                        )
                    };
                    d[..cols].copy_from_slice(src);
                    d[cols..].fill(0.0);
                }
            } else if rs == 1 {
                // Transposed B (`Wᵀ` of a PyTorch-layout weight): each column contiguous
                // along k.
                // SAFETY: columns jc+j0 .. +cols, rows pc .. pc+kc are inside B; packing runs
                // only where AVX-512F was detected.
                unsafe {
                    pack_transposed(cols, kc, NR, dst, |j| {
                        base.offset(pc as isize + (jc + j0 + j) as isize * cs)
                    })
                };
            } else {
                for j in 0..NR {
                    for p in 0..kc {
                        dst[p * NR + j] = if j < cols {
                            // SAFETY: (pc+p, jc+j0+j) is inside B.
                            unsafe {
                                *base.offset((pc + p) as isize * rs + (jc + j0 + j) as isize * cs)
                            }
                        } else {
                            0.0
                        };
                    }
                }
            }
        }
    }

    /// `C[mr × nr] = α · Â·B̂ + β · C` for one micro-tile from packed slivers, on the first `R`
    /// rows of the `A` sliver (`by_rows!` picks `R`).
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn kernel<const R: usize>(
        kc: usize,
        a: *const f32,
        b: *const f32,
        c: *mut f32,
        rs: isize,
        cs: isize,
        mr: usize,
        nr: usize,
        alpha: f32,
        beta: f32,
    ) {
        let mut lo = [_mm512_setzero_ps(); R];
        let mut hi = [_mm512_setzero_ps(); R];
        let (mut ap, mut bp) = (a, b);
        for _ in 0..kc {
            let b0 = _mm512_loadu_ps(bp);
            let b1 = _mm512_loadu_ps(bp.add(16));
            for i in 0..R {
                let ai = _mm512_set1_ps(*ap.add(i));
                lo[i] = _mm512_fmadd_ps(ai, b0, lo[i]);
                hi[i] = _mm512_fmadd_ps(ai, b1, hi[i]);
            }
            ap = ap.add(MR);
            bp = bp.add(NR);
        }
        store_tile(&lo, &hi, c, rs, cs, mr, nr, alpha, beta);
    }

    /// `C[mr × nr] = α · acc + β · C` from the accumulators of a micro-tile.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    #[inline]
    unsafe fn store_tile<const R: usize>(
        lo: &[__m512; R],
        hi: &[__m512; R],
        c: *mut f32,
        rs: isize,
        cs: isize,
        mr: usize,
        nr: usize,
        alpha: f32,
        beta: f32,
    ) {
        let va = _mm512_set1_ps(alpha);
        if mr == R && nr == NR && cs == 1 {
            for i in 0..R {
                let row = c.offset(i as isize * rs);
                let (mut x0, mut x1) = (_mm512_mul_ps(va, lo[i]), _mm512_mul_ps(va, hi[i]));
                // β = 0 must not read C (it may hold NaN from a fresh buffer).
                if beta != 0.0 {
                    let vb = _mm512_set1_ps(beta);
                    x0 = _mm512_fmadd_ps(vb, _mm512_loadu_ps(row), x0);
                    x1 = _mm512_fmadd_ps(vb, _mm512_loadu_ps(row.add(16)), x1);
                }
                _mm512_storeu_ps(row, x0);
                _mm512_storeu_ps(row.add(16), x1);
            }
            return;
        }
        let mut tile = [0.0f32; MR * NR];
        for i in 0..R {
            _mm512_storeu_ps(tile.as_mut_ptr().add(i * NR), lo[i]);
            _mm512_storeu_ps(tile.as_mut_ptr().add(i * NR + 16), hi[i]);
        }
        for i in 0..mr {
            for j in 0..nr {
                let p = c.offset(i as isize * rs + j as isize * cs);
                let v = alpha * tile[i * NR + j];
                // Fused, as in the full tiles: a row's result does not depend on its tile.
                *p = if beta == 0.0 { v } else { beta.mul_add(*p, v) };
            }
        }
    }

    /// f32 → bf16 bits, round to nearest even; NaN stays a (quiet) NaN.
    #[inline(always)]
    fn bf16_bits(x: f32) -> u32 {
        let b = x.to_bits();
        if x.is_nan() {
            return (b >> 16) | 0x40;
        }
        (b.wrapping_add(0x7fff + ((b >> 16) & 1))) >> 16
    }

    /// Two consecutive-k values as one packed pair (low half: the even k).
    #[inline(always)]
    fn pair(lo: f32, hi: f32) -> u32 {
        bf16_bits(lo) | (bf16_bits(hi) << 16)
    }

    /// Walks the `w`-row slivers of a `rows × kc` panel packed as k-pairs,
    /// `out[(sliver · kp + p2) · w + r]`: rows past the end are zero, every real row is filled
    /// by `fill(sliver, r, row)`.
    fn for_each_pair_row(
        rows: usize,
        kc: usize,
        w: usize,
        out: &mut [u32],
        mut fill: impl FnMut(&mut [u32], usize, usize),
    ) {
        let kp = kc.div_ceil(2);
        for (sl, r0) in (0..rows).step_by(w).enumerate() {
            let n = w.min(rows - r0);
            let dst = &mut out[sl * w * kp..(sl + 1) * w * kp];
            for r in 0..w {
                if r < n {
                    fill(dst, r, r0 + r);
                } else {
                    for p2 in 0..kp {
                        dst[p2 * w + r] = 0;
                    }
                }
            }
        }
    }

    /// Pairs `from..` of row `r` of a sliver, `(x[2p2], x[2p2 + 1])` from `get(p)`, the odd
    /// tail padded with zero.
    fn fill_pairs_scalar(
        dst: &mut [u32],
        w: usize,
        r: usize,
        from: usize,
        kc: usize,
        get: impl Fn(usize) -> f32,
    ) {
        for p2 in from..kc.div_ceil(2) {
            let hi = if 2 * p2 + 1 < kc {
                get(2 * p2 + 1)
            } else {
                0.0
            };
            dst[p2 * w + r] = pair(get(2 * p2), hi);
        }
    }

    /// `get(r, p)` for `r < rows`, `p < kc` of a `kc`-deep panel of `w`-wide slivers into
    /// k-pairs: `out[(sliver · kp + p2) · w + r] = (x[r, 2p2], x[r, 2p2 + 1])`, zero-padded.
    fn pack_pairs(
        rows: usize,
        kc: usize,
        w: usize,
        out: &mut [u32],
        get: impl Fn(usize, usize) -> f32,
    ) {
        for_each_pair_row(rows, kc, w, out, |dst, r, row| {
            fill_pairs_scalar(dst, w, r, 0, kc, |p| get(row, p))
        });
    }

    /// The first `min(n, 16)` lanes.
    #[inline(always)]
    fn lane_mask(n: usize) -> __mmask16 {
        if n >= 16 {
            0xffff
        } else {
            (1u16 << n) - 1
        }
    }

    /// The block transpose the contiguous packers share: for each 16-row group of a `w`-wide
    /// sliver and each chunk `c < chunks`, `load(r, c)` gives row `r`'s 16 lanes of that
    /// chunk (rows `≥ n` stay zero); the 16 × 16 block is transposed in registers and output
    /// `t`'s lane for row `r` lands at `out[(16c + t) · w + r]`.
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn transpose_into(
        n: usize,
        chunks: usize,
        w: usize,
        out: *mut u32,
        load: impl Fn(usize, usize) -> __m512i,
    ) {
        for g0 in (0..w).step_by(16) {
            let lanes = 16.min(w - g0);
            let mask = lane_mask(lanes);
            for c in 0..chunks {
                let mut r = [_mm512_setzero_si512(); 16];
                for (i, ri) in r
                    .iter_mut()
                    .enumerate()
                    .take(lanes.min(n.saturating_sub(g0)))
                {
                    *ri = load(g0 + i, c);
                }
                transpose16(&mut r);
                for (t, rt) in r.iter().enumerate() {
                    // SAFETY (caller): 16c + t is below the sliver's depth, lanes g0 .. g0 +
                    // lanes ≤ w.
                    _mm512_mask_storeu_epi32(out.add((16 * c + t) * w + g0) as *mut _, mask, *rt);
                }
            }
        }
    }

    /// Transposes a 16 × 16 block of u32 held as 16 rows: `r[j][i]` becomes `r[i][j]`
    /// (interleaves of 32 then 64 bits within 128-bit lanes, then two rounds of lane shuffles).
    #[target_feature(enable = "avx512f")]
    #[inline]
    unsafe fn transpose16(r: &mut [__m512i; 16]) {
        let mut t = [_mm512_setzero_si512(); 16];
        for i in 0..8 {
            t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
            t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
        }
        // u[4j + e] holds, in 128-bit lane L, element 4L + e of rows 4j .. 4j + 3.
        let mut u = [_mm512_setzero_si512(); 16];
        for j in 0..4 {
            u[4 * j] = _mm512_unpacklo_epi64(t[4 * j], t[4 * j + 2]);
            u[4 * j + 1] = _mm512_unpackhi_epi64(t[4 * j], t[4 * j + 2]);
            u[4 * j + 2] = _mm512_unpacklo_epi64(t[4 * j + 1], t[4 * j + 3]);
            u[4 * j + 3] = _mm512_unpackhi_epi64(t[4 * j + 1], t[4 * j + 3]);
        }
        let mut v = [_mm512_setzero_si512(); 16];
        for g in 0..2 {
            for e in 0..4 {
                let (a, b) = (u[8 * g + e], u[8 * g + 4 + e]);
                v[8 * g + e] = _mm512_shuffle_i32x4::<0x88>(a, b);
                v[8 * g + 4 + e] = _mm512_shuffle_i32x4::<0xdd>(a, b);
            }
        }
        for i in 0..8 {
            r[i] = _mm512_shuffle_i32x4::<0x88>(v[i], v[8 + i]);
            r[8 + i] = _mm512_shuffle_i32x4::<0xdd>(v[i], v[8 + i]);
        }
    }

    /// [`pack_pairs`] for a source contiguous along k (`row(r)` points at `x[r, 0]`): per 16
    /// rows and 32 values of k, each row rounded by `vcvtne2ps2bf16` (nearest even; like the
    /// hardware's dot products it flushes f32 subnormals, below 1.2e-38, to zero) into 16
    /// pairs, the 16 × 16 block transposed in registers and stored a pair index at a time;
    /// the odd tail of k scalar.
    #[target_feature(enable = "avx512f,avx512bf16")]
    unsafe fn pack_pairs_contiguous(
        rows: usize,
        kc: usize,
        w: usize,
        out: &mut [u32],
        row: impl Fn(usize) -> *const f32,
    ) {
        let kp = kc.div_ceil(2);
        let chunks = kc / 32;
        for (sl, r0) in (0..rows).step_by(w).enumerate() {
            let n = w.min(rows - r0);
            let dst = out[sl * w * kp..(sl + 1) * w * kp].as_mut_ptr();
            transpose_into(n, chunks, w, dst, |i, c| {
                // SAFETY: 32 values from 32·c are inside the row (c < kc / 32).
                unsafe {
                    let src = row(r0 + i).add(32 * c);
                    let (lo, hi) = (_mm512_loadu_ps(src), _mm512_loadu_ps(src.add(16)));
                    std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo))
                }
            });
            let dst = &mut out[sl * w * kp..(sl + 1) * w * kp];
            for r in 0..w {
                if r < n {
                    let src = row(r0 + r);
                    // SAFETY: p < kc is inside the row.
                    fill_pairs_scalar(dst, w, r, 16 * chunks, kc, |p| unsafe { *src.add(p) });
                } else {
                    for p2 in 16 * chunks..kp {
                        dst[p2 * w + r] = 0;
                    }
                }
            }
        }
    }

    /// [`pack_pairs`] for a source whose rows along k are contiguous across the sliver's
    /// width (`B[p, j]` of a row-major `B`, or `A = gᵀ`): per k-pair, 16 entries of `k` and
    /// `k + 1` rounded together by `vcvtne2ps2bf16` and interleaved into (k, k+1) pairs by one
    /// 16-bit permute; `row(p)` points at entry 0 of the panel's row `p`; `w` (≤ 32) is the
    /// sliver width.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn pack_pairs_rows(
        cols: usize,
        kc: usize,
        w: usize,
        out: &mut [u32],
        row: impl Fn(usize) -> *const f32,
    ) {
        let kp = kc.div_ceil(2);
        // Output 16-bit element 2j takes row k's entry j (input j), 2j+1 row k+1's (16 + j).
        let idx: [i16; 32] = std::array::from_fn(|e| ((e / 2) + 16 * (e % 2)) as i16);
        let idx = _mm512_loadu_si512(idx.as_ptr() as *const _);
        for (sl, j0) in (0..cols).step_by(w).enumerate() {
            let dst = &mut out[sl * w * kp..(sl + 1) * w * kp];
            for jb in (0..w).step_by(16) {
                let load = lane_mask(cols.saturating_sub(j0 + jb));
                let store = lane_mask(w - jb);
                for p2 in 0..kp {
                    let lo = _mm512_maskz_loadu_ps(load, row(2 * p2).add(j0 + jb));
                    let hi = if 2 * p2 + 1 < kc {
                        _mm512_maskz_loadu_ps(load, row(2 * p2 + 1).add(j0 + jb))
                    } else {
                        _mm512_setzero_ps()
                    };
                    let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                    let v = _mm512_permutexvar_epi16(idx, v);
                    _mm512_mask_storeu_epi32(dst.as_mut_ptr().add(p2 * w + jb) as *mut _, store, v);
                }
            }
        }
    }

    /// `B[pc.., jc..]` (`kc × nc`) into `NR`-column slivers of k-pairs, zero-padded.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn pack_b_bf16(
        b: &ArrayView2<f32>,
        pc: usize,
        kc: usize,
        jc: usize,
        nc: usize,
        pb: &mut [u32],
    ) {
        let (brs, bcs, bbase) = (b.strides()[0], b.strides()[1], b.as_ptr());
        // SAFETY (all packers): (pc+p, jc+j) is inside B.
        if brs == 1 {
            pack_pairs_contiguous(nc, kc, NR, pb, |j| {
                bbase.offset(pc as isize + (jc + j) as isize * bcs)
            });
        } else if bcs == 1 {
            pack_pairs_rows(nc, kc, NR, pb, |p| {
                bbase.offset((pc + p) as isize * brs + jc as isize)
            });
        } else {
            pack_pairs(nc, kc, NR, pb, |j, p| {
                *bbase.offset((pc + p) as isize * brs + (jc + j) as isize * bcs)
            });
        }
    }

    /// The whole of `B` packed, one panel (every `NR`-sliver of its columns) per `KC`-block of
    /// its rows: what a frozen weight keeps. The slivers are packed on all threads (a weight
    /// that is frozen for one training step only is packed once per step).
    pub(super) fn pack_whole_b(bf16: bool, b: &ArrayView2<f32>) -> Panels {
        let (k, n) = b.dim();
        let slivers = n.div_ceil(NR);
        let per_thread = slivers.div_ceil(rayon::current_num_threads().max(1)).max(1);
        fn blocks<P: Copy + Default + Send>(
            k: usize,
            n: usize,
            slivers: usize,
            per_thread: usize,
            depth: impl Fn(usize) -> usize + Sync,
            pack: impl Fn(usize, usize, usize, usize, &mut [P]) + Sync,
        ) -> Vec<Vec<P>> {
            (0..k)
                .step_by(KC)
                .map(|pc| {
                    let kc = KC.min(k - pc);
                    let part = per_thread * NR * depth(kc);
                    let mut out = vec![P::default(); slivers * NR * depth(kc)];
                    out.par_chunks_mut(part).enumerate().for_each(|(i, chunk)| {
                        let jc = i * per_thread * NR;
                        pack(pc, kc, jc, (n - jc).min(per_thread * NR), chunk);
                    });
                    out
                })
                .collect()
        }
        if bf16 {
            // SAFETY: bf16 products run only where the CPU has AVX-512 BF16.
            let pack =
                |pc, kc, jc, nc, out: &mut [u32]| unsafe { pack_b_bf16(b, pc, kc, jc, nc, out) };
            Panels::Bf16(blocks(k, n, slivers, per_thread, |kc| kc.div_ceil(2), pack))
        } else {
            let pack = |pc, kc, jc, nc, out: &mut [f32]| pack_b(b, pc, kc, jc, nc, out);
            Panels::F32(blocks(k, n, slivers, per_thread, |kc| kc, pack))
        }
    }

    /// The blocked loop on one thread, bf16 inputs; `packed` as for [`gemm_serial`].
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    unsafe fn gemm_serial_bf16(
        alpha: f32,
        a: &ArrayView2<f32>,
        b: &ArrayView2<f32>,
        beta: f32,
        c: CPtr,
        packed: Option<(&[Vec<u32>], usize)>,
    ) {
        let ((m, k), n) = (a.dim(), b.ncols());
        let (ars, acs, abase) = (a.strides()[0], a.strides()[1], a.as_ptr());
        PACK_BF16.with(|pack| {
            let mut pack = pack.borrow_mut();
            let (pa, pb) = &mut *pack;
            if packed.is_none() {
                pb.resize(NC.div_ceil(NR) * NR * KC / 2, 0);
            }
            let pack_b = |pc: usize, kc: usize, jc: usize, nc: usize, pb: &mut [u32]| match packed {
                Some(p) => prepacked(p, pc, jc, kc.div_ceil(2)),
                None => {
                    // SAFETY: inside this AVX-512 BF16 function.
                    unsafe { pack_b_bf16(b, pc, kc, jc, nc, pb) };
                    pb.as_ptr()
                }
            };
            // SAFETY (the packer): (ic+i, pc+p) is inside A.
            let pack_a = |ic: usize, mc: usize, pc: usize, kc: usize, pa: &mut [u32]| unsafe {
                if acs == 1 {
                    pack_pairs_contiguous(mc, kc, MR, pa, |i| {
                        abase.offset((ic + i) as isize * ars + pc as isize)
                    });
                } else if ars == 1 {
                    // A = gᵀ (the weight gradient's product).
                    pack_pairs_rows(mc, kc, MR, pa, |p| {
                        abase.offset((pc + p) as isize * acs + ic as isize)
                    });
                } else {
                    pack_pairs(mc, kc, MR, pa, |i, p| {
                        *abase.offset((ic + i) as isize * ars + (pc + p) as isize * acs)
                    });
                }
            };
            blocked(
                (m, n, k),
                c,
                beta,
                packed.is_some(),
                pa,
                pb,
                |kc| kc.div_ceil(2),
                pack_b,
                pack_a,
                |d, ap, bp, cij, mr, nr, bk| {
                    by_rows!(
                        mr,
                        kernel_bf16,
                        d,
                        ap,
                        bp,
                        cij,
                        c.rs,
                        c.cs,
                        mr,
                        nr,
                        alpha,
                        bk
                    )
                },
            );
        });
    }

    /// The bf16 micro-tile: per k-pair two loads of `B`, `R` broadcasts of an `A` pair and
    /// `2R` `vdpbf16ps` (each two multiply-adds per lane, summed in f32); `R` as in [`kernel`].
    #[target_feature(enable = "avx512f,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    unsafe fn kernel_bf16<const R: usize>(
        kp: usize,
        a: *const u32,
        b: *const u32,
        c: *mut f32,
        rs: isize,
        cs: isize,
        mr: usize,
        nr: usize,
        alpha: f32,
        beta: f32,
    ) {
        let mut lo = [_mm512_setzero_ps(); R];
        let mut hi = [_mm512_setzero_ps(); R];
        let (mut ap, mut bp) = (a, b);
        for _ in 0..kp {
            let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(bp as *const _));
            let b1: __m512bh = std::mem::transmute(_mm512_loadu_si512(bp.add(16) as *const _));
            for i in 0..R {
                let ai: __m512bh = std::mem::transmute(_mm512_set1_epi32(*ap.add(i) as i32));
                lo[i] = _mm512_dpbf16_ps(lo[i], ai, b0);
                hi[i] = _mm512_dpbf16_ps(hi[i], ai, b1);
            }
            ap = ap.add(MR);
            bp = bp.add(NR);
        }
        store_tile(&lo, &hi, c, rs, cs, mr, nr, alpha, beta);
    }

    /// Twelve independent chains of 512-bit FMAs (more than FMA latency × ports), long enough
    /// to time.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn peak_fma() -> f64 {
        let mut acc = [_mm512_set1_ps(1.0); 12];
        let x = _mm512_set1_ps(0.999_999);
        let y = _mm512_set1_ps(1e-7);
        let reps = 20_000_000usize;
        let t = std::time::Instant::now();
        for _ in 0..reps {
            for a in acc.iter_mut() {
                *a = _mm512_fmadd_ps(*a, x, y);
            }
        }
        let secs = t.elapsed().as_secs_f64();
        std::hint::black_box(&acc);
        (reps * 12 * 16 * 2) as f64 / secs / 1e9
    }
}
