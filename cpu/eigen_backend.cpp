// cpu-eigen: RoPE as Eigen array expressions on OpenMP threads.
//
// It computes exactly what cpu-naive computes (the same angle from the shared
// pair_angle, the same std::cos/std::sin, the same rotation), only faster.
// RoPE does a handful of flops per element against 8 bytes moved (fp32, read
// and written), so it is bound by memory bandwidth; speed comes from keeping
// the memory system busy all the time, with as little work as possible:
//
//   1. A head row is rotated as Eigen fixed-size arrays, several pairs per
//      instruction (SIMD), with a generic gather/scatter path for strided
//      views and 16-bit storage.
//   2. cos/sin are computed once per (position, pair) and reused by every head
//      of q and k (and by every sequence when they share positions); cpu-naive
//      recomputes them per head.
//   3. OpenMP threads split the tokens and, when there are too few tokens
//      (decoding one token at a time), the heads, so every core streams; each
//      thread walks memory in its own order and prefetches the rows it will
//      rotate next.
//
// Read top to bottom: the row kernel, the cos/sin tables, the work split and
// walk, and the backend that ties them together.
#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <type_traits>
#include <vector>

#include "backend_factories.hpp"
#include "rope/rotation.hpp"

namespace rope {
namespace {

// ---------------------------------------------------------------------------
// 1. One head row
// ---------------------------------------------------------------------------

// Pairs rotated per step. Eight floats are two SSE2 registers (the portable
// baseline) or one AVX register; a fixed size lets Eigen unroll the step
// completely and keep x, y, cos and sin in registers (sixteen would spill
// SSE2's sixteen registers to the stack).
constexpr int64_t kLanes = 8;
using Lanes = Eigen::Array<float, kLanes, 1>;

// The first and second features of kLanes consecutive pairs, widened to float32.
struct PairBlock {
    Lanes x;
    Lanes y;
};

// Where one head row lives: its first element and the distance between features.
template <typename Element>
struct Row {
    Element* data;
    int64_t stride;  // stride_dim, in elements.
};

// Loads pairs [first, first + kLanes) of a row into registers.
//
// The fast case is float32 with unit stride: the halves are plain memory, so
// Eigen::Map reads them in place as SIMD loads. Half-split pairs sit in two
// contiguous runs (x = features [i, i+8), y = [p+i, p+i+8)); interleaved pairs
// alternate, so x and y are the same memory seen with an inner stride of 2.
// Any other row (a strided view, or fp16/bf16 that must be widened first) is
// gathered element by element through the shared pairing rule.
template <typename Storage, Style kStyle, bool kUnitStride>
PairBlock load_pairs(Row<const Storage> row, int64_t rotary_dim, int64_t first) {
    const int64_t half = rotary_dim / 2;
    if constexpr (std::is_same_v<Storage, float> && kUnitStride) {
        if constexpr (kStyle == Style::half_split) {
            return {Eigen::Map<const Lanes>(row.data + first), Eigen::Map<const Lanes>(row.data + half + first)};
        } else {
            using Pairs = Eigen::Map<const Lanes, Eigen::Unaligned, Eigen::InnerStride<2>>;
            return {Pairs(row.data + 2 * first), Pairs(row.data + 2 * first + 1)};
        }
    } else {
        PairBlock block;
        for (int64_t lane = 0; lane < kLanes; ++lane) {
            const PairIndex pair = pair_elements(kStyle, rotary_dim, first + lane);
            block.x[lane] = to_float(row.data[pair.first * row.stride]);
            block.y[lane] = to_float(row.data[pair.second * row.stride]);
        }
        return block;
    }
}

// Stores a rotated block: the mirror image of load_pairs, rounding to Storage.
template <typename Storage, Style kStyle, bool kUnitStride>
void store_pairs(Row<Storage> row, int64_t rotary_dim, int64_t first, const PairBlock& block) {
    const int64_t half = rotary_dim / 2;
    if constexpr (std::is_same_v<Storage, float> && kUnitStride) {
        if constexpr (kStyle == Style::half_split) {
            Eigen::Map<Lanes>(row.data + first) = block.x;
            Eigen::Map<Lanes>(row.data + half + first) = block.y;
        } else {
            using Pairs = Eigen::Map<Lanes, Eigen::Unaligned, Eigen::InnerStride<2>>;
            Pairs(row.data + 2 * first) = block.x;
            Pairs(row.data + 2 * first + 1) = block.y;
        }
    } else {
        for (int64_t lane = 0; lane < kLanes; ++lane) {
            const PairIndex pair = pair_elements(kStyle, rotary_dim, first + lane);
            row.data[pair.first * row.stride] = from_float<Storage>(block.x[lane]);
            row.data[pair.second * row.stride] = from_float<Storage>(block.y[lane]);
        }
    }
}

// What every row of a call has in common.
struct RowShape {
    int64_t pairs;       // rotary_dim / 2.
    int64_t rotary_dim;  // Features that rotate.
    int64_t head_dim;    // Features per row; those past rotary_dim pass through.
};

// Rotates one head row by the angles whose (scaled, signed) cos and sin are given per pair.
//
// In place is safe because a block is loaded completely (both x and y) into
// registers before any of it is stored; no scratch copy of the row is needed.
// The shape comes by value: through a reference the compiler would have to
// reload it after every store, in case the row's memory aliased it.
template <typename Storage, Style kStyle, bool kUnitStride>
void rotate_row(Row<const Storage> in, Row<Storage> out, const float* cos, const float* sin, RowShape shape) {
    const int64_t pairs = shape.pairs, rotary_dim = shape.rotary_dim;
    int64_t i = 0;
    for (; i + kLanes <= pairs; i += kLanes) {
        const PairBlock block = load_pairs<Storage, kStyle, kUnitStride>(in, rotary_dim, i);
        const Eigen::Map<const Lanes> c(cos + i), s(sin + i);
        // rotate_pair, written for kLanes pairs at once: one SIMD multiply per term.
        const PairBlock rotated{block.x * c - block.y * s, block.y * c + block.x * s};
        store_pairs<Storage, kStyle, kUnitStride>(out, rotary_dim, i, rotated);
    }
    // The last pairs % kLanes pairs (e.g. rotary_dim 24 = 8 + 4 pairs) take the scalar rule.
    for (; i < pairs; ++i) {
        const PairIndex pair = pair_elements(kStyle, rotary_dim, i);
        float x = to_float(in.data[pair.first * in.stride]);
        float y = to_float(in.data[pair.second * in.stride]);
        rotate_pair(x, y, cos[i], sin[i]);
        out.data[pair.first * out.stride] = from_float<Storage>(x);
        out.data[pair.second * out.stride] = from_float<Storage>(y);
    }
    // Partial rotary: features past rotary_dim are copied through as stored
    // (bit for bit). In place they already are where they belong.
    if (out.data == in.data) return;
    for (int64_t d = rotary_dim; d < shape.head_dim; ++d) out.data[d * out.stride] = in.data[d * in.stride];
}

// A row kernel with style, storage and stride case fixed at compile time.
template <typename Storage>
using RowKernel = void (*)(Row<const Storage>, Row<Storage>, const float*, const float*, RowShape);

// Picks the kernel for one operand once per call, not once per row: the
// choice depends only on the style and on the operand's strides.
template <typename Storage>
RowKernel<Storage> pick_row_kernel(Style style, const Operand& operand) {
    const bool unit = operand.in_geometry.stride_dim == 1 && operand.out_geometry.stride_dim == 1;
    if (style == Style::half_split)
        return unit ? rotate_row<Storage, Style::half_split, true> : rotate_row<Storage, Style::half_split, false>;
    return unit ? rotate_row<Storage, Style::interleaved, true> : rotate_row<Storage, Style::interleaved, false>;
}

// ---------------------------------------------------------------------------
// 2. cos and sin, once per (position, pair)
// ---------------------------------------------------------------------------

// Consecutive tokens of one position row: the tokens one cos/sin table serves.
struct TokenBlock {
    int64_t index = 0;          // Which block of the call.
    int64_t position_row = 0;   // Row of positions: b for per-sequence ids, else 0.
    int64_t first_token = 0;
    int64_t tokens = 0;
};

// Fills the table of @p block: entry [t * pairs + i] holds cos and sin of pair
// i at token t, already scaled by the attention factor and, for the inverse,
// with sin negated, so the row kernel only multiplies.
//
// This is all of the backend's trigonometry: one sincos per (position, pair),
// then reused by every head of q and k (and every sequence sharing the
// positions). At [1, 32, 4096, 128] it is still about a seventh of the time,
// because the memory bus idles meanwhile. (Filling the next block's table a
// few entries per row, hoping the out-of-order core would hide the sines
// behind the loads, measured slower here, so the simple version stays.)
void fill_trig_table(const Plan& plan, const TokenBlock& block, float* cos, float* sin) {
    const float sign = plan.direction == Direction::forward ? 1.0f : -1.0f;
    const float scale = plan.frequencies.attention_factor;
    const float* inv_freq = plan.frequencies.inv_freq.data();
    const double* inv_freq_exact = plan.frequencies.inv_freq_exact.data();
    for (int64_t t = 0; t < block.tokens; ++t) {
        const int64_t position = plan.positions.at(block.position_row, block.first_token + t);
        for (int64_t i = 0; i < plan.pairs; ++i) {
            // The same angle (float32 by default, or the precise mode's) and the
            // same std::cos/std::sin as cpu-naive: the two backends then differ
            // only by the rounding of the rotation itself.
            const float angle = pair_angle(plan.precise_angles, position, inv_freq[i], inv_freq_exact[i]);
            cos[t * plan.pairs + i] = scale * std::cos(angle);
            sin[t * plan.pairs + i] = sign * scale * std::sin(angle);
        }
    }
}

// One thread's cos/sin table, kept between calls so the hot path never allocates.
struct TrigTable {
    std::vector<float> cos;
    std::vector<float> sin;
};

// ---------------------------------------------------------------------------
// 3. Splitting the work among threads, and walking it
// ---------------------------------------------------------------------------

// Bytes of cos + sin per table (128 tokens at head_dim 128): small enough to
// stay in L2 next to the rows streaming through, large enough that each head
// is read in long contiguous runs.
constexpr int64_t kTableBytes = 64 * 1024;
// Work units per thread: enough that an uneven last unit costs little.
constexpr int64_t kUnitsPerThread = 8;
// Bytes per cache line (x86-64 and most ARM cores): the unit of prefetching.
constexpr int64_t kCacheLine = 64;
// Rows requested ahead of the one being rotated (4 KiB at head_dim 128, fp32).
constexpr int64_t kPrefetchRows = 8;
// Bytes (read + written) each thread should have at least: waking a thread and
// joining it costs microseconds (5 to 10 on the 2-core VM this was tuned on),
// in which one core moves about this much. Below it, fewer threads are faster.
constexpr int64_t kMinBytesPerThread = 256 * 1024;

// How a call is cut into independent units of work.
//
// Tokens that share a position row (the whole batch when positions are shared,
// one sequence when each has its own ids) share cos/sin. A unit is one block of
// consecutive tokens of one position row, times a chunk of the "row owners"
// that use those positions: every (sequence, q or k head) pair. Long sequences
// give many token blocks; decoding (seq = 1) gives one block, so its owners,
// the heads, are cut into chunks instead and both cores still get work.
struct WorkSplit {
    int64_t position_rows = 1;       // Distinct rows of positions: 1 (shared) or batch.
    int64_t owners = 0;              // Owners per position row: sequences sharing it * (q + k heads).
    int64_t tokens_per_block = 1;    // Tokens per cos/sin table.
    int64_t blocks_per_row = 1;      // ceil(seq / tokens_per_block).
    int64_t owner_chunks = 1;        // Chunks the owners of one block are cut into.
    int64_t seq = 0;
    int64_t units() const { return position_rows * blocks_per_row * owner_chunks; }

