// kern_same, variant A: (float* y, int32 n) -> y[i] = 1
#include <stdint.h>
extern "C" __global__ void kern_same(float* y, int32_t n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 1.0f;
}
