// Step 5: a visit of two rows per head.
//
// Step 4 reads four streams of memory, one per head, but leaves each after one
// row (512 bytes of features here) for the next head's. A processor follows a
// stream best when it stays on it: the prefetchers see more of it at once, and
// the memory serves longer runs. Here each head of the group takes
// kTokensPerVisit consecutive tokens before the next head; the table rows of
// those tokens (two here: 1 KiB) stay in L1 while the group's heads use them.
// cpu-eigen visits a head for 1 KiB of its rows (kVisitBytes in
// cpu/eigen/work_split.hpp): two of these rows, four bf16 ones.
#include <algorithm>
#include <cstddef>
#include <vector>

#include "ladder.hpp"

namespace ladder {

constexpr int64_t kGroupHeads = 4;      // As step 4's kHeadsSideBySide.
constexpr int64_t kTokensPerVisit = 2;  // Rows of one head read before the next head.

void step5_visits(const Problem& p) {
    std::vector<float> cos(std::size_t(p.seq * p.pairs())), sin(cos.size());
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < p.seq; ++t) fill_table_row(p, t, cos.data(), sin.data());

    //! [visits]
    const int64_t groups = (p.heads() + kGroupHeads - 1) / kGroupHeads;
#pragma omp parallel for schedule(static)
    for (int64_t group = 0; group < groups; ++group) {
        const int64_t first = group * kGroupHeads;
        const int64_t end = std::min(first + kGroupHeads, p.heads());
        for (int64_t visit = 0; visit < p.seq; visit += kTokensPerVisit) {
            const int64_t visit_end = std::min(visit + kTokensPerVisit, p.seq);
            for (int64_t head = first; head < end; ++head)
                for (int64_t token = visit; token < visit_end; ++token)
                    rotate_row(p.row(head, token), cos.data() + token * p.pairs(), sin.data() + token * p.pairs(),
                               p.pairs());
        }
    }
    //! [visits]
}

}  // namespace ladder
