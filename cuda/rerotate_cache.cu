// The CUDA kernel of rope::rerotate_cache, shared by both CUDA backends: the direct
// port of cpu-naive's rerotate_cache_rows (cpu/naive_backend.cpp), one thread per
// pair of a cached head row. The lesson: tutorials/17_rerotation/chapter.md.
//
// Thread `item` takes entry t = item / (heads * pairs), head h and pair i; when the
// entry's slot lies in [0, pages * page_size) it turns that pair of the slot's row
// in place by the precise angle of to[t] - from[t] (PositionSource::at, relative);
// the pairs lie in the rotary window, from rotary_offset on.
// A slot outside that range (padding, or a device slot validation could not read)
// writes nothing. Every offset is int64.
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
struct RerotateCacheArgs {
    PositionSource positions;
    AngleArgs<kMaxPairs> angles;
    Style style;
    int64_t rotary_offset, rotary_dim, pairs, heads;  // rotary_offset: the window's first feature.
    int64_t total;  // entries * heads * pairs
    const int64_t* slots;
    int64_t slot_count, page_size, slot_limit;
    CacheTarget cache;
};

template <typename Storage>
__global__ void rerotate_cache_kernel(const __grid_constant__ RerotateCacheArgs args) {
    const int64_t step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; item < args.total; item += step) {
        const int64_t t = item / (args.heads * args.pairs);
        if (t >= args.slot_count) continue;
        const int64_t slot = args.slots[t];
        if (slot < 0 || slot >= args.slot_limit) continue;
        const int64_t h = (item / args.pairs) % args.heads, i = item % args.pairs;
        Storage* const row =
            static_cast<Storage*>(args.cache.data) + args.cache.row_offset(slot, args.page_size, h) + args.rotary_offset;
        float cos_angle, sin_angle;
        rotation_factors(args.angles, args.positions.at(0, t, args.angles.pair_axis[i]), i, cos_angle, sin_angle);
        const PairIndex pair = pair_elements(args.style, args.rotary_dim, i);
        float x = to_float(row[pair.first]);
        float y = to_float(row[pair.second]);
        rotate_pair(x, y, cos_angle, sin_angle);
        row[pair.first] = from_float<Storage>(x);
        row[pair.second] = from_float<Storage>(y);
    }
}

}  // namespace

void launch_rerotate_cache(const KvAppendPlan& plan) {
    const Plan& rope = plan.rope;
    check_device_pointers(rope);  // The positions (and the stand-in of the rows: the cache's address).
    int device = 0;
    check_cuda(cudaGetDevice(&device), "cudaGetDevice");
    if (plan.slot_count > 0) check_device_pointer("slot_mapping.slots", plan.slots, device);
    check_device_pointer("k_cache.data", plan.k_cache.data, device);
    RerotateCacheArgs args{};
    args.positions = rope.positions;
    args.angles = make_angle_args<kMaxPairs>(rope);
    args.style = rope.style;
    args.rotary_offset = rope.rotary_offset;
    args.rotary_dim = rope.rotary_dim;
    args.pairs = rope.pairs;
    args.heads = plan.k_cache.heads;
    args.total = plan.tokens() * args.heads * args.pairs;
    args.slots = plan.slots;
    args.slot_count = plan.slot_count;
    args.page_size = plan.page_size;
    args.slot_limit = plan.slot_limit;
    args.cache = plan.k_cache;
    if (args.total == 0) return;
    const cudaLaunchConfig_t config = grid_stride_config(args.total, 256, stream_of(rope));
    dispatch_dtype(rope.dtype, [&](auto storage) {
        using Storage = decltype(storage);
        launch_kernel("rerotate_cache_kernel", config, rerotate_cache_kernel<Storage>, args);
    });
}

}  // namespace rope::cuda_detail
