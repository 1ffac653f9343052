#pragma once
// How cpu-eigen divides a call's rows among its threads, and the order in
// which a thread walks its share.
//
// Two words. A *chunk* is a run of tokens whose cos/sin the table holds at
// once (all tokens of a short sequence); a *tile* is a range of a chunk's
// tokens times a range of its heads, the unit a thread takes. (The heads of a
// chunk are its (sequence, q-or-k head) pairs: sequence b's q heads, then its
// k heads, then sequence b+1's, over the whole batch when the sequences share
// positions, else of the chunk's own sequence.)
//
//   [b, h, s, d] (a head's tokens adjacent): heads split first
//
//                 tokens of the chunk ->
//               +---------+---------+
//     heads 0-3 | tile 0  | tile 1  |   thread 0: tiles 0-1
//               +---------+---------+
//     heads 4-7 | tile 2  | tile 3  |   thread 1: tiles 2-3
//               +---------+---------+
//
//   [b, s, h, d] (a token's heads adjacent): tokens split first
//
//                 tokens of the chunk ->
//               +---------+---------+
//     heads 0-3 | tile 0  | tile 2  |
//               +---------+---------+   thread 0: tiles 0-1
//     heads 4-7 | tile 1  | tile 3  |   thread 1: tiles 2-3
//               +---------+---------+
//
// Where the batch shares its positions, the heads of a chunk span the batch;
// a [b, s, h, d] tile then holds one sequence's heads at most, for the reason
// split_work gives.
//
// Tiles are numbered so that each thread's contiguous range of them (OpenMP's
// static schedule) is a contiguous region of memory: two threads streaming
// two separate regions go faster than both hopping over the same heads.
// Within a tile the rows are walked token by token, each token's heads in
// order (RowWalk), so that a token's row of the table is read once and then
// from L1; for [b, h, s, d] that means the tile's few heads advance side by
// side, each its own stream of memory. A stream is visited for kVisitBytes at
// least: where a row is shorter (float32 at head_dim 128: 512 bytes), each head
// takes the next few tokens of the walk in one visit, their table rows still in
// L1. In every layout, before a row is rotated, the same head's row some way
// further on is asked for with a software prefetch (kPrefetchBytes), so that
// the walk finds its rows in the caches instead of waiting for each.
#include <algorithm>
#include <cstdint>

#include "rope/detail/plan.hpp"
#include "row.hpp"

namespace rope::cpu_eigen {
// Internal linkage, as if written in backend.cpp, its one includer: the compiler
// then inlines the per-row calls below as it does the rest of that file.
namespace {

// Bytes of cos + sin for one chunk (4096 tokens at head_dim 128). The table
// is shared by all threads, filled by all of them before any row is rotated
// (filling it is arithmetic only, with the memory bus idle; overlapping the
// two did not pay); a long sequence is done chunk after chunk.
constexpr int64_t kChunkTableBytes = 2 * 1024 * 1024;
// Bytes of table per tile when a token's heads are adjacent in memory
// ([b, s, h, d]: 128 tokens at head_dim 128): it stays in L2 while the tile's
// rows of every head stream by.
constexpr int64_t kTileTableBytes = 64 * 1024;
// Heads per tile, walked side by side token by token, where a head's tokens
// are adjacent ([b, h, s, d]). Each token's cos/sin row is read from L1 by all
// of them, and each thread keeps this many streams of memory going; one head
// at a time would read its table row from L2 or L3 for every row.
constexpr int64_t kHeadsSideBySide = 4;
// Bytes of a head's rows read in one visit of its stream, where a head's tokens
// are adjacent ([b, h, s, d]): a walk that moves on to the next head after every
// short row keeps the memory system from streaming any of them at full speed;
// the visit's table rows stay in L1 (bench/results/notes/cpu-eigen.md: how much).
constexpr int64_t kVisitBytes = 1024;
// Bytes of the walk ahead that a thread asks for with software prefetches
// before it rotates a row: the same head's row on the token that many bytes of
// rows later (its next token at least). Where a head's tokens are adjacent
// ([b, h, s, d]) a thread's kHeadsSideBySide streams, each visited for
// kVisitBytes and then left for the next, are more than the processor's own
// prefetchers keep ahead of; where a token's heads are adjacent
// ([b, s, h, d]) a tile's q and k rows are two streams taken in turn, and the
// prefetchers fell behind there too. Without it most of a row's time was the
// wait for its first load (bench/results/notes/cpu-eigen.md: how much, and
// the distances tried).
constexpr int64_t kPrefetchBytes = 2048;
// Tiles per thread: enough that an uneven last tile costs little.
constexpr int64_t kTilesPerThread = 8;

// Consecutive tokens of one row of positions (b for per-sequence ids, 0 when
// the batch shares them) whose cos/sin are in the table together.
struct Chunk {
    int64_t position_row = 0;
    int64_t first_token = 0;
    int64_t tokens = 0;
};

struct WorkSplit {
    int64_t position_rows = 1;   // Distinct rows of positions: 1 (shared) or batch.
    int64_t heads = 0;           // Heads per position row: sequences sharing it * (q + k heads).
    int64_t chunk_tokens = 1;    // Tokens per chunk (its table is kChunkTableBytes at most).
    int64_t chunks_per_row = 1;  // ceil(seq / chunk_tokens).
    int64_t tile_tokens = 1;     // Tokens per tile.
    int64_t head_ranges = 1;     // Ranges the heads are cut into.
    bool heads_outer = true;     // Threads split heads (true) or tokens (false).
    int64_t visit_tokens = 1;    // Tokens of one head walked before the next head (heads_outer).
    int64_t prefetch_tokens = 0;  // How far ahead, in tokens, the same head's row is prefetched (0: none).
    int64_t seq = 0;

