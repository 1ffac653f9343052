#pragma once
// rope's paired bf16 rounding (detail::round_pair_to) run on the GPU (rounding_device.cu),
// for qk_norm_test.cpp to compare with the host's round_to, bit for bit. Free of CUDA
// headers; in a build without CUDA the function throws (the test reaches it only once a
// CUDA backend is available).
#include <vector>

namespace testing::cuda {

// values[2i] and values[2i + 1] rounded to bf16 together by round_pair_to<bfloat16> on the
// current GPU (one thread per pair), widened back to float; an odd last value is paired with 0.
std::vector<float> bf16_pairs_on_device(const std::vector<float>& values);

}  // namespace testing::cuda
