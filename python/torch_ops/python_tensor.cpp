// The at::Tensor of a Python torch.Tensor: PyTorch's own unpacking (THPVariable_Unpack,
// the function every PyTorch binding uses), a pointer read, no copy.
#include "python_tensor.hpp"

#include <torch/csrc/autograd/python_variable.h>

#include <rope/error.hpp>

namespace rope_torch {

std::optional<at::Tensor> tensor_or_none(const char* name, PyObject* object) {
    if (object == Py_None) return std::nullopt;
    // Subclasses of torch.Tensor pass as well (rope.ops takes this path only for plain tensors).
    if (!THPVariable_Check(object)) rope::fail(name, Py_TYPE(object)->tp_name, "must be a torch.Tensor");
    return THPVariable_Unpack(object);
}

}  // namespace rope_torch
