// DLPack-described arrays to one rope call: see call_args.hpp.
#include "call_args.hpp"

#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace rope_python {
namespace {

std::string dtype_text(ElementType dtype) {
    const char* kind = "code";
    switch (static_cast<dlpack::Code>(dtype.code)) {
        case dlpack::Code::Int: kind = "int"; break;
        case dlpack::Code::UInt: kind = "uint"; break;
        case dlpack::Code::Float: kind = "float"; break;
        case dlpack::Code::Bfloat: kind = "bfloat"; break;
        case dlpack::Code::Complex: kind = "complex"; break;
        case dlpack::Code::Bool: kind = "bool"; break;
        default: break;
    }
    return std::string(kind) + std::to_string(dtype.bits);
}

bool is(ElementType dtype, dlpack::Code code, int bits) {
    return dtype.code == static_cast<uint8_t>(code) && dtype.bits == bits && dtype.lanes == 1;
}

// The default backend for a call whose tensors live on @p device.
std::string_view default_backend(rope::Device device) {
    if (device == rope::Device::cuda) return "cuda-optimized";
    static const bool eigen = rope::backend_info("cpu-eigen").available;
    return eigen ? "cpu-eigen" : "cpu-naive";
}

// Every CUDA array of one call must be on one device: the first one met names it.
struct CallDevice {
    std::string_view first_name;  // The callers' names are string literals.
    int cuda_device = -1;
    void add(std::string_view name, const Placement& placement) {
        if (placement.device != rope::Device::cuda) return;
        if (cuda_device < 0) {
            cuda_device = placement.cuda_device;
            first_name = name;
        } else if (placement.cuda_device != cuda_device) {
            rope::fail(std::string(name) + ".device", "cuda:" + std::to_string(placement.cuda_device),
                       "must be on the CUDA device of " + std::string(first_name) + " (cuda:" +
                           std::to_string(cuda_device) + ")");
        }
    }
    void add(std::string_view name, const Array& array) {
        add(name, placement_of(name, array.device_type, array.device_id));
    }
};

// --- Positions --------------------------------------------------------------------------
// The forms of rope::Positions, from what Python passed: an offset, an ids
// array ([seq], [batch, seq], [axes, seq] or [axes, batch, seq]), packed
// sequences (cu_seqlens, starts), and a context-parallel shard of either.
rope::Positions positions_of(const rope::RopeConfig& config, const CallArrays& arrays, const CallOptions& options,
                             CallDevice& call_device) {
    rope::Positions positions = rope::Positions::starting_at(options.offset);
    if (arrays.ids) {
        const IndexArray index = index_array(options.positions_name, *arrays.ids, 3);
        const int64_t axes = config.multi_axis.axes();
        // [seq] | [batch, seq] for one axis; [axes, seq] | [axes, batch, seq] for several.
        int64_t id_axes = 1, rows = 1, length = index.shape[size_t(index.ndim - 1)];
        if (index.ndim == 2 && axes == 1) rows = index.shape[0];
        if (index.ndim == 2 && axes > 1) id_axes = index.shape[0];
        if (index.ndim == 3) {
            id_axes = index.shape[0];
            rows = index.shape[1];
        }
        positions = rope::Positions::multi_axis(index.data, id_axes, rows, length, index.placement.device);
        call_device.add(options.positions_name, index.placement);
    }
    if (arrays.cu_seqlens) {
        const IndexArray cu = index_array("cu_seqlens", *arrays.cu_seqlens, 1);
        const int64_t* first_positions = nullptr;
        if (arrays.starts) {
            const IndexArray s = index_array("starts", *arrays.starts, 1);
            if (s.shape[0] != cu.shape[0] - 1)
                rope::fail("starts.shape[0]", s.shape[0],
                           "must be len(cu_seqlens) - 1 = " + std::to_string(cu.shape[0] - 1) + " (one per sequence)");
            if (s.placement.device != cu.placement.device)
                rope::fail("starts.device", rope::device_name(s.placement.device),
                           "must be where cu_seqlens is (" + std::string(rope::device_name(cu.placement.device)) + ")");
            first_positions = s.data;
            call_device.add("starts", s.placement);
        }
        const rope::Positions packed =
            rope::Positions::packed(cu.data, cu.shape[0] - 1, first_positions, cu.placement.device);
        positions.cu_seqlens = packed.cu_seqlens;
        positions.sequences = packed.sequences;
        positions.starts = packed.starts;
        if (!arrays.ids) positions.device = packed.device;
        call_device.add("cu_seqlens", cu.placement);
    } else if (arrays.starts) {
        rope::fail("starts", "set", "is only read with cu_seqlens (packed sequences)");
    }
    positions.max_position = options.max_position;
    return positions.sharded(options.cp_size, options.cp_rank);
}

}  // namespace

