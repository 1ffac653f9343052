// Float64 RoPE for tests, written independently of the backends (see oracle.hpp).
#include "oracle.hpp"

#include <cmath>
#include <complex>
#include <cstdint>
#include <cstring>
#include <stdexcept>

namespace oracle {

namespace {

long element_index(const rope::TensorView& view, long b, long h, long s, long d) {
    // Strides are given in the order the layout names its axes.
    if (view.layout == rope::Layout::bhsd)
        return b * view.strides[0] + h * view.strides[1] + s * view.strides[2] + d * view.strides[3];
    return b * view.strides[0] + s * view.strides[1] + h * view.strides[2] + d * view.strides[3];
}

struct Sizes {
    long batch, heads, seq, dim;
};

Sizes sizes_of(const rope::TensorView& view) {
    if (view.layout == rope::Layout::bhsd) return {view.shape[0], view.shape[1], view.shape[2], view.shape[3]};
    return {view.shape[0], view.shape[2], view.shape[1], view.shape[3]};
}

}  // namespace

double read(const rope::TensorView& view, long b, long h, long s, long d) {
    const long i = element_index(view, b, h, s, d);
    switch (view.dtype) {
        case rope::DType::f32: return static_cast<const float*>(view.data)[i];
        case rope::DType::f16: {
            _Float16 half;
            std::memcpy(&half, static_cast<const uint16_t*>(view.data) + i, 2);
            return static_cast<double>(half);
        }
        case rope::DType::bf16: {
            // bfloat16 is the upper half of a float32.
            const uint32_t bits = uint32_t(static_cast<const uint16_t*>(view.data)[i]) << 16;
            float value;
            std::memcpy(&value, &bits, 4);
            return value;
        }
    }
    return NAN;
}

std::vector<double> values(const rope::TensorView& view) {
    const Sizes n = sizes_of(view);
    std::vector<double> out;
    out.reserve(size_t(n.batch * n.heads * n.seq * n.dim));
    for (long b = 0; b < n.batch; ++b)
        for (long h = 0; h < n.heads; ++h)
            for (long s = 0; s < n.seq; ++s)
                for (long d = 0; d < n.dim; ++d) out.push_back(read(view, b, h, s, d));
    return out;
}

std::vector<double> rotate(const rope::RopeConfig& config, const rope::TensorView& x,
                           const rope::Positions& positions, rope::Direction direction) {
    // The oracle's independence is in the rotation; the other scaling types'
    // frequencies are checked against HuggingFace's own (tests/scaling_test.cpp),
    // so refuse them here rather than silently rotating with unscaled ones.
    if (config.scaling.type != rope::ScalingType::none && config.scaling.type != rope::ScalingType::linear)
        throw std::invalid_argument("oracle::rotate supports scaling none and linear only");
    const Sizes n = sizes_of(x);
    const long rotary = config.rotary_dim == 0 ? config.head_dim : config.rotary_dim;
    const long half = rotary / 2;
    std::vector<double> theta(static_cast<size_t>(half));
    for (long i = 0; i < half; ++i) {
        theta[size_t(i)] = std::exp(-(2.0 * double(i) / double(rotary)) * std::log(config.base));
        if (config.scaling.type == rope::ScalingType::linear) theta[size_t(i)] /= config.scaling.factor;
    }
    const double sign = direction == rope::Direction::forward ? 1.0 : -1.0;

    std::vector<double> out = values(x);
    for (long b = 0; b < n.batch; ++b) {
        for (long s = 0; s < n.seq; ++s) {
            double position = double(positions.offset + s);
            if (positions.ids != nullptr)
                position = double(positions.ids[(positions.rows == 1 ? 0 : b) * positions.length + s]);
            for (long h = 0; h < n.heads; ++h) {
                double* row = out.data() + ((b * n.heads + h) * n.seq + s) * n.dim;
                for (long i = 0; i < half; ++i) {
                    const bool interleaved = config.style == rope::Style::interleaved;
                    const long first = interleaved ? 2 * i : i;
                    const long second = interleaved ? 2 * i + 1 : i + half;
                    const std::complex<double> z(row[first], row[second]);
                    const std::complex<double> turned = z * std::polar(1.0, sign * position * theta[size_t(i)]);
                    row[first] = turned.real();
                    row[second] = turned.imag();
                }
            }
        }
    }
    return out;
}

ErrorStats compare(const std::vector<double>& got, const std::vector<double>& want) {
    ErrorStats stats;
    double diff2 = 0, ref2 = 0;
    for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
        if (!std::isfinite(got[i])) {
            ++stats.non_finite;
            continue;
        }
        const double diff = got[i] - want[i];
        diff2 += diff * diff;
        ref2 += want[i] * want[i];
        stats.max_abs = std::max(stats.max_abs, std::fabs(diff));
    }
    if (got.size() != want.size()) stats.non_finite += long(got.size() > want.size() ? got.size() - want.size() : want.size() - got.size());
    stats.rel_l2 = ref2 > 0 ? std::sqrt(diff2 / ref2) : std::sqrt(diff2);
    return stats;
}

}  // namespace oracle
