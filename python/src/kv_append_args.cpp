// DLPack-described arrays to one rope::append_kv call: see kv_append_args.hpp.
#include "kv_append_args.hpp"

#include <string>

namespace rope_python {
namespace {

// Every CUDA array of the call on the device of q (prepare_call checked q, k and the positions).
void check_device(std::string_view name, const Array& array, int& cuda_device) {
    const Placement placement = placement_of(name, array.device_type, array.device_id);
    if (placement.device != rope::Device::cuda) return;
    if (cuda_device < 0) cuda_device = placement.cuda_device;
    if (placement.cuda_device != cuda_device)
        rope::fail(std::string(name) + ".device", "cuda:" + std::to_string(placement.cuda_device),
                   "must be on the CUDA device of q (cuda:" + std::to_string(cuda_device) + ")");
}

// FP8 dequantisation scales: float32, [1] (per tensor) or [heads] (per head), contiguous, on q's device.
void check_scale(const char* name, const Array& array, int& cuda_device) {
    if (!(array.dtype.code == uint8_t(dlpack::Code::Float) && array.dtype.bits == 32 && array.dtype.lanes == 1))
        rope::fail(std::string(name) + ".dtype", "not float32", "scales are float32");
    if (array.ndim > 1) rope::fail(std::string(name) + ".ndim", array.ndim, "must be 0 or 1 ([1] or [heads])");
    if (array.ndim == 1 && array.shape[0] > 1 && array.strides[0] != 1)
        rope::fail(std::string(name) + ".strides[0]", array.strides[0], "must be 1 (contiguous scales)");
    check_device(name, array, cuda_device);
}

void attach_scale(const char* name, const Array* array, rope::PagedCache& cache, int& cuda_device) {
    if (cache.dtype == rope::CacheDType::model) {
        if (array != nullptr)
            rope::fail(name, "set", "is read only for an FP8 cache (cache_dtype \"e4m3fn\" or \"e5m2\")");
        return;
    }
    if (array == nullptr)
        rope::fail(name, "None",
                   "an FP8 cache needs its dequantisation scale (value ~= fp8 * scale): float32, one or one per head");
    check_scale(name, *array, cuda_device);
    cache = cache.with_scale(static_cast<const float*>(array->data), array->size());
}

bool is_uint8(const Array& array) {
    return array.dtype.code == uint8_t(dlpack::Code::UInt) && array.dtype.bits == 8 && array.dtype.lanes == 1;
}

}  // namespace

// A cache array as rope::PagedCache: 4-D (page, slot, head, dim) in kv_layout's axis order,
// or 3-D (page, slot, dim) for a single head; its dtype the model's, or uint8 holding FP8.
rope::PagedCache paged_cache(const char* name, const Array& array, const KvAppendOptions& options,
                             std::string_view dtype_name, bool bfloat16_bits, rope::DType model) {
    const std::string field(name);
    rope::PagedCache cache;
    cache.dtype = cache_dtype_named(field + " cache_dtype", dtype_name);
    const bool uint8 = array.dtype.code == uint8_t(dlpack::Code::UInt) && array.dtype.bits == 8 &&
                       array.dtype.lanes == 1;
    if (cache.dtype == rope::CacheDType::model) {
        if (uint8)
            rope::fail(field + ".dtype", "uint8",
                       "is an FP8 cache only with its format named: cache_dtype=\"e4m3fn\" or \"e5m2\"");
        const rope::DType dtype = storage_type(field, array.dtype, bfloat16_bits);
        if (dtype != model)
            rope::fail(field + ".dtype", rope::dtype_name(dtype),
                       "must be k's dtype " + std::string(rope::dtype_name(model)) + " (or an FP8 cache)");
    } else if (!uint8) {
        rope::fail(field + ".dtype", "not uint8",
                   "an FP8 cache (" + std::string(dtype_name) + ") is held as uint8 or torch.float8 codes");
    }
    // Axis numbers of (page, slot, head, dim); -1: absent (a single-head cache).
    int page = 0, slot = 1, head = 2, dim = 3;
    if (array.ndim == 3) {
        head = -1;
        dim = 2;
    } else if (array.ndim == 4) {
        if (options.kv_layout == "hnd") {
            slot = 2;
            head = 1;
        } else if (options.kv_layout != "nhd") {
            rope::fail("kv_layout", std::string(options.kv_layout),
                       "must be \"nhd\" ([pages, page_size, heads, head_dim]) or \"hnd\" ([pages, heads, page_size, "
                       "head_dim])");
        }
    } else {
        rope::fail(field + ".ndim", array.ndim,
                   "must be 4 ([pages, page_size, heads, head_dim] or, with kv_layout=\"hnd\", [pages, heads, "
                   "page_size, head_dim]; any strides) or 3 ([pages, page_size, head_dim]: one head, as the halves "
                   "of an MLA cache)");
    }
    cache.data = array.data;
    cache.device = placement_of(field, array.device_type, array.device_id).device;
    cache.pages = array.shape[page];
    cache.page_size = array.shape[slot];
    cache.heads = head < 0 ? 1 : array.shape[head];
    cache.head_dim = array.shape[dim];
    cache.stride_page = array.strides[page];
    cache.stride_slot = array.strides[slot];
    cache.stride_head = head < 0 ? cache.head_dim : array.strides[head];
    if (cache.head_dim > 1 && array.strides[dim] != 1)
        rope::fail(field + ".strides[" + std::to_string(dim) + "]", array.strides[dim],
                   "must be 1: each cached head's features are contiguous");
    if (options.page_size != 0 && options.page_size != cache.page_size)
        rope::fail("page_size", options.page_size,
                   "must equal " + field + "'s page axis, of length " + std::to_string(cache.page_size));
    return cache;
}

rope::Fp8Output fp8_output(const char* name, const Array& array, std::string_view dtype_name) {
    const std::string field(name);
    if (dtype_name.empty()) {
        if (is_uint8(array))
            rope::fail(field + ".dtype", "uint8",
                       "is an FP8 q_out only with its format named: q_out_dtype=\"e4m3fn\" or \"e5m2\"");
        rope::fail("q_out_dtype", "None", "an FP8 q_out needs its format: \"e4m3fn\" or \"e5m2\"");
    }
    rope::Fp8Output out;
    out.dtype = cache_dtype_named("q_out_dtype", dtype_name);
    if (out.dtype == rope::CacheDType::model)
        rope::fail("q_out_dtype", std::string(dtype_name),
                   "must be \"e4m3fn\" or \"e5m2\" (the format of an FP8 q_out), or None for q's dtype");
    if (!is_uint8(array))
        rope::fail(field + ".dtype", "not uint8",
                   "an FP8 q_out (" + std::string(dtype_name) + ") is held as uint8 or torch.float8 codes");
    if (array.ndim != 3)
        rope::fail(field + ".ndim", array.ndim, "must be 3 ([tokens, heads, head_dim], as q; any strides)");
    for (int axis = 0; axis < 3; ++axis)
        if (array.strides[axis] < 0)
            rope::fail(field + ".strides[" + std::to_string(axis) + "]", array.strides[axis], "must be >= 0");
    if (array.shape[2] > 1 && array.strides[2] != 1)
        rope::fail(field + ".strides[2]", array.strides[2], "must be 1: each head's features are contiguous");
    out.data = array.data;
    out.device = placement_of(field, array.device_type, array.device_id).device;
    out.tokens = array.shape[0];
    out.heads = array.shape[1];
    out.head_dim = array.shape[2];
    out.stride_token = array.strides[0];
    out.stride_head = array.strides[1];
    return out;
}

rope::CacheDType cache_dtype_named(std::string_view name, std::string_view value) {
    if (value.empty() || value == "model") return rope::CacheDType::model;
    if (value == "e4m3fn" || value == "fp8_e4m3") return rope::CacheDType::e4m3fn;
    if (value == "e5m2" || value == "fp8_e5m2") return rope::CacheDType::e5m2;
    rope::fail(name, std::string(value), "must be \"e4m3fn\", \"e5m2\" or None (the model's dtype)");
}

KvAppendCall prepare_kv_append(const rope::RopeConfig& config, const KvAppendArrays& arrays,
                               const KvAppendOptions& options) {
    if (arrays.rope.k == nullptr) rope::fail("k", "None", "append_kv needs the keys it appends");
    for (const auto& [name, array] : {std::pair<const char*, const Array*>{"v", arrays.v},
                                      {"slot_mapping", arrays.slot_mapping}, {"k_cache", arrays.k_cache},
                                      {"v_cache", arrays.v_cache}})
        if (array == nullptr) rope::fail(name, "None", "append_kv needs it");
    CallOptions rope_options = options.rope;
    rope_options.layout = "thd";
    // An FP8 q output (uint8 codes, or any q_out with q_out_dtype named): rope::append_kv then reads
    // q and writes nothing to q_out, which must be q itself; k goes to k_out, or stays in place.
    CallArrays rope_arrays = arrays.rope;
    const Array* q_fp8 = nullptr;
    if (rope_arrays.q_out != nullptr && (!options.q_out_dtype.empty() || is_uint8(*rope_arrays.q_out))) {
        if (rope_arrays.q == nullptr) rope::fail("q", "None", "append_kv needs the queries it rotates");
        q_fp8 = rope_arrays.q_out;
        rope_arrays.q_out = rope_arrays.q;
        rope_options.bfloat16_bits = (rope_options.bfloat16_bits & ~4) | (rope_options.bfloat16_bits & 1) << 2;
        if (rope_arrays.k_out == nullptr) {
            rope_arrays.k_out = rope_arrays.k;
            rope_options.bfloat16_bits = (rope_options.bfloat16_bits & ~8) | (rope_options.bfloat16_bits & 2) << 2;
        }
    } else if (!options.q_out_dtype.empty()) {
        rope::fail("q_out_dtype", std::string(options.q_out_dtype),
                   "names the format of an FP8 q_out, and there is none (out=(q_out, k_out) with q_out uint8 "
                   "or torch.float8)");
    } else if (arrays.q_scale != nullptr) {
        rope::fail("q_scale", "set",
                   "is read only with an FP8 q_out (a torch.float8 tensor, or uint8 with q_out_dtype \"e4m3fn\" "
                   "or \"e5m2\")");
    }
    Call call = prepare_call(config, rope_arrays, rope_options);
    KvAppendCall result;
    result.backend = call.backend;
    int cuda_device = call.cuda_device;
    rope::KvAppendArgs& args = result.args;
    args.q = call.args.q;
    args.k = call.args.k;
    args.q_out = call.args.q_out;
    args.k_out = call.args.k_out;
    args.positions = call.args.positions;
    args.cos_sin_cache = call.args.cos_sin_cache;

    const rope::DType model = args.k.dtype;
    auto bit = [&](int i) { return (options.bfloat16_bits >> i & 1) != 0; };
    args.v = tensor_view("v", *arrays.v, rope::Layout::thd, bit(0));
    check_device("v", *arrays.v, cuda_device);

    const IndexArray slots = index_array("slot_mapping", *arrays.slot_mapping, 1);
    args.slot_mapping = rope::SlotMapping{slots.data, slots.shape[0], slots.placement.device};
    check_device("slot_mapping", *arrays.slot_mapping, cuda_device);

    args.k_cache = paged_cache("k_cache", *arrays.k_cache, options, options.k_cache_dtype, bit(1), model);
    args.v_cache = paged_cache("v_cache", *arrays.v_cache, options, options.v_cache_dtype, bit(2), args.v.dtype);
    check_device("k_cache", *arrays.k_cache, cuda_device);
    check_device("v_cache", *arrays.v_cache, cuda_device);
    attach_scale("k_scale", arrays.k_scale, args.k_cache, cuda_device);
    attach_scale("v_scale", arrays.v_scale, args.v_cache, cuda_device);
    if (q_fp8 != nullptr) {
        rope::Fp8Output out = fp8_output("q_out", *q_fp8, options.q_out_dtype);
        const Array& q = *rope_arrays.q;  // [tokens, heads, head_dim]: prepare_call checked it is 3-D.
        if (out.tokens != q.shape[0] || out.heads != q.shape[1] || out.head_dim != q.shape[2])
            rope::fail("q_out.shape",
                       "[" + std::to_string(out.tokens) + ", " + std::to_string(out.heads) + ", " +
                           std::to_string(out.head_dim) + "]",
                       "must be q's [" + std::to_string(q.shape[0]) + ", " + std::to_string(q.shape[1]) + ", " +
                           std::to_string(q.shape[2]) + "]");
        check_device("q_out", *q_fp8, cuda_device);
        if (arrays.q_scale == nullptr)
            rope::fail("q_scale", "None",
                       "an FP8 q_out needs its dequantisation scale (value ~= fp8 * scale): float32, one or one per "
                       "q head");
        check_scale("q_scale", *arrays.q_scale, cuda_device);
        args.q_out_fp8 = out.with_scale(static_cast<const float*>(arrays.q_scale->data), arrays.q_scale->size());
    }
    result.cuda_device = result.backend->device() == rope::Device::cuda ? cuda_device : -1;
    return result;
}

}  // namespace rope_python
