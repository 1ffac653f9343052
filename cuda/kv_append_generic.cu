// The generic CUDA kernel of RoPE + KV append: the direct port of cpu-naive's
// append_rows (cpu/naive_backend.cpp), one thread per rotated pair, pass-through
// feature or v feature. The lesson: tutorials/14_kv_cache_append/chapter.md.
//
// Thread `item` takes, within token t = item / per_token, one of:
//   a pair (or pass-through feature) of a q head row    -> q_out, or q's FP8 output
//                                                          (quantised from float32);
//   a pair (or pass-through feature) of a k head row    -> k_out, and the cache row of the
//                                                          token's slot (model dtype or FP8);
//   a feature of a v head row                           -> the v cache row of the slot.
// The angle is the token's position (PositionSource::at), never its slot. Every
// offset is int64: a cache of more than 2^31 elements is an ordinary size. A
// slot outside [0, pages * page_size) writes nothing (padding, or a device slot
// validation could not read).
#include <cstdint>

#include "check.hpp"
#include "kernel_args.cuh"
#include "kv_append_generic.hpp"
#include "pointer_check.hpp"
#include "rope/detail/pair_step.hpp"
#include "rope/rotation.hpp"

namespace rope::cuda_detail {
namespace {

/// Everything the kernel needs, by value (kernel_args.cuh says why).
struct AppendArgs {
    Operand q, k;
    PositionSource positions;
    AngleArgs<kMaxPairs> angles;
    Style style;
    int64_t rotary_dim, pairs;
    int64_t row_items;  // pairs + pass-through features: threads per q or k head row.
    int64_t q_items;    // Threads per token for q's rows, then k's, then v's.
    int64_t k_items;
    int64_t per_token;
    int64_t total;
    const void* v;
    Geometry v_geometry;
    const int64_t* slots;
    int64_t slot_count, page_size, slot_limit;
    CacheTarget k_cache, v_cache;
    CacheTarget q_fp8;  // Data null: q goes to q_out.
};

__device__ int64_t slot_of(const AppendArgs& args, int64_t t) {
    if (t >= args.slot_count) return -1;
    const int64_t slot = args.slots[t];
    return slot >= 0 && slot < args.slot_limit ? slot : -1;
}

template <typename Storage>
__global__ void kv_append_generic_kernel(const __grid_constant__ AppendArgs args) {
    const int64_t step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; item < args.total; item += step) {
        const int64_t t = item / args.per_token;
        int64_t j = item % args.per_token;
        if (j >= args.q_items + args.k_items) {  // A v feature: copied, unrotated, to the cache.
            j -= args.q_items + args.k_items;
            const int64_t slot = slot_of(args, t);
            if (slot < 0) continue;
            const int64_t h = j / args.v_geometry.head_dim, d = j % args.v_geometry.head_dim;
            const Storage value = static_cast<const Storage*>(args.v)[args.v_geometry.offset(0, h, t, d)];
            store_cache_element(args.v_cache, args.v_cache.row_offset(slot, args.page_size, h) + d, h, value,
                                to_float(value));
            continue;
        }
        const bool is_k = j >= args.q_items;
        if (is_k) j -= args.q_items;
        const Operand& operand = is_k ? args.k : args.q;
        const Geometry& g = operand.in_geometry;
        const Geometry& o = operand.out_geometry;
        const int64_t h = j / args.row_items, i = j % args.row_items;
        const auto* in = static_cast<const Storage*>(operand.in);
        auto* out = static_cast<Storage*>(operand.out);
        const int64_t slot = is_k ? slot_of(args, t) : -1;
        const int64_t row = slot < 0 ? 0 : args.k_cache.row_offset(slot, args.page_size, h);
        const bool q_fp8 = !is_k && args.q_fp8.data != nullptr;  // q's rotation to FP8 only.
        const int64_t q_row = q_fp8 ? args.q_fp8.row_offset(t, 1, h) : 0;
        if (i < args.pairs) {
            float cos_angle, sin_angle;
            rotation_factors(args.angles, args.positions.at(0, t, args.angles.pair_axis[i]), i, cos_angle, sin_angle);
            const PairIndex pair = pair_elements(args.style, args.rotary_dim, i);
            float x = to_float(in[g.offset(0, h, t, pair.first)]);
            float y = to_float(in[g.offset(0, h, t, pair.second)]);
            rotate_pair(x, y, cos_angle, sin_angle);
            const Storage x_stored = from_float<Storage>(x), y_stored = from_float<Storage>(y);
            if (q_fp8) {
                store_cache_element(args.q_fp8, q_row + pair.first, h, x_stored, x);
                store_cache_element(args.q_fp8, q_row + pair.second, h, y_stored, y);
                continue;
            }
            out[o.offset(0, h, t, pair.first)] = x_stored;  // The live k (or q): always written.
            out[o.offset(0, h, t, pair.second)] = y_stored;
            if (slot < 0) continue;
            store_cache_element(args.k_cache, row + pair.first, h, x_stored, x);
            store_cache_element(args.k_cache, row + pair.second, h, y_stored, y);
        } else {
            const int64_t d = args.rotary_dim + (i - args.pairs);  // Partial rotary: passed through.
            const Storage value = in[g.offset(0, h, t, d)];
            if (q_fp8) {
                store_cache_element(args.q_fp8, q_row + d, h, value, to_float(value));
                continue;
            }
            out[o.offset(0, h, t, d)] = value;
            if (slot >= 0) store_cache_element(args.k_cache, row + d, h, value, to_float(value));
        }
    }
}

}  // namespace

void launch_kv_append_generic(const KvAppendPlan& plan) {
    check_device_pointers(plan);
    const Plan& rope = plan.rope;
    AppendArgs args{};
    args.q = rope.q;
    args.k = rope.k;
    args.positions = rope.positions;
    args.angles = make_angle_args<kMaxPairs>(rope);
    args.style = rope.style;
    args.rotary_dim = rope.rotary_dim;
    args.pairs = rope.pairs;
    args.row_items = rope.pairs + (rope.head_dim - rope.rotary_dim);
    args.q_items = rope.q.in_geometry.heads * args.row_items;
    args.k_items = rope.k.in_geometry.heads * args.row_items;
    args.per_token = args.q_items + args.k_items + plan.v_geometry.heads * plan.v_geometry.head_dim;
    args.total = plan.tokens() * args.per_token;
    args.v = plan.v;
    args.v_geometry = plan.v_geometry;
    args.slots = plan.slots;
    args.slot_count = plan.slot_count;
    args.page_size = plan.page_size;
    args.slot_limit = plan.slot_limit;
    args.k_cache = plan.k_cache;
    args.v_cache = plan.v_cache;
    args.q_fp8 = plan.q_fp8;
    if (args.total == 0) return;
    const cudaLaunchConfig_t config = grid_stride_config(args.total, 256, stream_of(rope));
    dispatch_dtype(rope.dtype, [&](auto storage) {
        using Storage = decltype(storage);
        launch_kernel("kv_append_generic_kernel", config, kv_append_generic_kernel<Storage>, args);
    });
}

}  // namespace rope::cuda_detail
