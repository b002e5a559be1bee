// Device helpers shared by the kernel files; prepended to every file before NVRTC
// compiles it (src/cuda/sources.rs), so the files need no include directive.

// Max (is_max) or sum of `v` over the block; every thread gets the result.
// blockDim.x must be a multiple of 32.
static __device__ float block_reduce(float v, bool is_max) {
    __shared__ float warp_part[32];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, other) : v + other;
    }
    if (lane == 0) warp_part[warp] = v;
    __syncthreads();
    const int n_warps = (blockDim.x + 31) >> 5;
    if (warp == 0) {
        v = (lane < n_warps) ? warp_part[lane] : (is_max ? -3.402823466e38f : 0.0f);
        for (int o = 16; o > 0; o >>= 1) {
            const float other = __shfl_xor_sync(0xffffffffu, v, o);
            v = is_max ? fmaxf(v, other) : v + other;
        }
        if (lane == 0) warp_part[0] = v;
    }
    __syncthreads();
    v = warp_part[0];
    __syncthreads();
    return v;
}
