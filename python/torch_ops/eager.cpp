// rope._torch_ops.rope_: a fast way into the operator's kernel for plain eager
// code, beside the operator (operator.cpp), not instead of it.
//
// torch.ops.rope.apply_(...) parses its 14 arguments against the schema and
// passes three dispatch keys (Autograd, ADInplaceOrView, then CPU or CUDA)
// before rope's kernel runs: a few microseconds per call even for PyTorch's own
// operators (python/bench/op_cost.py times torch.ops.aten.copy_ beside it),
// which a decode step notices. So rope.ops.rope_ first hands its arguments, as
// the user gave them, to rope_ below: the same kernel (rotate, operator.hpp:
// the same checks, messages and rope::apply call), on PyTorch's current
// stream, and what the two dispatch keys would have done: nothing for Autograd
// (apply_ is not differentiable), the version counters moved for
// ADInplaceOrView.
//
// rope_ declines (returns False, having read nothing but its arguments' types)
// where PyTorch must see the call: a torch-function or dispatch mode active, a
// tensor subclass or a wrapped tensor (vmap, functionalization). It also
// declines the argument forms that Python checks and converts first (positions
// given as a list or a bool, an int beyond int64, a cp that is not a tuple of
// two ints, ...). rope.ops.rope_ then calls the operator. Under torch.compile
// rope_ is never called (rope.ops.rope_ checks torch.compiler.is_compiling()).
//
// The library is one file with operator.cpp: importing rope._torch_ops also
// registers the operators with PyTorch (TORCH_LIBRARY runs when it is loaded).
#include <cstdint>
#include <string_view>

#include <nanobind/nanobind.h>

#include <c10/core/InferenceMode.h>

