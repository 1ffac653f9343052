#pragma once
/// @file qk_norm_baseline.hpp
/// @brief The unfused pair's first kernel, for rope-bench --op qknorm: a plain RMSNorm of each head row of q
/// or of k, in place, as a user runs Qwen3's q_norm and k_norm before RoPE (two launches, then rope's RoPE
/// call).
///
/// A baseline, not a product: it exists so that the fused call (rope::apply_qk_norm) is measured against the
/// steps it replaces. It is not a strawman either: one warp per head row, 16-byte loads and stores, a
/// shuffle reduction, `weight * round(x * rsqrt(mean(x^2) + eps))` as vLLM's rms_norm kernel computes it.
/// Its sum of squares is not added in PyTorch's order, so its results are not the fused call's bit for bit.

#include <cstdint>

#include "rope/dtype.hpp"

namespace rope_bench {

/// @brief One RMSNorm launch: `rows` contiguous rows of `head_dim` elements, normalised in place.
struct NormRows {
    void* data = nullptr;            ///< Row 0 (on the device).
    const void* weight = nullptr;    ///< [head_dim] in the same dtype (on the device).
    int64_t rows = 0, head_dim = 0;
    rope::DType dtype = rope::DType::bf16;
    float eps = 1e-6f;
};

/// @brief Enqueues @p call on @p stream (a cudaStream_t). Throws rope::Error where head_dim does not split
/// into 16-byte runs or a pointer is not 16-byte aligned.
void rms_norm_async(const NormRows& call, void* stream);

}  // namespace rope_bench
