#pragma once
// torch.ops.rope.apply_, the kernel: PyTorch tensors in, one rope call.
//
// The kernel is written once (rotate), over what runs the prepared call
// (run_host in operator.cpp; run_cuda in operator_cuda.cpp, which adds
// PyTorch's device guard and current stream); each file registers its
// instance for its dispatch key, and eager.cpp calls it without the dispatcher. The tensors are checked by the same code as
// rope.apply's arrays (python/src/call_args.hpp), so the messages are the same.
// The call is rope::apply's two steps (make_plan, then the backend's run), taken
// here so that what is known beforehand is not recomputed per call: the
// configuration's frequency table is built once per key (KeyedConfig), and on
// CUDA the tensors' devices stand for the driver's pointer queries
// (Plan::pointers_verified; cuda/pointer_check.hpp says when that holds).
#include <cstdint>
#include <optional>
#include <string_view>

#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>
#include <c10/util/string_view.h>

#include <rope/detail/plan.hpp>
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
    const at::Tensor* q = nullptr;              ///< Rotated in place.
    const at::Tensor* k = nullptr;              ///< Rotated in place; null: q only.
    const at::Tensor* ids = nullptr;            ///< Positions by index (rope.ops: `positions`).
    const at::Tensor* cu_seqlens = nullptr;     ///< Packed sequences' boundaries.
    const at::Tensor* starts = nullptr;         ///< Each packed sequence's first position.
    const at::Tensor* cos_sin_cache = nullptr;  ///< A caller's cos/sin table.
};

/// @p tensor borrowed: null for none or an undefined tensor.
inline const at::Tensor* borrow(const std::optional<at::Tensor>& tensor) {
    return tensor && tensor->defined() ? &*tensor : nullptr;
}

/// The operator's scalar arguments and its tensors, checked and assembled.
rope_python::Call prepare(const rope::RopeConfig& config, const CallTensors& tensors,
                          const rope_python::CallOptions& options);

/// What a rope.Config.key stands for, read once per distinct key and kept for the process.
struct KeyedConfig {
    rope::RopeConfig config;  ///< python/src/config_key.hpp's reading of the key, validated.
    /// The frequency table every call of the configuration shares (rope::detail::reusable_frequency_table),
    /// so a call does not compute theta_i again; none for dynamic and longrope scaling (make_plan builds
    /// theirs per call, from the call's largest position).
    std::optional<rope::FrequencyTable> frequencies;
};

/// The KeyedConfig of a rope.Config.key: parsed on the first call with that key; later calls
/// find it without a parse (a calling thread's last key is compared first, without the lock).
/// The reference stays valid for the process.
const KeyedConfig& config_for_key(std::string_view key);

/// rope::apply's two steps for a prepared call: the plan (with the key's shared frequency table)
/// and the run. @p pointers_verified: the caller checked where every tensor lives (Plan::pointers_verified).
void run_plan(const KeyedConfig& keyed, const rope_python::Call& call, bool pointers_verified);

/// What runs a prepared call on its device.
using Runner = void (*)(const KeyedConfig& keyed, rope_python::Call& call);

/// Runs a prepared call on the host (rope::apply's checks refuse CUDA tensors for a host backend).
void run_host(const KeyedConfig& keyed, rope_python::Call& call);
#if ROPE_TORCH_OPS_CUDA
/// Runs a prepared call on the CUDA device of its tensors, on PyTorch's current stream there
/// (operator_cuda.cpp); a call without CUDA tensors runs as run_host.
void run_cuda(const KeyedConfig& keyed, rope_python::Call& call);
#endif

/// rope::apply_'s work, whoever calls it (the dispatcher's kernel below, or the eager entry of
/// eager.cpp): checks every argument, then runs the call with @p run. Throws rope::Error, naming
/// the bad argument, before anything is written.
void rotate(Runner run, const CallTensors& tensors, std::string_view config, int64_t offset, int64_t cp_size,
            int64_t cp_rank, std::string_view layout, bool inverse, std::string_view backend, int64_t max_position);

inline std::string_view view(c10::string_view text) { return {text.data(), text.size()}; }

/// rope::apply_ for one dispatch key. A rope::Error becomes c10::ValueError
/// with rope's message (Python: ValueError; rope.ops.rope_ raises it as rope.Error),
/// raised before anything is written: q and k are left as they were.
template <Runner run>
void apply_in_place(const at::Tensor& q, const std::optional<at::Tensor>& k, c10::string_view config, int64_t offset,
                    const std::optional<at::Tensor>& ids, const std::optional<at::Tensor>& cu_seqlens,
                    const std::optional<at::Tensor>& starts, int64_t cp_size, int64_t cp_rank,
                    const std::optional<at::Tensor>& cos_sin_cache, c10::string_view layout, bool inverse,
                    c10::string_view backend, int64_t max_position) {
    try {
        const CallTensors tensors{&q, borrow(k), borrow(ids), borrow(cu_seqlens), borrow(starts), borrow(cos_sin_cache)};
        rotate(run, tensors, view(config), offset, cp_size, cp_rank, view(layout), inverse, view(backend), max_position);
    } catch (const rope::Error& error) {
        TORCH_CHECK_VALUE(false, error.what());
    }
}

}  // namespace rope_torch
