// rope-tune: times cuda-optimized's kernel body (rotate_units,
// cuda/optimized/unit_kernel.cuh) under variants of its own, beside the
// backend itself and a copy of the same bytes, on the benchmark shapes. It is
// how the backend's choices (cuda/optimized/backend.cu) were made; it is not a
// test. The variants are this file's, compiled over the shipped body:
// - access: the backend's 16-byte accesses ("default") or streaming cache
//   hints ("streaming": StreamingPath below);
// - rows in flight and the software pipeline (the body's own parameters);
// - a register cap ("minblocks": CappedUnitKernel below; 1 is the shipped kernel);
// - threads per block and rows per thread (a LaunchShape);
// - the order of the units over the rows: the backend's, q's memory order
//   ("memory"), or forced over neighbouring "tokens" or "heads".
//
//   rope-tune [--focus]  prints CSV rows: TUNE,<case>,<variant>,...,us,pct_of_copy, and per case
//                        a line "# best <case>: ..." (the backend's default and the fastest row)
//
// --focus: the large shapes only, the
// backend's variant (4 rows in flight, batched, default caching, 128 threads)
// at 8 and 16 rows per thread in the memory order (RowOrder), with and
// without a register cap, fp16 included. The full sweep forces both orders.
//
// The timing is rope-bench's (bench/timing/: one timer for the project):
// CUDA events around batches of calls rotating through enough q/k sets to
// exceed twice the L2 (graph replay for the small shapes), medians of
// repetitions, and the ratio to the fastest copy of the same bytes measured
// in the same run.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "cuda_timing.hpp"
#include "device_launch.cuh"
#include "rope/cuda_check.hpp"
#include "rope/detail/plan.hpp"
#include "rope/rope.hpp"
#include "row_access.cuh"
#include "unit_kernel.cuh"

namespace {

using namespace rope;
using namespace rope::cuda_detail;

struct Case {
    const char* name;
    int64_t batch, q_heads, k_heads, seq, head_dim;
    Layout layout;
    bool in_place;
    bool small;  // Graph replay (latency-bound).
};

// The shapes of the goals (issue 15), in place and out of place, bhsd and bshd.
const Case kCases[] = {
    {"8x32x4096x128", 8, 32, 32, 4096, 128, Layout::bhsd, true, false},
    {"8x32x4096x128", 8, 32, 32, 4096, 128, Layout::bshd, true, false},
    {"8x32x4096x128", 8, 32, 32, 4096, 128, Layout::bhsd, false, false},
    {"4x32x2048x128", 4, 32, 32, 2048, 128, Layout::bhsd, true, false},
    {"4x32x2048x128", 4, 32, 32, 2048, 128, Layout::bshd, true, false},
    {"llama3-8b-prefill", 1, 32, 8, 4096, 128, Layout::bshd, true, false},
    {"4x8x256x64", 4, 8, 8, 256, 64, Layout::bhsd, true, true},
    {"decode-1x32x1x128", 1, 32, 32, 1, 128, Layout::bhsd, true, true},
};

// The backend's 16-byte path with streaming cache hints (ld.global.cs / st.global.cs: evict
// first), each byte being touched once: does the L2 gain from not keeping the rows? Its four
// accesses hide VectorPath's; everything else (which pairs a chunk holds, the rotation) is
// VectorPath's own.
template <typename Storage, Style kStyle>
struct StreamingPath : VectorPath<Storage, kStyle> {
    using Base = VectorPath<Storage, kStyle>;
    using typename Base::Chunk;
    using typename Base::Pass;

