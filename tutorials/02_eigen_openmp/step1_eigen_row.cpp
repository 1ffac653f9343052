// Step 1: a head row as Eigen fixed-size arrays.
//
// cpu-naive rotates one pair at a time: x' = x cos - y sin, y' = y cos + x sin.
// With half-split pairs the x of pairs i..i+7 are eight adjacent floats, and so
// are their y (half a row further on). Eigen::Map views those floats in place
// as an Eigen::Array<float, 8, 1>, and one array expression rotates all eight
// pairs: the compiler turns each product and sum into SIMD instructions (two
// SSE2 or one AVX per term). A fixed size lets Eigen unroll the step
// completely and keep x, y, cos and sin in registers.
//
// The trigonometry is still cpu-naive's: std::cos and std::sin for every pair
// of every row, although every head at one position turns by the same angles.
#include <cmath>
#include <cstddef>
#include <vector>

#include <Eigen/Core>
#include <rope/rotation.hpp>

#include "ladder.hpp"

namespace ladder {

//! [eight pairs at once]
using Lanes = Eigen::Array<float, 8, 1>;

void rotate_row(float* row, const float* cos, const float* sin, int64_t pairs) {
    for (int64_t i = 0; i < pairs; i += 8) {
        Eigen::Map<Lanes> x(row + i), y(row + pairs + i);  // Features i.. and pairs + i..: no copy.
        const Eigen::Map<const Lanes> c(cos + i), s(sin + i);
        const Lanes rotated_x = x * c - y * s;  // rope::rotate_pair, eight pairs at once.
        y = y * c + x * s;                      // Still reads the x of before the rotation.
        x = rotated_x;
    }
}
//! [eight pairs at once]

void step1_eigen_row(const Problem& p) {
    std::vector<float> cos(std::size_t(p.pairs())), sin(std::size_t(p.pairs()));
    for (int64_t head = 0; head < p.heads(); ++head)
        for (int64_t token = 0; token < p.seq; ++token) {
            for (int64_t i = 0; i < p.pairs(); ++i) {
                // The same float32 angle as every backend: float(position) * theta_i.
                const float angle = rope::rope_angle(token, p.inv_freq[i]);
                cos[std::size_t(i)] = std::cos(angle);
                sin[std::size_t(i)] = std::sin(angle);
            }
            rotate_row(p.row(head, token), cos.data(), sin.data(), p.pairs());
        }
}

}  // namespace ladder
