// cuda-naive's fused QK-RMSNorm + RoPE: cpu-naive's loops (cpu/naive_qk_norm.cpp), one
// GPU thread per norm group (a head row, or all heads of a token), running the very same
// qk_norm_group step from common/. A group's sum of squares must be complete before any of
// its features is written, so the group, not the pair, is a thread's unit of work.
#include <climits>
#include <cstdint>

#include "qk_norm_common.cuh"

namespace rope {
namespace {

template <typename Storage>
__global__ void qk_norm_naive_kernel(const __grid_constant__ cuda_detail::QkNormArgsDevice args) {
    const int64_t step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; item < args.total_items; item += step) {
        const cuda_detail::QkNormItem at = cuda_detail::qk_norm_item(args, item);
        detail::qk_norm_group<Storage>(args.step, args.angles, args.positions, at.which, at.b, at.group, at.s);
    }
}

}  // namespace

void detail::run_qk_norm_cuda_naive(const QkNormPlan& plan) {
    cuda_detail::check_qk_norm_pointers(plan);
    dispatch_dtype(plan.rope.dtype, [&](auto storage) {
        using Storage = decltype(storage);
        if (!plan.rope.empty()) {
            const cuda_detail::QkNormArgsDevice args = cuda_detail::make_qk_norm_args(plan);
            if (args.total_items > 0) {
                constexpr int threads = 128;
                const int64_t blocks = (args.total_items + threads - 1) / threads;
                cuda_detail::launch_kernel(
                    "qk_norm_naive_kernel",
                    cuda_detail::launch_config(unsigned(blocks < INT_MAX ? blocks : INT_MAX), threads,
                                               cuda_detail::stream_of(plan.rope)),
                    qk_norm_naive_kernel<Storage>, args);
            }
        }
        cuda_detail::copy_v<Storage>(plan);
    });
}

}  // namespace rope
