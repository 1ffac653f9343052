// The at::Tensor of a Python torch.Tensor: PyTorch's own unpacking (THPVariable_Unpack,
// the function every PyTorch binding uses), a pointer read, no copy.
#include "python_tensor.hpp"

#include <utility>

#include <ATen/PythonTorchFunctionTLS.h>
#include <c10/core/DispatchKeySet.h>
#include <c10/core/impl/TorchDispatchModeTLS.h>
#include <torch/csrc/autograd/python_variable.h>

namespace rope_torch {

PythonTensor unpack_tensor(PyObject* object) {
    if (object == Py_None) return {};
    if (!THPVariable_Check(object)) return {PythonTensorKind::other};
    // A subclass (FakeTensor, a user's wrapper) may override what an operator does to it.
    if (!THPVariable_CheckExact(object)) return {PythonTensorKind::dispatched};
    const at::Tensor& tensor = THPVariable_Unpack(object);
    // A plain torch.Tensor object may still wrap another tensor: vmap's batched tensors and
    // grad's wrappers (functorch), functionalization's, tensors with the Python key. Their data
    // is not where the tensor says; their dispatch keys say so.
    const c10::DispatchKeySet wrapped = c10::functorch_transforms_ks | c10::python_ks |
                                        c10::DispatchKeySet(c10::DispatchKey::Functionalize);
    if (tensor.key_set().has_any(wrapped)) return {PythonTensorKind::dispatched};
    return {PythonTensorKind::plain, &tensor};
}

PyObject* wrap_tensor(at::Tensor tensor) { return THPVariable_Wrap(std::move(tensor)); }

bool python_modes_active() {
    return at::impl::torch_function_mode_enabled() || c10::impl::TorchDispatchModeTLS::stack_len() > 0;
}

}  // namespace rope_torch
