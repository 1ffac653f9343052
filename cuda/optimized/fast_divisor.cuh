#pragma once
/// @file fast_divisor.cuh
/// @brief Division by a divisor fixed at launch, with a multiply instead of a divide
/// (internal to the CUDA backends).
///
/// GPUs have no integer divide instruction: `n / d` on int64 compiles to a
/// software routine of dozens of instructions, more than the rest of a
/// short RoPE thread's work. When d is known on the host, n / d for n < 2^31
/// equals mulhi(n, m) >> shift for a precomputed m and shift (Granlund and
/// Montgomery; the same scheme as CUTLASS's FastDivmod), a couple of
/// instructions. Larger dividends, possible for tensors beyond 2^31
/// elements, take the ordinary 64-bit division: correctness never depends on
/// the fast path.

#include <cstdint>

#include "rope/host_device.hpp"

namespace rope::cuda_detail {

/// @brief A divisor in [1, 2^31) with its magic multiplier, built on the host, used on the device.
struct FastDivisor {
    int64_t divisor = 1;      ///< d.
    uint32_t multiplier = 0;  ///< ceil(2^(31 + ceil(log2 d)) / d); 0 when d == 1 or d >= 2^31.
    uint32_t shift = 0;       ///< ceil(log2 d) - 1.

    FastDivisor() = default;
    /// @brief Prepares division by @p d (d >= 1).
    explicit FastDivisor(int64_t d) : divisor(d) {
        if (d <= 1 || d >= (int64_t(1) << 31)) return;  // d == 1 needs no division; huge d takes the slow path.
        uint32_t log2 = 0;
        while ((int64_t(1) << log2) < d) ++log2;  // ceil(log2 d), in [1, 31].
        const uint32_t p = 31 + log2;
        multiplier = uint32_t(((uint64_t(1) << p) + uint64_t(d) - 1) / uint64_t(d));
        shift = p - 32;
    }

    /// @brief n / d for n >= 0.
    ROPE_HOST_DEVICE int64_t divide(int64_t n) const {
        if (divisor == 1) return n;
        if (multiplier != 0 && n < (int64_t(1) << 31)) return int64_t(mul_high(uint32_t(n), multiplier) >> shift);
        return n / divisor;
    }

private:
    // The upper 32 bits of the 64-bit product.
    ROPE_HOST_DEVICE static uint32_t mul_high(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
        return __umulhi(a, b);
#else
        return uint32_t((uint64_t(a) * uint64_t(b)) >> 32);
#endif
    }
};

}  // namespace rope::cuda_detail
