// Row-wise softmax, argmax and inverse-CDF sampling, f32. One block per row; blockDim multiple of 32.

// y[r, :] = softmax(x[r, :] / temperature). x, y: [rows, cols].
extern "C" __global__ void softmax_f32(const float* __restrict__ x, float* __restrict__ y, int cols,
                                       float inv_temperature) {
    const size_t r = blockIdx.x;
    const float* xr = x + r * cols;
    float* yr = y + r * cols;
    float local_max = -3.402823466e38f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) local_max = fmaxf(local_max, xr[i] * inv_temperature);
    const float m = block_reduce(local_max, true);
    float local_sum = 0.0f;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float e = expf(xr[i] * inv_temperature - m);
        yr[i] = e;
        local_sum += e;
    }
    const float inv_sum = 1.0f / block_reduce(local_sum, false);
    for (int i = threadIdx.x; i < cols; i += blockDim.x) yr[i] *= inv_sum;
}

// out[r] = argmax_i x[r, i]; ties go to the smallest index (same as a first-max CPU scan). NaN is skipped.
extern "C" __global__ void argmax_f32(const float* __restrict__ x, unsigned int* __restrict__ out, int cols) {
    __shared__ float best_val[1024];
    __shared__ int best_idx[1024];
    const size_t r = blockIdx.x;
    const float* xr = x + r * cols;
    float bv = -3.402823466e38f;
    int bi = -1;
    for (int i = threadIdx.x; i < cols; i += blockDim.x) {
        const float v = xr[i];
        if (v > bv || (bi < 0 && v == v)) {  // v == v excludes NaN
            bv = v;
            bi = i;
        }
    }
    best_val[threadIdx.x] = bv;
    best_idx[threadIdx.x] = bi;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            const float ov = best_val[threadIdx.x + stride];
            const int oi = best_idx[threadIdx.x + stride];
            const float mv = best_val[threadIdx.x];
            const int mi = best_idx[threadIdx.x];
            const bool take = oi >= 0 && (mi < 0 || ov > mv || (ov == mv && oi < mi));
            if (take) {
                best_val[threadIdx.x] = ov;
                best_idx[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) out[r] = best_idx[0] < 0 ? 0u : (unsigned int)best_idx[0];
}

// Inverse-CDF sampling from (not necessarily normalised) non-negative weights p[r, :]:
// out[r] = smallest i with cumsum(p[r, :i+1]) > u[r] * sum(p[r, :]), u[r] in [0, 1).
// Each thread sums one contiguous chunk; thread 0 then walks the chunk sums and the chosen chunk.
// blockDim must be a power of two <= 1024.
extern "C" __global__ void sample_f32(const float* __restrict__ p, const float* __restrict__ u,
                                      unsigned int* __restrict__ out, int cols) {
    __shared__ float chunk_sum[1024];
    const size_t r = blockIdx.x;
    const float* pr = p + r * cols;
    const int chunk = (cols + blockDim.x - 1) / blockDim.x;
    const int begin = threadIdx.x * chunk;
    const int end = min(begin + chunk, cols);
    float s = 0.0f;
    for (int i = begin; i < end; ++i) s += pr[i];
    chunk_sum[threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int t = 0; t < (int)blockDim.x; ++t) total += chunk_sum[t];
        const float target = u[r] * total;
        float acc = 0.0f;
        int last_nonzero = 0;
        int chosen = -1;
        for (int t = 0; t < (int)blockDim.x && chosen < 0; ++t) {
            if (acc + chunk_sum[t] > target) {
                const int b = t * chunk;
                const int e = min(b + chunk, cols);
                for (int i = b; i < e; ++i) {
                    if (pr[i] > 0.0f) last_nonzero = i;
                    acc += pr[i];
                    if (acc > target) {
                        chosen = i;
                        break;
                    }
                }
                if (chosen < 0) chosen = last_nonzero;  // rounding: chunk sum said yes, walk said no
            } else {
                acc += chunk_sum[t];
                if (chunk_sum[t] > 0.0f) {
                    const int b = t * chunk;
                    const int e = min(b + chunk, cols);
                    for (int i = e - 1; i >= b; --i)
                        if (pr[i] > 0.0f) { last_nonzero = i; break; }
                }
            }
        }
        out[r] = (unsigned int)(chosen < 0 ? last_nonzero : chosen);
    }
}
