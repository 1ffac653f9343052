// rope._torch_ops.rope_ and rope: fast ways into the operators' kernel for plain
// eager code, beside the operators (operator.cpp), not instead of them.
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
// ADInplaceOrView. rope.ops.rope does the same through rope below: the
// functional operator's outputs made as its kernel makes them, then the same
// kernel; its Autograd key is a Python function (register_autograd in
// rope/ops.py), so this way saves the most, and it is taken only where that
// function would record nothing (no tensor that requires grad, or grad mode off).
//
// Both decline (rope_ returns False, rope None, having read nothing but the arguments)
// where PyTorch must see the call: a torch-function or dispatch mode active, a
// tensor subclass or a wrapped tensor (vmap, functionalization). They also
// decline the argument forms that Python checks and converts first (positions
// given as a list or a bool, an int beyond int64, a cp that is not a tuple of
// two ints, ...). rope.ops then calls the operator. Under torch.compile
// neither is called (rope.ops checks torch.compiler.is_compiling()).
//
// rope.apply on PyTorch tensors takes the same way, through apply_ (rope/_apply.py): at decode its
// DLPack exports, one per tensor, cost more than the kernel's launch. apply_ declines, besides
// rope_'s cases, any argument that is no torch.Tensor (a NumPy or CuPy array: rope.apply's DLPack
// way takes the call) and an inference tensor outside torch.inference_mode(), which rope.apply has
// always rotated and the operator refuses.
//
// The library is one file with operator.cpp: importing rope._torch_ops also
// registers the operators with PyTorch (TORCH_LIBRARY runs when it is loaded).
#include <cstdint>
#include <string_view>
#include <utility>

#include <nanobind/nanobind.h>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/empty_like.h>
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

// Whose arguments an entry reads: rope.ops' (every tensor argument a torch.Tensor or None) or
// rope.apply's (any array with __dlpack__: an argument that is no torch.Tensor is for rope.apply's
// own way through DLPack, which then takes the whole call).
enum class Caller { ops, apply };

