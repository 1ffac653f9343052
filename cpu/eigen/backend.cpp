// cpu-eigen: RoPE as Eigen array expressions on OpenMP threads.
// The lesson: tutorials/02_eigen_openmp/chapter.md builds it step by step.
//
// It computes what cpu-naive computes (the same angle from the shared
// pair_angle, the same rotation), only faster; its cos and sin come from
// Eigen's SIMD routines, within 2 float32 ulps of cpu-naive's std::cos/std::sin.
// RoPE does a handful of flops per element against 8 bytes moved (fp32, read
// and written), so it is bound by memory bandwidth; speed comes from keeping
// the memory system busy all the time, with as little work as possible:
//
//   1. cos/sin are computed once per (position, pair), by all threads
//      together and several pairs per instruction, into one table that every
//      head of q and k then reads (and every sequence, when they share
//      positions); cpu-naive recomputes them per head. (This file.)
//   2. A head row is rotated several pairs per instruction: as Eigen
//      fixed-size arrays (rotate_row.cpp), or, for a contiguous row, by kernels
//      with the widest instructions the processor has, which for fp16/bf16 rows
//      also widen and round back (wide_rows.cpp). row.hpp lists the kernels.
//   3. OpenMP threads each stream one contiguous region of memory, also when
//      decoding a single token (work_split.hpp: the picture), and ask for
//      each head's rows ahead with software prefetches (work_split.hpp,
//      kPrefetchBytes); out-of-place
//      float32 outputs of half-split pairs larger than the last-level cache
//      are written with streaming stores, by whole lines (streaming_stores.hpp).
//
// bench/results/notes/cpu-eigen.md records the measurements behind these choices.
#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "rope/detail/backend_factories.hpp"
#include "rope/detail/kv_append_plan.hpp"
#include "rope/detail/pair_step.hpp"
#include "rope/detail/plan.hpp"
#include "rope/detail/qk_norm_plan.hpp"
#include "rope/rotation.hpp"
#include "row.hpp"
#include "streaming_stores.hpp"
#include "work_split.hpp"

namespace rope {
namespace {

using namespace cpu_eigen;

// Bytes (read + written) each thread should have at least: waking a thread and
// joining it costs microseconds, in which one core moves about this much.
// Below it, fewer threads are faster.
constexpr int64_t kMinBytesPerThread = 256 * 1024;

// Fills @p cos_row and @p sin_row with cos and sin of every pair of token @p token of
// position row @p position_row, already scaled by the attention factor and, for the
// inverse, with sin negated, so the row kernel only multiplies.
void fill_token_trig(const Plan& plan, int64_t position_row, int64_t token, float* cos_row, float* sin_row) {
    const TokenPositions positions = token_positions(plan.positions, plan.axes, position_row, token);
    const AngleRule& rule = plan.angles;
    if (rule.table.data != nullptr) {
        // A caller's table is read as given, through the shared rule.
        for (int64_t i = 0; i < plan.pairs; ++i)
            rotation_factors(rule, positions.of_pair(rule, plan.axes, i), i, cos_row[i], sin_row[i]);
        return;
    }
    // The same float32 angles as every backend (the shared pair_angle), then
    // their cos and sin with Eigen's SIMD routines, four pairs per instruction
    // rather than std::cos and std::sin one at a time. Eigen's results are
    // within 2 ulps (1.2e-7) of cpu-naive's std::cos/std::sin, at any angle:
    // past about 2e4 radians a lane falls back to an exact (slower) reduction
    // of the angle.
    for (int64_t i = 0; i < plan.pairs; ++i)
        sin_row[i] = pair_angle(rule, positions.of_pair(rule, plan.axes, i), i);
    Eigen::Map<Eigen::ArrayXf> angles(sin_row, plan.pairs);
    Eigen::Map<Eigen::ArrayXf>(cos_row, plan.pairs) = rule.cos_scale * angles.cos();
    angles = rule.sin_scale * angles.sin();
}

// Fills table row @p t of @p chunk (fill_token_trig of that token).
void fill_trig_row(const Plan& plan, const Chunk& chunk, int64_t t, float* cos, float* sin) {
    fill_token_trig(plan, chunk.position_row, chunk.first_token + t, cos + t * plan.pairs, sin + t * plan.pairs);
}

// Picks the kernel for one operand once per call, not once per row: the
// choice depends only on the storage type, the style, the operand's strides
// and the rotary width.
template <typename Storage>
RowKernel<Storage> pick_row_kernel(Style style, const Operand& operand, int64_t rotary_dim) {
    if (reorders(style)) return reordering_row_kernel<Storage>(style);
    const bool contiguous = operand.in_geometry.stride_dim == 1 && operand.out_geometry.stride_dim == 1;
    if (contiguous)
        if (const RowKernel<Storage> kernel = wide_row_kernel<Storage>(style, rotary_dim)) return kernel;
    return eigen_row_kernel<Storage>(style, contiguous);
}

// The cos/sin table is kept between calls (allocating 2 MiB on every call
// would cost page faults each time), one per calling thread: threads that
// call one backend object at once each fill and read their own table, so the
// object holds no state a concurrent call could disturb.
class EigenCpuBackend final : public Backend {
public:
    explicit EigenCpuBackend(const BackendOptions& options) : requested_threads_(options.threads) {}

