#pragma once
/// @file detail/backend_factories.hpp
/// @brief For backend authors: the factory of every backend the registry knows.
/// Users create backends by name through rope::make_backend().
#include <memory>

#include "rope/backend.hpp"

namespace rope {

/// @brief cpu-naive (cpu/naive_backend.cpp). @return a new backend.
std::unique_ptr<Backend> make_cpu_naive_backend();
#if ROPE_HAVE_EIGEN
/// @brief cpu-eigen (cpu/eigen/backend.cpp). @param options worker threads. @return a new backend.
std::unique_ptr<Backend> make_cpu_eigen_backend(const BackendOptions& options);
#endif
#if ROPE_HAVE_CUDA
/// @brief cuda-naive (cuda/naive_backend.cu). @return a new backend.
std::unique_ptr<Backend> make_cuda_naive_backend();
/// @brief cuda-optimized (cuda/optimized/). @return a new backend.
std::unique_ptr<Backend> make_cuda_optimized_backend();
#endif

}  // namespace rope
