#pragma once
/// @file tiling.hpp
/// @brief How cuda-optimized cuts a call into tiles, one per thread block (host code,
/// internal to the CUDA backends; plain C++ so the tests can check it without a GPU).
///
/// A tile is a block of consecutive tokens times a block of head rows (q's
/// heads, then k's). Its thread block first computes the cos/sin of the
/// tile's tokens once, into shared memory, then streams the tile's rows,
/// reusing them for every row: the more rows a tile has, the more each
/// sincosf is reused; the more tiles a call has, the more SMs work on it.
///
/// - Bandwidth regime (the call has more work than the GPU has thread
///   slots): a tile holds all rows of a few tokens, sized so every thread
///   moves a handful of batches of chunks: enough to amortise the tile's
///   setup, few enough for short-lived blocks and a short tail.
/// - Latency regime (decode, small prompts): the work is spread over about
///   one tile per SM, and a tile may hold only a few rows of one token, so
///   that the few kilobytes are fetched by many SMs at once.

#include <algorithm>
#include <cstdint>

namespace rope::cuda_detail {

/// @brief The tile shape of one launch.
struct Tiling {
    int64_t tile_tokens = 1;  ///< Consecutive tokens per tile.
    int64_t tile_rows = 1;    ///< Consecutive head rows per tile (q's heads, then k's).
    int threads = 256;        ///< Threads per block.
    bool bandwidth = true;    ///< Which regime the call is in.
};

/// @brief The settings of choose_tiling; the defaults are the backend's, and the tuning
/// sweep (bench/tune) times others against them.
struct TileSettings {
    int threads = 256;                  ///< Threads per block in the bandwidth regime.
    int64_t batches_per_thread = 4;     ///< Bandwidth regime: batches of chunks each thread moves per tile.
    int max_small_threads = 128;        ///< Largest block in the latency regime.
    int64_t shared_bytes_limit = 24 * 1024;  ///< Cos/sin bytes a tile may keep in shared memory.
};

/// Thread slots of one SM on every GPU since Volta.
inline constexpr int64_t kThreadSlotsPerSM = 2048;

/// @brief Chooses the tiles of a call.
/// @param tokens batch * seq.
/// @param rows q heads + k heads.
/// @param chunks chunks per row (rotating and pass-through).
/// @param pairs rotated pairs per row (cos and sin of each are kept per token).
/// @param multiprocessors SMs of the device.
/// @param items_in_flight chunks a thread loads before it uses the first (one batch).
/// @param settings block size and work per thread.
/// @return the tile shape and block size.
inline Tiling choose_tiling(int64_t tokens, int64_t rows, int64_t chunks, int64_t pairs, int64_t multiprocessors,
                            int64_t items_in_flight, const TileSettings& settings = {}) {
    Tiling tiling;
    const int64_t items = tokens * rows * chunks;
    const int64_t token_bytes = std::max<int64_t>(1, 2 * 4 * pairs);  // cos + sin in float32
    const int64_t max_tile_tokens = std::max<int64_t>(1, settings.shared_bytes_limit / token_bytes);
    tiling.bandwidth = items >= multiprocessors * kThreadSlotsPerSM * items_in_flight;
    int64_t tile_items;
    if (tiling.bandwidth) {
        tiling.threads = settings.threads;
        tile_items = settings.threads * items_in_flight * settings.batches_per_thread;
    } else {
        // About one tile per SM, each thread one batch.
        tile_items = std::max<int64_t>((items + multiprocessors - 1) / multiprocessors, 32);
    }
    const int64_t items_per_token = rows * chunks;
    if (tile_items >= items_per_token) {
        // Whole tokens: every row of the tile's tokens, maximal reuse of their cos/sin.
        tiling.tile_rows = rows;
        tiling.tile_tokens = std::clamp<int64_t>(tile_items / items_per_token, 1, std::min(max_tile_tokens, tokens));
    } else {
        // Part of one token's rows.
        tiling.tile_tokens = 1;
        tiling.tile_rows = std::clamp<int64_t>(tile_items / std::max<int64_t>(chunks, 1), 1, rows);
    }
    if (!tiling.bandwidth) {
        const int64_t work = tiling.tile_tokens * tiling.tile_rows * chunks;
        const int64_t threads = (work + items_in_flight - 1) / items_in_flight;
        tiling.threads = int(std::clamp<int64_t>((threads + 31) / 32 * 32, 32, settings.max_small_threads));
    }
    return tiling;
}

}  // namespace rope::cuda_detail
