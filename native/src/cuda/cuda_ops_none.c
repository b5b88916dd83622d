/*
 * cuda_ops_none.c: cr_cuda_ops_new in a build without CUDA (cuda_ops.cu is compiled
 * only with -DGGML_CUDA=ON, which defines CODECRT_CUDA_OPS): no ops backend, so the
 * graphs compose the residual units' cores from ggml ops.
 */
#include "cuda_ops.h"

#ifndef CODECRT_CUDA_OPS
ggml_backend_t cr_cuda_ops_new(ggml_backend_t device, bool precise_sin) {
    (void)device;
    (void)precise_sin;
    return NULL;
}
#else
typedef int cr_cuda_ops_none_unused; /* ISO C: a translation unit is not empty */
#endif
