#pragma once
/// @file host_device.hpp
/// @brief Lets one small function body serve both the CPU and the GPU backends.
///
/// The pairing, position and rotation rules in common/ are the specification;
/// the CUDA kernels call the very same functions instead of re-deriving them,
/// so they are marked for both sides when compiled by nvcc.

#if defined(__CUDACC__)
/// Marks a function callable from host code and from CUDA device code.
#define ROPE_HOST_DEVICE __host__ __device__
#else
/// Marks a function callable from host code and from CUDA device code.
#define ROPE_HOST_DEVICE
#endif
