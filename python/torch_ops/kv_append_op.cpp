// torch.ops.rope.append_kv_: RoPE fused with the paged KV-cache append, as a PyTorch operator.
//
//   rope::append_kv_(Tensor(a0!) q, Tensor(a1!) k, Tensor v, Tensor(a3!) k_cache, Tensor(a4!) v_cache,
//                    Tensor slot_mapping, ..., Tensor(a16!)? q_out, Tensor? q_scale, str q_out_dtype) -> ()
//
// q and k are rotated in place and the rotated k and v written into the caches: the schema
// declares all four mutations, so torch.compile orders the call against every other use of
// them (rope/ops.py registers its fake implementation, which returns nothing). With q_out (an
// FP8 tensor: torch.float8_e4m3fn / float8_e5m2, or uint8 with q_out_dtype named) the rotated q
// is written there alone, quantised with the dequantisation scales q_scale, and q is left as it
// was (still declared written: one schema for both forms). q_out, q_scale and q_out_dtype have no
// defaults: PyTorch hands a Python kernel its arguments without the trailing ones left at their
// defaults, and the version bump of rope/ops.py's registration (torch.library.custom_op) then
// finds no q_out to index. The alias sets are named by argument index, as custom_op names them,
// so both registrations print the same schema. The kernel
// checks the tensors with the code rope.append_kv's arrays go through
// (python/src/kv_append_args.hpp) and makes one rope::append_kv call. On CUDA it runs on
// PyTorch's current stream with no host synchronisation and no allocation (given int64,
// contiguous positions and slots, which are otherwise converted first), so a CUDA graph
// captures it. FP8 caches are torch.float8_e4m3fn / float8_e5m2 tensors, or uint8 tensors
// with cache_dtype named.
#include <optional>
#include <string>

#include <ATen/DLConvertor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/core/InferenceMode.h>
#include <torch/library.h>
#if ROPE_TORCH_OPS_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include "kv_append_args.hpp"
#include "operator.hpp"