    // The token block that unit @p unit works on.
    TokenBlock block_of(int64_t unit) const {
        const int64_t index = unit / owner_chunks;
        const int64_t first_token = (index % blocks_per_row) * tokens_per_block;
        return {index, index / blocks_per_row, first_token, std::min(tokens_per_block, seq - first_token)};
    }
};

WorkSplit split_work(const Plan& plan, int64_t threads) {
    WorkSplit split;
    const bool per_sequence_ids = plan.positions.ids != nullptr && plan.positions.row_stride != 0;
    split.position_rows = per_sequence_ids ? plan.batch : 1;
    split.owners = (per_sequence_ids ? 1 : plan.batch) * (plan.q.in_geometry.heads + plan.k.in_geometry.heads);
    split.seq = plan.seq;

    const int64_t target_units = threads * kUnitsPerThread;
    const int64_t table_tokens = std::max<int64_t>(1, kTableBytes / (2 * int64_t(sizeof(float)) * plan.pairs));
    // As many tokens per table as fit, but few enough that there are target_units blocks.
    const int64_t tokens_for_balance = std::max<int64_t>(1, split.position_rows * plan.seq / target_units);
    split.tokens_per_block = std::min({plan.seq, table_tokens, tokens_for_balance});
    split.blocks_per_row = (plan.seq + split.tokens_per_block - 1) / split.tokens_per_block;
    const int64_t blocks = split.position_rows * split.blocks_per_row;
    split.owner_chunks = std::clamp<int64_t>((target_units + blocks - 1) / blocks, 1, split.owners);
    return split;
}

// One head row ready to rotate: where its input and output live, and the
// kernel for its operand (q and k may differ in strides).
template <typename Storage>
struct RowRef {
    Row<const Storage> in;
    Row<Storage> out;
    int64_t in_step;   // stride_seq: from this row to the same head's next token.
    int64_t out_step;
    int64_t prefetch_bytes;  // Bytes of the row to prefetch; 0 for strided rows.
    RowKernel<Storage> kernel;

