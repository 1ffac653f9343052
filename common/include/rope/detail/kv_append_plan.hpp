#pragma once
/// @file detail/kv_append_plan.hpp
/// @brief For backend authors: a validated RoPE + KV append call (rope::append_kv).
///
/// The rotation of q and k is an ordinary Plan, built and checked by
/// make_plan; this adds the v operand, the slot mapping and the two cache
/// targets, in a form device code can read (pointers and 64-bit integers).

#include <cstdint>
#include <string_view>

#include "rope/detail/plan.hpp"
#include "rope/dtype.hpp"
#include "rope/fp8.hpp"
#include "rope/host_device.hpp"
#include "rope/kv_append.hpp"
#include "rope/tensor.hpp"

namespace rope {

/// @brief One cache as the kernels write it (PagedCache, validated).
struct CacheTarget {
    void* data = nullptr;                  ///< Element (0, 0, 0, 0).
    CacheDType dtype = CacheDType::model;  ///< model: the written tensor's DType; else FP8 bytes.
    int64_t heads = 0;        ///< Heads per slot (the written tensor's).
    int64_t head_dim = 0;     ///< Features per head (the written tensor's).
    int64_t stride_page = 0;  ///< Elements between pages.
    int64_t stride_slot = 0;  ///< Elements between slots of a page.
    int64_t stride_head = 0;  ///< Elements between heads.
    const float* scale = nullptr;  ///< FP8: dequantisation scales; null for a model-dtype cache.
    int64_t scale_stride = 0;      ///< FP8: 0 (one scale) or 1 (one per head).

    /// @brief Element offset of feature 0 of (slot, head).
    /// @param slot the slot, in [0, pages * page_size).
    /// @param page_size slots per page.
    /// @param head the head.
    /// @return page * stride_page + (slot % page_size) * stride_slot + head * stride_head, in 64 bits.
    ROPE_HOST_DEVICE int64_t row_offset(int64_t slot, int64_t page_size, int64_t head) const {
        return (slot / page_size) * stride_page + (slot % page_size) * stride_slot + head * stride_head;
    }
    /// @brief The dequantisation scale of head @p head (FP8 caches only).
    /// @param head the head.
    /// @return scale[head * scale_stride].
    ROPE_HOST_DEVICE float scale_of(int64_t head) const { return scale[head * scale_stride]; }
};

/// @brief A RoPE + KV append call after validation.
///
/// Token t (the seq index of rope.q and rope.k; batch is 1) is rotated by
/// rope's pair steps as a Plan is; when t < slot_count and slots[t] is in
/// [0, slot_limit), its rotated k row goes to k_cache and its v row to v_cache
/// at that slot. A slot outside [0, slot_limit) writes nothing: padding (< 0)
/// or a device slot past the cache that validation could not see.
struct KvAppendPlan {
    Plan rope;                    ///< The rotation of q into q_out and k into k_out (batch 1, seq = tokens).
    const void* v = nullptr;      ///< Values, rope.dtype.
    Geometry v_geometry;          ///< Sizes and strides of v (batch 1, seq = tokens, heads = k's).
    const int64_t* slots = nullptr;  ///< Slot of each of the first slot_count tokens.
    int64_t slot_count = 0;       ///< Tokens with a slot entry, <= tokens.
    int64_t page_size = 0;        ///< Slots per page.
    int64_t slot_limit = 0;       ///< pages * page_size: slots at or past it are never written.
    CacheTarget k_cache;          ///< Receives the rotated k rows.
    CacheTarget v_cache;          ///< Receives the v rows.
    /// The FP8 output of rotated q (KvAppendArgs::q_out_fp8), heads and head_dim of q; data null
    /// when q goes to rope.q.out. Token t's head h row starts at q_fp8.row_offset(t, 1, h)
    /// (stride_page is the token stride). When set, rope.q.out is q itself and is not written.
    CacheTarget q_fp8;

