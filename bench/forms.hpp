#pragma once
/// @file forms.hpp
/// @brief The position forms rope-bench measures (plain, ids, packed, context-parallel shard, M-RoPE, axial,
/// a caller's cos/sin table): for one shape, the RoPE configuration, the tensor geometry and the host arrays
/// the positions read. All built on the host before any timing; rope-bench copies the arrays to the device.

#include <cstdint>
#include <string>
#include <vector>

#include "options.hpp"
#include "rope/args.hpp"
#include "rope/config.hpp"
#include "rope/positions.hpp"
#include "rope/tensor.hpp"

namespace rope_bench {

/// @brief One shape under one position form.
struct Form {
    std::string name;    ///< plain, ids, packed, mrope or axial, then +cp, +table (or cp, table alone).
    std::string detail;  ///< What the form holds, e.g. "23 sequences of 1..8192 tokens"; "" for plain.
    rope::RopeConfig config;
    rope::Layout layout = rope::Layout::bhsd;
    int64_t batch = 0, seq = 0;  ///< Geometry of the tensors (thd: batch 1, seq = all tokens).
    int64_t q_heads = 0, k_heads = 0, head_dim = 0;
    int64_t offset = 0;               ///< First position (plain and packed).
    int64_t cp_size = 1, cp_rank = 0;
    std::vector<int64_t> cu_seqlens;  ///< Packed: sequences + 1 token offsets (empty otherwise).
    std::vector<int64_t> ids;         ///< Multi-axis or --ids: [axes, seq] ids shared by the batch (or empty).
    int64_t axes = 1;                 ///< Rows of ids per token.
    std::vector<float> cos_sin;       ///< --table: [table_rows, rotary_dim] (empty otherwise).
    int64_t table_rows = 0;

    /// @brief Elements of q and k together.
    int64_t elements() const { return batch * seq * (q_heads + k_heads) * head_dim; }
    /// @brief The view of a tensor of @p heads heads whose first element is at @p data.
    rope::TensorView view(void* data, int64_t heads, rope::DType dtype, rope::Device device) const;
    /// @brief The positions, reading cu_seqlens and ids at the given addresses (on @p device).
    rope::Positions positions(const int64_t* device_cu_seqlens, const int64_t* device_ids, rope::Device device) const;
    /// @brief The table's description, its rows at @p device_table (on @p device); empty without --table.
    rope::CosSinCache cos_sin_cache(const float* device_table, rope::Device device) const;
};

/// @brief The form the options ask for, applied to @p shape with @p kv_heads k heads.
/// @throws UsageError if the options do not fit the shape (e.g. packed lengths that do not total its
/// tokens). What the library itself rejects is left to rope::make_plan.
Form make_form(const Options& options, const Shape& shape, int64_t kv_heads);

/// @brief The lengths of --packed's sequences: the list, or drawn uniformly from [min_length, max_length]
/// with a fixed seed until they total @p total (the last cut to fit), each a multiple of @p granularity
/// (2 under context parallelism: every local sequence splits into two equal chunks).
std::vector<int64_t> packed_lengths(const PackedLengths& packed, int64_t total, int64_t granularity);

/// @brief SplitMix64: the next 64 random bits from @p state (which it advances). Deterministic, so every run
/// of a command measures the same inputs and packed lengths; fast enough to fill gigabytes of them.
inline uint64_t split_mix(uint64_t& state) {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

}  // namespace rope_bench