    Chunk chunk(int64_t index) const {
        const int64_t first_token = (index % chunks_per_row) * chunk_tokens;
        return {index / chunks_per_row, first_token, std::min(chunk_tokens, seq - first_token)};
    }
    int64_t token_ranges(const Chunk& chunk) const { return (chunk.tokens + tile_tokens - 1) / tile_tokens; }
    int64_t tiles(const Chunk& chunk) const { return token_ranges(chunk) * head_ranges; }
};

inline WorkSplit split_work(const Plan& plan, int64_t threads) {
    WorkSplit split;
    const bool per_sequence_ids = plan.positions.per_sequence();
    split.position_rows = per_sequence_ids ? plan.batch : 1;
    split.heads = (per_sequence_ids ? 1 : plan.batch) * (plan.q.in_geometry.heads + plan.k.in_geometry.heads);
    split.seq = plan.seq;
    // At least one pair's worth: a plan with none (the copy part of a rotary window) still splits.
    const int64_t table_row_bytes = 2 * int64_t(sizeof(float)) * std::max<int64_t>(plan.pairs, 1);
    split.chunk_tokens = std::clamp<int64_t>(kChunkTableBytes / table_row_bytes, 1, plan.seq);
    split.chunks_per_row = (plan.seq + split.chunk_tokens - 1) / split.chunk_tokens;
    split.heads_outer = plan.q.in_geometry.stride_seq < plan.q.in_geometry.stride_head;
    const int64_t row_bytes = std::max<int64_t>(1, plan.head_dim * int64_t(dtype_size(plan.dtype)));

    // Enough tiles for every thread, cut from whichever axis comes first.
    const int64_t target_tiles = threads * kTilesPerThread;
    if (split.heads_outer) {
        // Heads first, kHeadsSideBySide per tile at most; the tokens are cut
        // into ranges only when there are too few heads for the threads.
        split.head_ranges = std::max(std::min(split.heads, target_tiles),
                                     (split.heads + kHeadsSideBySide - 1) / kHeadsSideBySide);
        const int64_t ranges = std::clamp<int64_t>((target_tiles + split.heads - 1) / split.heads, 1, split.chunk_tokens);
        split.tile_tokens = (split.chunk_tokens + ranges - 1) / ranges;
        split.visit_tokens = std::max<int64_t>(1, kVisitBytes / row_bytes);
    } else {
        split.tile_tokens = std::clamp<int64_t>(kTileTableBytes / table_row_bytes, 1, split.chunk_tokens);
        const int64_t ranges = split.token_ranges(split.chunk(0));
        split.head_ranges = std::clamp<int64_t>((target_tiles + ranges - 1) / ranges, 1, split.heads);
        // Sequences sharing positions: a tile holds the heads of one sequence at most (a whole
        // number of ranges per sequence). A token's heads of one sequence are one contiguous run
        // of q and one of k; a tile across the batch would walk two runs per sequence for each
        // token, more streams of memory than the prefetchers follow.
        const int64_t sequences = split.heads / (plan.q.in_geometry.heads + plan.k.in_geometry.heads);
        split.head_ranges = std::min((split.head_ranges + sequences - 1) / sequences * sequences, split.heads);
    }
    // How many tokens ahead is kPrefetchBytes: in [b, h, s, d] a head's tokens are its own stream,
    // so a token is one row of it; in [b, s, h, d] the walk takes all of a tile's heads before the
    // next token, so a token is that many rows of the walk. Contiguous rows only: a strided row
    // spans more than the lines prefetched.
    const int64_t bytes_per_token =
        split.heads_outer ? row_bytes : row_bytes * ((split.heads + split.head_ranges - 1) / split.head_ranges);
    if (plan.q.in_geometry.stride_dim == 1 && plan.k.in_geometry.stride_dim == 1 &&
        plan.q.out_geometry.stride_dim == 1 && plan.k.out_geometry.stride_dim == 1)
        split.prefetch_tokens = std::max<int64_t>(1, kPrefetchBytes / bytes_per_token);
    return split;
}

// One head row ready to rotate: where its input and output live, and the
// kernel for its operand (q and k may differ in strides).
template <typename Storage>
struct HeadRow {
    Row<const Storage> in;
    Row<Storage> out;
    RowKernel<Storage> kernel;
    const Storage* in_ahead = nullptr;  // The same head's row WorkSplit::prefetch_tokens on, if any.
    Storage* out_ahead = nullptr;       // Its output row, when not in place.
};

// Asks for @p row's rows ahead (HeadRow::in_ahead, out_ahead; kPrefetchBytes):
// the input to read and, with @p output, the output to write (fetched for
// writing, so the stores find their lines owned; not for rows streamed out
// past the caches). A prefetch reads nothing into a register and cannot
// fault; the rows are the tensor's own.
template <typename Storage>
inline void prefetch_ahead(const HeadRow<Storage>& row, int64_t row_bytes, bool output) {
    constexpr int64_t kLine = 64;
    if (row.in_ahead != nullptr)
        for (int64_t b = 0; b < row_bytes; b += kLine)
            __builtin_prefetch(reinterpret_cast<const char*>(row.in_ahead) + b, 0, 3);
    if (output && row.out_ahead != nullptr)
        for (int64_t b = 0; b < row_bytes; b += kLine)
            __builtin_prefetch(reinterpret_cast<const char*>(row.out_ahead) + b, 1, 3);
}

// The rows of one tile, in the order a thread visits them: token by token,
// and each token's heads in order; or, where a visit spans several tokens
// (WorkSplit::visit_tokens), visit by visit: each head's tokens of the visit,
// then the next head's.
template <typename Storage>
class RowWalk {
public:
    // A position in the walk: which head (sequence, head) and which token.
    struct Cursor {
        int64_t sequence;
        int64_t head;          // Counting q's heads first, then k's.
        int64_t head_in_tile;  // 0 .. heads-1 within the tile.
        int64_t token;         // 0 .. tokens-1 within the tile.
        int64_t visit_begin;   // The visit's tokens: [visit_begin, visit_end).
        int64_t visit_end;
        HeadRow<Storage> row;
    };

