#pragma once
// Factory functions of the backends the registry knows. Internal to the library:
// users create backends by name through rope::make_backend().
#include <memory>

#include "rope/backend.hpp"

namespace rope {

std::unique_ptr<Backend> make_cpu_naive_backend();
#if ROPE_HAVE_EIGEN
std::unique_ptr<Backend> make_cpu_eigen_backend(const BackendOptions& options);
#endif
#if ROPE_HAVE_CUDA
std::unique_ptr<Backend> make_cuda_naive_backend();
std::unique_ptr<Backend> make_cuda_optimized_backend();
#endif

}  // namespace rope
