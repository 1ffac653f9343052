// Step 3: OpenMP threads.
//
// Step 2 on every core. Both loops are independent iteration by iteration
// (each table row, each head row is written by one iteration only), so one
// pragma each splits them among threads:
//
// - the table: each thread fills a range of positions;
// - the rows: `collapse(2)` makes (head, token) one loop of heads x seq
//   iterations, and `schedule(static)` gives each thread one contiguous range
//   of it. In this layout (bhsd) consecutive iterations are consecutive rows
//   in memory, so each thread streams through one region of memory, the
//   access pattern the processor's prefetchers follow best.
//
// The end of the first loop is a barrier: no thread starts rotating before
// every row of the table is written.
//
// RoPE is bound by memory bandwidth, not arithmetic, so more threads help
// only while the memory system has bandwidth to spare: one core alone rarely
// keeps it busy, a few usually do. The step's threads are OpenMP's default
// (OMP_NUM_THREADS, else one per core).
#include <cstddef>
#include <vector>

#include "ladder.hpp"

namespace ladder {

void step3_openmp(const Problem& p) {
    std::vector<float> cos(std::size_t(p.seq * p.pairs())), sin(cos.size());
    //! [threads]
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < p.seq; ++t) fill_table_row(p, t, cos.data(), sin.data());

#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t head = 0; head < p.heads(); ++head)
        for (int64_t token = 0; token < p.seq; ++token)
            rotate_row(p.row(head, token), cos.data() + token * p.pairs(), sin.data() + token * p.pairs(), p.pairs());
    //! [threads]
}

}  // namespace ladder
