// Ladder step 6: the grid sized for the device, for long prompts and for decode.
//
// v5 launches one thread per (token, chunk). For a 4096-token prompt that is
// 65536 threads: about 500 per SM of an H200, a quarter of what an SM can keep
// resident, so fewer bytes are in flight than the memory system could serve.
// For a decode step (32 sequences, one token each) it is 512 threads: 2 blocks
// on a GPU with 132 SMs, each thread walking 40 heads one group after another.
//
// The kernel stays v5's; only the grid changes (grid_v6 in ladder.hpp): the
// heads of a token are split into groups, with as many groups as it takes to
// put a full load of threads on every SM, and blocks shrink until every SM
// has one. A long prompt keeps several heads per thread (cos/sin still shared);
// a decode step gets one head per thread and many small blocks. The grid is
// computed from the device's own SM count, not from a constant.
#include "ladder.cuh"

namespace ladder {

void launch_v6(const Problem& p, const Device& device) {
    launch_cos_sin_per_token(p, grid_v6(p, device));
}

}  // namespace ladder
