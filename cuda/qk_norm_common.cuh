#pragma once
/// @file qk_norm_common.cuh
/// @brief What both CUDA backends' fused QK-norm + RoPE share (internal): the kernel
/// parameters, the pointer checks and the copy of v.

#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>

#include "check.hpp"
#include "kernel_args.cuh"
#include "pointer_check.hpp"
#include "rope/detail/qk_norm_plan.hpp"

namespace rope::cuda_detail {

/// @brief A QkNormPlan as a kernel parameter (see kernel_args.cuh for why by value).
struct QkNormArgsDevice {
    QkNormStep step;                 ///< The norm, the operands, the pairing.
    PositionSource positions;        ///< Position of each token.
    AngleArgs<kMaxPairs> angles;     ///< cos and sin of each pair.
    int64_t seq = 0;                 ///< Tokens per sequence.
    int64_t groups[2] = {0, 0};      ///< Norm groups per token of q and of k.
    int64_t q_items = 0;             ///< Groups of q over all tokens; k's come after them.
    int64_t total_items = 0;         ///< Groups of q and k over all tokens.
};

/// @brief The kernel parameters of @p plan (non-empty RoPE part).
inline QkNormArgsDevice make_qk_norm_args(const QkNormPlan& plan) {
    QkNormArgsDevice args{};
    args.step = plan.step;
    args.positions = plan.rope.positions;
    args.angles = make_angle_args<kMaxPairs>(plan.rope);
    args.seq = plan.rope.seq;
    const int64_t tokens = plan.rope.batch * plan.rope.seq;
    args.groups[0] = detail::groups_per_token(plan.step, 0);
    args.groups[1] = detail::groups_per_token(plan.step, 1);
    args.q_items = tokens * args.groups[0];
    args.total_items = args.q_items + tokens * args.groups[1];
    return args;
}

/// @brief Group @p item of the flattened (operand, token, group) order: which operand, b, group, s.
struct QkNormItem {
    int which;
    int64_t b, group, s;
};
__device__ inline QkNormItem qk_norm_item(const QkNormArgsDevice& args, int64_t item) {
    const int which = item < args.q_items ? 0 : 1;
    const int64_t local = which == 0 ? item : item - args.q_items;
    const int64_t groups = args.groups[which];
    const int64_t token = local / groups;
    return {which, token / args.seq, local % groups, token % args.seq};
}

/// @brief Checks every pointer the kernels of @p plan dereference (check_device_pointers, plus
/// the weights and v).
inline void check_qk_norm_pointers(const QkNormPlan& plan) {
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    if (!plan.rope.empty()) check_device_pointers(plan.rope);
    if (plan.step.operands[0].tensor.in_geometry.heads > 0)
        check_device_pointer("q_weight.data", plan.step.operands[0].weight, device);
    if (plan.step.operands[1].tensor.in_geometry.heads > 0)
        check_device_pointer("k_weight.data", plan.step.operands[1].weight, device);
    if (plan.v.in_geometry.heads > 0 && plan.rope.seq > 0) {
        check_device_pointer("qkv.data", plan.v.in, device);
        check_device_pointer("v_out.data", plan.v.out, device);
    }
}

template <typename Storage>
__global__ void qk_norm_copy_v_kernel(const Operand v) {
    const Geometry& g = v.in_geometry;
    const int64_t total = g.batch * g.seq * g.heads * g.head_dim;
    const int64_t step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += step) {
        const int64_t d = e % g.head_dim, h = e / g.head_dim % g.heads, s = e / g.head_dim / g.heads % g.seq,
                      b = e / g.head_dim / g.heads / g.seq;
        detail::copy_v_element<Storage>(v, b, h, s, d);
    }
}

/// @brief Copies the qkv buffer's v slice to v_out, if the plan asks for it.
template <typename Storage>
void copy_v(const QkNormPlan& plan) {
    const Geometry& g = plan.v.in_geometry;
    const int64_t total = g.batch * g.seq * g.heads * g.head_dim;
    if (total == 0) return;
    constexpr int threads = 256;
    const int64_t blocks = (total + threads - 1) / threads;
    launch_kernel("qk_norm_copy_v_kernel",
                  launch_config(unsigned(blocks < INT_MAX ? blocks : INT_MAX), threads, stream_of(plan.rope)),
                  qk_norm_copy_v_kernel<Storage>, plan.v);
}

}  // namespace rope::cuda_detail
