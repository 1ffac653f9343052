#pragma once
/// @file kv_append.hpp
/// @brief RoPE fused with the KV-cache append: the decode step of a serving engine.
///
/// One call rotates q and k, writes the rotated k back to k_out (the live key
/// attention reads next) and into a paged cache, and copies v, unrotated, into
/// a second paged cache. The cache row of token t is named by a slot mapping,
/// separate from its position (the angle): after eviction or compaction the two
/// differ. A cache may hold the model's dtype or FP8 (e4m3fn, e5m2), quantised
/// from the float32 rotated value with a dequantisation scale.

#include <cstdint>

#include "rope/args.hpp"
#include "rope/config.hpp"
#include "rope/dtype.hpp"
#include "rope/positions.hpp"
#include "rope/tensor.hpp"

namespace rope {

class Backend;  // rope/backend.hpp

/// @brief What a paged cache stores.
enum class CacheDType {
    model,   ///< The dtype of the tensor written into it (k for the k cache, v for the v cache).
    e4m3fn,  ///< FP8 e4m3fn (max 448, no infinity), saturating, with a scale.
    e5m2,    ///< FP8 e5m2 (max 57344), saturating, with a scale.
};

/// @brief Name of a cache dtype, for messages and command lines.
/// @param dtype the cache dtype to name.
/// @return "model", "e4m3fn" or "e5m2".
constexpr const char* cache_dtype_name(CacheDType dtype) {
    return dtype == CacheDType::model ? "model" : dtype == CacheDType::e4m3fn ? "e4m3fn" : "e5m2";
}

/// @brief A paged KV cache, described by strides over (page, slot in page, head, feature).
///
/// Element (page p, slot s, head h, feature d) lies at
/// `data + p * stride_page + s * stride_slot + h * stride_head + d`, counted in
/// elements of the cache's dtype (2 bytes for a bf16/fp16 model cache, 4 for
/// fp32, 1 for FP8); the feature axis is contiguous. Token t of a call goes to
/// slot `slot_mapping[t] = page * page_size + s`. Strides describe NHD
/// `[pages, page_size, heads, head_dim]` and HND `[pages, heads, page_size,
/// head_dim]` (the factories below), vLLM's layouts (e.g. one `[2, pages,
/// page_size, heads, head_dim]` tensor: two PagedCache values, one per half), a
/// packed [K|V] buffer (`[pages, page_size, heads, 2, head_dim]`: stride_head
/// 2 * head_dim, v's data head_dim elements after k's) and the MLA cache
/// (mla_cache()). All offsets are 64-bit.
///
/// FP8 caches store `fp8 = round_to_nearest_even(saturate(value / scale))` of
/// the float32 value: scales follow the dequantisation convention, value ~=
/// fp8 * scale, as vLLM, FlashMLA and HF store them (FlashInfer's
/// `quant_scale` is 1 / scale). One scale for the whole cache (scale_count 1)
/// or one per head (scale_count = heads), on the backend's device.
struct PagedCache {
    void* data = nullptr;                 ///< Element (0, 0, 0, 0).
    CacheDType dtype = CacheDType::model; ///< What the cache stores.
    Device device = Device::host;         ///< Where data (and scale) live; must match the backend.
    int64_t pages = 0;        ///< Pages in the cache.
    int64_t page_size = 0;    ///< Slots per page (tokens a page holds).
    int64_t heads = 0;        ///< Heads per slot; must equal the written tensor's heads.
    int64_t head_dim = 0;     ///< Features per head; must equal the written tensor's head_dim.
    int64_t stride_page = 0;  ///< Elements between pages.
    int64_t stride_slot = 0;  ///< Elements between slots of a page.
    int64_t stride_head = 0;  ///< Elements between heads of a slot.
    /// FP8 caches only: dequantisation scales (value ~= fp8 * scale), float32,
    /// finite and > 0; null for a model-dtype cache. Scales in host memory are
    /// checked; in GPU memory no validation reads them, and a scale that is not
    /// finite and > 0 writes NaN codes (rope::quantize_fp8).
    const float* scale = nullptr;
    int64_t scale_count = 0;  ///< FP8: 1 (per tensor) or heads (per head); 0 for a model-dtype cache.