    RowWalk(const Plan& plan, const RowKernel<Storage> (&kernels)[2], const WorkSplit& split, const Chunk& chunk,
            int64_t tile)
        : plan_(plan), kernels_(kernels), heads_per_sequence_(plan.q.in_geometry.heads + plan.k.in_geometry.heads) {
        const int64_t token_ranges = split.token_ranges(chunk);
        const int64_t token_range = split.heads_outer ? tile % token_ranges : tile / split.head_ranges;
        const int64_t head_range = split.heads_outer ? tile / token_ranges : tile % split.head_ranges;
        const int64_t head_begin = head_range * split.heads / split.head_ranges;
        const int64_t head_end = (head_range + 1) * split.heads / split.head_ranges;
        // Shared positions: the position row is 0 and the heads span the batch.
        // Per-sequence ids: the heads are those of sequence position_row.
        first_sequence_ = chunk.position_row + head_begin / heads_per_sequence_;
        first_head_ = head_begin % heads_per_sequence_;
        heads_ = head_end - head_begin;
        first_token_ = token_range * split.tile_tokens;  // Within the chunk.
        tokens_ = std::min(split.tile_tokens, chunk.tokens - first_token_);
        chunk_first_token_ = chunk.first_token;
        visit_tokens_ = split.heads_outer ? split.visit_tokens : 1;
        prefetch_tokens_ = split.prefetch_tokens;
    }