    __device__ static Vector16<Storage> load16(const Storage* source) {
        const uint4 raw = __ldcs(reinterpret_cast<const uint4*>(source));
        Vector16<Storage> vector;
        memcpy(&vector, &raw, sizeof raw);
        return vector;
    }
    __device__ static void store16(Storage* target, const Vector16<Storage>& vector) {
        uint4 raw;
        memcpy(&raw, &vector, sizeof raw);
        __stcs(reinterpret_cast<uint4*>(target), raw);
    }
    __device__ static Chunk load(const RowRef<Storage>& row, int64_t chunk, int64_t rotary_dim) {
        const int64_t first = chunk * Base::kWidth;
        return {load16(row.in + first), load16(row.in + rotary_dim / 2 + first)};
    }
    __device__ static void store(const RowRef<Storage>& row, int64_t chunk, int64_t rotary_dim, const Chunk& data) {
        const int64_t first = chunk * Base::kWidth;
        store16(row.out + first, data.first);
        store16(row.out + rotary_dim / 2 + first, data.second);
    }
    __device__ static Pass load_pass(const RowRef<Storage>& row, int64_t feature) { return load16(row.in + feature); }
    __device__ static void store_pass(const RowRef<Storage>& row, int64_t feature, const Pass& data) {
        store16(row.out + feature, data);
    }
};

// The shipped body under a register cap: the compiler must fit MinBlocksPerSM blocks of
// kMaxBlockThreads per SM. Fewer registers mean more resident threads, as long as nothing spills.
template <typename Storage, typename Path, int RowsInFlight, bool Pipelined, int MinBlocksPerSM, int Capacity>
__global__ void __launch_bounds__(kMaxBlockThreads, MinBlocksPerSM)
    CappedUnitKernel(const __grid_constant__ UnitArgs<Capacity> args) {
    rotate_units<Storage, Path, RowsInFlight, Pipelined, true>(args);
}

// The angle arguments' capacity of every variant (the backend's for rotary_dim <= 128).
constexpr int kCapacity = 64;

// A compiled variant: how accesses are issued, rows loaded before the first is used, whether
// the next batch is loaded while the current one is computed, and a register cap (blocks of
// kMaxBlockThreads per SM; 1: none, the shipped kernel itself).
template <bool Streaming, int RowsInFlight, bool Pipelined, int MinBlocksPerSM>
struct Variant {
    static constexpr bool kStreaming = Streaming;
    static constexpr int kRowsInFlight = RowsInFlight;
    static constexpr bool kPipelined = Pipelined;
    static constexpr int kMinBlocksPerSM = MinBlocksPerSM;

    template <typename Storage, Style kStyle>
    using Path = std::conditional_t<Streaming, StreamingPath<Storage, kStyle>, VectorPath<Storage, kStyle>>;