    // Asks the memory system for this row ahead of its use. RoPE computes for
    // a while on every row it loads, and memory left idle meanwhile is
    // bandwidth lost; hardware prefetchers also stall at every jump from one
    // head to the next. So the loop names the rows it will need soon itself.
    void prefetch() const {
        const char* read = reinterpret_cast<const char*>(in.data);
        const char* write = reinterpret_cast<const char*>(out.data);
        for (int64_t byte = 0; byte < prefetch_bytes; byte += kCacheLine) {
            __builtin_prefetch(read + byte, 0);
            if (write != read) __builtin_prefetch(write + byte, 1);
        }
    }
};

// The rows of one unit, in the order a thread visits them.
//
// Memory is visited in its own order: for [b, h, s, d] the rows of one head
// are adjacent, so each owner's tokens are walked before the next owner (and
// the next row is just one stride further); for [b, s, h, d] the heads of one
// token are adjacent, so each token's owners are walked before the next token.
template <typename Storage>
class RowWalk {
public:
    // A position in the walk: which owner (sequence, head) and which token.
    struct Cursor {
        int64_t sequence;
        int64_t head;   // Counting q's heads first, then k's.
        int64_t owner;  // 0 .. owners-1 within the unit.
        int64_t token;  // 0 .. tokens-1 within the block.
        RowRef<Storage> row;
    };

