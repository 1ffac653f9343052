// Chapter 12: the caller's cos/sin table.
//
// Serving engines precompute a table [max_position, rotary_dim] of cos and sin
// and hand it to the kernel, which then computes no angle at all. The chapter
// checks the table path on every backend available here against the float64
// formula reading the same table (tutorial.hpp), with real angles and with
// random ones, and reproduces the bugs that shipped (marked THE BUG): a kernel
// that ignores the table, an fp16 table, and a kernel that clamps ids past the
// table's end; each with the check that catches it.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <rope/rope.hpp>
#include <string>
#include <vector>

#include "every_backend.hpp"
#include "tutorial.hpp"

namespace {

using tutorial::Outcome;
using tutorial::PositionArrays;
using tutorial::Tensors;

constexpr double kPi = 3.14159265358979323846;

/// A table in the serving engines' format: row p = cos of the pairs' angles
/// at position p, then their sines; [rows, 2 * pairs], float32. angle(p, i)
/// gives the angles, computed in double and rounded once.
template <typename Angle>
std::vector<float> cos_sin_table(int64_t rows, int64_t pairs, Angle angle) {
    std::vector<float> table(size_t(rows * 2 * pairs));
    for (int64_t p = 0; p < rows; ++p)
        for (int64_t i = 0; i < pairs; ++i) {
            const double a = angle(p, i);
            table[size_t(p * 2 * pairs + i)] = float(std::cos(a));
            table[size_t(p * 2 * pairs + pairs + i)] = float(std::sin(a));
        }
    return table;
}

}  // namespace

