// RMSNorm over the last dimension, f32. One block per row; blockDim is a multiple of 32.
// y[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w[:]

// x, y: [rows, cols]; w: [cols]. grid = rows.
extern "C" __global__ void rmsnorm_f32(const float* __restrict__ x, const float* __restrict__ w,
                                       float* __restrict__ y, int cols, float eps) {
    const size_t row = blockIdx.x;
    const float* xr = x + row * cols;
    float* yr = y + row * cols;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float v = xr[i];
        ss += v * v;
    }
    ss = block_reduce(ss, false);
    // 1/sqrtf (IEEE sqrt) rather than rsqrtf: keeps the kernel within 1e-6 of a CPU reference.
    const float inv_rms = 1.0f / sqrtf(ss / (float)cols + eps);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) yr[i] = xr[i] * inv_rms * w[i];
}

// Per-head RMSNorm in place (Gemma 3's q/k norms): head h of row r is the head_dim floats at
// x + r*row_stride + h*head_dim, normalised over those floats and scaled by w[:head_dim].
// The heads may sit inside a fused q|k|v row (row_stride > n_heads*head_dim). grid = (rows, n_heads).
extern "C" __global__ void rmsnorm_heads_f32(float* __restrict__ x, const float* __restrict__ w,
                                             int row_stride, int head_dim, float eps) {
    float* xh = x + (size_t)blockIdx.x * row_stride + (size_t)blockIdx.y * head_dim;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) {
        const float v = xh[i];
        ss += v * v;
    }
    ss = block_reduce(ss, false);  // also a barrier: every read of xh is done before the writes
    const float inv_rms = 1.0f / sqrtf(ss / (float)head_dim + eps);
    for (int i = threadIdx.x; i < head_dim; i += blockDim.x) xh[i] = xh[i] * inv_rms * w[i];
}
