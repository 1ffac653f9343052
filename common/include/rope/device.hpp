#pragma once
/// @file device.hpp
/// @brief What this machine's CUDA can do: device count, why CUDA is unusable, synchronisation.

#include <string>

namespace rope {

/// @brief Number of CUDA devices usable here.
/// @return the CUDA device count (0 in a build without CUDA or on a machine without a GPU).
int cuda_device_count();

/// @brief Why CUDA is unusable here.
/// @return the reason ("built without CUDA ...", "no CUDA device ..."), or "" if CUDA is usable.
std::string cuda_unavailable_reason();

/// @brief Blocks until all work on the current CUDA device has finished (no-op in a build
/// without CUDA or on a machine without a CUDA device).
/// @throws rope::Error if the device reports an error (e.g. from an earlier asynchronous launch).
void cuda_synchronize();

}  // namespace rope
