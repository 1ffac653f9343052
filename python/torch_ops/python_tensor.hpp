#pragma once
// The at::Tensor inside a Python torch.Tensor object, without DLPack and without
// PyTorch's dispatcher: what eager.cpp hands to the operator's kernel.
//
// A file of its own because PyTorch's header for it brings pybind11, which is
// kept apart from nanobind (eager.cpp): each file includes one binding library.
#include <optional>

#include <Python.h>

#include <ATen/core/Tensor.h>

namespace rope_torch {

/// The tensor @p object holds (shared, not copied: the same storage), or nullopt for None.
/// Throws rope::Error naming @p name when @p object is neither a torch.Tensor nor None.
std::optional<at::Tensor> tensor_or_none(const char* name, PyObject* object);

}  // namespace rope_torch
