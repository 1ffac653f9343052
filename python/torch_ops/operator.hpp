#pragma once
// torch.ops.rope.apply_ and torch.ops.rope.apply, the kernels: PyTorch tensors in,
// one rope::apply call.
//
// The kernel is written once (rotate), over what runs the call (run_host in
// operator.cpp; run_cuda in operator_cuda.cpp, which adds PyTorch's device guard
// and current stream); each file registers its instance for its dispatch key,
// and eager.cpp calls it without the dispatcher. The tensors are checked by the
// same code as rope.apply's arrays (python/src/call_args.hpp), so the messages
// are the same, and the call is rope::apply, the library's public entry point:
// the operator adds PyTorch's business (tensors, device, stream, version
// counters), nothing of the library's.
#include <cstdint>
#include <optional>
#include <string_view>
#include <tuple>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <c10/util/string_view.h>

#include <rope/rope.hpp>

#include "call_args.hpp"

namespace rope_torch {

/// The operator's tensors, borrowed from the caller, who holds them for the call; null for None.
///
/// Pointers, not copies: copying an at::Tensor that has a Python object moves its reference
/// count from 1 to 2, and PyTorch then takes the GIL to keep the Python object alive (and takes
/// it again when the copy goes): four GIL round trips per call for q and k, which a decode step
/// notices.
struct CallTensors {
    const at::Tensor* q = nullptr;              ///< Rotated (in place when q_out is null).
    const at::Tensor* k = nullptr;              ///< Rotated likewise; null: q only.
    const at::Tensor* q_out = nullptr;          ///< The functional operator's outputs; null: in place.
    const at::Tensor* k_out = nullptr;
    const at::Tensor* ids = nullptr;            ///< Positions by index (rope.ops: `positions`).
    const at::Tensor* cu_seqlens = nullptr;     ///< Packed sequences' boundaries.
    const at::Tensor* starts = nullptr;         ///< Each packed sequence's first position.
    const at::Tensor* cos_sin_cache = nullptr;  ///< A caller's cos/sin table.
};

/// @p tensor borrowed: null for none or an undefined tensor.
inline const at::Tensor* borrow(const std::optional<at::Tensor>& tensor) {
    return tensor && tensor->defined() ? &*tensor : nullptr;
}

/// The operator's scalar arguments, as its schema has them.
struct CallScalars {
    std::string_view config;  ///< rope.Config.key.
    int64_t offset = 0;
    int64_t cp_size = 1;
    int64_t cp_rank = 0;
    std::string_view layout;
    bool inverse = false;
    std::string_view backend;  ///< Empty: chosen by the tensors' device.
    int64_t max_position = 0;
};

/// The rope::RopeConfig of a rope.Config.key: parsed on the first call with that key and kept
/// for the process (a calling thread's last key is compared first, without the lock).
const rope::RopeConfig& config_for_key(std::string_view key);

/// What runs a checked call on its device: rope::apply, with what the device needs around it.
using Runner = void (*)(const rope::RopeConfig& config, rope_python::Call& call);

/// rope::apply on the host (its checks refuse CUDA tensors for a host backend).
void run_host(const rope::RopeConfig& config, rope_python::Call& call);
#if ROPE_TORCH_OPS_CUDA
/// rope::apply on the CUDA device of the call's tensors, on PyTorch's current stream there
/// (operator_cuda.cpp); a call without CUDA tensors runs as run_host.
void run_cuda(const rope::RopeConfig& config, rope_python::Call& call);
#endif

/// Both operators' work, whoever calls it (the dispatcher's kernels below, or the eager entry
/// of eager.cpp): checks every argument, then runs the call with @p run. Throws rope::Error,
/// naming the bad argument, before anything is written.
void rotate(Runner run, const CallTensors& tensors, const CallScalars& scalars);

inline std::string_view view(c10::string_view text) { return {text.data(), text.size()}; }

/// A rope::Error as c10::ValueError with rope's message (Python: ValueError, the base of
/// rope.Error), raised before anything is written: q and k are left as they were.
template <typename Call>
void raising_value_error(Call&& call) {
    try {
        call();
    } catch (const rope::Error& error) {
        TORCH_CHECK_VALUE(false, error.what());
    }
}

/// rope::apply_ (in place) for one dispatch key.
template <Runner run>
void apply_in_place(const at::Tensor& q, const std::optional<at::Tensor>& k, c10::string_view config, int64_t offset,
                    const std::optional<at::Tensor>& ids, const std::optional<at::Tensor>& cu_seqlens,
                    const std::optional<at::Tensor>& starts, int64_t cp_size, int64_t cp_rank,
                    const std::optional<at::Tensor>& cos_sin_cache, c10::string_view layout, bool inverse,
                    c10::string_view backend, int64_t max_position) {
    raising_value_error([&] {
        const CallTensors tensors{&q, borrow(k), nullptr, nullptr, borrow(ids), borrow(cu_seqlens), borrow(starts),
                                  borrow(cos_sin_cache)};
        rotate(run, tensors,
               {view(config), offset, cp_size, cp_rank, view(layout), inverse, view(backend), max_position});
    });
}

/// The functional operator's outputs: like q and k (an empty tensor for k's when k is None:
/// operators return tensors). rope/ops.py's fake implementation returns the same.
std::tuple<at::Tensor, at::Tensor> outputs_like(const at::Tensor& q, const std::optional<at::Tensor>& k);

/// rope::apply (functional: new outputs) for one dispatch key.
template <Runner run>
std::tuple<at::Tensor, at::Tensor> apply_functional(
    const at::Tensor& q, const std::optional<at::Tensor>& k, c10::string_view config, int64_t offset,
    const std::optional<at::Tensor>& ids, const std::optional<at::Tensor>& cu_seqlens,
    const std::optional<at::Tensor>& starts, int64_t cp_size, int64_t cp_rank,
    const std::optional<at::Tensor>& cos_sin_cache, c10::string_view layout, bool inverse, c10::string_view backend,
    int64_t max_position) {
    auto outputs = outputs_like(q, k);
    raising_value_error([&] {
        const at::Tensor* k_in = borrow(k);
        const CallTensors tensors{&q,          k_in,           &std::get<0>(outputs),
                                  k_in ? &std::get<1>(outputs) : nullptr,
                                  borrow(ids), borrow(cu_seqlens), borrow(starts), borrow(cos_sin_cache)};
        rotate(run, tensors,
               {view(config), offset, cp_size, cp_rank, view(layout), inverse, view(backend), max_position});
    });
    return outputs;
}

/// The DLPack description of @p tensor, which call_args checks as it checks rope.apply's
/// arrays; with @p fp8 non-null, a float8_e4m3fn or float8_e5m2 tensor is described as its
/// uint8 codes and its format written to @p fp8. @p name names it in errors.
rope_python::Array array_of(const char* name, const at::Tensor& tensor, bool written,
                            std::string_view* fp8 = nullptr);

/// Integer indices (positions, cu_seqlens, starts, a slot mapping) as rope reads them: int64
/// and contiguous, converted into @p converted otherwise (which allocates: a captured call
/// passes them so already); floats are refused, never rounded.
/// @return @p tensor, @p converted, or null when @p tensor is null.
const at::Tensor* index_tensor(const char* name, const at::Tensor* tensor, at::Tensor& converted);

}  // namespace rope_torch