    /// @brief A dense NHD cache, `[pages, page_size, heads, head_dim]` (vLLM's flash layout, FlashInfer's NHD).
    /// @param data first element.
    /// @param device where @p data lives.
    /// @param pages pages in the cache.
    /// @param page_size slots per page.
    /// @param heads heads per slot.
    /// @param head_dim features per head.
    /// @param dtype what the cache stores (FP8 caches then need with_scale()).
    /// @return the cache description.
    static PagedCache nhd(void* data, Device device, int64_t pages, int64_t page_size, int64_t heads,
                          int64_t head_dim, CacheDType dtype = CacheDType::model) {
        return PagedCache{data, dtype, device, pages, page_size, heads, head_dim,
                          page_size * heads * head_dim, heads * head_dim, head_dim, nullptr, 0};
    }
    /// @brief A dense HND cache, `[pages, heads, page_size, head_dim]` (FlashInfer's HND).
    /// @param data first element.
    /// @param device where @p data lives.
    /// @param pages pages in the cache.
    /// @param page_size slots per page.
    /// @param heads heads per slot.
    /// @param head_dim features per head.
    /// @param dtype what the cache stores (FP8 caches then need with_scale()).
    /// @return the cache description.
    static PagedCache hnd(void* data, Device device, int64_t pages, int64_t page_size, int64_t heads,
                          int64_t head_dim, CacheDType dtype = CacheDType::model) {
        return PagedCache{data, dtype, device, pages, page_size, heads, head_dim,
                          heads * page_size * head_dim, head_dim, page_size * head_dim, nullptr, 0};
    }
    /// @brief This cache with FP8 dequantisation scales.
    /// @param scales float32 scales on the cache's device (value ~= fp8 * scale).
    /// @param count 1 (one for the whole cache) or heads (one per head).
    /// @return a copy with scale and scale_count set.
    PagedCache with_scale(const float* scales, int64_t count) const {
        PagedCache cache = *this;
        cache.scale = scales;
        cache.scale_count = count;
        return cache;
    }
};

/// @brief The two halves of an MLA cache (DeepSeek-V2/V3), as mla_cache() describes them.
struct MlaCache {
    PagedCache k_cache;  ///< The rope part: [pages, page_size, 1, rope_dim], at feature latent_dim of each row.
    PagedCache v_cache;  ///< The latent part: [pages, page_size, 1, latent_dim], at feature 0 of each row.
};

/// @brief One `[pages, page_size, latent_dim + rope_dim]` MLA cache, latent first, as vLLM and
/// FlashMLA store it, described as the k cache (the rotated k_pe) and the v cache (kv_c).
///
/// Pass k = k_pe `[T, 1, rope_dim]` and v = kv_c `[T, 1, latent_dim]` (single
/// head), with q = q_pe (the rope part of the queries) and a RopeConfig of
/// head_dim rope_dim: the call rotates q_pe and k_pe and writes each token's
/// `[kv_c | rotated k_pe]` row at its slot.
/// @param data the cache's first element.
/// @param model_dtype the dtype of k_pe and kv_c (gives the element size of a model-dtype cache).
/// @param device where @p data lives.
/// @param pages pages in the cache.
/// @param page_size slots per page.
/// @param latent_dim features of kv_c (vLLM's kv_lora_rank, 512 for DeepSeek-V3).
/// @param rope_dim features of k_pe (qk_rope_head_dim, 64 for DeepSeek-V3).
/// @param dtype what the cache stores (FP8 halves then need with_scale()).
/// @return both halves, sharing the row stride latent_dim + rope_dim.
inline MlaCache mla_cache(void* data, DType model_dtype, Device device, int64_t pages, int64_t page_size,
                          int64_t latent_dim, int64_t rope_dim, CacheDType dtype = CacheDType::model) {
    const int64_t row = latent_dim + rope_dim;
    const int64_t element = dtype == CacheDType::model ? dtype_size(model_dtype) : 1;
    PagedCache latent{data, dtype, device, pages, page_size, 1, latent_dim, page_size * row, row, row, nullptr, 0};
    PagedCache rope = latent;
    rope.data = data == nullptr ? nullptr : static_cast<char*>(data) + latent_dim * element;
    rope.head_dim = rope_dim;
    return MlaCache{rope, latent};
}

/// @brief An FP8 tensor `[tokens, heads, head_dim]` described by strides, with its
/// dequantisation scales: append_kv's optional FP8 output of the rotated queries.
///
/// An engine whose attention reads q in FP8 (FlashInfer's FP8 prefill and
/// decode kernels, vLLM's FP8 attention backends) would otherwise round the
/// rotated q to the model's dtype, write it, read it back and quantise it in a
/// second kernel. With this output the call writes each rotated q element once,
/// as `round_to_nearest_even(saturate(value / scale))` of its float32 value,
/// the caches' conversion (rope::quantize_fp8). Element (token t, head h,
/// feature d) lies at `data + t * stride_token + h * stride_head + d` (bytes:
/// an FP8 element is one byte); the feature axis is contiguous.
struct Fp8Output {
    void* data = nullptr;                   ///< Element (0, 0, 0); null: no FP8 output.
    CacheDType dtype = CacheDType::e4m3fn;  ///< e4m3fn or e5m2 (CacheDType::model is refused).
    Device device = Device::host;           ///< Where data (and scale) live; must match the backend.
    int64_t tokens = 0;        ///< Tokens; must equal q's.
    int64_t heads = 0;         ///< Heads per token; must equal q's.
    int64_t head_dim = 0;      ///< Features per head; must equal q's.
    int64_t stride_token = 0;  ///< Elements (bytes) between tokens.
    int64_t stride_head = 0;   ///< Elements (bytes) between heads of a token.
    /// Dequantisation scales (value ~= fp8 * scale), float32, finite and > 0,
    /// on the backend's device; checked where they are in host memory, as a
    /// PagedCache's.
    const float* scale = nullptr;
    int64_t scale_count = 0;  ///< 1 (per tensor) or heads (per head).