    std::string name() const override { return "cpu-eigen"; }
    Device device() const override { return Device::host; }

    void run(const Plan& plan) override {
        dispatch_dtype(plan.dtype, [&](auto storage) { run_typed<decltype(storage)>(plan); });
    }
    void run_qk_norm(const QkNormPlan& plan) override { detail::run_qk_norm_cpu_eigen(plan, requested_threads_); }

    void run_kv_append(const KvAppendPlan& plan) override {
        dispatch_dtype(plan.rope.dtype, [&](auto storage) { append_typed<decltype(storage)>(plan); });
    }

    // Re-rotation of cached keys: cpu-naive's loop, OpenMP threads over the entries
    // (each entry's rows are its slot's own: host slots are checked distinct).
    void run_rerotate_cache(const KvAppendPlan& plan) override {
        const int64_t entries = plan.tokens();
        const int64_t bytes = entries * plan.k_cache.heads * plan.rope.head_dim * 2 * int64_t(dtype_size(plan.rope.dtype));
        const int team = int(std::clamp<int64_t>(bytes / kMinBytesPerThread, 1, std::min(thread_count(), entries)));
#pragma omp parallel num_threads(team)
        {
            const int64_t threads = omp_get_num_threads(), me = omp_get_thread_num();
            detail::rerotate_cache_cpu(plan, entries * me / threads, entries * (me + 1) / threads);
        }
    }

private:
    // Threads for this call. Read on every call (not cached at construction)
    // so that 0 keeps following OMP_NUM_THREADS / omp_set_num_threads.
    int64_t thread_count() const {
        return requested_threads_ > 0 ? requested_threads_ : int64_t(omp_get_max_threads());
    }

