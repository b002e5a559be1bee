// Fixed-point (ELM) module helpers, f32.
// The projection u = z W_z^T + h W_h^T + b is two cuBLAS GEMMs plus add_bias_f32 (elementwise.cu).

// Anderson mixing update: out[j] = sum_i alpha[i] * ((1 - beta) * x_hist[i, j] + beta * f_hist[i, j]).
// x_hist, f_hist: [m, n] (the last m iterates and their images f(x)), alpha: [m] (sums to 1; solved on
// the host from the small m x m residual Gram system). beta = 1 is undamped Anderson.
extern "C" __global__ void anderson_mix_f32(const float* __restrict__ x_hist, const float* __restrict__ f_hist,
                                            const float* __restrict__ alpha, float* __restrict__ out,
                                            int m, int n, float beta) {
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < n; j += gridDim.x * blockDim.x) {
        float acc = 0.0f;
        for (int i = 0; i < m; ++i) {
            const size_t idx = (size_t)i * n + j;
            acc += alpha[i] * ((1.0f - beta) * x_hist[idx] + beta * f_hist[idx]);
        }
        out[j] = acc;
    }
}
