// rope._torch_ops as a Python module: rope.ops.rope_'s way into the operator's
// kernel in plain eager code, without PyTorch's dispatcher.
//
// Why: torch.ops.rope.apply_(...) parses its 14 arguments against the schema and
// passes three dispatch keys (Autograd, ADInplaceOrView, then CPU or CUDA) before
// rope's kernel runs: a few microseconds per call even for PyTorch's own
// operators (python/bench/op_cost.py times torch.ops.aten.copy_ beside it), which
// a decode step of a few microseconds notices. Where nothing traces or transforms
// the call (rope.ops._eager says when), rope.ops.rope_ calls apply_ below
// instead: the same kernel (rotate, operator.hpp), the same checks and messages,
// on PyTorch's current stream, and what the two dispatch keys would have done:
// nothing for Autograd (apply_ is not differentiable), the version counters
// moved for ADInplaceOrView. Under torch.compile, a tensor subclass or a
// dispatch mode, rope.ops.rope_ calls torch.ops.rope.apply_ as before.
//
// The library is one file with operator.cpp: importing rope._torch_ops also
// registers rope::apply_ with PyTorch (TORCH_LIBRARY runs when it is loaded).
#include <cstdint>
#include <optional>
#include <string_view>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string_view.h>

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

void apply_eager(nb::handle q, nb::handle k, std::string_view config, int64_t offset, nb::handle ids,
                 nb::handle cu_seqlens, nb::handle starts, int64_t cp_size, int64_t cp_rank, nb::handle cos_sin_cache,
                 std::string_view layout, bool inverse, std::string_view backend, int64_t max_position) {
#if ROPE_TORCH_OPS_CUDA
    const Runner run = run_cuda;  // CUDA tensors on their device and stream; host tensors as run_host.
#else
    const Runner run = run_host;
#endif
    try {
        const std::optional<at::Tensor> q_tensor = tensor_or_none("q", q.ptr());
        if (!q_tensor) rope::fail("q", "None", "must be a torch.Tensor");
        const std::optional<at::Tensor> k_tensor = tensor_or_none("k", k.ptr());
        const std::optional<at::Tensor> ids_tensor = tensor_or_none("positions", ids.ptr());
        const std::optional<at::Tensor> cu_seqlens_tensor = tensor_or_none("cu_seqlens", cu_seqlens.ptr());
        const std::optional<at::Tensor> starts_tensor = tensor_or_none("starts", starts.ptr());
        const std::optional<at::Tensor> table_tensor = tensor_or_none("cos_sin_cache", cos_sin_cache.ptr());
        {
            // Long host calls must not stall other Python threads; the tensors are held above.
            nb::gil_scoped_release no_gil;
            rotate(run, *q_tensor, k_tensor, config, offset, ids_tensor, cu_seqlens_tensor, starts_tensor, cp_size,
                   cp_rank, table_tensor, layout, inverse, backend, max_position);
        }
        bump_version(*q_tensor);
        if (k_tensor) bump_version(*k_tensor);
    } catch (const rope::Error& error) {
        raise_rope_error(error);
    }
}

}  // namespace
}  // namespace rope_torch

NB_MODULE(_torch_ops, m) {
    m.doc() = "rope's C++ PyTorch operator (torch.ops.rope.apply_, registered on import) and its eager entry. "
              "Use rope.ops, not this module.";
    m.def("apply_", &rope_torch::apply_eager, "q"_a.none(), "k"_a.none(), "config"_a, "offset"_a, "ids"_a.none(),
          "cu_seqlens"_a.none(), "starts"_a.none(), "cp_size"_a, "cp_rank"_a, "cos_sin_cache"_a.none(), "layout"_a,
          "inverse"_a, "backend"_a, "max_position"_a,
          "torch.ops.rope.apply_'s kernel called without PyTorch's dispatcher (rope.ops.rope_ in eager code); "
          "raises rope.Error.");
}