    template <typename Storage>
    void run_typed(const Plan& plan) {
        const WorkSplit split = split_work(plan, thread_count());
        // No thread that would get too little to do: a decode step of a small
        // model is over before a second thread has woken up.
        const int64_t bytes = (plan.q.in_geometry.numel() + plan.k.in_geometry.numel()) * 2 * int64_t(sizeof(Storage));
        const int team = int(std::clamp<int64_t>(bytes / kMinBytesPerThread, 1, thread_count()));
        // The shared table grows here, outside the parallel region, and only
        // when a call needs more than any before it.
        const size_t table_size = size_t(split.chunk_tokens * plan.pairs);
        thread_local std::vector<float> cos_table, sin_table;  // This calling thread's (see above).
        if (cos_table.size() < table_size) cos_table.resize(table_size), sin_table.resize(table_size);
        float* const cos = cos_table.data();
        float* const sin = sin_table.data();

        const RowKernel<Storage> kernels[2] = {pick_row_kernel<Storage>(plan.style, plan.q, plan.rotary_dim),
                                               pick_row_kernel<Storage>(plan.style, plan.k, plan.rotary_dim)};
        const RowShape shape{plan.pairs, plan.rotary_dim, plan.head_dim};
        const int64_t row_bytes = plan.head_dim * int64_t(sizeof(Storage));
        const int64_t chunks = split.position_rows * split.chunks_per_row;
        // Large out-of-place float32 calls with half-split pairs stream their rows
        // out (streaming_stores.hpp): each row is rotated into a buffer in L1, then
        // written by whole lines. Only those: for interleaved fp32 rows and for
        // bf16 rows the buffer costs more than the stores save.
        const bool contiguous_outputs = plan.q.out_geometry.stride_dim == 1 && plan.k.out_geometry.stride_dim == 1;
        const int64_t output_bytes = (plan.q.out_geometry.numel() + plan.k.out_geometry.numel()) * int64_t(sizeof(Storage));
        const bool streaming = std::is_same_v<Storage, float> && plan.style == Style::half_split &&
                               plan.q.out != plan.q.in && contiguous_outputs &&
                               plan.head_dim <= kMaxWidenedDim && output_bytes > streaming_output_bytes();

#pragma omp parallel num_threads(team)
        {
            alignas(64) Storage finished_row[kMaxWidenedDim];  // This thread's, for streaming.
            LineStreamer streamer;
            for (int64_t chunk_index = 0; chunk_index < chunks; ++chunk_index) {
                const Chunk chunk = split.chunk(chunk_index);
                // All threads compute the chunk's table together; the loop's implicit
                // barrier then makes it complete and visible before any row uses it.
#pragma omp for schedule(static)
                for (int64_t t = 0; t < chunk.tokens; ++t) fill_trig_row(plan, chunk, t, cos, sin);

                // Static schedule: each thread one contiguous range of tiles, so one
                // contiguous region of memory. The implicit barrier at the end keeps
                // the table until every thread is done with it.
#pragma omp for schedule(static)
                for (int64_t tile = 0; tile < split.tiles(chunk); ++tile) {
                    const RowWalk<Storage> walk(plan, kernels, split, chunk, tile);
                    const int64_t rows = walk.size();
                    auto row = walk.first();
                    for (int64_t i = 0; i < rows; ++i) {
                        const int64_t entry = walk.table_row(row) * plan.pairs;
                        prefetch_ahead(row.row, row_bytes, !streaming);
                        if (streaming) {
                            row.row.kernel(row.row.in, {finished_row, 1}, cos + entry, sin + entry, shape);
                            streamer.write(finished_row, row.row.out.data, row_bytes);
                        } else {
                            row.row.kernel(row.row.in, row.row.out, cos + entry, sin + entry, shape);
                        }
                        if (i + 1 < rows) walk.advance(row);
                    }
                    if (streaming) streamer.finish();
                }
            }
        }
    }