    /// @brief A dense `[tokens, heads, head_dim]` FP8 tensor.
    /// @param data first element.
    /// @param device where @p data lives.
    /// @param tokens tokens.
    /// @param heads heads per token.
    /// @param head_dim features per head.
    /// @param dtype CacheDType::e4m3fn or CacheDType::e5m2.
    /// @return the description (it then needs with_scale()).
    static Fp8Output dense(void* data, Device device, int64_t tokens, int64_t heads, int64_t head_dim,
                           CacheDType dtype = CacheDType::e4m3fn) {
        return Fp8Output{data, dtype, device, tokens, heads, head_dim, heads * head_dim, head_dim, nullptr, 0};
    }
    /// @brief This output with its dequantisation scales.
    /// @param scales float32 scales on the output's device (value ~= fp8 * scale).
    /// @param count 1 (one for the whole tensor) or heads (one per head).
    /// @return a copy with scale and scale_count set.
    Fp8Output with_scale(const float* scales, int64_t count) const {
        Fp8Output output = *this;
        output.scale = scales;
        output.scale_count = count;
        return output;
    }
};

/// @brief Which cache slot each token of the call is written to.
///
/// `slots[t]` = page * page_size + slot in page, for t < count. Token t is
/// padding (rotated into q_out and k_out, written to neither cache) when
/// `slots[t] < 0` or `t >= count`. Host slots are checked (each below
/// pages * page_size, no slot twice); device slots cannot be read without a
/// copy, and the kernels skip (write nothing for) a slot past the cache, so a
/// bad device slot never writes out of bounds. Where two tokens share a device
/// slot, each element of its rows holds one of their values, which one unspecified.
struct SlotMapping {
    const int64_t* slots = nullptr;  ///< [count] int64 slots; may be null only when count is 0.
    int64_t count = 0;               ///< Tokens with a slot entry, <= the call's tokens.
    Device device = Device::host;    ///< Where slots lives; must match the backend.
};

/// @brief The arguments of one RoPE + KV append call.
///
/// q, k and v are `[T, heads, head_dim]` views (Layout::thd, or any view with
/// batch 1), any strides with the feature axis contiguous, of one dtype. k may
/// have fewer heads than q (GQA); v has k's heads and its own head_dim (MLA:
/// the latent). q_out and k_out may be q and k themselves (in place) or
/// separate tensors; q may have no heads (rotate and append k alone). With
/// q_out_fp8 the rotated q goes there alone, quantised, and q is left as it
/// was (q_out must then be q: nothing is written to it).
struct KvAppendArgs {
    TensorView q;       ///< Queries to rotate.
    TensorView k;       ///< Keys to rotate and append.
    TensorView v;       ///< Values to append, unrotated; k's heads.
    TensorView q_out;   ///< Where rotated q goes (may equal q).
    TensorView k_out;   ///< Where rotated k goes (may equal k): the live key attention reads next.
    Positions positions{};  ///< Each token's position: the angle only, never the slot.
    SlotMapping slot_mapping{};  ///< Each token's cache slot (padding: < 0, or past count).
    PagedCache k_cache;  ///< Receives rotated k; heads and head_dim of k.
    PagedCache v_cache;  ///< Receives v; heads and head_dim of v.
    CosSinCache cos_sin_cache{};  ///< A caller's cos/sin table (data null: computed from the config).
    void* stream = nullptr;       ///< CUDA backends: the cudaStream_t to issue work on (null: default stream).
    Fp8Output q_out_fp8{};        ///< Where rotated q goes in FP8 instead of q_out (data null: q_out).

