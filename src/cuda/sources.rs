//! The CUDA C sources of every kernel, embedded at build time (shared by the real backend and the stub).
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

/// One embedded kernel file and the `extern "C"` kernels it defines.
#[derive(Clone, Copy, Debug)]
pub struct KernelSource {
    /// File name under `kernels/`.
    pub file: &'static str,
    /// The CUDA C source text.
    pub source: &'static str,
    /// Names of the `extern "C" __global__` functions it defines.
    pub kernels: &'static [&'static str],
}

/// Every kernel file the backend compiles.
pub const KERNEL_SOURCES: &[KernelSource] = &[
    KernelSource {
        file: "norm.cu",
        source: with_common!("norm.cu"),
        kernels: &["rmsnorm_f32"],
    },
    KernelSource {
        file: "rope.cu",
        source: with_common!("rope.cu"),
        kernels: &["rope_half_f32", "rope_interleaved_f32"],
    },
    KernelSource {
        file: "elementwise.cu",
        source: with_common!("elementwise.cu"),
        kernels: &[
            "swiglu_f32",
            "add_inplace_f32",
            "add_bias_f32",
            "gather_rows_f32",
            "kv_cache_write_f32",
        ],
    },
    KernelSource {
        file: "attention.cu",
        source: with_common!("attention.cu"),
        kernels: &["attention_f32"],
    },
    KernelSource {
        file: "softmax.cu",
        source: with_common!("softmax.cu"),
        kernels: &["softmax_f32", "argmax_f32", "sample_f32"],
    },
    KernelSource {
        file: "fixed_point.cu",
        source: with_common!("fixed_point.cu"),
        kernels: &["anderson_mix_f32"],
    },
];

/// The embedded kernel sources (see [`KERNEL_SOURCES`]).
pub fn kernel_sources() -> &'static [KernelSource] {
    KERNEL_SOURCES
}

/// The source file defining kernel `name`, if any.
pub fn source_of(name: &str) -> Option<&'static KernelSource> {
    KERNEL_SOURCES.iter().find(|s| s.kernels.contains(&name))
}
