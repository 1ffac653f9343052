// cpu-naive's fused QK-RMSNorm + RoPE: plain loops, the readable specification.
// The lesson: tutorials/15_qk_norm/chapter.md.
//
// For q, then k; for every token (b, s); for every norm group of the token (one
// head, or all heads for QkNormKind::across_heads):
//   sum   = sum of x^2 over the group's features     (qk_norm_sum_of_squares: PyTorch's order)
//   r     = 1 / sqrt(sum / n + eps)                    (inverse_rms)
//   then for every head of the group and every pair (x, y) of its head row:
//   x, y  <- x * r, y * r, times the weight          (normalized_feature: rounded where the mode says)
//   (x, y) <- (x cos - y sin, y cos + x sin)          (rotate_normalized: cos/sin rounded where the mode says)
//   and the features past rotary_dim are normalised, not rotated.
// A qkv buffer's v slice is copied to v_out when the call asks for it.
#include "rope/detail/qk_norm_plan.hpp"

namespace rope::detail {

void run_qk_norm_cpu_naive(const QkNormPlan& plan) {
    dispatch_dtype(plan.rope.dtype, [&](auto storage) {
        using Storage = decltype(storage);
        const QkNormStep& step = plan.step;
        if (!plan.rope.empty()) {
            for (int which = 0; which < 2; ++which)
                for (int64_t b = 0; b < plan.rope.batch; ++b)
                    for (int64_t s = 0; s < plan.rope.seq; ++s)
                        for (int64_t group = 0; group < groups_per_token(step, which); ++group)
                            qk_norm_group<Storage>(step, plan.rope.angles, plan.rope.positions, which, b, group, s);
        }
        const Geometry& v = plan.v.in_geometry;
        for (int64_t b = 0; b < v.batch; ++b)
            for (int64_t h = 0; h < v.heads; ++h)
                for (int64_t s = 0; s < v.seq; ++s)
                    for (int64_t d = 0; d < v.head_dim; ++d) copy_v_element<Storage>(plan.v, b, h, s, d);
    });
}

}  // namespace rope::detail