// Each take_* reads one argument: false where the entries decline the call (the general way takes it).
// A tensor argument (q, k, cu_seqlens, starts, cos_sin_cache): None, or a plain tensor.
// Anything that is no torch.Tensor at all is, for rope.ops, an error naming the argument, as the operator's.
bool take_tensor(const char* name, nb::handle object, const at::Tensor*& tensor, Caller caller) {
    const PythonTensor unpacked = unpack_tensor(object.ptr());
    if (unpacked.kind == PythonTensorKind::other) {
        if (caller == Caller::apply) return false;
        rope::fail(name, Py_TYPE(object.ptr())->tp_name, "must be a torch.Tensor");
    }
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

// rope.ops.rope_'s, rope.ops.rope's and rope.apply's arguments, as given, read into @p tensors and
// @p scalars: false where the call must take the general way (nothing read but the arguments).
// @p key_holder keeps the config's key alive while scalars.config points into it. Throws rope::Error
// for a bad call.
bool take_call(nb::handle q, nb::handle k, nb::handle config, nb::handle positions, nb::handle layout,
               nb::handle cu_seqlens, nb::handle starts, nb::handle cp, nb::handle cos_sin_cache, nb::handle inverse,
               nb::handle backend, nb::handle max_position, Caller caller, CallTensors& tensors,
               CallScalars& scalars, nb::object& key_holder) {
    if (python_modes_active()) return false;
    // The tensors are borrowed from the arguments, which live until the call returns.
    if (!take_tensor("q", q, tensors.q, caller) || !take_tensor("k", k, tensors.k, caller)) return false;
    if (tensors.q == nullptr) {
        if (caller == Caller::apply) return false;
        rope::fail("q", "None", "must be a torch.Tensor");
    }
    if (!take_config(config, key_holder, scalars.config)) return false;
    // positions: None (from 0), an int offset, or a tensor of ids (other forms: converted in Python).
    if (!positions.is_none() && !take_int(positions, scalars.offset)) {
        const PythonTensor unpacked = unpack_tensor(positions.ptr());
        if (unpacked.kind != PythonTensorKind::plain) return false;
        tensors.ids = unpacked.tensor;
    }
    // The default layout: "thd" for a 3-dimensional (packed) q, else "bhsd", as rope.apply's.
    if (!take_text(layout, tensors.q->dim() == 3 ? "thd" : "bhsd", scalars.layout)) return false;
    if (!take_text(backend, "", scalars.backend)) return false;  // "": chosen by the tensors' device.
    if (!cp.is_none() && !(PyTuple_CheckExact(cp.ptr()) && PyTuple_GET_SIZE(cp.ptr()) == 2 &&
                           take_int(PyTuple_GET_ITEM(cp.ptr(), 0), scalars.cp_size) &&
                           take_int(PyTuple_GET_ITEM(cp.ptr(), 1), scalars.cp_rank)))
        return false;
    if (!take_int(max_position, scalars.max_position)) return false;
    const int inverse_value = PyObject_IsTrue(inverse.ptr());
    if (inverse_value < 0) {
        PyErr_Clear();
        return false;
    }
    scalars.inverse = inverse_value != 0;
    return take_tensor("cu_seqlens", cu_seqlens, tensors.cu_seqlens, caller) &&
           take_tensor("starts", starts, tensors.starts, caller) &&
           take_tensor("cos_sin_cache", cos_sin_cache, tensors.cos_sin_cache, caller);
}

#if ROPE_TORCH_OPS_CUDA
const Runner run = run_cuda;  // CUDA tensors on their device and stream; host tensors as run_host.
#else
const Runner run = run_host;
#endif

// rotate() with the GIL released: long host calls must not stall other Python threads (the
// tensors are held by the call's arguments and outputs).
void rotate_without_gil(const CallTensors& tensors, const CallScalars& scalars) {
    nb::gil_scoped_release no_gil;
    rotate(run, tensors, scalars);
}

bool is_inference(const at::Tensor* tensor) { return tensor != nullptr && tensor->is_inference(); }
bool records_grad(const at::Tensor* tensor) { return tensor != nullptr && tensor->requires_grad(); }

// The in-place call of rope.ops.rope_ or rope.apply, its arguments as given: true when the call ran,
// false when it must take the general way (nothing read but the arguments, nothing written). Raises
// rope.Error for a bad call.
bool in_place_eager(nb::handle q, nb::handle k, nb::handle config, nb::handle positions, nb::handle layout,
                    nb::handle cu_seqlens, nb::handle starts, nb::handle cp, nb::handle cos_sin_cache,
                    nb::handle inverse, nb::handle backend, nb::handle max_position, Caller caller) {
    try {
        CallTensors tensors;
        CallScalars scalars;
        nb::object key_holder;
        if (!take_call(q, k, config, positions, layout, cu_seqlens, starts, cp, cos_sin_cache, inverse, backend,
                       max_position, caller, tensors, scalars, key_holder))
            return false;
        // rope.apply has always rotated inference tensors outside torch.inference_mode() (through
        // DLPack, which PyTorch does not watch), which the operator refuses, and refused a tensor that
        // autograd tracks, naming the way out: its own way does both.
        if (caller == Caller::apply &&
            ((!c10::InferenceMode::is_enabled() && (is_inference(tensors.q) || is_inference(tensors.k))) ||
             (at::GradMode::is_enabled() && (records_grad(tensors.q) || records_grad(tensors.k)))))
            return false;
        rotate_without_gil(tensors, scalars);
        bump_version(*tensors.q);
        if (tensors.k != nullptr) bump_version(*tensors.k);
        return true;
    } catch (const rope::Error& error) {
        raise_rope_error(error);
    }
}

// rope.ops.rope_'s arguments: in_place_eager for rope.ops.
bool rope_eager(nb::handle q, nb::handle k, nb::handle config, nb::handle positions, nb::handle layout,
                nb::handle cu_seqlens, nb::handle starts, nb::handle cp, nb::handle cos_sin_cache, nb::handle inverse,
                nb::handle backend, nb::handle max_position) {
    return in_place_eager(q, k, config, positions, layout, cu_seqlens, starts, cp, cos_sin_cache, inverse, backend,
                          max_position, Caller::ops);
}

// rope.apply's arguments (an in-place call on the current stream: rope.apply declines out and stream
// itself): in_place_eager for rope.apply, which declines where an argument is no torch.Tensor.
bool apply_eager(nb::handle q, nb::handle k, nb::handle config, nb::handle positions, nb::handle layout,
                 nb::handle cu_seqlens, nb::handle starts, nb::handle cp, nb::handle cos_sin_cache, nb::handle inverse,
                 nb::handle backend, nb::handle max_position) {
    return in_place_eager(q, k, config, positions, layout, cu_seqlens, starts, cp, cos_sin_cache, inverse, backend,
                          max_position, Caller::apply);
}

// rope.ops.rope's arguments, as given: (q_rotated, k_rotated or None), new tensors, when the call
// ran; None when it must take the general way. That includes every call autograd must record (a
// tensor that requires grad, grad mode on): only the operator's autograd kernel builds the graph;
// without one, the Autograd dispatch key does nothing for the functional operator.
nb::object rope_functional_eager(nb::handle q, nb::handle k, nb::handle config, nb::handle positions,
                                 nb::handle layout, nb::handle cu_seqlens, nb::handle starts, nb::handle cp,
                                 nb::handle cos_sin_cache, nb::handle inverse, nb::handle backend,
                                 nb::handle max_position) {
    try {
        CallTensors tensors;
        CallScalars scalars;
        nb::object key_holder;
        if (!take_call(q, k, config, positions, layout, cu_seqlens, starts, cp, cos_sin_cache, inverse, backend,
                       max_position, Caller::ops, tensors, scalars, key_holder))
            return nb::none();
        if (at::GradMode::is_enabled() &&
            (records_grad(tensors.q) || records_grad(tensors.k) || records_grad(tensors.cos_sin_cache)))
            return nb::none();
        // The operator's outputs (outputs_like): empty tensors like q and k, written by the call.
        at::Tensor q_out = at::empty_like(*tensors.q), k_out;
        tensors.q_out = &q_out;
        if (tensors.k != nullptr) {
            k_out = at::empty_like(*tensors.k);
            tensors.k_out = &k_out;
        }
        rotate_without_gil(tensors, scalars);
        nb::object q_object = nb::steal(wrap_tensor(std::move(q_out)));
        if (!q_object.is_valid()) throw nb::python_error();
        if (tensors.k == nullptr) return nb::make_tuple(q_object, nb::none());
        nb::object k_object = nb::steal(wrap_tensor(std::move(k_out)));
        if (!k_object.is_valid()) throw nb::python_error();
        return nb::make_tuple(q_object, k_object);
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
    m.def("apply_", &rope_torch::apply_eager, "q"_a.none(), "k"_a.none(), "config"_a.none(), "positions"_a.none(),
          "layout"_a.none(), "cu_seqlens"_a.none(), "starts"_a.none(), "cp"_a.none(), "cos_sin_cache"_a.none(),
          "inverse"_a.none(), "backend"_a.none(), "max_position"_a.none(),
          "rope.apply's in-place arguments, as rope_'s: runs the operator's kernel on PyTorch tensors and returns "
          "True, or returns False having done nothing where rope.apply's DLPack way must take the call (an "
          "argument that is no torch.Tensor among them); raises rope.Error.");
    m.def("rope", &rope_torch::rope_functional_eager, "q"_a.none(), "k"_a.none(), "config"_a.none(),
          "positions"_a.none(), "layout"_a.none(), "cu_seqlens"_a.none(), "starts"_a.none(), "cp"_a.none(),
          "cos_sin_cache"_a.none(), "inverse"_a.none(), "backend"_a.none(), "max_position"_a.none(),
          "rope.ops.rope's arguments, as rope_'s: runs the functional operator's kernel without PyTorch's "
          "dispatcher and returns (q_rotated, k_rotated or None), or returns None having done nothing where "
          "PyTorch must see the call (autograd among them); raises rope.Error.");
}
