#pragma once
// The at::Tensor inside a Python torch.Tensor object, without DLPack and without
// PyTorch's dispatcher: what eager.cpp hands to the operator's kernel, and how it
// tells a plain tensor from one that PyTorch must see through its dispatcher.
//
// A file of its own because PyTorch's header for it brings pybind11, which is
// kept apart from nanobind (eager.cpp): each file includes one binding library.
#include <Python.h>

#include <ATen/core/Tensor.h>

namespace rope_torch {

/// What a Python argument is, for the eager entry.
enum class PythonTensorKind {
    none,       ///< None.
    plain,      ///< A torch.Tensor itself, holding its own data: the kernel may take it.
    dispatched, ///< A subclass of torch.Tensor, or a tensor that a transform or tracer wraps (vmap,
                ///< functionalization, a Python-key tensor): only the dispatcher does it justice.
    other,      ///< Anything else (a NumPy array, a list): not a tensor.
};

/// A Python argument and, for a plain tensor, the at::Tensor the Python object holds: borrowed,
/// valid while the object lives (a call's arguments live until it returns), and not copied (see
/// CallTensors in operator.hpp for why).
struct PythonTensor {
    PythonTensorKind kind = PythonTensorKind::none;
    const at::Tensor* tensor = nullptr;  ///< Set for PythonTensorKind::plain only.
};

/// What @p object is: pointer reads, no reference taken.
PythonTensor unpack_tensor(PyObject* object);

/// A new Python torch.Tensor object for @p tensor (a new reference; PyTorch's THPVariable_Wrap).
PyObject* wrap_tensor(at::Tensor tensor);

/// True when a torch-function mode or a dispatch mode is active on this thread (they see every
/// operator call, so a call that skips the dispatcher would hide from them).
bool python_modes_active();

}  // namespace rope_torch
