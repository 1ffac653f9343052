#pragma once
/// @file append_flashinfer.hpp
/// @brief rope-bench --op append beside FlashInfer: its fused RoPE + FP8 quantisation + paged append
/// (RopeQuantizeAppendPagedKVCache, behind flashinfer's rope_quantize_fp8_append_paged_kv_cache) and its
/// plain cache append (AppendPagedKVCache, behind append_paged_kv_cache), launched from FlashInfer's
/// header-only kernels. Built only when CMake's ROPE_BENCH_FLASHINFER_INCLUDE names a folder holding
/// flashinfer/pos_enc.cuh and flashinfer/page.cuh (the headers are never part of rope).
///
/// FlashInfer names a token's cache row by (batch index, position in its sequence) through a page table
/// (indptr, indices), where rope takes a slot; rope-bench hands both the same rows. FlashInfer's fused
/// kernel writes q_out (in the cache's type) and the caches, not the rotated k back to a live tensor, and
/// its scale multiplies (quant_scale = 1 / rope's dequantisation scale).

#include <cstdint>

#include "rope/dtype.hpp"
#include "rope/kv_append.hpp"

namespace rope_bench {

/// @brief One FlashInfer call on one set, all pointers on the device; int32 indices, as FlashInfer takes them.
struct FlashInferAppend {
    const void* q = nullptr;       ///< [tokens, q_heads, head_dim], dtype.
    const void* k = nullptr;       ///< [tokens, kv_heads, head_dim].
    const void* v = nullptr;       ///< [tokens, kv_heads, head_dim].
    void* q_out = nullptr;         ///< [tokens, q_heads, head_dim] in the cache's type.
    void* k_cache = nullptr;       ///< NHD [pages, page_size, kv_heads, head_dim].
    void* v_cache = nullptr;
    const int32_t* indptr = nullptr;          ///< [sequences + 1] first page-table entry of each sequence.
    const int32_t* indices = nullptr;         ///< Page table: the pages of each sequence, in order.
    const int32_t* last_page_len = nullptr;   ///< [sequences].
    const int32_t* batch_indices = nullptr;   ///< [tokens] sequence of each token.
    const int32_t* positions = nullptr;       ///< [tokens] position of each token in its sequence (and its angle).
    const float* cos_sin_cache = nullptr;     ///< [max position + 1, head_dim]: cos of each pair, then sin.
    uint32_t tokens = 0, q_heads = 0, kv_heads = 0, head_dim = 0, page_size = 0, sequences = 0;
    rope::DType dtype = rope::DType::bf16;                   ///< bf16 or fp16.
    rope::CacheDType cache_dtype = rope::CacheDType::model;  ///< The caches' (and q_out's) type.
    bool interleave = false;                                 ///< GPT-J pairs.
    float quant_scale = 1.0f;                                ///< FlashInfer's: 1 / the dequantisation scale.
};

/// @brief Enqueues FlashInfer's fused RoPE + quantise + append on @p stream; throws rope::Error with the
/// CUDA error, or where FlashInfer has no kernel for the types (fp32).
void flashinfer_rope_append_async(const FlashInferAppend& call, void* stream);

/// @brief Enqueues FlashInfer's plain append of k (unrotated) and v, model-dtype caches only.
void flashinfer_append_async(const FlashInferAppend& call, void* stream);

}  // namespace rope_bench