    int64_t size() const { return heads_ * tokens_; }

    Cursor first() const {
        Cursor cursor{first_sequence_, first_head_, 0, 0, 0, std::min(visit_tokens_, tokens_), {}};
        locate(cursor);
        return cursor;
    }

    // Row of the chunk's cos/sin table that the cursor's token uses.
    int64_t table_row(const Cursor& cursor) const { return first_token_ + cursor.token; }

    // Steps @p cursor to the next row; only call it when there is one.
    //
    // The cursor is changed field by field, in place: assigning it a whole new
    // Cursor lets the compiler write the fields one by one and then copy the
    // struct with wide vector moves, which wait for those writes to finish, a
    // stall on every row.
    void advance(Cursor& cursor) const {
        if (++cursor.token == cursor.visit_end) {  // The visit of this head is over: the next head's.
            cursor.token = cursor.visit_begin;
            ++cursor.head_in_tile;
            if (++cursor.head == heads_per_sequence_) cursor.head = 0, ++cursor.sequence;
            if (cursor.head_in_tile == heads_) {  // Every head visited: the next visit's tokens.
                cursor.sequence = first_sequence_;
                cursor.head = first_head_;
                cursor.head_in_tile = 0;
                cursor.token = cursor.visit_begin = cursor.visit_end;
                cursor.visit_end = std::min(cursor.visit_end + visit_tokens_, tokens_);
            }
        }
        locate(cursor);
    }

private:
    // Fills in the addresses of the cursor's row.
    void locate(Cursor& cursor) const {
        const int64_t q_heads = plan_.q.in_geometry.heads;
        const bool is_q = cursor.head < q_heads;
        const Operand& operand = is_q ? plan_.q : plan_.k;
        const int64_t head = is_q ? cursor.head : cursor.head - q_heads;
        const int64_t s = chunk_first_token_ + first_token_ + cursor.token;
        const Geometry& in = operand.in_geometry;
        const Geometry& out = operand.out_geometry;
        HeadRow<Storage>& row = cursor.row;
        row.in.data = static_cast<const Storage*>(operand.in) + in.offset(cursor.sequence, head, s, 0);
        row.in.stride = in.stride_dim;
        row.out.data = static_cast<Storage*>(operand.out) + out.offset(cursor.sequence, head, s, 0);
        row.out.stride = out.stride_dim;
        row.kernel = kernels_[is_q ? 0 : 1];
        const bool ahead = prefetch_tokens_ > 0 && s + prefetch_tokens_ < plan_.seq;  // A row of the tensor.
        row.in_ahead = ahead ? row.in.data + prefetch_tokens_ * in.stride_seq : nullptr;
        row.out_ahead = ahead && operand.out != operand.in ? row.out.data + prefetch_tokens_ * out.stride_seq : nullptr;
    }

    const Plan& plan_;
    const RowKernel<Storage> (&kernels_)[2];  // For q's rows and for k's.
    int64_t heads_per_sequence_;   // q heads + k heads.
    int64_t first_sequence_ = 0;   // Sequence of the tile's first head.
    int64_t first_head_ = 0;       // Its head.
    int64_t heads_ = 0;            // Heads in the tile.
    int64_t first_token_ = 0;      // First token of the tile, within the chunk.
    int64_t tokens_ = 0;           // Tokens in the tile.
    int64_t chunk_first_token_ = 0;  // First token of the chunk, within the sequence.
    int64_t visit_tokens_ = 1;     // Tokens per visit of a head.
    int64_t prefetch_tokens_ = 0;  // WorkSplit::prefetch_tokens.
};

}  // namespace
}  // namespace rope::cpu_eigen