int main(int argc, char** argv) {
    tutorial::print_title(12, "The caller's cos/sin table",
                          "with a caller's table rope reads each token's cos and sin from the row of its id; "
                          "random angles catch a kernel that ignores the table, and ids past the end are refused "
                          "(host) or give NaN (device), never a clamped, plausible rotation");
    (void)argc, (void)argv;  // No figure data.
    tutorial::Checks checks;
    tutorial::BugCount bugs;
    const tutorial::Backends backends = tutorial::every_backend();
    auto naive = rope::make_backend("cpu-naive");  // Where the bugs are reproduced.

    tutorial::print_section("A table of real angles, and one of random angles");
    // head_dim 128, rotary_dim 64 (32 pairs), a table of 64 positions; 24 tokens at scattered ids.
    rope::RopeConfig config;
    config.head_dim = 128;
    config.rotary_dim = 64;
    const int64_t rows = 64, pairs = 32;
    const std::vector<int64_t> token_ids{0, 1,  2,  3,  63, 62, 17, 5,  40, 41, 8,  33,
                                         9, 10, 60, 11, 12, 50, 13, 14, 27, 15, 16, 31};
    const Tensors x = tutorial::random_tensors(1, 24, 4, 2, 128, false, 809);
    const PositionArrays at_ids{.ids = token_ids};
    const std::vector<float> real = cos_sin_table(
        rows, pairs, [&](int64_t p, int64_t i) { return double(p) * std::pow(config.base, -2.0 * double(i) / 64.0); });
    std::mt19937 generator(810);  // Angles no formula would produce.
    std::uniform_real_distribution<double> any_angle(-kPi, kPi);
    std::vector<double> random_angles(size_t(rows * pairs));
    for (double& angle : random_angles) angle = any_angle(generator);
    const std::vector<float> random =
        cos_sin_table(rows, pairs, [&](int64_t p, int64_t i) { return random_angles[size_t(p * pairs + i)]; });
    std::printf("table [%ld rows, 64]: row p = cos of the 32 pairs' angles at p, then their sines (float32)\n",
                long(rows));
    struct Table {
        const char* name;
        const std::vector<float>& values;
    };
    for (const Table& table : {Table{"real angles p * theta_i", real}, Table{"random angles", random}})
        tutorial::expect_everywhere(checks, backends,
                                    std::string("table of ") + table.name + ": matches float64 with the table's cos/sin",
                                    [&](rope::Backend& backend) {
                                        return tutorial::matches_float64(backend, config, x, at_ids, table.values);
                                    });
    auto with_table = [&](const std::vector<float>& table) {
        return tutorial::reference(x.q, 4, x, config, at_ids, &table);
    };

    tutorial::print_section("Bugs, on cpu-naive");
    // THE BUG: a kernel that ignores the table and computes cos/sin from theta_i itself.
    const std::vector<float> ignored = tutorial::run(*naive, config, x, at_ids).q;
    const tutorial::Distance real_test = tutorial::distance(ignored, with_table(real));
    const tutorial::Distance random_test = tutorial::distance(ignored, with_table(random));
    std::printf("  table ignored:  test with real angles %s (%s), with random angles %s (%s)\n",
                real_test.within() ? "passes" : "FAILS", real_test.text().c_str(),
                random_test.within() ? "passes" : "FAILS", random_test.text().c_str());
    bugs.expect_caught(checks, real_test.within() && !random_test.within(),
                       "a kernel ignoring the table passes a real-angle test; the random-angle test catches it");
    // THE BUG: the table stored in fp16, as some engines did.
    std::vector<float> fp16_table = random;
    for (float& value : fp16_table) value = rope::to_float(rope::to_float16(value));
    const tutorial::Distance fp16 =
        tutorial::distance(tutorial::run(*naive, config, x, at_ids, fp16_table).q, with_table(random));
    std::printf("  fp16 table:     %s\n", fp16.text().c_str());
    bugs.expect_caught(checks, !fp16.within(), "an fp16 table: caught against float64 (10 bits of cos and sin)");
    std::vector<uint16_t> fp16_bits(random.size());
    for (size_t e = 0; e < random.size(); ++e) fp16_bits[e] = rope::to_float16(random[e]).bits;
    std::vector<float> q = x.q;
    auto q_view = rope::TensorView::contiguous(q.data(), rope::DType::f32, rope::Device::host, rope::Layout::bshd,
                                               {1, 24, 4, 128});
    auto k_view = rope::TensorView::contiguous(nullptr, rope::DType::f32, rope::Device::host, rope::Layout::bshd,
                                               {1, 24, 0, 128});
    rope::RopeArgs fp16_args = rope::RopeArgs::in_place(q_view, k_view, rope::Positions::shared(token_ids.data(), 24));
    fp16_args.cos_sin_cache = {fp16_bits.data(), rope::DType::f16, rope::Device::host, rows, 64, 64};
    std::string refusal;
    try {
        rope::apply(*naive, config, fp16_args);
    } catch (const rope::Error& error) {
        refusal = error.what();
    }
    std::printf("  rope given an fp16 table -> %s\n", refusal.c_str());
    checks.expect(!refusal.empty() && tutorial::identical(q, x.q), "rope refuses an fp16 table, naming cos_sin_cache.dtype");

    tutorial::print_section("Ids past the end of the table");
    std::vector<int64_t> beyond = token_ids;  // Id 64 in a table of 64 rows.
    beyond[4] = rows;
    const PositionArrays past_end{.ids = beyond};
    const Outcome refused = tutorial::run(*naive, config, x, past_end, real);
    std::printf("  host id 64, table of 64 rows -> %s\n", refused.error.c_str());
    checks.expect(!refused.error.empty() && tutorial::untouched(refused.q) && tutorial::untouched(refused.k),
                  "host ids past the table: a rope::Error, every output element untouched");
    // THE BUG: a kernel that clamps the id into the table: a plausible, wrong rotation.
    std::vector<int64_t> clamped = beyond;
    clamped[4] = rows - 1;
    const Outcome clamp = tutorial::run(*naive, config, x, {.ids = clamped}, real);
    bool token4_flagged = !clamp.error.empty();  // The out-of-range test: refused, or NaN in the token.
    for (int64_t e = 4 * 4 * 128; e < 5 * 4 * 128; ++e)
        if (e % 128 < 64) token4_flagged = token4_flagged || std::isnan(clamp.q[size_t(e)]);
    std::printf("  clamping kernel: token 4 silently gets row 63's rotation, finite and wrong\n");
    bugs.expect_caught(checks, !token4_flagged,
                       "a kernel clamping ids into the table fails the out-of-range test (a refusal or NaN, never a "
                       "finite rotation)");

    // On a device the ids cannot be checked before the launch: the kernels write NaN
    // into that token's rotated features, copy its pass-through features, and read nothing outside.
    bool any_cuda = false;
    const std::vector<double> want = with_table(real);
    for (const auto& backend : backends.available) {
        if (backend->device() != rope::Device::cuda) continue;
        any_cuda = true;
        const Outcome outcome = tutorial::run(*backend, config, x, past_end, real);
        bool nan_rotated = outcome.error.empty(), rest_right = outcome.error.empty();
        for (int64_t t = 0; t < 24; ++t)
            for (int64_t e = 0; e < 4 * 128; ++e) {
                const size_t at = size_t(t * 4 * 128 + e);
                const bool rotated = e % 128 < 64;
                if (t == 4 && rotated)
                    nan_rotated = nan_rotated && std::isnan(outcome.q[at]);
                else if (t == 4)
                    rest_right = rest_right && outcome.q[at] == x.q[at];
                else
                    rest_right = rest_right && std::fabs(outcome.q[at] - want[at]) < tutorial::kAbsTolerance;
            }
        checks.expect(nan_rotated && rest_right, backend->name() +
                                                     ": device id 64 past a 64-row table: NaN in that token's 64 "
                                                     "rotated features, its pass-through copied, every other token right");
    }
    if (!any_cuda)
        std::printf(
            "  device ids past the table (NaN in that token's rotated features): skipped, no CUDA backend "
            "runs here (%ld skipped above)\n",
            long(backends.skipped));

    return checks.finish("random angles expose an ignored table (" + random_test.text() + ") that real angles hide (" +
                         real_test.text() + "); an fp16 table is off by " + fp16.text() + "; " +
                         bugs.text());
}
