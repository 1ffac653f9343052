// The operators on CUDA tensors: the kernels of operator.hpp, run where PyTorch
// would run its own: on the current stream of the tensors' device, with that
// device made current for the call (c10::cuda::CUDAGuard), so rope's kernel is
// ordered after the work PyTorch queued on q and k, and a CUDA graph capture on
// that stream records it. Built only when both rope and PyTorch have CUDA.
#include "operator.hpp"

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/library.h>

namespace rope_torch {

void run_cuda(const rope::RopeConfig& config, rope_python::Call& call) {
    if (call.cuda_device < 0) {  // A host backend, or no CUDA tensor for a CUDA backend: rope::apply says which.
        run_host(config, call);
        return;
    }
    const auto device = static_cast<c10::DeviceIndex>(call.cuda_device);
    const c10::cuda::CUDAGuard guard(device);
    call.args.stream = c10::cuda::getCurrentCUDAStream(device).stream();
    rope::apply(*call.backend, config, call.args);
}

}  // namespace rope_torch

TORCH_LIBRARY_IMPL(rope, CUDA, m) {
    m.impl("apply_", &rope_torch::apply_in_place<&rope_torch::run_cuda>);
    m.impl("apply", &rope_torch::apply_functional<&rope_torch::run_cuda>);
}
