// Chapter 0: the rotation.
//
// RoPE by hand, in float64, in four steps (chapter 1 hands the work to the library):
//   1. a 2-D rotation, and why two rotated vectors keep a dot product that
//      depends only on the difference of their angles;
//   2. a head vector as d/2 pairs, pair i turning by theta_i = base^(-2i/d) per token;
//   3. the relative-position property: the score q_m . k_n depends only on m - n;
//   4. the long-term decay of the score with distance.
#include <cmath>
#include <cstdio>
#include <vector>

#include <rope/rope.hpp>

#include "tutorial.hpp"

namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr int64_t kHeadDim = 64;  // d: features per head.
constexpr int64_t kPairs = kHeadDim / 2;
constexpr double kBase = 10000.0;  // rope_theta of the original RoFormer and LLaMA 1/2.

// ---------------------------------------------------------------------------
// 1. A 2-D rotation
// ---------------------------------------------------------------------------

struct Vec2 {
    double x, y;
};

// Turns v counter-clockwise by `angle` radians: the matrix [[cos, -sin], [sin, cos]].
Vec2 rotate(Vec2 v, double angle) {
    return {v.x * std::cos(angle) - v.y * std::sin(angle), v.x * std::sin(angle) + v.y * std::cos(angle)};
}

double dot(Vec2 a, Vec2 b) { return a.x * b.x + a.y * b.y; }

// ---------------------------------------------------------------------------
// 2. Pairs and their frequencies
// ---------------------------------------------------------------------------

// theta_i = base^(-2i/d): pair 0 turns one radian per token, the last pair
// almost base times slower. Each theta_i is computed directly, never by
// repeated multiplication (which would accumulate rounding).
double theta(int64_t i) { return std::pow(kBase, -2.0 * double(i) / double(kHeadDim)); }

// RoPE of one head vector at position m, half-split pairing (feature i pairs
// with feature i + d/2, as LLaMA and HuggingFace do): each pair is a Vec2
// rotated by m * theta_i.
std::vector<double> rotate_head(const std::vector<double>& x, double m) {
    std::vector<double> out(x.size());
    for (int64_t i = 0; i < kPairs; ++i) {
        const Vec2 turned = rotate({x[size_t(i)], x[size_t(i + kPairs)]}, m * theta(i));
        out[size_t(i)] = turned.x;
        out[size_t(i + kPairs)] = turned.y;
    }
    return out;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
    double sum = 0;
    for (size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
    return sum;
}

// The attention score of a query at position m and a key at position n.
double score(const std::vector<double>& q, double m, const std::vector<double>& k, double n) {
    return dot(rotate_head(q, m), rotate_head(k, n));
}

}  // namespace

