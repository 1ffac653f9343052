// cuda-naive: the direct CUDA port of cpu-naive (cpu/naive_backend.cpp).
// The lesson: tutorials/03_naive_cuda/chapter.md.
//
// cpu-naive runs four nested loops (b, h, s, pair) and then copies the
// pass-through features. Here each iteration of the innermost loop becomes one
// GPU thread: thread `item` handles one rotated pair, or one pass-through
// feature, of one head row of q or of k. Every thread works out its own angle
// and calls sincosf itself, so cos/sin are recomputed for every head; that is
// the price of simplicity, and cuda-optimized shows what reusing them buys.
//
// Everything else is the CPU code unchanged: the same PositionSource::at,
// rotation_factors and rotate_pair_in_memory from common/, the same float32
// arithmetic, the same to_float / from_float conversions.
#include <climits>
#include <cstdint>
#include <memory>

#include "check.hpp"
#include "kernel_args.cuh"
#include "kv_append_generic.hpp"
#include "pointer_check.hpp"
#include "rope/detail/backend_factories.hpp"
#include "rope/detail/qk_norm_plan.hpp"
#include "rope/detail/pair_step.hpp"
#include "rope/rotation.hpp"
#include "to_half.hpp"

namespace rope {
namespace {

using cuda_detail::AngleArgs;
using cuda_detail::kMaxPairs;

/// Everything the kernel needs, passed by value (see kernel_args.cuh for why).
struct NaiveArgs {
    Operand operands[2];       // [0] = q, [1] = k (k may have no heads).
    PositionSource positions;  // Device-resident ids or cu_seqlens, or an offset.
    AngleArgs<kMaxPairs> angles;
    Style style;
    int64_t seq;
    int64_t rotary_dim;
    int64_t pairs;
    int64_t items_per_row;  // pairs + pass-through features: the threads one head row needs.
    int64_t q_items;        // Threads for all of q; k's threads come after them.
    int64_t total_items;
};

// One thread per (operand, b, h, s, item), with `item` fastest so that
// neighbouring threads touch neighbouring features of one row. The loop is a
// grid-stride loop: if the grid is smaller than the work, each thread takes
// every (gridDim.x * blockDim.x)-th item. All indices are int64: a tensor of
// more than 2^31 elements is an ordinary size for a long context.
//
// __grid_constant__ lets the kernel take references into its parameters
// without the compiler first copying them to per-thread local memory.
template <typename Storage>
__global__ void rope_naive_kernel(const __grid_constant__ NaiveArgs args) {
    const int64_t step = int64_t(gridDim.x) * blockDim.x;
    for (int64_t item = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; item < args.total_items; item += step) {
        const int which = item < args.q_items ? 0 : 1;
        const Operand& operand = args.operands[which];
        const Geometry& g = operand.in_geometry;
        const Geometry& o = operand.out_geometry;
        // Unflatten item -> (b, h, s, j), j fastest.
        int64_t rest = which == 0 ? item : item - args.q_items;
        const int64_t j = rest % args.items_per_row;
        rest /= args.items_per_row;
        const int64_t s = rest % args.seq;
        rest /= args.seq;
        const int64_t h = rest % g.heads;
        const int64_t b = rest / g.heads;

        const auto* in = static_cast<const Storage*>(operand.in);
        auto* out = static_cast<Storage*>(operand.out);
        if (j < args.pairs) {
            // The position on this pair's axis (one axis for text RoPE).
            const int64_t position = args.positions.at(b, s, args.angles.pair_axis[j]);
            float cos_angle, sin_angle;
            rotation_factors(args.angles, position, j, cos_angle, sin_angle);
            const PairIndex pair = pair_elements(args.style, args.rotary_dim, j);
            rotate_pair_in_memory(in, g, out, o, b, h, s, pair, cos_angle, sin_angle);  // In-place safe.
        } else {
            // Partial rotary: features past rotary_dim pass through untouched.
            const int64_t d = args.rotary_dim + (j - args.pairs);
            out[o.offset(b, h, s, d)] = in[g.offset(b, h, s, d)];
        }
    }
}

class NaiveCudaBackend final : public Backend {
public:
    std::string name() const override { return "cuda-naive"; }
    Device device() const override { return Device::cuda; }
    BackendLimits limits() const override { return cuda_detail::cuda_limits(); }
    void run_qk_norm(const QkNormPlan& plan) override { detail::run_qk_norm_cuda_naive(plan); }  // naive_qk_norm.cu
    void run(const Plan& plan) override {
        cuda_detail::check_device_pointers(plan);  // Host or another GPU's memory: a rope::Error, not a fault.
        // HF's DeepSeek order writes pairs where other pairs are read: a kernel that reads a row whole first.
        if (reorders(plan.style)) return cuda_detail::launch_to_half(plan);
        NaiveArgs args{};
        args.operands[0] = plan.q;
        args.operands[1] = plan.k;
        args.positions = plan.positions;
        args.angles = cuda_detail::make_angle_args<kMaxPairs>(plan);
        args.style = plan.style;
        args.seq = plan.seq;
        args.rotary_dim = plan.rotary_dim;
        args.pairs = plan.pairs;
        args.items_per_row = plan.pairs + (plan.head_dim - plan.rotary_dim);
        const int64_t rows_per_head = plan.batch * plan.seq * args.items_per_row;
        args.q_items = plan.q.in_geometry.heads * rows_per_head;
        args.total_items = args.q_items + plan.k.in_geometry.heads * rows_per_head;
        if (args.total_items == 0) return;

        //! [launch]
        constexpr int threads = 256;
        const int64_t blocks = (args.total_items + threads - 1) / threads;
        const unsigned grid = static_cast<unsigned>(blocks < INT_MAX ? blocks : INT_MAX);  // The loop covers the rest.
        dispatch_dtype(plan.dtype, [&](auto storage) {
            using Storage = decltype(storage);
            // rope_naive_kernel<Storage><<<grid, threads, 0, stream>>>(args), with its status checked.
            cuda_detail::launch_kernel("rope_naive_kernel",
                                       cuda_detail::launch_config(grid, threads, cuda_detail::stream_of(plan)),
                                       rope_naive_kernel<Storage>, args);
        });
        //! [launch]
    }
    // RoPE + KV append: the direct port of cpu-naive's loops (kv_append_generic.cu).
    void run_kv_append(const KvAppendPlan& plan) override { cuda_detail::launch_kv_append_generic(plan); }
};

}  // namespace

std::unique_ptr<Backend> make_cuda_naive_backend() { return std::make_unique<NaiveCudaBackend>(); }

}  // namespace rope