    RowWalk(const Plan& plan, const RowKernel<Storage> (&kernels)[2], bool tokens_inner, const WorkSplit& split,
            int64_t unit)
        : plan_(plan), kernels_(kernels), heads_(plan.q.in_geometry.heads + plan.k.in_geometry.heads),
          tokens_inner_(tokens_inner) {
        const TokenBlock block = split.block_of(unit);
        const int64_t chunk = unit % split.owner_chunks;
        const int64_t owner_begin = chunk * split.owners / split.owner_chunks;
        const int64_t owner_end = (chunk + 1) * split.owners / split.owner_chunks;
        // Shared positions: the position row is 0 and the owners span the batch.
        // Per-sequence ids: the owners are the heads of sequence position_row.
        first_sequence_ = block.position_row + owner_begin / heads_;
        first_head_ = owner_begin % heads_;
        owners_ = owner_end - owner_begin;
        first_token_ = block.first_token;
        tokens_ = block.tokens;
    }

    int64_t size() const { return owners_ * tokens_; }

    Cursor first() const { return with_row({first_sequence_, first_head_, 0, 0, {}}); }

    // Steps @p cursor to the next row; only call it when there is one.
    void advance(Cursor& cursor) const {
        if (tokens_inner_) {
            if (++cursor.token < tokens_) {
                // Same head, next token: one stride on, no address arithmetic.
                cursor.row.in.data += cursor.row.in_step;
                cursor.row.out.data += cursor.row.out_step;
                return;
            }
            cursor.token = 0;
            next_owner(cursor);
        } else {
            next_owner(cursor);
            if (cursor.owner == owners_) cursor = {first_sequence_, first_head_, 0, cursor.token + 1, {}};
        }
        cursor = with_row(cursor);
    }

private:
    void next_owner(Cursor& cursor) const {
        ++cursor.owner;
        if (++cursor.head == heads_) cursor.head = 0, ++cursor.sequence;
    }

    // Fills in the addresses of the cursor's row.
    Cursor with_row(Cursor cursor) const {
        const int64_t q_heads = plan_.q.in_geometry.heads;
        const bool is_q = cursor.head < q_heads;
        const Operand& operand = is_q ? plan_.q : plan_.k;
        const int64_t head = is_q ? cursor.head : cursor.head - q_heads;
        const int64_t s = first_token_ + cursor.token;
        const Geometry& in = operand.in_geometry;
        const Geometry& out = operand.out_geometry;
        const bool unit_stride = in.stride_dim == 1 && out.stride_dim == 1;
        cursor.row = {{static_cast<const Storage*>(operand.in) + in.offset(cursor.sequence, head, s, 0), in.stride_dim},
                      {static_cast<Storage*>(operand.out) + out.offset(cursor.sequence, head, s, 0), out.stride_dim},
                      in.stride_seq,
                      out.stride_seq,
                      unit_stride ? plan_.head_dim * int64_t(sizeof(Storage)) : 0,
                      kernels_[is_q ? 0 : 1]};
        return cursor;
    }

