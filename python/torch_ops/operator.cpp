// torch.ops.rope.apply_ registered in C++ (TORCH_LIBRARY): rope's in-place
// rotation of q and k as a PyTorch operator.
//
// Why C++: registered from Python (torch.library.custom_op), every call ran
// Python dispatch code on its way to the kernel, host time several times the
// kernel's own at a decode shape (the lab's notes: bench/results/h200.md.in).
// Registered here, torch.ops.rope.apply_(...) goes from Python straight into
// PyTorch's C++ dispatcher and on to the kernel below: no Python runs per call.
//
// The schema is the one custom_op inferred from the Python function it
// replaces (the same arguments, the mutation of q and k declared), so
// torch.compile, opcheck and every caller see the same operator. What stays in
// Python (rope/ops.py): the fake implementation (torch.library.register_fake,
// which set_python_module below points to) and the functional, differentiable
// rope::apply. Built by python/torch_ops/CMakeLists.txt when PyTorch is found;
// without it rope/ops.py registers the same schema with custom_op.
#include "operator.hpp"

#include <map>
#include <mutex>
#include <string>
#include <utility>

#include <ATen/DLConvertor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/InferenceMode.h>
#include <torch/library.h>

#include "config_key.hpp"

namespace rope_torch {
namespace {

// The DLPack description of a tensor (PyTorch's own mapping of its dtypes),
// which call_args checks as it checks rope.apply's arrays.
rope_python::Array array_of(const char* name, const at::Tensor& tensor, bool written) {
    rope_python::Array array;
    array.data = written ? tensor.mutable_data_ptr() : const_cast<void*>(tensor.const_data_ptr());
    DLDataType dtype{};
    try {
        dtype = at::getDLDataType(tensor);
    } catch (const c10::Error&) {
        rope::fail(std::string(name) + ".dtype", std::string(c10::toString(tensor.scalar_type())),
                   "has no DLPack type");
    }
    array.dtype = {dtype.code, dtype.bits, dtype.lanes};
    const c10::Device device = tensor.device();
    if (device.is_cpu()) {
        array.device_type = rope_python::dlpack::cpu;
    } else if (device.is_cuda()) {
        array.device_type = rope_python::dlpack::cuda;
        array.device_id = device.index();
    } else {
        rope::fail(std::string(name) + ".device", device.str(), "rope runs on the host (CPU) or on CUDA devices");
    }
    array.ndim = size_t(tensor.dim());
    array.shape = tensor.sizes().data();
    array.strides = tensor.strides().data();
    return array;
}

// --- Autograd and ADInplaceOrView: what custom_op registered for the Python operator ------
// Not differentiable (rope::apply, the functional operator, is): below autograd, as custom_op's
// forward_no_grad runs it, so a tensor that requires grad is rotated without a graph.
void below_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    at::AutoDispatchBelowAutograd guard;
    op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
}

// q and k change in place: their version counters move, so autograd refuses a backward
// through a graph that saved them before the rotation instead of using the rotated values.
void bump_versions(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    const size_t first = stack->size() - op.schema().arguments().size();
    const c10::IValue q = (*stack)[first], k = (*stack)[first + 1];
    {
        at::AutoDispatchBelowADInplaceOrView guard;
        op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
    }
    q.toTensor().unsafeGetTensorImpl()->bump_version();
    if (k.isTensor()) k.toTensor().unsafeGetTensorImpl()->bump_version();
}

}  // namespace

void run_host(const KeyedConfig& keyed, rope_python::Call& call) { run_plan(keyed, call, false); }

void rotate(Runner run, const CallTensors& tensors, std::string_view config, int64_t offset, int64_t cp_size,
            int64_t cp_rank, std::string_view layout, bool inverse, std::string_view backend, int64_t max_position) {
    // An inference tensor has no version counter, and PyTorch allows no in-place update of one outside
    // torch.inference_mode(): refused here, before the rotation, rather than by the version bump after it.
    if (!c10::InferenceMode::is_enabled()) {
        for (const auto& [name, tensor] : {std::pair{"q", tensors.q}, std::pair{"k", tensors.k}}) {
            if (tensor != nullptr && tensor->is_inference())
                rope::fail(name, "an inference tensor",
                           "is rotated in place outside torch.inference_mode(), which PyTorch does not allow: "
                           "clone it first, or call inside torch.inference_mode()");
        }
    }
    const KeyedConfig& keyed = config_for_key(config);
    const rope_python::CallOptions options{backend, layout, offset, cp_size, cp_rank, max_position, inverse, 0};
    rope_python::Call call = prepare(keyed.config, tensors, options);
    run(keyed, call);
}

