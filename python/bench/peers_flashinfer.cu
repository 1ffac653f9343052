// python/bench/peers.py's way into FlashInfer's RoPE kernels where the flashinfer package is not installed: its
// kernels are header-only (include/flashinfer/pos_enc.cuh), so peers.py compiles this file against a checkout's
// headers (scripts/stage-peers) and calls it through ctypes. Each entry makes the one call FlashInfer's own
// Python functions make (apply_rope_pos_ids_inplace, apply_rope_with_cos_sin_cache_inplace), in place, bf16,
// on [tokens, heads, head_dim] views given by their strides; it returns the cudaError_t (-1: a C++ exception).
#include <cuda_bf16.h>

#include <cstdint>

#include "flashinfer/pos_enc.cuh"

using bf16 = __nv_bfloat16;

extern "C" int peers_rope_pos_ids(bf16* q, bf16* k, int32_t* positions, uint32_t tokens, uint32_t q_heads,
                                  uint32_t k_heads, uint32_t head_dim, size_t q_token, size_t q_head, size_t k_token,
                                  size_t k_head, float theta, cudaStream_t stream) {
    try {
        return int(flashinfer::BatchQKApplyRotaryPosIds<bf16, int32_t>(
            q, k, q, k, positions, tokens, q_heads, k_heads, head_dim, head_dim, q_token, q_head, k_token, k_head,
            q_token, q_head, k_token, k_head, /*interleave=*/false, /*rope_scale=*/1.0f, theta, stream));
    } catch (...) {
        return -1;
    }
}

extern "C" int peers_rope_cos_sin_cache(bf16* q, bf16* k, float* cos_sin_cache, int64_t* positions, uint32_t tokens,
                                        uint32_t q_heads, uint32_t k_heads, uint32_t head_dim, size_t q_token,
                                        size_t q_head, size_t k_token, size_t k_head, cudaStream_t stream) {
    try {
        return int(flashinfer::BatchQKApplyRotaryPosIdsCosSinCache<bf16, int64_t>(
            q, k, q, k, cos_sin_cache, positions, tokens, q_heads, k_heads, head_dim, head_dim, q_token, q_head,
            k_token, k_head, q_token, q_head, k_token, k_head, /*interleave=*/false, stream));
    } catch (...) {
        return -1;
    }
}