#include "operator.hpp"
#include "python_tensor.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace rope_torch {
namespace {

// rope.Error, the exception rope's Python API raises (defined by rope._rope, whose
// rope::Error type this library does not share: each module links its own rope).
[[noreturn]] void raise_rope_error(const rope::Error& error) {
    const nb::object error_type = nb::module_::import_("rope._rope").attr("Error");
    PyErr_SetString(error_type.ptr(), error.what());
    throw nb::python_error();
}

// As ADInplaceOrView does for a PyTorch in-place operator: q and k changed, so autograd
// refuses a backward that would read a copy saved before. Inside torch.inference_mode()
// versions are not tracked; inference tensors carry no counter (rotate refuses them outside it).
void bump_version(const at::Tensor& tensor) {
    if (!c10::InferenceMode::is_enabled() && !tensor.is_inference()) tensor.unsafeGetTensorImpl()->bump_version();
}

// Each take_* reads one argument: false where rope_ declines the call (the general way takes it).
// A tensor argument (q, k, cu_seqlens, starts, cos_sin_cache): None, or a plain tensor.
// Anything that is no torch.Tensor at all is an error naming the argument, as the operator's.
bool take_tensor(const char* name, nb::handle object, const at::Tensor*& tensor) {
    const PythonTensor unpacked = unpack_tensor(object.ptr());
    if (unpacked.kind == PythonTensorKind::other)
        rope::fail(name, Py_TYPE(object.ptr())->tp_name, "must be a torch.Tensor");
    tensor = unpacked.tensor;
    return unpacked.kind != PythonTensorKind::dispatched;
}

// A Python int that fits in 64 bits, not a bool (rope.ops refuses bools where it wants a number).
bool take_int(nb::handle object, int64_t& value) {
    if (!PyLong_Check(object.ptr()) || PyBool_Check(object.ptr())) return false;
    value = PyLong_AsLongLong(object.ptr());
    if (value == -1 && PyErr_Occurred()) {  // Too large: the general way reports it.
        PyErr_Clear();
        return false;
    }
    return true;
}

// A str, or None for @p fallback.
bool take_text(nb::handle object, std::string_view fallback, std::string_view& text) {
    if (object.is_none()) {
        text = fallback;
        return true;
    }
    if (!PyUnicode_Check(object.ptr())) return false;
    Py_ssize_t size = 0;
    const char* data = PyUnicode_AsUTF8AndSize(object.ptr(), &size);
    if (data == nullptr) {
        PyErr_Clear();
        return false;
    }
    text = std::string_view(data, size_t(size));
    return true;
}

// The rope.Config's key. Its attribute `_key` is read directly: the property `key` returns
// the same string through a Python call. Anything but a rope.Config: the general way says so.
// @p holder keeps the string alive while @p key points into it (the GIL is released during the
// call, and another thread could replace the Config's attribute meanwhile).
bool take_config(nb::handle config, nb::object& holder, std::string_view& key) {
    // Looked up once and kept for the process (a reference never given back: the type outlives every call).
    static PyObject* const config_type = nb::object(nb::module_::import_("rope._config").attr("Config")).release().ptr();
    if (!PyObject_TypeCheck(config.ptr(), reinterpret_cast<PyTypeObject*>(config_type))) return false;
    holder = nb::getattr(config, "_key");
    return take_text(holder, {}, key) && !key.empty();
}

// rope.ops.rope_'s arguments, as given: true when the call ran, false when it must take the
// general way (nothing read but the arguments, nothing written). Raises rope.Error for a bad call.
bool rope_eager(nb::handle q, nb::handle k, nb::handle config, nb::handle positions, nb::handle layout,
                nb::handle cu_seqlens, nb::handle starts, nb::handle cp, nb::handle cos_sin_cache, nb::handle inverse,
                nb::handle backend, nb::handle max_position) {
#if ROPE_TORCH_OPS_CUDA
    const Runner run = run_cuda;  // CUDA tensors on their device and stream; host tensors as run_host.
#else
    const Runner run = run_host;
#endif
    if (python_modes_active()) return false;
    try {
        CallTensors tensors;  // Borrowed from the arguments, which live until the call returns.
        if (!take_tensor("q", q, tensors.q) || !take_tensor("k", k, tensors.k)) return false;
        if (tensors.q == nullptr) rope::fail("q", "None", "must be a torch.Tensor");
        nb::object key_holder;
        std::string_view key;
        if (!take_config(config, key_holder, key)) return false;
        // positions: None (from 0), an int offset, or a tensor of ids (other forms: converted in Python).
        int64_t offset = 0;
        if (!positions.is_none() && !take_int(positions, offset)) {
            const PythonTensor unpacked = unpack_tensor(positions.ptr());
            if (unpacked.kind != PythonTensorKind::plain) return false;
            tensors.ids = unpacked.tensor;
        }
        std::string_view layout_name, backend_name;
        // The default layout: "thd" for a 3-dimensional (packed) q, else "bhsd", as rope.apply's.
        if (!take_text(layout, tensors.q->dim() == 3 ? "thd" : "bhsd", layout_name)) return false;
        if (!take_text(backend, "", backend_name)) return false;  // "": chosen by the tensors' device.
        int64_t cp_size = 1, cp_rank = 0, max_position_value = 0;
        if (!cp.is_none() && !(PyTuple_CheckExact(cp.ptr()) && PyTuple_GET_SIZE(cp.ptr()) == 2 &&
                               take_int(PyTuple_GET_ITEM(cp.ptr(), 0), cp_size) &&
                               take_int(PyTuple_GET_ITEM(cp.ptr(), 1), cp_rank)))
            return false;
        if (!take_int(max_position, max_position_value)) return false;
        const int inverse_value = PyObject_IsTrue(inverse.ptr());
        if (inverse_value < 0) {
            PyErr_Clear();
            return false;
        }
        if (!take_tensor("cu_seqlens", cu_seqlens, tensors.cu_seqlens) || !take_tensor("starts", starts, tensors.starts) ||
            !take_tensor("cos_sin_cache", cos_sin_cache, tensors.cos_sin_cache))
            return false;
        {
            // Long host calls must not stall other Python threads; the tensors are held above.
            nb::gil_scoped_release no_gil;
            rotate(run, tensors,
                   {key, offset, cp_size, cp_rank, layout_name, inverse_value != 0, backend_name, max_position_value});
        }
        bump_version(*tensors.q);
        if (tensors.k != nullptr) bump_version(*tensors.k);
        return true;
    } catch (const rope::Error& error) {
        raise_rope_error(error);
    }
}

}  // namespace
}  // namespace rope_torch

NB_MODULE(_torch_ops, m) {
    m.doc() = "rope's C++ PyTorch operators (torch.ops.rope.apply_ and apply, registered on import) and the eager entry. "
              "Use rope.ops, not this module.";
    m.def("rope_", &rope_torch::rope_eager, "q"_a.none(), "k"_a.none(), "config"_a.none(), "positions"_a.none(),
          "layout"_a.none(), "cu_seqlens"_a.none(), "starts"_a.none(), "cp"_a.none(), "cos_sin_cache"_a.none(),
          "inverse"_a.none(), "backend"_a.none(), "max_position"_a.none(),
          "rope.ops.rope_'s arguments (q, k, config, positions, layout, cu_seqlens, starts, cp, cos_sin_cache, "
          "inverse, backend, max_position): runs the operator's kernel without PyTorch's dispatcher and returns "
          "True, or returns False having done nothing where PyTorch must see the call; raises rope.Error.");
}
