// cpu-eigen: RoPE as Eigen array expressions on OpenMP threads.
//
// It computes exactly what cpu-naive computes (same float32 angle from
// rope_angle, same std::cos/std::sin, same rotation), only faster. RoPE does
// a handful of flops per element against 8 bytes moved (fp32, read + write),
// so it is bound by memory bandwidth, and speed comes from three things:
//
//   1. cos/sin are computed once per (position, pair) and reused by every head
//      of q and k (and by every sequence when they share positions). cpu-naive
//      recomputes them per head: 64 heads means 64 times the trigonometry.
//   2. A head row is rotated as Eigen fixed-size arrays, several pairs per
//      instruction (SIMD), with a generic gather/scatter path for strided
//      views and 16-bit storage.
//   3. OpenMP threads split the tokens and, when there are too few tokens
//      (decoding one token at a time), the heads, so every core streams.
//
// Read top to bottom: the row kernel, the trigonometry table, the work split,
// and the backend that ties them together.
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

// cos and sin of a block of consecutive tokens, [token][pair], already scaled
// by the attention factor and, for the inverse, with sin negated, so the row
// kernel only multiplies.
//
// The table of one block stays small (kTableBytes) so it lives in L1 while
// every head of q and k streams past it.
void fill_trig_table(const Plan& plan, int64_t position_row, int64_t first_token, int64_t tokens, float* cos,
                     float* sin) {
    const float sign = plan.direction == Direction::forward ? 1.0f : -1.0f;
    const float scale = plan.frequencies.attention_factor;
    const float* inv_freq = plan.frequencies.inv_freq.data();
    const double* inv_freq_exact = plan.frequencies.inv_freq_exact.data();
    for (int64_t t = 0; t < tokens; ++t) {
        const int64_t position = plan.positions.at(position_row, first_token + t);
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

// ---------------------------------------------------------------------------
// 3. Splitting the work among threads
// ---------------------------------------------------------------------------

// Bytes of cos + sin per table: a third of a typical 32-48 KiB L1 data cache.
#ifndef KTB
#define KTB 16
#endif
constexpr int64_t kTableBytes = KTB * 1024;
// Work units per thread: enough that an uneven last unit costs little.
constexpr int64_t kUnitsPerThread = 8;
// Bytes per cache line (x86-64 and most ARM cores): the unit of prefetching.
constexpr int64_t kCacheLine = 64;
// Rows of a head prefetched ahead of the one being rotated.
#ifndef KPR
#define KPR 8
#endif
constexpr int64_t kPrefetchRows = KPR;

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
    int64_t sequences_per_row = 1;   // Sequences that use one position row.
    int64_t owners = 0;              // sequences_per_row * (q heads + k heads).
    int64_t tokens_per_block = 1;    // Tokens per cos/sin table.
    int64_t blocks_per_row = 1;      // ceil(seq / tokens_per_block).
    int64_t owner_chunks = 1;        // Chunks the owners of one block are cut into.
    int64_t units() const { return position_rows * blocks_per_row * owner_chunks; }
};

WorkSplit split_work(const Plan& plan, int64_t threads) {
    WorkSplit split;
    const bool per_sequence_ids = plan.positions.ids != nullptr && plan.positions.row_stride != 0;
    split.position_rows = per_sequence_ids ? plan.batch : 1;
    split.sequences_per_row = per_sequence_ids ? 1 : plan.batch;
    split.owners = split.sequences_per_row * (plan.q.in_geometry.heads + plan.k.in_geometry.heads);

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

// One thread's cos/sin table, kept between calls so the hot path never allocates.
struct ThreadScratch {
    std::vector<float> cos;
    std::vector<float> sin;
};

// The rows of one unit, in the order a thread visits them.
//
// Memory is visited in its own order: for [b, h, s, d] the rows of one head
// are adjacent, so each owner's tokens are walked before the next owner; for
// [b, s, h, d] the heads of one token are adjacent, so each token's owners are
// walked before the next token.
struct UnitRows {
    int64_t heads;           // q heads + k heads: owners per sequence.
    int64_t first_sequence;  // Sequence of the unit's first owner.
    int64_t first_head;      // Its head, counting q's heads first, then k's.
    int64_t owners;          // Owners in the unit.
    int64_t tokens;          // Tokens in the unit's block.
    bool tokens_inner;       // Walk an owner's tokens before moving to the next owner.
    int64_t size() const { return owners * tokens; }
};

// A position in that walk: which owner (sequence, head) and which token of the block.
struct RowCursor {
    int64_t sequence;
    int64_t head;   // Counting q's heads first, then k's.
    int64_t owner;  // 0 .. owners-1 within the unit.
    int64_t token;  // 0 .. tokens-1 within the block.
};

RowCursor first_row(const UnitRows& unit) { return {unit.first_sequence, unit.first_head, 0, 0}; }

// Steps @p cursor to the next row of the walk, without a division.
void advance(const UnitRows& unit, RowCursor& cursor) {
    auto next_owner = [&] {
        ++cursor.owner;
        if (++cursor.head == unit.heads) cursor.head = 0, ++cursor.sequence;
    };
    if (unit.tokens_inner) {
        if (++cursor.token < unit.tokens) return;
        cursor.token = 0;
        next_owner();
    } else {
        next_owner();
        if (cursor.owner < unit.owners) return;
        cursor = {unit.first_sequence, unit.first_head, 0, cursor.token + 1};
    }
}

// Where one row's input and output live, and the kernel for its operand.
template <typename Storage>
struct RowRef {
    Row<const Storage> in;
    Row<Storage> out;
    RowKernel<Storage> kernel;
    int64_t prefetch_bytes;  // Bytes of the row to prefetch; 0 for strided rows.

    // Asks the memory system for this row ahead of use. RoPE computes for a
    // while on each row it loads, and memory left idle meanwhile is bandwidth
    // lost; hardware prefetchers also restart at every jump between heads.
    // So the loop names the rows it will need a few rows from now itself.
    void prefetch() const {
        const char* read = reinterpret_cast<const char*>(in.data);
        const char* write = reinterpret_cast<const char*>(out.data);
        for (int64_t byte = 0; byte < prefetch_bytes; byte += kCacheLine) {
            __builtin_prefetch(read + byte, 0);
            if (write != read) __builtin_prefetch(write + byte, 1);
        }
    }
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
        // No more threads than units: a tiny call should not wake idle threads.
        const int team = int(std::min(thread_count(), split.units()));
        const size_t table_size = size_t(split.tokens_per_block * plan.pairs);
        // Grow the per-thread tables here, outside the parallel region, and only
        // when a call needs more than any before it.
        if (scratch_.size() < size_t(team)) scratch_.resize(size_t(team));
        for (ThreadScratch& scratch : scratch_) {
            if (scratch.cos.size() < table_size) {
                scratch.cos.resize(table_size);
                scratch.sin.resize(table_size);
            }
        }

        const RowKernel<Storage> q_kernel = pick_row_kernel<Storage>(plan.style, plan.q);
        const RowKernel<Storage> k_kernel = pick_row_kernel<Storage>(plan.style, plan.k);
        const int64_t q_heads = plan.q.in_geometry.heads;
        const int64_t heads = q_heads + plan.k.in_geometry.heads;
        const RowShape shape{plan.pairs, plan.rotary_dim, plan.head_dim};
        const bool tokens_inner = plan.q.in_geometry.stride_seq < plan.q.in_geometry.stride_head;

        // The row of @p cursor for a block starting at token first_token.
        auto locate = [&](const RowCursor& cursor, int64_t first_token) {
            const bool is_q = cursor.head < q_heads;
            const Operand& operand = is_q ? plan.q : plan.k;
            const int64_t head = is_q ? cursor.head : cursor.head - q_heads;
            const int64_t s = first_token + cursor.token;
            const Geometry& in = operand.in_geometry;
            const Geometry& out = operand.out_geometry;
            const bool unit_stride = in.stride_dim == 1 && out.stride_dim == 1;
            return RowRef<Storage>{{static_cast<const Storage*>(operand.in) + in.offset(cursor.sequence, head, s, 0), in.stride_dim},
                                   {static_cast<Storage*>(operand.out) + out.offset(cursor.sequence, head, s, 0), out.stride_dim},
                                   is_q ? q_kernel : k_kernel,
                                   unit_stride ? plan.head_dim * int64_t(sizeof(Storage)) : 0};
        };

#pragma omp parallel num_threads(team)
        {
            ThreadScratch& scratch = scratch_[size_t(omp_get_thread_num())];
            int64_t table_block = -1;  // Which (position row, block) the table holds now.

            // Static schedule: each thread gets one contiguous range of units, so
            // consecutive units mostly share a token block and reuse its table.
#pragma omp for schedule(static)
            for (int64_t unit_index = 0; unit_index < split.units(); ++unit_index) {
                const int64_t block = unit_index / split.owner_chunks;  // Index over (position row, block).
                const int64_t chunk = unit_index % split.owner_chunks;
                const int64_t position_row = block / split.blocks_per_row;
                const int64_t first_token = (block % split.blocks_per_row) * split.tokens_per_block;
                // Owners [owner_begin, owner_end) in (sequence, head) order. Shared
                // positions: position_row is 0 and the owners span the batch.
                // Per-sequence ids: the owners are one sequence's heads.
                const int64_t owner_begin = chunk * split.owners / split.owner_chunks;
                const int64_t owner_end = (chunk + 1) * split.owners / split.owner_chunks;
                const UnitRows unit{heads,
                                    position_row + owner_begin / heads,
                                    owner_begin % heads,
                                    owner_end - owner_begin,
                                    std::min(split.tokens_per_block, plan.seq - first_token),
                                    tokens_inner};

                // Two cursors walk the same rows: `lead` runs kPrefetchRows ahead
                // and prefetches, `row` follows and rotates. The first rows are
                // requested before cos/sin are computed, so they arrive meanwhile.
                const int64_t rows = unit.size();
                const int64_t ahead = std::min(rows, kPrefetchRows);
                RowCursor lead = first_row(unit);
                for (int64_t i = 0; i < ahead; ++i, advance(unit, lead)) locate(lead, first_token).prefetch();
                if (block != table_block) {
                    fill_trig_table(plan, position_row, first_token, unit.tokens, scratch.cos.data(), scratch.sin.data());
                    table_block = block;
                }
                RowCursor row = first_row(unit);
                for (int64_t i = 0; i < rows; ++i, advance(unit, row)) {
                    if (i + ahead < rows) {
                        locate(lead, first_token).prefetch();
                        advance(unit, lead);
                    }
                    const RowRef<Storage> ref = locate(row, first_token);
                    const int64_t table_offset = row.token * plan.pairs;
                    ref.kernel(ref.in, ref.out, scratch.cos.data() + table_offset, scratch.sin.data() + table_offset,
                               shape);
                }
            }
        }
    }

    int requested_threads_;               // BackendOptions::threads (0: OpenMP default).
    std::vector<ThreadScratch> scratch_;  // One cos/sin table per thread, reused across calls.
};

}  // namespace

std::unique_ptr<Backend> make_cpu_eigen_backend(const BackendOptions& options) {
    return std::make_unique<EigenCpuBackend>(options);
}

}  // namespace rope
