// Causal grouped-query attention, f32, one block per (query row, query head).
//
// Query row r (at q + r*q_stride + h*head_dim) attends to keys j = 0 ..= pos[r] of its sequence:
//   key j of KV head g lives at k + slot[r]*slot_stride + g*head_stride + j*key_stride (same for v).
// The same kernel serves
//   * decode / prefill against the KV cache [B, KV, T_max, D]:
//       slot_stride = KV*T_max*D, head_stride = T_max*D, key_stride = D;
//   * plain causal prefill of one sequence with contiguous k, v [T, KV, D]:
//       slot = 0, pos[t] = t, slot_stride = 0, head_stride = D, key_stride = KV*D.
// With window > 0 (Gemma 3's local layers) only the last `window` of those keys are seen:
// j = max(0, pos[r] + 1 - window) ..= pos[r] (nn::attention::first_visible); window = 0 sees all.
// Scores are kept in dynamic shared memory: smem = (head_dim + max_len) floats, max_len >= pos[r] + 1.
// Softmax is exact (max-subtracted), scale = 1/sqrt(head_dim) is passed in.
// grid = (rows, n_heads), blockDim multiple of 32.

extern "C" __global__ void attention_f32(const float* __restrict__ q, int q_stride,
                                         const float* __restrict__ k, const float* __restrict__ v,
                                         float* __restrict__ out, int out_stride,
                                         const unsigned int* __restrict__ slot,
                                         const unsigned int* __restrict__ pos,
                                         int n_heads, int n_kv_heads, int head_dim,
                                         long long slot_stride, long long head_stride, long long key_stride,
                                         float scale, int window) {
    extern __shared__ float smem[];
    float* q_s = smem;
    float* scores = smem + head_dim;
    const size_t r = blockIdx.x;
    const int h = blockIdx.y;
    const int kvh = h / (n_heads / n_kv_heads);
    const int len = (int)pos[r] + 1;
    // The first visible key; the loops below index from it (key j = first + i) so that they
    // keep the plain form the compiler unrolls (indexing scores by j - first cost decode a third
    // of its speed on an H200).
    const int first = (window > 0 && len > window) ? len - window : 0;
    const int seen = len - first;

    const float* q_row = q + r * q_stride + (size_t)h * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) q_s[d] = q_row[d];
    __syncthreads();

    const long long base = (long long)slot[r] * slot_stride + (long long)kvh * head_stride
                         + (long long)first * key_stride;
    const float* kb = k + base;
    const float* vb = v + base;

    float local_max = -3.402823466e38f;
    for (int j = threadIdx.x; j < seen; j += blockDim.x) {
        const float* kr = kb + (long long)j * key_stride;
        float dot = 0.0f;
        for (int d = 0; d < head_dim; ++d) dot += q_s[d] * kr[d];
        dot *= scale;
        scores[j] = dot;
        local_max = fmaxf(local_max, dot);
    }
    const float m = block_reduce(local_max, true);
    float local_sum = 0.0f;
    for (int j = threadIdx.x; j < seen; j += blockDim.x) {
        const float e = expf(scores[j] - m);
        scores[j] = e;
        local_sum += e;
    }
    const float inv_sum = 1.0f / block_reduce(local_sum, false);  // also a barrier: scores visible

    float* o_row = out + r * out_stride + (size_t)h * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < seen; ++j) acc += scores[j] * vb[(long long)j * key_stride + d];
        o_row[d] = acc * inv_sum;
    }
}
