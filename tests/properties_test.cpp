// Properties of RoPE that any correct backend must show, whatever the inputs:
// each pair keeps its norm; the inverse undoes the forward rotation; and the
// score between q at position m and k at position n depends only on m - n.
#include <doctest/doctest.h>

#include <cmath>

#include "backend_tags.hpp"
#include "support.hpp"

TEST_CASE_TEMPLATE_DEFINE("properties: pair norms, inverse, relative position", B, properties) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    CAPTURE(testing::seed());
    for (rope::Style style : {rope::Style::half_split, rope::Style::interleaved}) {
        CAPTURE(rope::style_name(style));
        rope::RopeConfig config;
        config.head_dim = 128;
        config.style = style;

        SUBCASE("rotation preserves the norm of every pair") {
            testing::Call call = testing::make_call(config, rope::DType::f32, rope::Layout::bhsd, {2, 4, 64, 128},
                                                    {2, 2, 64, 128});
            call.offset = 1000;
            testing::run(*backend, call);
            const auto in = call.q.values(), out = call.q_out.values();
            double worst = 0;
            for (size_t row = 0; row < in.size() / 128; ++row) {
                for (int i = 0; i < 64; ++i) {
                    const int a = style == rope::Style::half_split ? i : 2 * i;
                    const int b = style == rope::Style::half_split ? i + 64 : 2 * i + 1;
                    const double before = std::hypot(in[row * 128 + a], in[row * 128 + b]);
                    const double after = std::hypot(out[row * 128 + a], out[row * 128 + b]);
                    worst = std::max(worst, std::fabs(after - before) / before);
                }
            }
            INFO("largest relative change of a pair norm: " << worst);
            CHECK(worst <= 1e-6);  // a few float32 roundings of cos, sin and the products
        }

        SUBCASE("inverse(forward(x)) == x") {
            testing::Call forward = testing::make_call(config, rope::DType::f32, rope::Layout::bshd, {1, 32, 4, 128},
                                                       {1, 32, 4, 128});
            forward.offset = 70000;
            forward.in_place = true;
            const auto original = forward.q.values();
            testing::run(*backend, forward);
            forward.direction = rope::Direction::inverse;
            testing::run(*backend, forward);
            const oracle::ErrorStats stats = oracle::compare(forward.q.values(), original);
            INFO("rel_l2 " << stats.rel_l2 << " max_abs " << stats.max_abs);
            CHECK(stats.rel_l2 <= 1e-6);
            CHECK(stats.max_abs <= 5e-6);
        }

        SUBCASE("q_m . k_n depends only on m - n") {
            // Batch b holds the same q and k vectors, q at position m + t_b and k at n + t_b.
            const int64_t shifts[] = {0, 1, 37, 1000, 20000};
            const int64_t batch = 5, m = 9, n = 2;
            testing::Call call = testing::make_call(config, rope::DType::f32, rope::Layout::bhsd, {batch, 1, 2, 128},
                                                    {batch, 1, 2, 128});
            for (testing::HostTensor* t : {&call.q, &call.k}) {
                float* data = reinterpret_cast<float*>(t->storage.data());
                for (int64_t b = 1; b < batch; ++b) std::copy(data, data + 2 * 128, data + b * 2 * 128);
            }
            for (int64_t t : shifts) {
                call.ids.push_back(m + t);
                call.ids.push_back(n + t);
            }
            call.id_rows = batch;
            testing::run(*backend, call);
            const auto q = call.q_out.values(), k = call.k_out.values();
            auto score = [&](int64_t b) {
                double dot = 0, qq = 0, kk = 0;
                for (int d = 0; d < 128; ++d) {
                    const double x = q[size_t(b * 256 + d)], y = k[size_t(b * 256 + 128 + d)];
                    dot += x * y;
                    qq += x * x;
                    kk += y * y;
                }
                return dot / std::sqrt(qq * kk);  // cosine similarity: scale-free
            };
            for (int64_t b = 1; b < batch; ++b) {
                CAPTURE(shifts[b]);
                // Float32 angles at position ~20000 are off by up to ~2.4e-3 radians.
                CHECK(std::fabs(score(b) - score(0)) <= 1e-5 + 1.2e-7 * double(shifts[b]));
            }
        }
    }
}
TEST_CASE_TEMPLATE_APPLY(properties, AllBackends);
