//! CUDA backend (feature `cuda`).
