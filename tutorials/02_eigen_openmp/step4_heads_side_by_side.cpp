// Step 4: four heads side by side.
//
// In step 3 a thread rotates all the rows of one head, token after token,
// then the next head: every row reads its token's row of the table again
// (512 bytes of cos and sin for 512 bytes of features, at head_dim 128), and
// the table (1 MiB here) is larger than a core's L1 cache, so those reads come
// from L2 or further, beside the row itself.
//
// Here a thread takes a group of kHeadsSideBySide heads and walks them
// together, token by token: at each token it reads the table row once and
// rotates that token's row of each of the four heads while the table row is
// in L1. The thread now reads four streams of memory at once (one per head),
// each still in order, which the processor's prefetchers follow as well.
// Step 5 stays on each stream longer: the walk cpu-eigen uses for this layout
// (cpu/eigen/work_split.hpp).
#include <algorithm>
#include <cstddef>
#include <vector>

#include "ladder.hpp"

namespace ladder {

constexpr int64_t kHeadsSideBySide = 4;

void step4_heads_side_by_side(const Problem& p) {
    std::vector<float> cos(std::size_t(p.seq * p.pairs())), sin(cos.size());
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < p.seq; ++t) fill_table_row(p, t, cos.data(), sin.data());

    //! [side by side]
    const int64_t groups = (p.heads() + kHeadsSideBySide - 1) / kHeadsSideBySide;
#pragma omp parallel for schedule(static)
    for (int64_t group = 0; group < groups; ++group) {
        const int64_t first = group * kHeadsSideBySide;
        const int64_t end = std::min(first + kHeadsSideBySide, p.heads());
        for (int64_t token = 0; token < p.seq; ++token) {
            const float* cos_row = cos.data() + token * p.pairs();
            const float* sin_row = sin.data() + token * p.pairs();
            for (int64_t head = first; head < end; ++head) rotate_row(p.row(head, token), cos_row, sin_row, p.pairs());
        }
    }
    //! [side by side]
}

}  // namespace ladder
