#pragma once
/// @file append_baseline.hpp
/// @brief The unfused pair's second kernel, for rope-bench --op append: a plain scatter of the rotated k
/// and of v into their paged caches, the cache write a serving engine issues after a RoPE kernel.
///
/// A baseline, not a product: it exists so that the fused call (rope::append_kv) is measured against the
/// two kernels it replaces. It is not a strawman either: 16-byte loads and stores (FP8: one store of a run
/// of codes), one block per token, its threads over the token's heads and features, as vLLM's
/// reshape_and_cache_flash lays out its work.

#include <cstdint>

#include "rope/dtype.hpp"
#include "rope/kv_append.hpp"

namespace rope_bench {

/// @brief One scatter: token t's k and v rows ([tokens, heads, head_dim], contiguous) to slot slots[t]
/// of two NHD caches of the same strides; a slot < 0 writes nothing.
struct ScatterCall {
    const void* k = nullptr;        ///< Rotated keys (the RoPE call's output).
    const void* v = nullptr;        ///< Values.
    const int64_t* slots = nullptr; ///< [tokens] slots, on the device.
    int64_t tokens = 0, heads = 0, head_dim = 0;
    rope::DType dtype = rope::DType::bf16;                   ///< Of k and v (and of a model-dtype cache).
    rope::CacheDType cache_dtype = rope::CacheDType::model;  ///< What the caches store.
    const float* k_scale = nullptr;  ///< FP8: the k cache's dequantisation scale (one, on the device).
    const float* v_scale = nullptr;  ///< FP8: the v cache's.
    void* k_cache = nullptr;
    void* v_cache = nullptr;
    int64_t page_size = 0, stride_page = 0, stride_slot = 0, stride_head = 0;  ///< In cache elements.
};

/// @brief Enqueues @p call on @p stream (a cudaStream_t). Throws rope::Error where head_dim does not
/// split into 16-byte runs.
void scatter_kv_async(const ScatterCall& call, void* stream);

}  // namespace rope_bench
