// Rotary position embedding, in place, f32.
// x rows are tokens; each row holds n_heads heads of head_dim values starting at the row's base
// (row_stride lets the kernel rotate the q or k part of a fused qkv row). pos[r] = position of row r.
// inv_freq_i = theta^(-2i / head_dim), angle = pos * inv_freq_i, both in double: the rotation is then
// exact to f32 rounding at any position (an f32 angle drifts by ~pos * 6e-8 rad). The cost is a few
// double ops per rotated pair, negligible next to the projections.
// grid = rows.

// Half-split layout (HF Llama/Qwen2): pairs (i, i + head_dim/2).
extern "C" __global__ void rope_half_f32(float* __restrict__ x, const unsigned int* __restrict__ pos,
                                         int row_stride, int n_heads, int head_dim, float theta) {
    const size_t row = blockIdx.x;
    const int half = head_dim / 2;
    const unsigned int p = pos[row];
    float* xr = x + row * row_stride;
    for (int idx = threadIdx.x; idx < n_heads * half; idx += blockDim.x) {
        const int h = idx / half;
        const int i = idx - h * half;
        const double inv_freq = pow((double)theta, -(double)(2 * i) / (double)head_dim);
        double sd, cd;
        sincos((double)p * inv_freq, &sd, &cd);
        const float s = (float)sd, c = (float)cd;
        float* hx = xr + h * head_dim;
        const float x1 = hx[i];
        const float x2 = hx[i + half];
        hx[i] = x1 * c - x2 * s;
        hx[i + half] = x2 * c + x1 * s;
    }
}

// Interleaved layout (GGUF / original Meta): pairs (2i, 2i + 1).
extern "C" __global__ void rope_interleaved_f32(float* __restrict__ x, const unsigned int* __restrict__ pos,
                                                int row_stride, int n_heads, int head_dim, float theta) {
    const size_t row = blockIdx.x;
    const int half = head_dim / 2;
    const unsigned int p = pos[row];
    float* xr = x + row * row_stride;
    for (int idx = threadIdx.x; idx < n_heads * half; idx += blockDim.x) {
        const int h = idx / half;
        const int i = idx - h * half;
        const double inv_freq = pow((double)theta, -(double)(2 * i) / (double)head_dim);
        double sd, cd;
        sincos((double)p * inv_freq, &sd, &cd);
        const float s = (float)sd, c = (float)cd;
        float* hx = xr + h * head_dim;
        const float x1 = hx[2 * i];
        const float x2 = hx[2 * i + 1];
        hx[2 * i] = x1 * c - x2 * s;
        hx[2 * i + 1] = x2 * c + x1 * s;
    }
}