    /// @brief An in-place call: q and k are overwritten with their rotation.
    /// @param q queries, input and output.
    /// @param k keys, input and output.
    /// @param v values.
    /// @param positions each token's position.
    /// @param slot_mapping each token's cache slot.
    /// @param k_cache the key cache.
    /// @param v_cache the value cache.
    /// @return the arguments, with q_out = q, k_out = k, no table, the default stream and no FP8 q.
    static KvAppendArgs in_place(TensorView q, TensorView k, TensorView v, Positions positions,
                                 SlotMapping slot_mapping, PagedCache k_cache, PagedCache v_cache) {
        return KvAppendArgs{q, k, v, q, k, positions, slot_mapping, k_cache, v_cache, {}, nullptr, {}};
    }
};

/// @brief Rotates q and k, writes the rotated k to k_out and into k_cache, and v into v_cache,
/// at each token's slot; the fused decode step of a serving engine.
///
/// For each token t: q_out[t] = RoPE(q[t]) (or, with q_out_fp8, its FP8 codes
/// quantised from float32) and k_out[t] = RoPE(k[t]) at the
/// token's positions (every angle form rope has: scalings, precise angles, a
/// cos/sin table, partial rotary, both pairings, several axes). When t <
/// slot_mapping.count and slot = slot_mapping.slots[t] >= 0, the rotated k row
/// (from float32, before any rounding to the model dtype) and the v row go to
/// row (slot / page_size, slot % page_size) of their cache, quantised for an
/// FP8 cache. Nothing else in the caches is written. An empty call is a
/// valid no-op; on error nothing is written.
/// @param backend the backend that runs the call; its device() is where every array lives.
/// @param config the model's RoPE (for MLA: head_dim = rope_dim).
/// @param args the tensors, positions, slots, caches, table and stream.
/// @throws rope::Error naming the offending parameter and its value.
void append_kv(Backend& backend, const RopeConfig& config, const KvAppendArgs& args);

}  // namespace rope
