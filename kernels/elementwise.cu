// Element-wise and gather kernels, f32. 1-D grids cover n elements with a grid-stride loop.

// The gated MLP activation, out[r, i] = act(gate[r*in_stride + i]) * up[r*in_stride + i],
// out: [rows, cols] contiguous; in_stride lets gate/up live inside one fused [rows, 2*cols]
// gate|up buffer. One loop for every activation; each kernel below names its `act`.
template <typename Act>
static __device__ void gated_rows(const float* __restrict__ gate, const float* __restrict__ up,
                                  float* __restrict__ out, int rows, int cols, int in_stride) {
    const size_t n = (size_t)rows * cols;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        const size_t r = idx / cols;
        const size_t i = idx - r * cols;
        out[idx] = Act::apply(gate[r * in_stride + i]) * up[r * in_stride + i];
    }
}

// silu(g) = g / (1 + e^-g) (Llama, Qwen2).
struct Silu {
    static __device__ float apply(float g) { return g / (1.0f + expf(-g)); }
};

// GELU's tanh approximation (Gemma 3's GeGLU), nn::geglu's formula:
// gelu(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))).
struct GeluTanh {
    static __device__ float apply(float g) {
        const float t = tanhf(0.7978845608028654f * g * (1.0f + 0.044715f * g * g));
        return 0.5f * g * (1.0f + t);
    }
};

extern "C" __global__ void swiglu_f32(const float* __restrict__ gate, const float* __restrict__ up,
                                      float* __restrict__ out, int rows, int cols, int in_stride) {
    gated_rows<Silu>(gate, up, out, rows, cols, in_stride);
}

extern "C" __global__ void geglu_tanh_f32(const float* __restrict__ gate, const float* __restrict__ up,
                                          float* __restrict__ out, int rows, int cols, int in_stride) {
    gated_rows<GeluTanh>(gate, up, out, rows, cols, in_stride);
}

// x += y (residual add), both [n].
extern "C" __global__ void add_inplace_f32(float* __restrict__ x, const float* __restrict__ y, int n) {
    for (int idx = blockIdx.x * blockDim.x + threadIdx.x; idx < n; idx += gridDim.x * blockDim.x)
        x[idx] += y[idx];
}

// x[r, c] += b[c], x: [rows, cols].
extern "C" __global__ void add_bias_f32(float* __restrict__ x, const float* __restrict__ b, int rows, int cols) {
    const size_t n = (size_t)rows * cols;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x)
        x[idx] += b[idx % cols];
}

// Row gather: out[r, :] = scale * table[index[r], :]. Token embedding lookup (scale sqrt(C) on
// Gemma 3, else 1), and picking each sequence's last hidden row before the LM head (scale 1).
// Indices are validated on the host. grid = rows.
extern "C" __global__ void gather_rows_f32(const float* __restrict__ table, const unsigned int* __restrict__ index,
                                           float* __restrict__ out, int cols, float scale) {
    const size_t r = blockIdx.x;
    const float* src = table + (size_t)index[r] * cols;
    float* dst = out + r * cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) dst[c] = src[c] * scale;
}

// Appends the new K and V of each token into the per-layer cache.
// src row r: k at src[r*src_stride + k_off + kvh*head_dim + d], v likewise at v_off.
// cache layout [max_batch, n_kv_heads, max_seq, head_dim]; slot[r], pos[r] say where row r goes.
// grid = rows.
extern "C" __global__ void kv_cache_write_f32(const float* __restrict__ src, int src_stride, int k_off, int v_off,
                                              float* __restrict__ k_cache, float* __restrict__ v_cache,
                                              const unsigned int* __restrict__ slot,
                                              const unsigned int* __restrict__ pos,
                                              int n_kv_heads, int head_dim, int max_seq) {
    const size_t r = blockIdx.x;
    const float* row = src + r * src_stride;
    const size_t s = slot[r];
    const size_t p = pos[r];
    for (int idx = threadIdx.x; idx < n_kv_heads * head_dim; idx += blockDim.x) {
        const int kvh = idx / head_dim;
        const int d = idx - kvh * head_dim;
        const size_t dst = ((s * n_kv_heads + kvh) * max_seq + p) * head_dim + d;
        k_cache[dst] = row[k_off + idx];
        v_cache[dst] = row[v_off + idx];
    }
}
