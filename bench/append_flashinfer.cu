// rope-bench --op append's launcher of FlashInfer's append kernels (append_flashinfer.hpp): the calls
// flashinfer's Python functions make, on rope-bench's buffers.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <string>

#include "append_flashinfer.hpp"
#include "flashinfer/page.cuh"
#include "flashinfer/pos_enc.cuh"
#include "rope/error.hpp"

namespace rope_bench {
namespace {

void check(cudaError_t status, const char* what) {
    if (status != cudaSuccess) rope::fail(what, cudaGetErrorString(status), "FlashInfer's launch failed");
}

template <typename Body>
void with_types(const FlashInferAppend& call, Body&& body) {
    auto with_cache = [&](auto model) {
        using Model = decltype(model);
        switch (call.cache_dtype) {
            case rope::CacheDType::model: return body(Model{}, Model{});
            case rope::CacheDType::e4m3fn: return body(Model{}, __nv_fp8_e4m3{});
            case rope::CacheDType::e5m2: return body(Model{}, __nv_fp8_e5m2{});
        }
    };
    if (call.dtype == rope::DType::bf16) return with_cache(__nv_bfloat16{});
    if (call.dtype == rope::DType::f16) return with_cache(__half{});
    rope::fail("dtype", rope::dtype_name(call.dtype), "FlashInfer's append kernels take bf16 or fp16");
}

template <typename Cache>
flashinfer::paged_kv_t<Cache, int32_t> paged(const FlashInferAppend& call) {
    return flashinfer::paged_kv_t<Cache, int32_t>(
        call.kv_heads, call.page_size, call.head_dim, call.sequences, flashinfer::QKVLayout::kNHD,
        static_cast<Cache*>(call.k_cache), static_cast<Cache*>(call.v_cache), const_cast<int32_t*>(call.indices),
        const_cast<int32_t*>(call.indptr), const_cast<int32_t*>(call.last_page_len));
}

}  // namespace

void flashinfer_rope_append_async(const FlashInferAppend& call, void* stream) {
    with_types(call, [&](auto model, auto cache) {
        using Model = decltype(model);
        using Cache = decltype(cache);
        const size_t q_token = size_t(call.q_heads) * call.head_dim, kv_token = size_t(call.kv_heads) * call.head_dim;
        auto* q = const_cast<Model*>(static_cast<const Model*>(call.q));
        auto* k = const_cast<Model*>(static_cast<const Model*>(call.k));
        auto* v = const_cast<Model*>(static_cast<const Model*>(call.v));
        check(flashinfer::RopeQuantizeAppendPagedKVCache<Model, int32_t, int32_t, Cache>(
                  q, k, /*q_nope_in=*/nullptr, /*k_nope_in=*/nullptr, v, static_cast<Cache*>(call.q_out),
                  /*q_nope_out=*/nullptr, paged<Cache>(call), const_cast<int32_t*>(call.batch_indices),
                  const_cast<int32_t*>(call.positions), const_cast<float*>(call.cos_sin_cache),
                  const_cast<int32_t*>(call.positions), call.tokens, call.q_heads, call.kv_heads, call.head_dim,
                  /*no_rope_dim=*/0, q_token, call.head_dim, 0, 0, q_token, call.head_dim, 0, 0, kv_token,
                  call.head_dim, 0, 0, kv_token, call.head_dim, call.quant_scale, call.quant_scale, call.interleave,
                  /*enable_pdl=*/true, static_cast<cudaStream_t>(stream)),
              "RopeQuantizeAppendPagedKVCache");
    });
}

void flashinfer_append_async(const FlashInferAppend& call, void* stream) {
    if (call.cache_dtype != rope::CacheDType::model)
        rope::fail("cache", rope::cache_dtype_name(call.cache_dtype),
                   "FlashInfer's plain append copies k and v as they are");
    with_types(call, [&](auto model, auto) {
        using Model = decltype(model);
        const size_t kv_token = size_t(call.kv_heads) * call.head_dim;
        check(flashinfer::AppendPagedKVCache<Model, int32_t>(
                  paged<Model>(call), const_cast<Model*>(static_cast<const Model*>(call.k)),
                  const_cast<Model*>(static_cast<const Model*>(call.v)), const_cast<int32_t*>(call.batch_indices),
                  const_cast<int32_t*>(call.positions), call.tokens, kv_token, call.head_dim, kv_token, call.head_dim,
                  static_cast<cudaStream_t>(stream)),
              "AppendPagedKVCache");
    });
}

}  // namespace rope_bench