namespace rope_torch {
namespace {

void run(rope_python::KvAppendCall& call, const rope::RopeConfig& config) {
#if ROPE_TORCH_OPS_CUDA
    if (call.cuda_device >= 0) {
        const auto device = static_cast<c10::DeviceIndex>(call.cuda_device);
        const c10::cuda::CUDAGuard guard(device);
        call.args.stream = c10::cuda::getCurrentCUDAStream(device).stream();
        rope::append_kv(*call.backend, config, call.args);
        return;
    }
#endif
    rope::append_kv(*call.backend, config, call.args);
}

void append_kv_in_place(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& k_cache,
                        const at::Tensor& v_cache, const at::Tensor& slot_mapping, c10::string_view config_key,
                        int64_t offset, const std::optional<at::Tensor>& ids,
                        const std::optional<at::Tensor>& k_scale, const std::optional<at::Tensor>& v_scale,
                        const std::optional<at::Tensor>& cos_sin_cache, c10::string_view kv_layout,
                        c10::string_view cache_dtype, c10::string_view backend, int64_t max_position,
                        const std::optional<at::Tensor>& q_out, const std::optional<at::Tensor>& q_scale,
                        c10::string_view q_out_dtype) {
    raising_value_error([&] {
        const at::Tensor* q_fp8 = borrow(q_out);
        if (!c10::InferenceMode::is_enabled())
            for (const auto& [name, tensor] :
                 {std::pair{q_fp8 ? "q_out" : "q", q_fp8 ? q_fp8 : &q}, std::pair{"k", &k},
                  std::pair{"k_cache", &k_cache}, std::pair{"v_cache", &v_cache}})
                if (tensor->is_inference())
                    rope::fail(name, "an inference tensor",
                               "is written in place outside torch.inference_mode(), which PyTorch does not allow: "
                               "clone it first, or call inside torch.inference_mode()");
        const rope::RopeConfig& config = config_for_key(view(config_key));
        at::Tensor converted[2];
        const at::Tensor* id_tensor = index_tensor("positions", borrow(ids), converted[0]);
        const at::Tensor* slots = index_tensor("slot_mapping", &slot_mapping, converted[1]);

        rope_python::Array arrays[12];
        std::string_view k_fp8, v_fp8, q_fp8_dtype;
        rope_python::KvAppendArrays call_arrays;
        arrays[0] = array_of("q", q, q_fp8 == nullptr);  // With an FP8 q_out, q is only read.
        arrays[1] = array_of("k", k, true);
        arrays[2] = array_of("v", v, false);
        arrays[3] = array_of("k_cache", k_cache, true, &k_fp8);
        arrays[4] = array_of("v_cache", v_cache, true, &v_fp8);
        arrays[5] = array_of("slot_mapping", *slots, false);
        call_arrays.rope.q = &arrays[0];
        call_arrays.rope.k = &arrays[1];
        call_arrays.v = &arrays[2];
        call_arrays.k_cache = &arrays[3];
        call_arrays.v_cache = &arrays[4];
        call_arrays.slot_mapping = &arrays[5];
        if (id_tensor) call_arrays.rope.ids = &(arrays[6] = array_of("positions", *id_tensor, false));
        if (borrow(k_scale)) call_arrays.k_scale = &(arrays[7] = array_of("k_scale", *k_scale, false));
        if (borrow(v_scale)) call_arrays.v_scale = &(arrays[8] = array_of("v_scale", *v_scale, false));
        if (borrow(cos_sin_cache))
            call_arrays.rope.cos_sin_cache = &(arrays[9] = array_of("cos_sin_cache", *cos_sin_cache, false));
        if (q_fp8) call_arrays.rope.q_out = &(arrays[10] = array_of("q_out", *q_fp8, true, &q_fp8_dtype));
        if (borrow(q_scale)) call_arrays.q_scale = &(arrays[11] = array_of("q_scale", *q_scale, false));

        rope_python::KvAppendOptions options;
        options.rope.backend = view(backend);
        options.rope.offset = offset;
        options.rope.max_position = max_position;
        options.kv_layout = view(kv_layout);
        // A float8 tensor names its format; a uint8 one takes cache_dtype's.
        const std::string_view named = view(cache_dtype);
        for (auto [fp8, field] : {std::pair{k_fp8, &options.k_cache_dtype}, std::pair{v_fp8, &options.v_cache_dtype}}) {
            if (!fp8.empty() && !named.empty() && rope_python::cache_dtype_named("cache_dtype", named) !=
                                                      rope_python::cache_dtype_named("cache_dtype", fp8))
                rope::fail("cache_dtype", std::string(named), "disagrees with the cache's float8 dtype");
            *field = fp8.empty() ? named : fp8;
        }
        // q_out is FP8 only: a float8 tensor names its format, a uint8 one takes q_out_dtype's.
        const std::string_view q_named = view(q_out_dtype);
        if (!q_fp8_dtype.empty() && !q_named.empty() &&
            rope_python::cache_dtype_named("q_out_dtype", q_named) !=
                rope_python::cache_dtype_named("q_out_dtype", q_fp8_dtype))
            rope::fail("q_out_dtype", "'" + std::string(q_named) + "'",
                       "disagrees with q_out.dtype torch.float8_" + std::string(q_fp8_dtype));
        if (q_fp8 && q_fp8_dtype.empty() && q_named.empty() && q_fp8->scalar_type() != at::kByte)
            rope::fail("q_out.dtype", "torch." + c10::getDtypeNames(q_fp8->scalar_type()).first,
                       "must be torch.float8_e4m3fn or float8_e5m2 (or uint8 with q_out_dtype): the FP8 output of q");
        options.q_out_dtype = q_fp8_dtype.empty() ? q_named : q_fp8_dtype;
        rope_python::KvAppendCall call = rope_python::prepare_kv_append(config, call_arrays, options);
        run(call, config);
    });
}

// Not differentiable: run below autograd (a tensor that requires grad is written without a graph).
void below_autograd(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    at::AutoDispatchBelowAutograd guard;
    op.redispatchBoxed(keys & c10::after_autograd_keyset, stack);
}

// Every argument the schema marks written (q, k, k_cache, v_cache, q_out when given) changed in place:
// its version moves.
void bump_versions(const c10::OperatorHandle& op, c10::DispatchKeySet keys, torch::jit::Stack* stack) {
    const auto& arguments = op.schema().arguments();
    const size_t first = stack->size() - arguments.size();
    std::vector<at::Tensor> written;
    for (size_t i = 0; i < arguments.size(); ++i)
        if (arguments[i].alias_info() && arguments[i].alias_info()->isWrite() && (*stack)[first + i].isTensor())
            written.push_back((*stack)[first + i].toTensor());
    {
        at::AutoDispatchBelowADInplaceOrView guard;
        op.redispatchBoxed(keys & c10::after_ADInplaceOrView_keyset, stack);
    }
    if (c10::InferenceMode::is_enabled()) return;
    for (const at::Tensor& tensor : written)
        if (!tensor.is_inference()) tensor.unsafeGetTensorImpl()->bump_version();
}

}  // namespace
}  // namespace rope_torch

TORCH_LIBRARY_FRAGMENT(rope, m) {
    m.set_python_module("rope.ops");  // Where the fake implementation lives (torch.compile needs it).
    m.def("append_kv_(Tensor(a0!) q, Tensor(a1!) k, Tensor v, Tensor(a3!) k_cache, Tensor(a4!) v_cache, "
          "Tensor slot_mapping, str config, SymInt offset, Tensor? ids, Tensor? k_scale, Tensor? v_scale, "
          "Tensor? cos_sin_cache, str kv_layout, str cache_dtype, str backend, SymInt max_position, "
          "Tensor(a16!)? q_out, Tensor? q_scale, str q_out_dtype) -> ()",
          {at::Tag::pt2_compliant_tag});
}

TORCH_LIBRARY_IMPL(rope, CPU, m) { m.impl("append_kv_", &rope_torch::append_kv_in_place); }
// On CUDA tensors the same kernel runs on PyTorch's current stream (run above); without a CUDA
// build rope's own message says why it cannot run them.
TORCH_LIBRARY_IMPL(rope, CUDA, m) { m.impl("append_kv_", &rope_torch::append_kv_in_place); }
TORCH_LIBRARY_IMPL(rope, Autograd, m) {
    m.impl("append_kv_", torch::CppFunction::makeFromBoxedFunction<&rope_torch::below_autograd>());
}
TORCH_LIBRARY_IMPL(rope, ADInplaceOrView, m) {
    m.impl("append_kv_", torch::CppFunction::makeFromBoxedFunction<&rope_torch::bump_versions>());
}