    /// @brief Tokens in the call.
    /// @return rope.seq.
    int64_t tokens() const { return rope.seq; }
    /// @brief Whether rotated q goes to q_fp8, quantised, instead of rope.q.out.
    /// @return true when q_fp8 has data.
    ROPE_HOST_DEVICE bool quantises_q() const { return q_fp8.data != nullptr; }
    /// @brief Whether there is nothing to do.
    /// @return true when the call has no token.
    bool empty() const { return rope.seq == 0 || rope.batch == 0; }
    /// @brief The slot token @p t is written to, or -1 when it writes nothing.
    /// @param t token index.
    /// @return slots[t] when t < slot_count and 0 <= slots[t] < slot_limit, else -1.
    ROPE_HOST_DEVICE int64_t slot_of(int64_t t) const {
        if (t >= slot_count) return -1;
        const int64_t slot = slots[t];
        return slot >= 0 && slot < slot_limit ? slot : -1;
    }
};

/// @brief Writes feature @p offset of a cache row: the one store every backend shares.
///
/// A model-dtype cache receives @p stored, exactly what the backend writes to
/// k_out (or the v element itself); an FP8 cache receives quantize_fp8 of
/// @p value, the float32 value before any rounding to the model dtype.
/// @tparam Storage the model dtype's element type.
/// @param cache the cache.
/// @param offset element offset (CacheTarget::row_offset + feature).
/// @param head the row's head (selects a per-head scale).
/// @param stored the value in the model dtype.
/// @param value the float32 value @p stored was rounded from.
template <typename Storage>
ROPE_HOST_DEVICE inline void store_cache_element(const CacheTarget& cache, int64_t offset, int64_t head,
                                                 Storage stored, float value) {
    if (cache.dtype == CacheDType::model) {
        static_cast<Storage*>(cache.data)[offset] = stored;
        return;
    }
    static_cast<uint8_t*>(cache.data)[offset] = quantize_fp8(
        value, cache.scale_of(head), cache.dtype == CacheDType::e4m3fn ? Fp8Format::e4m3fn : Fp8Format::e5m2);
}

/// @brief Validates @p args against @p config for a backend on @p device and builds the plan.
///
/// The rotation is checked by make_plan (its messages name q, k, q_out,
/// k_out, positions and cos_sin_cache); then v, the slot mapping and the
/// caches, each failure naming the parameter and its value.
/// @param config the model's RoPE.
/// @param args the call.
/// @param device where the backend runs.
/// @return the plan (an empty call gets no angles).
/// @throws rope::Error naming the first offending parameter and its value.
KvAppendPlan make_kv_append_plan(const RopeConfig& config, const KvAppendArgs& args, Device device);

namespace detail {
/// @brief make_kv_append_plan's checks of one cache (rope::rerotate_cache's too): device, dtype,
/// sizes against the tensor it holds, strides, 64-bit offsets, rows apart, scales.
/// @param name the cache's name in messages ("k_cache").
/// @param cache the cache.
/// @param tensor the sizes its rows must have (heads, head_dim).
/// @param tensor_name what @p tensor is called in messages ("k").
/// @param model the model dtype (a model-dtype cache's element type).
/// @param device where the backend runs.
/// @throws rope::Error naming the first offending field and its value.
void check_cache(std::string_view name, const PagedCache& cache, const Geometry& tensor, std::string_view tensor_name,
                 DType model, Device device);
/// @brief Host slots: each below @p slot_limit (or < 0), no slot twice; device slots are not read.
/// @param slots the slot mapping (count and pointer already checked).
/// @param slot_limit pages * page_size.
/// @throws rope::Error naming slot_mapping.slots[t] and its value.
void check_host_slots(const SlotMapping& slots, int64_t slot_limit);
/// @brief Whether @p cache's memory overlaps the @p bytes bytes at @p data.
/// @param cache a checked cache. @param model the model dtype.
/// @param data first byte (null: nothing). @param bytes the size.
/// @return true when they share a byte.
bool cache_overlaps(const PagedCache& cache, DType model, const void* data, int64_t bytes);
/// @brief cpu-naive's re-rotation of cache rows (rope::rerotate_cache), entries [@p first, @p last)
/// of @p plan (cpu/naive_backend.cpp); cpu-eigen runs it over its threads' shares of the entries.
/// @param plan a validated, non-empty plan for Device::host, built by rope::rerotate_cache.
/// @param first the first entry. @param last one past the last entry.
void rerotate_cache_cpu(const KvAppendPlan& plan, int64_t first, int64_t last);
}  // namespace detail

}  // namespace rope
