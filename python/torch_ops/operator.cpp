// rope's two PyTorch operators, registered in C++ the way a PyTorch C++
// extension registers its operators (pytorch/extension-cpp's muladd.cpp):
// TORCH_LIBRARY defines them, TORCH_LIBRARY_IMPL gives each dispatch key its
// kernel, and rope/ops.py adds what lives in Python: the fake implementations
// (torch.library.register_fake, for torch.compile) and the functional
// operator's backward (torch.library.register_autograd).
//
//   rope::apply_(q, k, ...) -> ()                rotates q and k in place
//   rope::apply(q, k, ...) -> (Tensor, Tensor)   returns the rotated q and k
//
// Both kernels are rotate() (operator.hpp): the arguments checked by the code
// rope.apply's arrays go through, then one rope::apply call. Registered in C++,
// a call goes from Python straight into PyTorch's dispatcher and on to the
// kernel, with no Python on the way (a Python-registered operator runs Python
// dispatch code on every call). Built by python/torch_ops/CMakeLists.txt when
// PyTorch is found; without it rope/ops.py registers the same schemas with
// torch.library.custom_op.
#include "operator.hpp"

#include <map>
#include <mutex>
#include <string>
#include <utility>

#include <ATen/DLConvertor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/core/InferenceMode.h>
#include <torch/library.h>

#include "config_key.hpp"

