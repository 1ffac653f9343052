// Step 6: asking for each head's rows ahead.
//
// Step 5's thread keeps four streams going, one per head, and leaves each after
// a visit of 1 KiB. The processor's own prefetchers follow a stream only once it
// has missed a few times in a row, and a stream left and resumed looks new: the
// first loads of each visit wait for memory. Here, before a row is rotated, the
// thread asks for the same head's row kPrefetchTokens further on
// (__builtin_prefetch: a hint that loads nothing into a register and cannot
// fault), so that by the time the walk gets there its lines are in the caches.
// cpu-eigen asks kPrefetchBytes (2 KiB) ahead in cpu/eigen/work_split.hpp: four
// of these rows, eight bf16 ones.
#include <algorithm>
#include <cstddef>
#include <vector>

#include "ladder.hpp"

namespace ladder {

constexpr int64_t kGroupHeads = 4;      // As step 4's kHeadsSideBySide.
constexpr int64_t kTokensPerVisit = 2;  // As step 5's.
constexpr int64_t kPrefetchTokens = 4;  // Rows of the same head ahead: 2 KiB of float32 rows at head_dim 128.

void step6_prefetch(const Problem& p) {
    std::vector<float> cos(std::size_t(p.seq * p.pairs())), sin(cos.size());
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < p.seq; ++t) fill_table_row(p, t, cos.data(), sin.data());

    //! [prefetch]
    const int64_t groups = (p.heads() + kGroupHeads - 1) / kGroupHeads;
    const int64_t line_floats = 64 / int64_t(sizeof(float));  // A cache line holds 16 floats.
#pragma omp parallel for schedule(static)
    for (int64_t group = 0; group < groups; ++group) {
        const int64_t first = group * kGroupHeads;
        const int64_t end = std::min(first + kGroupHeads, p.heads());
        for (int64_t visit = 0; visit < p.seq; visit += kTokensPerVisit) {
            const int64_t visit_end = std::min(visit + kTokensPerVisit, p.seq);
            for (int64_t head = first; head < end; ++head)
                for (int64_t token = visit; token < visit_end; ++token) {
                    if (token + kPrefetchTokens < p.seq) {  // A row of the tensor: the same head, further on.
                        const float* ahead = p.row(head, token + kPrefetchTokens);
                        for (int64_t f = 0; f < p.head_dim; f += line_floats) __builtin_prefetch(ahead + f);
                    }
                    rotate_row(p.row(head, token), cos.data() + token * p.pairs(), sin.data() + token * p.pairs(),
                               p.pairs());
                }
        }
    }
    //! [prefetch]
}

}  // namespace ladder
