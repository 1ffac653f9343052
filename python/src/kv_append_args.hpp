#pragma once
// From arrays as DLPack describes them to one rope::append_kv call (RoPE fused with
// the paged KV-cache append): shared, as call_args.hpp is for rope::apply, by the
// nanobind module (rope.append_kv) and the PyTorch operator (torch.ops.rope.append_kv_).
//
// q, k, q_out, k_out, the positions and the cos/sin table go through prepare_call
// (call_args.hpp), so they are checked and named exactly as rope.apply's; what is
// added here is v, the slot mapping, and the caches: each cache is an array
// indexed (page, slot in page, head, feature) with any strides (NHD, a permuted
// HND tensor, one half of a packed [K|V] buffer), or (page, slot, feature) for a
// single-head cache (the two halves of an MLA buffer); and the optional FP8 output of the rotated
// queries (rope::Fp8Output): q_out given as uint8 codes with its format named, q then only read.
#include <cstdint>
#include <string_view>

#include <rope/kv_append.hpp>

#include "call_args.hpp"

namespace rope_python {

/// The arrays of one append call; null stands for None.
struct KvAppendArrays {
    /// q, k (required), q_out/k_out, ids, cos_sin_cache. q_out is the FP8 output of q when it is uint8
    /// or KvAppendOptions::q_out_dtype is set (q is then only read; k_out null: k in place).
    CallArrays rope;
    const Array* v = nullptr;
    const Array* slot_mapping = nullptr;
    const Array* k_cache = nullptr;
    const Array* v_cache = nullptr;
    const Array* k_scale = nullptr;  ///< FP8 k cache: float32 [1] or [heads] dequantisation scales.
    const Array* v_scale = nullptr;
    const Array* q_scale = nullptr;  ///< FP8 q_out: float32 [1] or [heads] dequantisation scales.
};

/// The scalar arguments of an append call.
struct KvAppendOptions {
    CallOptions rope;  ///< Backend, offset, max_position, bfloat16 bits 0-3 (layout is always thd).
    std::string_view kv_layout = "nhd";  ///< "nhd": 4-D caches are (page, slot, head, dim); "hnd": (page, head, slot, dim).
    int64_t page_size = 0;               ///< 0: from the caches' shape; else must equal it.
    std::string_view k_cache_dtype;      ///< "" (the array's dtype), "e4m3fn" or "e5m2" (uint8 arrays).
    std::string_view v_cache_dtype;
    int bfloat16_bits = 0;  ///< Bit 0 v, 1 k_cache, 2 v_cache hold bfloat16 as uint16.
    std::string_view q_out_dtype;  ///< "" (q_out in q's dtype, or an unnamed uint8: refused), "e4m3fn" or "e5m2".
};

/// What rope::append_kv needs, checked (stream unset), and the CUDA device of the call (-1 if none).
struct KvAppendCall {
    rope::Backend* backend = nullptr;
    rope::KvAppendArgs args;
    int cuda_device = -1;
};

/// rope::CacheDType of a name: "" or "model" (the model's dtype), "e4m3fn", "e5m2"; else rope::Error naming @p name.
rope::CacheDType cache_dtype_named(std::string_view name, std::string_view value);

/// A cache array as rope::PagedCache: 4-D (page, slot, head, dim) in options.kv_layout's axis order,
/// or 3-D (page, slot, dim) for a single head; its dtype @p model, or uint8 holding FP8 codes
/// (@p dtype_name "e4m3fn" or "e5m2"). Throws rope::Error naming @p name and the bad field.
rope::PagedCache paged_cache(const char* name, const Array& array, const KvAppendOptions& options,
                             std::string_view dtype_name, bool bfloat16_bits, rope::DType model);

/// An FP8 q output array [tokens, heads, head_dim] of uint8 codes (the last axis contiguous, any
/// strides >= 0) as rope::Fp8Output, its format @p dtype_name ("e4m3fn" or "e5m2"; scales unset).
/// Throws rope::Error naming @p name (its dtype, ndim, strides) or "q_out_dtype".
rope::Fp8Output fp8_output(const char* name, const Array& array, std::string_view dtype_name);

/// Checks the arrays of one append call and assembles it; throws rope::Error naming the first
/// bad argument (rope::append_kv checks the rest: slots, overlaps, scales' values).
KvAppendCall prepare_kv_append(const rope::RopeConfig& config, const KvAppendArrays& arrays,
                               const KvAppendOptions& options);

}  // namespace rope_python
