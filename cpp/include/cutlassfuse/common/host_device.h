// Functions that host code and kernels share: plain inline functions to the host
// compiler, __host__ __device__ ones to nvcc.
#pragma once

#ifdef __CUDACC__
#define CUTLASSFUSE_HOST_DEVICE __host__ __device__ inline
#else
#define CUTLASSFUSE_HOST_DEVICE inline
#endif