    // The kernel of this variant, for the default angle (the only one rope-tune's calls use).
    template <typename Storage, Style kStyle>
    static auto kernel() {
        using P = Path<Storage, kStyle>;
        if constexpr (MinBlocksPerSM == 1)
            return rope_unit_kernel<Storage, P, RowsInFlight, Pipelined, true, kCapacity>;
        else
            return CappedUnitKernel<Storage, P, RowsInFlight, Pipelined, MinBlocksPerSM, kCapacity>;
    }
};

// Which neighbours the units of a block are: q's memory order (the backend's), or forced.
enum class RowOrder { memory, tokens, heads };

// A launch setting the sweep times: the shape and the order of the units.
struct Setting {
    LaunchShape shape;
    RowOrder order;
};

std::array<int64_t, 4> shape_of(const Case& c, int64_t heads) {
    return c.layout == Layout::bhsd ? std::array<int64_t, 4>{c.batch, heads, c.seq, c.head_dim}
                                    : std::array<int64_t, 4>{c.batch, c.seq, heads, c.head_dim};
}

struct Measured {
    std::string variant;
    double us;
};

const char* order_name(RowOrder order) {
    return order == RowOrder::heads ? "heads" : order == RowOrder::tokens ? "tokens" : "memory";
}

// Launches variant V of the kernel for plan in setting, on plan.stream: the backend's
// arguments and grid for that shape, the units' order forced where the setting says.
template <typename Storage, Style kStyle, typename V>
void launch_variant(const Plan& plan, const DeviceInfo& device, const Setting& setting) {
    if (!default_angle_only(plan.angles)) rope::fail("rope-tune plan", "angles", "must be the default angle");
    UnitLaunch<kCapacity> launch;
    if (!plan_units<typename V::template Path<Storage, kStyle>>(plan, setting.shape, launch)) return;
    if (setting.order != RowOrder::memory) launch.args.heads_adjacent = setting.order == RowOrder::heads;
    launch_unit_grid(plan, device, launch, V::template kernel<Storage, kStyle>());
}

void run_case(const Case& c, DType dtype, Style style, bool focus) {
    const int64_t element = dtype_size(dtype);
    const size_t q_bytes = size_t(c.batch * c.q_heads * c.seq * c.head_dim * element);
    const size_t k_bytes = size_t(c.batch * c.k_heads * c.seq * c.head_dim * element);
    // Sets of q then k, in one allocation, enough of them to exceed twice the L2:
    // every call reads from memory (rope-bench's layout, so its copy ceiling applies).
    rope_bench::Sets sets;
    sets.set_bytes = q_bytes + k_bytes;
    sets.stride = rope_bench::set_stride(sets.set_bytes);
    sets.sets = rope_bench::sets_spanning_twice(sets.set_bytes, rope_bench::cuda_l2_bytes());
    Buffer source(Device::cuda, sets.stride * size_t(sets.sets));
    Buffer destination(Device::cuda, sets.stride * size_t(sets.sets));
    sets.inputs = source.data();
    sets.copy_destination = destination.data();
    {
        std::mt19937_64 rng(7);
        std::vector<uint16_t> host(source.bytes() / 2);
        // Random non-zero values: bf16/fp16 halves, or the two halves of a float.
        for (uint16_t& bits : host) bits = uint16_t(0x3c00 | (rng() & 0x3ff)) ^ uint16_t(rng() & 0x8000);
        source.copy_from_host(host.data());
    }
    rope::CudaStream stream;
    RopeConfig config;
    config.head_dim = c.head_dim;
    config.style = style;
    std::vector<Plan> plans;
    for (int64_t s = 0; s < sets.sets; ++s) {
        auto view = [&](Buffer& buffer, size_t offset, int64_t heads) {
            return TensorView::contiguous(sets.at(buffer.data(), s) + offset, dtype, Device::cuda, c.layout,
                                          shape_of(c, heads));
        };
        const TensorView q = view(source, 0, c.q_heads), k = view(source, q_bytes, c.k_heads);
        RopeArgs args = c.in_place ? RopeArgs::in_place(q, k)
                                   : RopeArgs::out_of_place(q, k, view(destination, 0, c.q_heads),
                                                            view(destination, q_bytes, c.k_heads));
        args.stream = stream.get();
        plans.push_back(make_plan(config, args, Device::cuda));
    }

    const int reps = 9;
    const rope_bench::GpuClock clock = c.small ? rope_bench::GpuClock::graph : rope_bench::GpuClock::events;
    auto time = [&](const rope_bench::Launch& launch) {
        return rope_bench::cuda_call_us(launch, clock, reps, sets.sets, stream.get());
    };
    // The ceiling: the fastest copy of the same bytes (timing.hpp says which candidates).
    const double copy_us = rope_bench::cuda_copy_ceiling(sets, reps).us;

    std::vector<Measured> results;
    auto backend = make_backend("cuda-optimized");
    results.push_back({"backend-default", time([&](int64_t call) { backend->run(plans[size_t(call % sets.sets)]); })});
    const DeviceInfo device = device_info(0);
    dispatch_dtype(dtype, [&](auto storage) {
        using Storage = decltype(storage);
        auto variants = [&]<Style kStyle>() {
            auto sweep = [&]<typename V>() {
                std::vector<Setting> settings;
                for (int threads : {64, 128, 256})
                    for (int64_t rows : {1, 2, 4, 8, 16, 32})
                        for (RowOrder order : {RowOrder::tokens, RowOrder::heads, RowOrder::memory}) {
                            // Small shapes: few rows per thread. Large: every count, down to one row per
                            // thread (no sincosf shared, the fewest registers).
                            bool wanted = c.small ? (threads != 256 && rows <= 4) : threads != 64;
                            // Focus: the memory order (the backend's), measured best against the two forced ones.
                            const bool focus_setting = threads == 128 && (rows == 8 || rows == 16);
                            if (focus)
                                wanted = wanted && focus_setting && order == RowOrder::memory;
                            else
                                wanted = wanted && order != RowOrder::memory;
                            // Small shapes keep the memory order (the rows of one token are few).
                            if (c.small) wanted = wanted && order == RowOrder::tokens;
                            if (wanted) settings.push_back({LaunchShape{threads, rows}, order});
                        }
                for (const Setting& setting : settings) {
                    const double us = time([&](int64_t call) {
                        launch_variant<Storage, kStyle, V>(plans[size_t(call % sets.sets)], device, setting);
                    });
                    char name[128];
                    std::snprintf(name, sizeof name, "%s-rif%d-%s-minblocks%d-threads%d-rows%" PRId64 "-%s",
                                  V::kStreaming ? "streaming" : "default", V::kRowsInFlight,
                                  V::kPipelined ? "pipelined" : "batched", V::kMinBlocksPerSM,
                                  setting.shape.block_threads, setting.shape.rows_per_slice,
                                  order_name(setting.order));
                    results.push_back({name, us});
                }
            };
            if (!focus) {
                sweep.template operator()<Variant<true, 2, true, 1>>();
                sweep.template operator()<Variant<true, 2, true, 2>>();
                sweep.template operator()<Variant<true, 4, false, 1>>();
                sweep.template operator()<Variant<true, 2, false, 1>>();
                sweep.template operator()<Variant<false, 2, true, 1>>();
                sweep.template operator()<Variant<false, 1, false, 1>>();  // One row at a time.
            }
            sweep.template operator()<Variant<false, 4, false, 1>>();
            if (focus) {  // A register cap: 3 or 4 blocks of 256 threads per SM.
                sweep.template operator()<Variant<false, 4, false, 3>>();
                sweep.template operator()<Variant<false, 4, false, 4>>();
            }
        };
        if (style == Style::half_split) variants.template operator()<Style::half_split>();
        else variants.template operator()<Style::interleaved>();
    });
    std::sort(results.begin() + 1, results.end(), [](const Measured& a, const Measured& b) { return a.us < b.us; });
    const std::string key = std::string(c.name) + "," + std::string(layout_name(c.layout)) + "," +
                            std::string(dtype_name(dtype)) + "," + std::string(style_name(style)) + "," +
                            (c.in_place ? "in" : "out");
    for (const Measured& m : results)
        std::printf("TUNE,%s,%s,%.3f,%.3f,%.2f\n", key.c_str(), m.variant.c_str(), copy_us, m.us,
                    100.0 * copy_us / m.us);
    // The line scripts/gpu-check's summary shows: the backend's default against the fastest row.
    const Measured& best = results.size() > 1 && results[1].us < results[0].us ? results[1] : results[0];
    std::printf("# best %s: default %.2f%% (%.3f us), best %.2f%% %s\n", key.c_str(), 100.0 * copy_us / results[0].us,
                results[0].us, 100.0 * copy_us / best.us, best.variant.c_str());
    std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
    const bool focus = argc > 1 && std::strcmp(argv[1], "--focus") == 0;
    const std::string reason = cuda_unavailable_reason();
    if (!reason.empty()) {
        std::printf("rope-tune: skipped: %s\n", reason.c_str());
        return 77;
    }
    try {
        std::printf("# rope-tune on %s\n", rope_bench::cuda_device_name());
        std::printf("TUNE,case,layout,dtype,style,placement,variant,copy_us,us,pct_of_copy\n");
        for (const Case& c : kCases)
            for (DType dtype : {DType::f32, DType::bf16, DType::f16})
                for (Style style : {Style::half_split, Style::interleaved}) {
                    if (c.small && focus) continue;
                    const bool fp16_case = focus && std::string(c.name) == "8x32x4096x128";
                    if (dtype == DType::f16 && !fp16_case) continue;
                    // Interleaved rows have the half-split access pattern (vector_layout.hpp):
                    // one case of them suffices. The Llama shape's goal is bf16.
                    if (style == Style::interleaved && (c.layout != Layout::bhsd || !c.in_place || c.small)) continue;
                    if (std::string(c.name) == "llama3-8b-prefill" && dtype != DType::bf16) continue;
                    run_case(c, dtype, style, focus);
                }
    } catch (const std::exception& error) {
        std::printf("rope-tune: error: %s\n", error.what());
        return 1;
    }
    return 0;
}
