// Tiny kernels for kern-runtime's GPU tests. Build: nvcc -cubin -arch=sm_90 -O2 toy.cu -o toy.cubin
#include <stdint.h>

// y[i] = a * x[i] + 1 for i < n
extern "C" __global__ void kern_scale(const float* x, float* y, int32_t n, float a) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + 1.0f;
}

// out[i] = p[i] + q[i] for i < n
extern "C" __global__ void kern_add(const float* p, const float* q, float* out, int32_t n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = p[i] + q[i];
}

// y[i] = v * 1000 + i for i < n (graph-key tests: the value is burned into the graph)
extern "C" __global__ void kern_fill(float* y, int32_t v, int32_t n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = (float)v * 1000.0f + (float)i;
}

// Uses 64 KiB of dynamic shared memory: y[i] = x[i] staged through shared memory
extern "C" __global__ void kern_big_shared(const float* x, float* y, int32_t n) {
    extern __shared__ float smem[];
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    smem[threadIdx.x + 16000] = (i < n) ? x[i] : 0.0f;
    __syncthreads();
    if (i < n) y[i] = smem[threadIdx.x + 16000];
}

// out[b] = 100 * (CTAs in b's cluster) + (b's rank in its cluster), one value per block (thread 0):
// launched with a cluster of c blocks it reads 100 c + b % c; without a cluster attribute, 100.
extern "C" __global__ void kern_cluster_rank(int32_t* out, int32_t nblocks) {
    uint32_t rank, size;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(size));
    if (threadIdx.x == 0 && (int32_t)blockIdx.x < nblocks) out[blockIdx.x] = (int32_t)(100 * size + rank);
}
