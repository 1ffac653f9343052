// DLPack arrays as rope views: see dlpack_views.hpp.
#include "dlpack_views.hpp"

#include <string>

namespace rope_python {
namespace {

// "numpy.ndarray", "torch.Tensor", "list": how messages name a Python object's type.
std::string python_type_name(nb::handle object) {
    nb::handle type = object.type();
    const std::string module = nb::hasattr(type, "__module__") ? nb::str(type.attr("__module__")).c_str() : "";
    const std::string name = nb::str(type.attr("__qualname__")).c_str();
    return module.empty() || module == "builtins" ? name : module + "." + name;
}

// Why @p object could not be imported: the most useful of three explanations.
[[noreturn]] void explain_import_failure(const std::string& name, nb::handle object) {
    const std::string type = python_type_name(object);
    if (!nb::hasattr(object, "__dlpack__") && !PyObject_CheckBuffer(object.ptr()))
        rope::fail(name, type,
                   "has no DLPack (__dlpack__) or buffer interface: pass a NumPy array, a PyTorch tensor or a "
                   "CuPy array");
    // The producer refused to export it: its own exception says why (a PyTorch
    // tensor that requires grad, a NumPy dtype DLPack cannot describe, ...).
    if (nb::hasattr(object, "__dlpack__")) {
        try {
            object.attr("__dlpack__")();
        } catch (nb::python_error& error) {
            rope::fail(name, type, std::string("its __dlpack__() failed: ") + error.what());
        }
    }
    rope::fail(name, type, "could not be imported through DLPack or the buffer protocol");
}

template <typename Array>
bool try_import(nb::handle object, Array& array) {
    // convert=false: never let nanobind make a converted copy; rope works on the caller's memory.
    return nb::try_cast(object, array, /*convert=*/false);
}

std::string dtype_text(nb::dlpack::dtype dtype) {
    const char* kind = "code";
    switch (static_cast<nb::dlpack::dtype_code>(dtype.code)) {
        case nb::dlpack::dtype_code::Int: kind = "int"; break;
        case nb::dlpack::dtype_code::UInt: kind = "uint"; break;
        case nb::dlpack::dtype_code::Float: kind = "float"; break;
        case nb::dlpack::dtype_code::Bfloat: kind = "bfloat"; break;
        case nb::dlpack::dtype_code::Complex: kind = "complex"; break;
        case nb::dlpack::dtype_code::Bool: kind = "bool"; break;
        default: break;
    }
    return std::string(kind) + std::to_string(dtype.bits);
}

bool is(nb::dlpack::dtype dtype, nb::dlpack::dtype_code code, int bits) {
    return dtype.code == static_cast<uint8_t>(code) && dtype.bits == bits && dtype.lanes == 1;
}

}  // namespace

InputArray import_input(const std::string& name, nb::handle object) {
    InputArray array;
    if (!try_import(object, array)) explain_import_failure(name, object);
    return array;
}

OutputArray import_output(const std::string& name, nb::handle object) {
    OutputArray array;
    if (try_import(object, array)) return array;
    // Importable for reading but not for writing: the producer marked it read-only.
    InputArray readable;
    if (try_import(object, readable))
        rope::fail(name, python_type_name(object) + " (read-only)",
                   "rope writes into it: pass a writable array (e.g. a copy), or an out= array");
    explain_import_failure(name, object);
}

Placement placement_of(const std::string& name, int device_type, int device_id) {
    switch (device_type) {
        case nb::device::cpu::value:
        case nb::device::cuda_host::value: return {rope::Device::host, -1};
        case nb::device::cuda::value:
        case nb::device::cuda_managed::value: return {rope::Device::cuda, device_id};
        default: break;
    }
    rope::fail(name + ".device", "DLPack device type " + std::to_string(device_type),
               "rope runs on the host (CPU) or on CUDA devices");
}

rope::DType storage_type(const std::string& name, nb::dlpack::dtype dtype, bool bfloat16_bits) {
    using code = nb::dlpack::dtype_code;
    if (is(dtype, code::Float, 32)) return rope::DType::f32;
    if (is(dtype, code::Float, 16)) return rope::DType::f16;
    if (is(dtype, code::Bfloat, 16)) return rope::DType::bf16;
    if (bfloat16_bits && is(dtype, code::UInt, 16)) return rope::DType::bf16;
    rope::fail(name + ".dtype", dtype_text(dtype), "must be float32, float16 or bfloat16");
}

template <typename Array>
rope::TensorView tensor_view(const std::string& name, const Array& array, rope::Layout layout, bool bfloat16_bits) {
    const size_t ndim = layout == rope::Layout::thd ? 3 : 4;
    if (array.ndim() != ndim)
        rope::fail(name + ".ndim", array.ndim(),
                   "must be " + std::to_string(ndim) + " for layout " + std::string(rope::layout_name(layout)) +
                       (ndim == 4 ? " (or pass layout=\"thd\" for packed [tokens, heads, head_dim])"
                                  : " ([total_tokens, heads, head_dim])"));
    rope::TensorView view;
    view.data = const_cast<void*>(static_cast<const void*>(array.data()));
    view.dtype = storage_type(name, array.dtype(), bfloat16_bits);
    view.device = placement_of(name, array.device_type(), array.device_id()).device;
    view.layout = layout;
    // DLPack strides count elements, as rope's do: every axis is taken as it is,
    // the last one included (a non-unit feature stride is honoured, not assumed away).
    for (size_t axis = 0; axis < ndim; ++axis) {
        view.shape[axis] = array.shape(axis);
        view.strides[axis] = array.stride(axis);
    }
    if (ndim == 3) {  // thd: the unit fourth axis rope's 3-D views carry.
        view.shape[3] = 1;
        view.strides[3] = 1;
    }
    return view;
}

template rope::TensorView tensor_view(const std::string&, const InputArray&, rope::Layout, bool);
template rope::TensorView tensor_view(const std::string&, const OutputArray&, rope::Layout, bool);

IndexArray index_array(const std::string& name, const InputArray& array, int max_ndim) {
    if (!is(array.dtype(), nb::dlpack::dtype_code::Int, 64))
        rope::fail(name + ".dtype", dtype_text(array.dtype()), "must be int64 (e.g. tensor.long(), array.astype(np.int64))");
    if (array.ndim() < 1 || int(array.ndim()) > max_ndim)
        rope::fail(name + ".ndim", array.ndim(), "must be 1 to " + std::to_string(max_ndim));
    IndexArray index;
    index.ndim = int(array.ndim());
    const bool empty = array.size() == 0;  // No element to address: any strides will do.
    int64_t expected_stride = 1;  // Row-major, as rope::Positions reads it.
    for (int axis = index.ndim - 1; axis >= 0; --axis) {
        index.shape[size_t(axis)] = array.shape(size_t(axis));
        if (!empty && array.shape(size_t(axis)) > 1 && array.stride(size_t(axis)) != expected_stride)
            rope::fail(name + ".strides[" + std::to_string(axis) + "]", array.stride(size_t(axis)),
                       "must be " + std::to_string(expected_stride) + ": ids must be contiguous (row-major)");
        expected_stride *= array.shape(size_t(axis));
    }
    index.data = static_cast<const int64_t*>(array.data());
    index.placement = placement_of(name, array.device_type(), array.device_id());
    return index;
}

rope::CosSinCache cos_sin_cache(const InputArray& array, Placement& placement) {
    const std::string name = "cos_sin_cache";
    if (array.ndim() != 2) rope::fail(name + ".ndim", array.ndim(), "must be 2 ([max_position, rotary_dim])");
    rope::CosSinCache cache;
    cache.data = array.data();
    cache.dtype = storage_type(name, array.dtype(), false);
    placement = placement_of(name, array.device_type(), array.device_id());
    cache.device = placement.device;
    cache.rows = int64_t(array.shape(0));
    cache.cols = int64_t(array.shape(1));
    if (cache.cols > 1 && array.stride(1) != 1)
        rope::fail(name + ".strides[1]", array.stride(1), "must be 1 (each row's cos and sin are contiguous)");
    cache.row_stride = cache.rows > 1 ? array.stride(0) : cache.cols;
    return cache;
}

}  // namespace rope_python
