#pragma once
// The optimisation ladder's common ground, in plain C++ so that a machine
// without a GPU can still print it: the problem every version solves, and the
// grid each version launches.
//
// Every version solves the same problem: q [tokens, q_heads, head_dim] and
// k [tokens, k_heads, head_dim] (layout bshd, batch * seq = tokens), float32,
// half-split pairs, rotated out of place into q_out and k_out. Out of place
// because version 2 cannot work in place (see v2_thread_per_element.cu), and
// the same bytes moved keeps the comparison fair.
#include <algorithm>
#include <cstdint>
#include <string>

#include <rope/host_device.hpp>

namespace ladder {

/// What a kernel gets: pointers into device memory and the sizes.
struct Problem {
    const float* q = nullptr;
    const float* k = nullptr;
    float* q_out = nullptr;
    float* k_out = nullptr;
    const float* inv_freq = nullptr;  ///< theta_i, head_dim / 2 floats in device memory.
    int64_t tokens = 0;               ///< batch * seq.
    int64_t seq = 1;                  ///< Tokens per sequence.
    int64_t position_offset = 0;      ///< Position of token t: position_offset + t % seq.
    int64_t q_heads = 0, k_heads = 0, head_dim = 0;
};

/// The position of token @p token (its sequence's offset + its index in the sequence).
ROPE_HOST_DEVICE inline int64_t position_of(const Problem& p, int64_t token) {
    return p.position_offset + token % p.seq;
}

/// Head rows of q and k together: every version covers all of them.
ROPE_HOST_DEVICE inline int64_t total_rows(const Problem& p) { return p.tokens * (p.q_heads + p.k_heads); }

/// One head row: where to read it, where to write it, which token it belongs to.
struct Row {
    const float* in;
    float* out;
    int64_t token;
};

/// Row @p row of all rows, q's first then k's (in bshd, a token's heads are adjacent).
ROPE_HOST_DEVICE inline Row row_at(const Problem& p, int64_t row) {
    const int64_t q_rows = p.tokens * p.q_heads;
    if (row < q_rows) return {p.q + row * p.head_dim, p.q_out + row * p.head_dim, row / p.q_heads};
    row -= q_rows;
    return {p.k + row * p.head_dim, p.k_out + row * p.head_dim, row / p.k_heads};
}

/// Head @p head of token @p token, counting q's heads first, then k's.
ROPE_HOST_DEVICE inline Row head_of_token(const Problem& p, int64_t token, int64_t head) {
    if (head < p.q_heads) {
        const int64_t row = token * p.q_heads + head;
        return {p.q + row * p.head_dim, p.q_out + row * p.head_dim, token};
    }
    const int64_t row = token * p.k_heads + (head - p.q_heads);
    return {p.k + row * p.head_dim, p.k_out + row * p.head_dim, token};
}

/// 16-byte chunks (4 pairs) per half row, for versions 4 to 6. Needs head_dim % 8 == 0.
inline int64_t chunks_per_half(const Problem& p) { return p.head_dim / 2 / 4; }

/// The facts about the GPU that grid choices depend on.
struct Device {
    int sms = 132;              ///< Streaming multiprocessors (an H200 has 132).
    int threads_per_sm = 2048;  ///< Resident threads per SM (2048 on Hopper).
};

/// A launch: blocks x threads per block, and what one thread does.
struct Grid {
    int64_t blocks = 0;
    int threads_per_block = 256;
    int64_t heads_per_thread = 1;  ///< Versions 5 and 6: head rows that share one thread's cos/sin.
    int64_t threads() const { return blocks * threads_per_block; }
};

inline int64_t blocks_for(int64_t threads, int threads_per_block) {
    return (threads + threads_per_block - 1) / threads_per_block;
}

// v1: one thread per head row; the thread loops over the row's pairs.
inline Grid grid_v1(const Problem& p) { return {blocks_for(total_rows(p), 256), 256, 1}; }
// v2: one thread per element (feature).
inline Grid grid_v2(const Problem& p) { return {blocks_for(total_rows(p) * p.head_dim, 256), 256, 1}; }
// v3: one thread per pair.
inline Grid grid_v3(const Problem& p) { return {blocks_for(total_rows(p) * p.head_dim / 2, 256), 256, 1}; }
// v4: one thread per 16-byte chunk of each half: 4 pairs.
inline Grid grid_v4(const Problem& p) { return {blocks_for(total_rows(p) * chunks_per_half(p), 256), 256, 1}; }
// v5: one thread per (token, chunk), visiting every head of q and k of its token.
inline Grid grid_v5(const Problem& p) {
    return {blocks_for(p.tokens * chunks_per_half(p), 256), 256, p.q_heads + p.k_heads};
}

// v6: v5's kernel with a grid sized for the device. The heads of a token are
// split into groups, one thread per (token, chunk, group), with as many groups
// as it takes to give every SM a full load of threads: few groups (much reuse)
// for a long prompt, one head per thread for a decode step of a few tokens.
// Blocks shrink (256 -> 128 -> 64 threads) until every SM has at least one.
inline Grid grid_v6(const Problem& p, const Device& device) {
    const int64_t heads = p.q_heads + p.k_heads;
    const int64_t per_group_threads = p.tokens * chunks_per_half(p);
    const int64_t fill = int64_t(device.sms) * device.threads_per_sm;
    const int64_t groups = std::clamp<int64_t>((fill + per_group_threads - 1) / per_group_threads, 1, heads);
    Grid grid;
    grid.heads_per_thread = (heads + groups - 1) / groups;
    const int64_t threads = per_group_threads * ((heads + grid.heads_per_thread - 1) / grid.heads_per_thread);
    grid.threads_per_block = 256;
    while (grid.threads_per_block > 64 && blocks_for(threads, grid.threads_per_block) < device.sms)
        grid.threads_per_block /= 2;
    grid.blocks = blocks_for(threads, grid.threads_per_block);
    return grid;
}

/// The grid of version @p version (1 to 6) for @p p on @p device.
inline Grid grid_of(int version, const Problem& p, const Device& device) {
    switch (version) {
        case 1: return grid_v1(p);
        case 2: return grid_v2(p);
        case 3: return grid_v3(p);
        case 4: return grid_v4(p);
        case 5: return grid_v5(p);
        default: return grid_v6(p, device);
    }
}

/// Names and one-line ideas, for the table.
struct Step {
    const char* name;
    const char* idea;
};
inline constexpr Step kSteps[] = {
    {"v1 thread per row", "chapter 1's pair loop inside each thread: neighbouring threads are a row apart"},
    {"v2 thread per element", "neighbouring threads, neighbouring features: coalesced, but every pair done twice"},
    {"v3 thread per pair", "each pair once, both halves read as coalesced runs (= cuda-naive's mapping)"},
    {"v4 16-byte vectors", "a thread moves 4 pairs with one float4 from each half: 1/4 of the instructions"},
    {"v5 cos/sin per token", "cos/sin of 4 pairs computed once, applied to all 40 heads; 4 rows in flight"},
    {"v6 grid for the device", "v5's kernel, heads split into groups so every SM is full, even for decode"},
};
inline constexpr int kVersions = 6;

// ---------------------------------------------------------------------------
// The GPU side (ladder_gpu.cu and v1..v6 *.cu), built only with CUDA.
// ---------------------------------------------------------------------------

/// The current GPU's Device facts, and its name in @p name (throws rope::Error if there is none).
Device query_device(std::string& name);
/// Enqueues version @p version on the default stream; checks the launch.
/// (Timing is not here: the chapter uses rope-bench's timer, bench/timing/cuda_timing.hpp.)
void launch(int version, const Problem& p, const Device& device);
/// Fills @p bytes of device memory with 0xFF bytes (NaN floats): a version that
/// writes nothing cannot pass by reusing the previous version's output.
void poison(void* device_memory, int64_t bytes);
/// Waits for the GPU and reports any error that happened in a kernel.
void synchronize();

}  // namespace ladder
