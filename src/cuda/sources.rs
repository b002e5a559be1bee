//! The CUDA kernels and the C sources that define them, embedded at build time (shared by the
//! real backend and the stub).
//!
//! One list: [`Kernel`] names every `extern "C" __global__` function the backend launches
//! (`Kernel::ALL`, checked by the compiler against the enum); its name and the [`KernelFile`]
//! defining it are exhaustive matches, so a new kernel is its `.cu` code, a variant here (with
//! its name and file), and its launcher in `kernels.rs`. A new file is also a [`KernelFile`]
//! variant (file name and embedded source).
//!
//! Each file is an f32 `.cu` program without include directives, compiled by NVRTC on first use
//! with `kernels/common.cuh` (shared device helpers) prepended: NVRTC line numbers in
//! error logs count from the start of that header.

/// `kernels/common.cuh` followed by `kernels/<file>`, as one string literal.
macro_rules! with_common {
    ($file:literal) => {
        concat!(
            include_str!("../../kernels/common.cuh"),
            "\n",
            include_str!(concat!("../../kernels/", $file))
        )
    };
}

crate::registry::variant_list! {
    /// One embedded kernel file (`kernels/<name>`), compiled by NVRTC as one module.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum KernelFile("kernel file") {
        Norm,
        Rope,
        Elementwise,
        Attention,
        Softmax,
        FixedPoint,
    }
}

impl KernelFile {
    /// File name under `kernels/`.
    pub fn name(self) -> &'static str {
        match self {
            KernelFile::Norm => "norm.cu",
            KernelFile::Rope => "rope.cu",
            KernelFile::Elementwise => "elementwise.cu",
            KernelFile::Attention => "attention.cu",
            KernelFile::Softmax => "softmax.cu",
            KernelFile::FixedPoint => "fixed_point.cu",
        }
    }
    /// The CUDA C source text: `kernels/common.cuh`, a newline, then the file.
    pub fn source(self) -> &'static str {
        match self {
            KernelFile::Norm => with_common!("norm.cu"),
            KernelFile::Rope => with_common!("rope.cu"),
            KernelFile::Elementwise => with_common!("elementwise.cu"),
            KernelFile::Attention => with_common!("attention.cu"),
            KernelFile::Softmax => with_common!("softmax.cu"),
            KernelFile::FixedPoint => with_common!("fixed_point.cu"),
        }
    }
    /// The kernels the file defines, in [`Kernel::ALL`]'s order.
    pub fn kernels(self) -> impl Iterator<Item = Kernel> {
        Kernel::ALL.into_iter().filter(move |k| k.file() == self)
    }
}

crate::registry::variant_list! {
    /// One `extern "C" __global__` kernel the backend launches.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    pub enum Kernel("kernel") {
        RmsNorm,
        RmsNormHeads,
        RopeHalf,
        RopeInterleaved,
        Swiglu,
        GegluTanh,
        AddInplace,
        AddBias,
        GatherRows,
        KvCacheWrite,
        Attention,
        Softmax,
        Argmax,
        Sample,
        AndersonMix,
    }
}

impl Kernel {
    /// The C function's name.
    pub fn name(self) -> &'static str {
        match self {
            Kernel::RmsNorm => "rmsnorm_f32",
            Kernel::RmsNormHeads => "rmsnorm_heads_f32",
            Kernel::RopeHalf => "rope_half_f32",
            Kernel::RopeInterleaved => "rope_interleaved_f32",
            Kernel::Swiglu => "swiglu_f32",
            Kernel::GegluTanh => "geglu_tanh_f32",
            Kernel::AddInplace => "add_inplace_f32",
            Kernel::AddBias => "add_bias_f32",
            Kernel::GatherRows => "gather_rows_f32",
            Kernel::KvCacheWrite => "kv_cache_write_f32",
            Kernel::Attention => "attention_f32",
            Kernel::Softmax => "softmax_f32",
            Kernel::Argmax => "argmax_f32",
            Kernel::Sample => "sample_f32",
            Kernel::AndersonMix => "anderson_mix_f32",
        }
    }
    /// The file that defines it.
    pub fn file(self) -> KernelFile {
        match self {
            Kernel::RmsNorm | Kernel::RmsNormHeads => KernelFile::Norm,
            Kernel::RopeHalf | Kernel::RopeInterleaved => KernelFile::Rope,
            Kernel::Swiglu
            | Kernel::GegluTanh
            | Kernel::AddInplace
            | Kernel::AddBias
            | Kernel::GatherRows
            | Kernel::KvCacheWrite => KernelFile::Elementwise,
            Kernel::Attention => KernelFile::Attention,
            Kernel::Softmax | Kernel::Argmax | Kernel::Sample => KernelFile::Softmax,
            Kernel::AndersonMix => KernelFile::FixedPoint,
        }
    }
}