    const Plan& plan_;
    const RowKernel<Storage> (&kernels_)[2];  // For q's rows and for k's.
    int64_t heads_;                // q heads + k heads: owners per sequence.
    bool tokens_inner_;            // Walk an owner's tokens before the next owner.
    int64_t first_sequence_ = 0;   // Sequence of the unit's first owner.
    int64_t first_head_ = 0;       // Its head.
    int64_t owners_ = 0;           // Owners in the unit.
    int64_t first_token_ = 0;      // First token of the block.
    int64_t tokens_ = 0;           // Tokens in the block.
};

// ---------------------------------------------------------------------------
// 4. The backend
// ---------------------------------------------------------------------------

class EigenCpuBackend final : public Backend {
public:
    explicit EigenCpuBackend(const BackendOptions& options) : requested_threads_(options.threads) {}

    std::string name() const override { return "cpu-eigen"; }
    Device device() const override { return Device::host; }

    void run(const Plan& plan) override {
        dispatch_dtype(plan.dtype, [&](auto storage) { run_typed<decltype(storage)>(plan); });
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
        // No more threads than units, and none that would get too little to do:
        // a decode step of a small model is over before a second thread wakes up.
        const int64_t bytes = (plan.q.in_geometry.numel() + plan.k.in_geometry.numel()) * 2 * int64_t(sizeof(Storage));
        const int team = int(std::clamp<int64_t>(bytes / kMinBytesPerThread, 1, std::min(thread_count(), split.units())));
        // Grow the per-thread tables here, outside the parallel region, and only
        // when a call needs more than any before it.
        const size_t table_size = size_t(split.tokens_per_block * plan.pairs);
        if (tables_.size() < size_t(team)) tables_.resize(size_t(team));
        for (TrigTable& table : tables_) {
            if (table.cos.size() < table_size) table.cos.resize(table_size), table.sin.resize(table_size);
        }

        const RowKernel<Storage> kernels[2] = {pick_row_kernel<Storage>(plan.style, plan.q),
                                               pick_row_kernel<Storage>(plan.style, plan.k)};
        const RowShape shape{plan.pairs, plan.rotary_dim, plan.head_dim};
        const bool tokens_inner = plan.q.in_geometry.stride_seq < plan.q.in_geometry.stride_head;

#pragma omp parallel num_threads(team)
        {
            TrigTable& table = tables_[size_t(omp_get_thread_num())];
            int64_t table_block = -1;  // Which token block the table holds now.

            // Static schedule: each thread gets one contiguous range of units, so
            // consecutive units mostly share a token block and reuse its table.
#pragma omp for schedule(static)
            for (int64_t unit = 0; unit < split.units(); ++unit) {
                const RowWalk<Storage> walk(plan, kernels, tokens_inner, split, unit);
                const int64_t rows = walk.size();

                // Two cursors walk the same rows: `lead` runs kPrefetchRows ahead
                // and prefetches, `row` follows and rotates. The first rows are
                // requested before cos/sin are computed, so they arrive meanwhile.
                auto lead = walk.first();
                int64_t requested = 0;  // Rows the lead has asked for.
                auto request_up_to = [&](int64_t count) {
                    for (; requested < std::min(count, rows); ++requested) {
                        lead.row.prefetch();
                        if (requested + 1 < rows) walk.advance(lead);
                    }
                };
                request_up_to(kPrefetchRows);

                const TokenBlock block = split.block_of(unit);
                if (block.index != table_block) {
                    fill_trig_table(plan, block, table.cos.data(), table.sin.data());
                    table_block = block.index;
                }

                auto row = walk.first();
                for (int64_t i = 0; i < rows; ++i) {
                    request_up_to(i + 1 + kPrefetchRows);
                    const int64_t entry = row.token * plan.pairs;
                    row.row.kernel(row.row.in, row.row.out, table.cos.data() + entry, table.sin.data() + entry, shape);
                    if (i + 1 < rows) walk.advance(row);
                }
            }
        }
    }

    int requested_threads_;            // BackendOptions::threads (0: OpenMP default).
    std::vector<TrigTable> tables_;  // One cos/sin table per thread, reused across calls.
};

}  // namespace

std::unique_ptr<Backend> make_cpu_eigen_backend(const BackendOptions& options) {
    return std::make_unique<EigenCpuBackend>(options);
}

}  // namespace rope