    // RoPE + KV append: OpenMP threads over tokens, each token's cos/sin computed once
    // (fill_token_trig) for all its heads of q and k, its rows rotated by the same row
    // kernels as run(); a cached token's k row is then stored from k_out into the cache
    // (the same bits cpu-naive writes; fp32 rows also hold the float32 value an FP8 cache
    // is quantised from), its v row from v. An FP8 q output takes q's rows quantised from
    // their float32 rotation (rotate_and_quantise_row), and q_out is not written.
    template <typename Storage>
    void append_typed(const KvAppendPlan& kv) {
        const Plan& plan = kv.rope;
        const RowKernel<Storage> q_kernel = pick_row_kernel<Storage>(plan.style, plan.q, plan.rotary_dim);
        const RowKernel<Storage> k_kernel = pick_row_kernel<Storage>(plan.style, plan.k, plan.rotary_dim);
        const RowShape shape{plan.pairs, plan.rotary_dim, plan.head_dim};
        const int64_t tokens = kv.tokens();
        const int64_t bytes =
            (plan.q.in_geometry.numel() + 2 * plan.k.in_geometry.numel() + kv.v_geometry.numel()) * 2 * int64_t(sizeof(Storage));
        const int team = int(std::clamp<int64_t>(bytes / kMinBytesPerThread, 1, std::min(thread_count(), tokens)));
        const Operand& q = plan.q;
        const Operand& k = plan.k;
        const Geometry& v = kv.v_geometry;
        // An FP8 k cache is quantised from the float32 rotation, which a 2-byte k_out row no
        // longer holds: those rows are rotated pair by pair here, each pair written to both.
        const bool quantised_from_float = kv.k_cache.dtype != CacheDType::model && !std::is_same_v<Storage, float>;
#pragma omp parallel num_threads(team)
        {
            std::vector<float> cos(size_t(plan.pairs)), sin(size_t(plan.pairs));
#pragma omp for schedule(static)
            for (int64_t t = 0; t < tokens; ++t) {
                fill_token_trig(plan, 0, t, cos.data(), sin.data());
                for (int64_t h = 0; h < q.in_geometry.heads; ++h) {
                    const Storage* const q_in = static_cast<const Storage*>(q.in) + q.in_geometry.offset(0, h, t, 0);
                    if (kv.quantises_q())  // FP8 q: from the float32 rotation, q_out not written.
                        rotate_and_quantise_row(plan, kv.q_fp8, kv.q_fp8.row_offset(t, 1, h), h, q_in,
                                                static_cast<Storage*>(nullptr), cos.data(), sin.data());
                    else
                        q_kernel({q_in, q.in_geometry.stride_dim},
                                 {static_cast<Storage*>(q.out) + q.out_geometry.offset(0, h, t, 0), q.out_geometry.stride_dim},
                                 cos.data(), sin.data(), shape);
                }
                const int64_t slot = kv.slot_of(t);
                for (int64_t h = 0; h < k.in_geometry.heads; ++h) {
                    const Storage* const k_in = static_cast<const Storage*>(k.in) + k.in_geometry.offset(0, h, t, 0);
                    Storage* const k_row = static_cast<Storage*>(k.out) + k.out_geometry.offset(0, h, t, 0);
                    // Rows are contiguous (make_kv_append_plan): element d is row[d].
                    if (slot >= 0 && quantised_from_float) {
                        rotate_and_quantise_row(plan, kv.k_cache, kv.k_cache.row_offset(slot, kv.page_size, h), h, k_in,
                                                k_row, cos.data(), sin.data());
                    } else {
                        k_kernel({k_in, k.in_geometry.stride_dim}, {k_row, k.out_geometry.stride_dim}, cos.data(),
                                 sin.data(), shape);
                    }
                    if (slot < 0) continue;  // Padding: rotated, not cached.
                    const Storage* const v_row = static_cast<const Storage*>(kv.v) + v.offset(0, h, t, 0);
                    const int64_t k_at = kv.k_cache.row_offset(slot, kv.page_size, h);
                    const int64_t v_at = kv.v_cache.row_offset(slot, kv.page_size, h);
                    if (!quantised_from_float)
                        for (int64_t d = 0; d < plan.head_dim; ++d)
                            store_cache_element(kv.k_cache, k_at + d, h, k_row[d], to_float(k_row[d]));
                    for (int64_t d = 0; d < v.head_dim; ++d)
                        store_cache_element(kv.v_cache, v_at + d, h, v_row[d], to_float(v_row[d]));
                }
            }
        }
    }

    // One k row of a call with an FP8 k cache and 2-byte storage, or one q row of an FP8 q
    // output (out null): each pair rotated in float32 (the shared rotate_pair, by the token's
    // cos/sin), rounded into out and quantised from float32 into the FP8 row at @p at;
    // pass-through features copied and quantised.
    template <typename Storage>
    static void rotate_and_quantise_row(const Plan& plan, const CacheTarget& cache, int64_t at, int64_t head,
                                        const Storage* in, Storage* out, const float* cos, const float* sin) {
        for (int64_t i = 0; i < plan.pairs; ++i) {
            const PairIndex pair = pair_elements(plan.style, plan.rotary_dim, i);
            float x = to_float(in[pair.first]), y = to_float(in[pair.second]);
            rotate_pair(x, y, cos[i], sin[i]);
            const Storage x_stored = from_float<Storage>(x), y_stored = from_float<Storage>(y);
            if (out != nullptr) out[pair.first] = x_stored, out[pair.second] = y_stored;
            store_cache_element(cache, at + pair.first, head, x_stored, x);
            store_cache_element(cache, at + pair.second, head, y_stored, y);
        }
        for (int64_t d = plan.rotary_dim; d < plan.head_dim; ++d) {
            if (out != nullptr) out[d] = in[d];
            store_cache_element(cache, at + d, head, in[d], to_float(in[d]));
        }
    }

    int requested_threads_;  // BackendOptions::threads (0: OpenMP default).
};

}  // namespace

std::unique_ptr<Backend> make_cpu_eigen_backend(const BackendOptions& options) {
    return std::make_unique<EigenCpuBackend>(options);
}

}  // namespace rope
