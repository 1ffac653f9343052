// Step 2: cos and sin once per position, shared by every head.
//
// The angle of pair i at position m is m * theta_i: it does not depend on the
// head. Step 1 computed it 40 times per position (32 query heads and 8 key
// heads), so this step first fills a table, one row of cos and one of sin per
// position, and then rotates every row of every head with its position's row
// of the table. The trigonometry shrinks by the number of heads; what is left
// is what RoPE fundamentally is, a few multiplications per element read from
// memory and written back.
//
// The table itself is filled with SIMD too: Eigen's .cos() and .sin() on a
// whole row of angles, several pairs per instruction, accurate to 2 float32
// ulps of std::cos and std::sin.
#include <cstddef>
#include <vector>

#include <Eigen/Core>
#include <rope/rotation.hpp>

#include "ladder.hpp"

namespace ladder {

//! [table]
// Row t of the table: cos and sin of every pair at position t.
void fill_table_row(const Problem& p, int64_t t, float* cos, float* sin) {
    Eigen::Map<Eigen::ArrayXf> angles(sin + t * p.pairs(), p.pairs());  // Computed in sin's row, then replaced.
    for (int64_t i = 0; i < p.pairs(); ++i) angles[i] = rope::rope_angle(t, p.inv_freq[i]);
    Eigen::Map<Eigen::ArrayXf>(cos + t * p.pairs(), p.pairs()) = angles.cos();
    angles = angles.sin();
}
//! [table]

void step2_table(const Problem& p) {
    std::vector<float> cos(std::size_t(p.seq * p.pairs())), sin(cos.size());
    for (int64_t t = 0; t < p.seq; ++t) fill_table_row(p, t, cos.data(), sin.data());
    //! [every head reads the table]
    for (int64_t head = 0; head < p.heads(); ++head)
        for (int64_t token = 0; token < p.seq; ++token)
            rotate_row(p.row(head, token), cos.data() + token * p.pairs(), sin.data() + token * p.pairs(), p.pairs());
    //! [every head reads the table]
}

}  // namespace ladder