namespace rope_torch {

// The DLPack description of a tensor (PyTorch's own mapping of its dtypes), which call_args
// checks as it checks rope.apply's arrays; with @p fp8, an FP8 tensor as its uint8 codes.
rope_python::Array array_of(const char* name, const at::Tensor& tensor, bool written, std::string_view* fp8) {
    rope_python::Array array;
    array.data = written ? tensor.mutable_data_ptr() : const_cast<void*>(tensor.const_data_ptr());
    const at::ScalarType type = tensor.scalar_type();
    if (fp8 != nullptr && (type == at::kFloat8_e4m3fn || type == at::kFloat8_e5m2)) {
        array.dtype = {uint8_t(rope_python::dlpack::Code::UInt), 8, 1};
        *fp8 = type == at::kFloat8_e4m3fn ? "e4m3fn" : "e5m2";
    } else {
        DLDataType dtype{};
        try {
            dtype = at::getDLDataType(tensor);
        } catch (const c10::Error&) {
            rope::fail(std::string(name) + ".dtype", std::string(c10::toString(type)), "has no DLPack type");
        }
        array.dtype = {dtype.code, dtype.bits, dtype.lanes};
    }
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

// Positions, cu_seqlens and starts as users hold them: any integer dtype, any strides (a slice,
// an expand()ed row). rope reads contiguous int64, so any other is converted into @p converted,
// on the tensor's device and PyTorch's current stream there, the stream the call then runs on.
// Anything but integers is refused: a float position is never rounded to one.
const at::Tensor* index_tensor(const char* name, const at::Tensor* tensor, at::Tensor& converted) {
    if (tensor == nullptr) return nullptr;
    const at::ScalarType type = tensor->scalar_type();
    if (!at::isIntegralType(type, /*includeBool=*/false))
        rope::fail(name, c10::getDtypeNames(type).first, "must be integers (any integer dtype): never rounded");
    if (type == at::kLong && tensor->is_contiguous()) return tensor;
    converted = tensor->to(at::kLong).contiguous();
    return &converted;
}

namespace {


// --- Autograd and ADInplaceOrView for apply_: what custom_op registers for a Python operator -----
// apply_ is not differentiable (apply, the functional operator, is): below autograd, as custom_op's
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

void run_host(const rope::RopeConfig& config, rope_python::Call& call) {
    rope::apply(*call.backend, config, call.args);
}

std::tuple<at::Tensor, at::Tensor> outputs_like(const at::Tensor& q, const std::optional<at::Tensor>& k) {
    return {at::empty_like(q), k && k->defined() ? at::empty_like(*k) : at::empty({0}, q.options())};
}

void rotate(Runner run, const CallTensors& tensors, const CallScalars& scalars) {
    if (tensors.q == nullptr) rope::fail("q", "None", "must be a torch.Tensor");
    // An inference tensor has no version counter, and PyTorch allows no in-place update of one outside
    // torch.inference_mode(): refused here, before the rotation, rather than by the version bump after it.
    if (tensors.q_out == nullptr && !c10::InferenceMode::is_enabled()) {
        for (const auto& [name, tensor] : {std::pair{"q", tensors.q}, std::pair{"k", tensors.k}}) {
            if (tensor != nullptr && tensor->is_inference())
                rope::fail(name, "an inference tensor",
                           "is rotated in place outside torch.inference_mode(), which PyTorch does not allow: "
                           "clone it first, or call inside torch.inference_mode()");
        }
    }
    const rope::RopeConfig& config = config_for_key(scalars.config);
    at::Tensor converted[3];  // Index tensors converted to contiguous int64, held for the call.
    const at::Tensor* ids = index_tensor("positions", tensors.ids, converted[0]);
    const at::Tensor* cu_seqlens = index_tensor("cu_seqlens", tensors.cu_seqlens, converted[1]);
    const at::Tensor* starts = index_tensor("starts", tensors.starts, converted[2]);

    rope_python::Array arrays[8];
    auto take = [&](size_t slot, const char* name, const at::Tensor* tensor, bool written) -> const rope_python::Array* {
        if (tensor == nullptr) return nullptr;
        arrays[slot] = array_of(name, *tensor, written);
        return &arrays[slot];
    };
    const bool in_place = tensors.q_out == nullptr;
    rope_python::CallArrays call_arrays;
    call_arrays.q = take(0, "q", tensors.q, in_place);
    call_arrays.k = take(1, "k", tensors.k, in_place);
    call_arrays.q_out = take(2, "out[0]", tensors.q_out, true);
    call_arrays.k_out = take(3, "out[1]", tensors.k_out, true);
    // The names rope.apply gives them: the same message whichever way the call came.
    call_arrays.ids = take(4, "positions", ids, false);
    call_arrays.cu_seqlens = take(5, "cu_seqlens", cu_seqlens, false);
    call_arrays.starts = take(6, "starts", starts, false);
    call_arrays.cos_sin_cache = take(7, "cos_sin_cache", tensors.cos_sin_cache, false);
    const rope_python::CallOptions options{scalars.backend, scalars.layout,       scalars.offset,  scalars.cp_size,
                                           scalars.cp_rank, scalars.max_position, scalars.inverse, 0};
    rope_python::Call call = rope_python::prepare_call(config, call_arrays, options);
    run(config, call);
}

const rope::RopeConfig& config_for_key(std::string_view key) {
    // This thread's last key and its entry: a model passes one key (or a few) on every call, and
    // comparing it (a memcmp of some 200 bytes; PyTorch hands each call a fresh copy of the string,
    // so its address says nothing) is cheaper than the lock, the map, and parsing it again.
    thread_local std::string last_key;
    thread_local const rope::RopeConfig* last = nullptr;
    if (last != nullptr && key == last_key) return *last;

    static std::mutex mutex;
    // One entry per distinct configuration (a model has one or a few); std::map's nodes never move
    // and no entry is ever erased, so `last` stays valid.
    static std::map<std::string, rope::RopeConfig, std::less<>> configs;
    std::lock_guard<std::mutex> lock(mutex);
    auto found = configs.find(key);
    if (found == configs.end())  // A bad key throws here: nothing stored.
        found = configs.emplace(std::string(key), rope_python::config_from_key(key)).first;
    last_key.assign(key);
    last = &found->second;
    return *last;
}

}  // namespace rope_torch

TORCH_LIBRARY(rope, m) {
    m.set_python_module("rope.ops");  // Where the fake implementations live (torch.compile needs them).
    const char* arguments = "str config, SymInt offset, Tensor? ids, Tensor? cu_seqlens, Tensor? starts, "
                            "SymInt cp_size, SymInt cp_rank, Tensor? cos_sin_cache, str layout, bool inverse, "
                            "str backend, SymInt max_position)";
    m.def((std::string("apply_(Tensor(a0!) q, Tensor(a1!)? k, ") + arguments + " -> ()").c_str(),
          {at::Tag::pt2_compliant_tag});
    m.def((std::string("apply(Tensor q, Tensor? k, ") + arguments + " -> (Tensor, Tensor)").c_str(),
          {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(rope, CPU, m) {
    m.impl("apply_", &rope_torch::apply_in_place<&rope_torch::run_host>);
    m.impl("apply", &rope_torch::apply_functional<&rope_torch::run_host>);
}

#if !ROPE_TORCH_OPS_CUDA
// No CUDA kernel built (rope or PyTorch without CUDA): CUDA tensors still reach rope,
// whose message says why it cannot run them, rather than PyTorch's "no kernel".
TORCH_LIBRARY_IMPL(rope, CUDA, m) {
    m.impl("apply_", &rope_torch::apply_in_place<&rope_torch::run_host>);
    m.impl("apply", &rope_torch::apply_functional<&rope_torch::run_host>);
}
#endif

TORCH_LIBRARY_IMPL(rope, Autograd, m) {
    m.impl("apply_", torch::CppFunction::makeFromBoxedFunction<&rope_torch::below_autograd>());
}

TORCH_LIBRARY_IMPL(rope, ADInplaceOrView, m) {
    m.impl("apply_", torch::CppFunction::makeFromBoxedFunction<&rope_torch::bump_versions>());
}
