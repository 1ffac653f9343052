// cpu-eigen's fused QK-RMSNorm + RoPE: cpu-naive's row step (rope/detail/qk_norm_plan.hpp),
// its norm groups shared out among OpenMP threads. A group (one head row, or all heads of a
// token) is the unit of work: its sum of squares must be complete before any of its
// features is written, so no group is split between threads.
#include <omp.h>

#include <algorithm>

#include "rope/detail/qk_norm_plan.hpp"

namespace rope::detail {
namespace {

// Below this many elements per thread a call is over before another thread wakes up.
constexpr int64_t kMinElementsPerThread = 16384;

int team_for(int64_t elements, int threads) {
    const int64_t available = threads > 0 ? threads : omp_get_max_threads();
    return int(std::clamp<int64_t>(elements / kMinElementsPerThread, 1, available));
}

}  // namespace

void run_qk_norm_cpu_eigen(const QkNormPlan& plan, int threads) {
    dispatch_dtype(plan.rope.dtype, [&](auto storage) {
        using Storage = decltype(storage);
        const QkNormStep& step = plan.step;
        const int64_t seq = plan.rope.seq, tokens = plan.rope.batch * seq;
        if (!plan.rope.empty()) {
            const int64_t q_groups = groups_per_token(step, 0), k_groups = groups_per_token(step, 1);
            const int64_t items = tokens * (q_groups + k_groups);
            const int team = team_for(plan.rope.q.in_geometry.numel() + plan.rope.k.in_geometry.numel(), threads);
#pragma omp parallel for schedule(static) num_threads(team)
            for (int64_t item = 0; item < items; ++item) {
                const int which = item < tokens * q_groups ? 0 : 1;
                const int64_t local = which == 0 ? item : item - tokens * q_groups;
                const int64_t groups = which == 0 ? q_groups : k_groups;
                const int64_t token = local / groups;
                qk_norm_group<Storage>(step, plan.rope.angles, plan.rope.positions, which, token / seq, local % groups,
                                       token % seq);
            }
        }
        const Operand& v = plan.v;
        const Geometry& g = v.in_geometry;
        const int64_t rows = g.batch * g.seq * g.heads;
#pragma omp parallel for schedule(static) num_threads(team_for(rows * g.head_dim, threads))
        for (int64_t row = 0; row < rows; ++row) {
            const int64_t h = row % g.heads, s = row / g.heads % g.seq, b = row / g.heads / g.seq;
            for (int64_t d = 0; d < g.head_dim; ++d) copy_v_element<Storage>(v, b, h, s, d);
        }
    });
}

}  // namespace rope::detail
