//! Which integer kernel the quantized products run on, detected once per process: the one
//! choice both the products (`super::matmul`) and the weights' layout (`super::matrix`, which
//! tiles its rows for the VNNI kernel) read.

/// Which kernel [`super::matmul::qmatmul_rows`] uses; detected once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kernel {
    /// The AVX2 kernels with their block products on AVX-512 VNNI's `vpdpbusd` (256-bit).
    Avx512Vnni,
    Avx2,
    Portable,
}

impl Kernel {
    /// Every kernel, fastest first.
    pub const ALL: [Kernel; 3] = [Kernel::Avx512Vnni, Kernel::Avx2, Kernel::Portable];

    /// Whether this CPU can run it (checked once per kernel).
    pub fn is_available(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::sync::OnceLock;
            static AVX2: OnceLock<bool> = OnceLock::new();
            static VNNI: OnceLock<bool> = OnceLock::new();
            let avx2 = || {
                *AVX2.get_or_init(|| {
                    is_x86_feature_detected!("avx2")
                        && is_x86_feature_detected!("fma")
                        && is_x86_feature_detected!("f16c")
                })
            };
            match self {
                Kernel::Portable => true,
                Kernel::Avx2 => avx2(),
                Kernel::Avx512Vnni => {
                    avx2()
                        && *VNNI.get_or_init(|| {
                            is_x86_feature_detected!("avx512vnni")
                                && is_x86_feature_detected!("avx512vl")
                        })
                }
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Kernel::Portable
        }
    }
}

/// The fastest kernel this CPU supports (`ELM_QKERNEL=avx2|portable` picks a slower one, for
/// comparisons).
pub fn detected_kernel() -> Kernel {
    static CHOSEN: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let forced = match std::env::var("ELM_QKERNEL").ok().as_deref() {
            Some("avx2") => Some(Kernel::Avx2),
            Some("portable") => Some(Kernel::Portable),
            _ => None,
        };
        Kernel::ALL
            .into_iter()
            .filter(|k| forced.is_none_or(|f| *k == f))
            .find(|k| k.is_available())
            .unwrap_or(Kernel::Portable)
    })
}
