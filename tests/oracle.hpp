#pragma once
// The float64 oracle: an independent implementation of RoPE used only by tests.
//
// It deliberately shares no code with the backends or with common/'s plan and
// rotation helpers: it reads user-level arguments (RopeConfig, TensorView,
// Positions) with its own indexing, computes theta_i with exp/log instead of
// pow, rotates pairs as complex numbers in double precision, and converts
// fp16 with the compiler's _Float16 instead of rope's bit tricks. A backend
// that agrees with it therefore agrees with the formula, not with itself.
#include <vector>

#include "rope/config.hpp"
#include "rope/positions.hpp"
#include "rope/tensor.hpp"

namespace oracle {

// Reads element (b, h, s, d) of a host view, whatever its layout, strides and dtype.
double read(const rope::TensorView& view, long b, long h, long s, long d);

// Exact RoPE of one host tensor in float64; the result is dense in (batch, heads, seq, dim) order.
std::vector<double> rotate(const rope::RopeConfig& config, const rope::TensorView& x,
                           const rope::Positions& positions, rope::Direction direction);

// All elements of a host view as doubles, dense in (batch, heads, seq, dim) order.
std::vector<double> values(const rope::TensorView& view);

// Relative L2 error ||got - want|| / ||want|| and the largest absolute difference.
struct ErrorStats {
    double rel_l2 = 0;
    double max_abs = 0;
    long non_finite = 0;  // Elements of `got` that are NaN or inf (unwritten outputs are NaN).
};
ErrorStats compare(const std::vector<double>& got, const std::vector<double>& want);

}  // namespace oracle