Placement placement_of(std::string_view name, int device_type, int device_id) {
    switch (device_type) {
        case dlpack::cpu:
        case dlpack::cuda_host: return {rope::Device::host, -1};
        case dlpack::cuda:
        case dlpack::cuda_managed: return {rope::Device::cuda, device_id};
        default: break;
    }
    rope::fail(std::string(name) + ".device", "DLPack device type " + std::to_string(device_type),
               "rope runs on the host (CPU) or on CUDA devices");
}

rope::DType storage_type(std::string_view name, ElementType dtype, bool bfloat16_bits) {
    using dlpack::Code;
    if (is(dtype, Code::Float, 32)) return rope::DType::f32;
    if (is(dtype, Code::Float, 16)) return rope::DType::f16;
    if (is(dtype, Code::Bfloat, 16)) return rope::DType::bf16;
    if (bfloat16_bits && is(dtype, Code::UInt, 16)) return rope::DType::bf16;
    rope::fail(std::string(name) + ".dtype", dtype_text(dtype), "must be float32, float16 or bfloat16");
}

rope::TensorView tensor_view(std::string_view name, const Array& array, rope::Layout layout, bool bfloat16_bits) {
    const size_t ndim = layout == rope::Layout::thd ? 3 : 4;
    if (array.ndim != ndim)
        rope::fail(std::string(name) + ".ndim", array.ndim,
                   "must be " + std::to_string(ndim) + " for layout " + std::string(rope::layout_name(layout)) +
                       (ndim == 4 ? " (or pass layout=\"thd\" for packed [tokens, heads, head_dim])"
                                  : " ([total_tokens, heads, head_dim])"));
    rope::TensorView view;
    view.data = array.data;
    view.dtype = storage_type(name, array.dtype, bfloat16_bits);
    view.device = placement_of(name, array.device_type, array.device_id).device;
    view.layout = layout;
    // DLPack strides count elements, as rope's do: every axis is taken as it is,
    // the last one included (a non-unit feature stride is honoured, not assumed away).
    for (size_t axis = 0; axis < ndim; ++axis) {
        view.shape[axis] = array.shape[axis];
        view.strides[axis] = array.strides[axis];
    }
    if (ndim == 3) {  // thd: the unit fourth axis rope's 3-D views carry.
        view.shape[3] = 1;
        view.strides[3] = 1;
    }
    return view;
}

IndexArray index_array(std::string_view name, const Array& array, int max_ndim) {
    // rope.apply and the PyTorch operators convert integer arrays of other types and strides before
    // they get here (NumPy, PyTorch, CuPy); an array of another producer must come as contiguous int64.
    const auto code = static_cast<dlpack::Code>(array.dtype.code);
    if (code != dlpack::Code::Int && code != dlpack::Code::UInt)
        rope::fail(name, dtype_text(array.dtype), "must be integers (any integer dtype): never rounded");
    if (!is(array.dtype, dlpack::Code::Int, 64))
        rope::fail(std::string(name) + ".dtype", dtype_text(array.dtype),
                   "must be int64 for an array rope.apply does not convert (NumPy, PyTorch and CuPy arrays are)");
    if (array.ndim < 1 || int(array.ndim) > max_ndim)
        rope::fail(std::string(name) + ".ndim", array.ndim, "must be 1 to " + std::to_string(max_ndim));
    IndexArray index;
    index.ndim = int(array.ndim);
    const bool empty = array.size() == 0;  // No element to address: any strides will do.
    int64_t expected_stride = 1;  // Row-major, as rope::Positions reads it.
    for (int axis = index.ndim - 1; axis >= 0; --axis) {
        index.shape[size_t(axis)] = array.shape[axis];
        if (!empty && array.shape[axis] > 1 && array.strides[axis] != expected_stride)
            rope::fail(std::string(name) + ".strides[" + std::to_string(axis) + "]", array.strides[axis],
                       "must be " + std::to_string(expected_stride) + ": ids must be contiguous (row-major)");
        expected_stride *= array.shape[axis];
    }
    index.data = static_cast<const int64_t*>(array.data);
    index.placement = placement_of(name, array.device_type, array.device_id);
    return index;
}