int main(int argc, char** argv) {
    tutorial::print_title(0, "The rotation",
                          "rotate each pair of q and k by position * theta_i: q.k then depends only on the distance");
    tutorial::Checks checks;
    tutorial::Csv csv(tutorial::csv_path(argc, argv, "tutorial-00-rotation"));

    tutorial::print_section("1. A 2-D rotation");
    const Vec2 east{1, 0};
    const Vec2 north = rotate(east, kPi / 2);
    std::printf("(1, 0) turned by 90 degrees = (%.3f, %.3f)\n", north.x + 0.0, north.y);
    // Two vectors turned by a and by b: their dot product only sees b - a,
    // because R(a)^T R(b) = R(b - a). This is all of RoPE's relative-position trick.
    const Vec2 u{0.8, 0.6}, v{0.28, 0.96};
    std::printf("u = (0.8, 0.6), v = (0.28, 0.96), u.v = %.6f\n", dot(u, v));
    std::printf("%10s %10s %10s %20s\n", "a", "b", "b - a", "R(a)u . R(b)v");
    double spread_2d = 0;
    const double reference_2d = dot(u, rotate(v, 0.2));
    for (double a : {0.3, 1.3, 100.3, 12345.3}) {
        const double b = a + 0.2;
        const double d = dot(rotate(u, a), rotate(v, b));
        spread_2d = std::max(spread_2d, std::fabs(d - reference_2d));
        std::printf("%10.1f %10.1f %10.1f %20.12f\n", a, b, b - a, d);
    }
    checks.expect(spread_2d < 1e-9, "R(a)u . R(b)v = u . R(b-a)v for every a (largest deviation " +
                                        tutorial::sci(spread_2d) + ")");

    tutorial::print_section("2. A head is d/2 pairs, each with its own frequency");
    std::printf("d = %ld features = %ld pairs; pair i turns by theta_i = %.0f^(-2i/d) radians per token\n",
                long(kHeadDim), long(kPairs), kBase);
    std::printf("%4s %14s %20s\n", "i", "theta_i", "wavelength (tokens)");
    csv.table("spectrum: theta_i and wavelength 2 pi / theta_i of each pair, d = 64, base = 10000",
              "pair,theta,wavelength_tokens");
    for (int64_t i = 0; i < kPairs; ++i) {
        csv.row(i, theta(i), 2 * kPi / theta(i));
        if (i % 4 == 0 || i == kPairs - 1)
            std::printf("%4ld %14.6e %20.1f\n", long(i), theta(i), 2 * kPi / theta(i));
    }
    std::printf("Fast pairs tell neighbours apart; slow pairs (wavelength up to %.0f tokens) keep\n"
                "distant positions distinguishable. The library computes the same table once, in float32:\n",
                2 * kPi / theta(kPairs - 1));
    rope::RopeConfig config;
    config.head_dim = kHeadDim;
    config.base = kBase;
    const rope::FrequencyTable table = rope::make_frequency_table(config, 0);
    double table_error = 0;
    for (int64_t i = 0; i < kPairs; ++i)
        table_error = std::max(table_error, std::fabs(table.inv_freq[size_t(i)] - theta(i)) / theta(i));
    checks.expect(table_error <= 0x1p-24, "rope::make_frequency_table matches base^(-2i/d) to float32 rounding "
                                          "(largest relative difference " + tutorial::sci(table_error) + ")");

    tutorial::print_section("3. The score depends only on the distance m - n");
    const std::vector<float> q_values = tutorial::random_values(kHeadDim, 1);
    const std::vector<float> k_values = tutorial::random_values(kHeadDim, 2);
    const std::vector<double> q(q_values.begin(), q_values.end()), k(k_values.begin(), k_values.end());
    std::printf("q, k: random vectors of %ld features; q.k before any rotation = %.9f\n", long(kHeadDim), dot(q, k));
    std::printf("%10s %10s %8s %18s\n", "m (query)", "n (key)", "m - n", "score q_m . k_n");
    for (double m : {3.0, 10.0, 100.0, 1000.0, 100000.0})
        std::printf("%10.0f %10.0f %8.0f %18.12f\n", m, m - 3, 3.0, score(q, m, k, m - 3));
    // The check: many random (m, n), each compared with (m - n, 0).
    std::mt19937 generator(3);
    std::uniform_int_distribution<int64_t> position(0, 100000);
    const double scale = std::sqrt(dot(q, q) * dot(k, k));
    double worst = 0;
    for (int trial = 0; trial < 500; ++trial) {
        const double m = double(position(generator)), n = double(position(generator));
        worst = std::max(worst, std::fabs(score(q, m, k, n) - score(q, m - n, k, 0)) / scale);
    }
    checks.expect(worst < 1e-9, "q_m . k_n = q_(m-n) . k_0 for 500 random (m, n) up to 100000 (largest deviation " +
                                    tutorial::sci(worst) + " of |q||k|)");
    double norm_change = 0;
    for (double m : {1.0, 77.0, 4096.0, 1e6})
        norm_change = std::max(norm_change, std::fabs(std::sqrt(dot(rotate_head(q, m), rotate_head(q, m))) - std::sqrt(dot(q, q))));
    checks.expect(norm_change < 1e-12, "a rotation keeps the length of q (largest change " +
                                           tutorial::sci(norm_change) + ")");

    tutorial::print_section("4. Long-term decay: the score of a perfect match falls with distance");
    // Take q = k = (1, ..., 1): the key that matches the query best. Its score at
    // distance D is sum_i 2 cos(D theta_i), which we normalise by its value at
    // D = 0. RoFormer (section 3.4.3) bounds the score of any q, k by
    // max|h| * (2/d) * sum_j |S_j|, with S_j = sum_{i<j} exp(i D theta_i):
    // the "bound" column is that sum, which decays with distance.
    const std::vector<double> ones(kHeadDim, 1.0);
    auto relative_score = [&](double distance) { return score(ones, distance, ones, 0) / double(kHeadDim); };
    auto roformer_bound = [&](double distance) {
        double re = 0, im = 0, sum = 0;
        for (int64_t i = 0; i < kPairs; ++i) {
            re += std::cos(distance * theta(i));
            im += std::sin(distance * theta(i));
            sum += std::hypot(re, im);
        }
        return sum / double(kPairs);
    };
    csv.table("decay: relative score of q = k = ones and the RoFormer bound, by distance", "distance,score,bound");
    for (int distance = 0; distance <= 8192; ++distance)
        csv.row(distance, relative_score(distance), roformer_bound(distance));
    std::printf("%10s %16s %14s\n", "distance", "score / score(0)", "RoFormer bound");
    for (int distance : {0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192})
        std::printf("%10d %16.4f %14.3f\n", distance, relative_score(distance), roformer_bound(distance));
    // The decay in numbers: the average bound over far distances against near ones.
    auto mean_bound = [&](int from, int to) {
        double sum = 0;
        for (int distance = from; distance < to; ++distance) sum += roformer_bound(distance);
        return sum / double(to - from);
    };
    const double near = mean_bound(1, 16), far = mean_bound(1024, 8192);
    std::printf("mean bound over distances 1-15: %.3f, over 1024-8191: %.3f\n", near, far);
    checks.expect(far < 0.5 * near, "the bound decays: far distances average under half the near ones (" +
                                        tutorial::fixed(far, 3) + " vs " + tutorial::fixed(near, 3) + ")");
    csv.finish(checks);

    return checks.finish("q.k depends on m - n only (deviation " + tutorial::sci(worst, 1) + "); a perfect match keeps " +
                         tutorial::fixed(100 * relative_score(1024), 0) + "% at distance 1024");
}