const KeyedConfig& config_for_key(std::string_view key) {
    // This thread's last key and its entry: a model passes one key (or a few) on every call, and
    // comparing it (a memcmp of some 200 bytes; PyTorch hands each call a fresh copy of the string,
    // so its address says nothing) is cheaper than the lock and the map.
    thread_local std::string last_key;
    thread_local const KeyedConfig* last = nullptr;
    if (last != nullptr && key == last_key) return *last;

    static std::mutex mutex;
    // One entry per distinct configuration (a model has one or a few); std::map's nodes never move
    // and no entry is ever erased, so `last` stays valid.
    static std::map<std::string, KeyedConfig, std::less<>> configs;
    std::lock_guard<std::mutex> lock(mutex);
    auto found = configs.find(key);
    if (found == configs.end()) {
        KeyedConfig keyed{rope_python::config_from_key(key), std::nullopt};  // Throws for a bad key: nothing stored.
        keyed.frequencies = rope::detail::reusable_frequency_table(keyed.config);
        found = configs.emplace(std::string(key), std::move(keyed)).first;
    }
    last_key.assign(key);
    last = &found->second;
    return *last;
}

void run_plan(const KeyedConfig& keyed, const rope_python::Call& call, bool pointers_verified) {
    rope::Plan plan = rope::make_plan(keyed.config, call.args, call.backend->device(),
                                      keyed.frequencies ? &*keyed.frequencies : nullptr);
    plan.pointers_verified = pointers_verified;
    rope::detail::run_plan(*call.backend, plan);
}

rope_python::Call prepare(const rope::RopeConfig& config, const CallTensors& tensors,
                          const rope_python::CallOptions& options) {
    rope_python::Array arrays[6];
    auto take = [&](size_t slot, const char* name, const at::Tensor* tensor, bool written) -> const rope_python::Array* {
        if (tensor == nullptr) return nullptr;
        arrays[slot] = array_of(name, *tensor, written);
        return &arrays[slot];
    };
    if (tensors.q == nullptr) rope::fail("q", "None", "must be a torch.Tensor");
    rope_python::CallArrays call_arrays;
    call_arrays.q = take(0, "q", tensors.q, true);
    call_arrays.k = take(1, "k", tensors.k, true);
    // The names rope.apply and rope.ops.rope_ give them: the same message whichever way the call came.
    call_arrays.ids = take(2, "positions", tensors.ids, false);
    call_arrays.cu_seqlens = take(3, "cu_seqlens", tensors.cu_seqlens, false);
    call_arrays.starts = take(4, "starts", tensors.starts, false);
    call_arrays.cos_sin_cache = take(5, "cos_sin_cache", tensors.cos_sin_cache, false);
    return rope_python::prepare_call(config, call_arrays, options);
}

}  // namespace rope_torch

TORCH_LIBRARY(rope, m) {
    m.set_python_module("rope.ops");  // Where the fake implementation lives (torch.compile needs it).
    m.def("apply_(Tensor(a0!) q, Tensor(a1!)? k, str config, SymInt offset, Tensor? ids, Tensor? cu_seqlens, "
          "Tensor? starts, SymInt cp_size, SymInt cp_rank, Tensor? cos_sin_cache, str layout, bool inverse, "
          "str backend, SymInt max_position) -> ()",
          {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(rope, CPU, m) {
    m.impl("apply_", &rope_torch::apply_in_place<&rope_torch::run_host>);
}

#if !ROPE_TORCH_OPS_CUDA
// No CUDA kernel built (rope or PyTorch without CUDA): CUDA tensors still reach rope,
// whose message says why it cannot run them, rather than PyTorch's "no kernel".
TORCH_LIBRARY_IMPL(rope, CUDA, m) {
    m.impl("apply_", &rope_torch::apply_in_place<&rope_torch::run_host>);
}
#endif

TORCH_LIBRARY_IMPL(rope, Autograd, m) {
    m.impl("apply_", torch::CppFunction::makeFromBoxedFunction<&rope_torch::below_autograd>());
}

TORCH_LIBRARY_IMPL(rope, ADInplaceOrView, m) {
    m.impl("apply_", torch::CppFunction::makeFromBoxedFunction<&rope_torch::bump_versions>());
}
