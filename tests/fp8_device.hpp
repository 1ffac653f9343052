#pragma once
// rope's FP8 conversions run on the GPU (fp8_device.cu), for fp8_test.cpp to
// compare with the host's bits. Free of CUDA headers like cuda_helpers.hpp;
// in a build without CUDA the function throws (the test reaches it only once
// a CUDA backend is available).
#include <cstdint>
#include <vector>

namespace testing::cuda {

struct Fp8DeviceResults {
    std::vector<uint8_t> e4m3fn;           // float_to_e4m3fn(values[i])
    std::vector<uint8_t> e5m2;             // float_to_e5m2(values[i])
    std::vector<uint8_t> e4m3fn_quantized;  // quantize_fp8(values[i], scale, e4m3fn)
    std::vector<uint8_t> e5m2_quantized;    // quantize_fp8(values[i], scale, e5m2)
    std::vector<uint8_t> e4m3fn_quantizer;  // Fp8Quantizer<e4m3fn>(scale).quantize4, four values a thread
    std::vector<uint8_t> e5m2_quantizer;    // Fp8Quantizer<e5m2>(scale).quantize4
    std::vector<float> e4m3fn_decoded;     // e4m3fn_to_float(code), code = 0..255
    std::vector<float> e5m2_decoded;       // e5m2_to_float(code), code = 0..255
};

// Runs every conversion of rope/fp8.hpp on the current GPU: one thread per value, and
// Fp8Quantizer::quantize4 (the append kernel's) one thread per four values. Each kernel runs twice, over
// outputs poisoned with different bytes; an element neither run writes throws std::runtime_error.
Fp8DeviceResults fp8_on_device(const std::vector<float>& values, float scale);

}  // namespace testing::cuda
