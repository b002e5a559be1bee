// Rotary position embedding, in place, f32.
// x rows are tokens; each row holds n_heads heads of head_dim values starting at the row's base
// (row_stride lets the kernel rotate the q or k part of a fused qkv row). pos[r] = position of row r.
// Frequencies follow HF: inv_freq_i = 1 / theta^(2i / head_dim), angle = pos * inv_freq_i (f32).
// grid = rows.

// Half-split layout (HF Llama/Qwen2): pairs (i, i + head_dim/2).
extern "C" __global__ void rope_half_f32(float* __restrict__ x, const unsigned int* __restrict__ pos,
                                         int row_stride, int n_heads, int head_dim, float theta) {
    const size_t row = blockIdx.x;
    const int half = head_dim / 2;
    const float p = (float)pos[row];
    float* xr = x + row * row_stride;
    for (int idx = threadIdx.x; idx < n_heads * half; idx += blockDim.x) {
        const int h = idx / half;
        const int i = idx - h * half;
        const float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)head_dim);
        float s, c;
        sincosf(p * inv_freq, &s, &c);
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
    const float p = (float)pos[row];
    float* xr = x + row * row_stride;
    for (int idx = threadIdx.x; idx < n_heads * half; idx += blockDim.x) {
        const int h = idx / half;
        const int i = idx - h * half;
        const float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)head_dim);
        float s, c;
        sincosf(p * inv_freq, &s, &c);
        float* hx = xr + h * head_dim;
        const float x1 = hx[2 * i];
        const float x2 = hx[2 * i + 1];
        hx[2 * i] = x1 * c - x2 * s;
        hx[2 * i + 1] = x2 * c + x1 * s;
    }
}