rope::CosSinCache cos_sin_cache(const Array& array, Placement& placement) {
    const std::string name = "cos_sin_cache";
    if (array.ndim != 2) rope::fail(name + ".ndim", array.ndim, "must be 2 ([max_position, rotary_dim])");
    rope::CosSinCache cache;
    cache.data = array.data;
    cache.dtype = storage_type(name, array.dtype, false);
    placement = placement_of(name, array.device_type, array.device_id);
    cache.device = placement.device;
    cache.rows = array.shape[0];
    cache.cols = array.shape[1];
    if (cache.cols > 1 && array.strides[1] != 1)
        rope::fail(name + ".strides[1]", array.strides[1], "must be 1 (each row's cos and sin are contiguous)");
    cache.row_stride = cache.rows > 1 ? array.strides[0] : cache.cols;
    return cache;
}

Call prepare_call(const rope::RopeConfig& config, const CallArrays& arrays, const CallOptions& options) {
    const rope::Layout layout = rope::parse_layout(options.layout);
    const bool in_place = arrays.q_out == nullptr;
    if (in_place && arrays.k_out) rope::fail("out", "(None, k_out)", "give both outputs or neither");
    auto bits = [&](int operand) { return (options.bfloat16_bits >> operand & 1) != 0; };
    CallDevice call_device;
    Call call;
    rope::RopeArgs& args = call.args;

    // One operand: its input's view, and its output's (the input itself in place); bit i of
    // bfloat16_bits marks q, k, out[0], out[1] in that order.
    auto operand = [&](const char* name, const Array& input, int input_bit, const char* out_name,
                       const Array* output, int output_bit, rope::TensorView& view, rope::TensorView& out_view) {
        view = tensor_view(name, input, layout, bits(input_bit));
        call_device.add(name, input);
        if (in_place) {
            out_view = view;
            return;
        }
        out_view = tensor_view(out_name, *output, layout, bits(output_bit));
        call_device.add(out_name, *output);
    };
    const std::string q_name(options.q_name), q_out_name(options.q_out_name);
    operand(q_name.c_str(), *arrays.q, 0, q_out_name.c_str(), arrays.q_out, 2, args.q, args.q_out);
    if (!arrays.k) {
        // Rotate q only: a k with no heads (rope's convention), same device.
        if (arrays.k_out) rope::fail("out[1]", "set", "must be None when k is None");
        args.k = args.q;
        args.k.data = nullptr;
        args.k.shape[layout == rope::Layout::bshd ? 2 : 1] = 0;
        args.k_out = args.k;
    } else {
        if (!in_place && !arrays.k_out) rope::fail("out[1]", "None", "k needs an output too (out=(q_out, k_out))");
        operand("k", *arrays.k, 1, "out[1]", arrays.k_out, 3, args.k, args.k_out);
    }

    args.positions = positions_of(config, arrays, options, call_device);
    if (arrays.cos_sin_cache) {
        Placement placement;
        args.cos_sin_cache = cos_sin_cache(*arrays.cos_sin_cache, placement);
        call_device.add("cos_sin_cache", placement);
    }
    args.direction = options.inverse ? rope::Direction::inverse : rope::Direction::forward;

    call.backend = &backend_named(options.backend.empty() ? default_backend(args.q.device) : options.backend);
    call.cuda_device = call.backend->device() == rope::Device::cuda ? call_device.cuda_device : -1;
    return call;
}

rope::Backend& backend_named(std::string_view name) {
    // This thread's last name and its backend: most programs call one backend throughout, and
    // comparing a short name is cheaper than the lock and the map.
    thread_local std::string last_name;
    thread_local rope::Backend* last = nullptr;
    if (last != nullptr && name == last_name) return *last;

    static std::mutex mutex;
    static std::map<std::string, std::unique_ptr<rope::Backend>, std::less<>> backends;
    std::lock_guard<std::mutex> lock(mutex);
    auto found = backends.find(name);
    if (found == backends.end()) {
        // Throws rope::Error for unknown or unavailable names (and then nothing is stored).
        std::unique_ptr<rope::Backend> backend = rope::make_backend(std::string(name));
        found = backends.emplace(std::string(name), std::move(backend)).first;
    }
    // No entry is ever erased: the backend outlives every thread's `last`.
    last_name.assign(name);
    last = found->second.get();
    return *last;
}

}  // namespace rope_python
