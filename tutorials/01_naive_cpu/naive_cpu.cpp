// Chapter 1: naive CPU, the specification in loops.
//
// Chapter 0 rotated one vector by hand. A model rotates whole tensors: q and k
// of shape [batch, heads, seq, head_dim]. This chapter
//   1. writes RoPE for such a tensor as four nested loops, with the library's
//      three rules (pair_elements, rope_angle, rotate_pair);
//   2. runs the same thing through the library: rope::apply on the backend
//      "cpu-naive", whose source (cpu/naive_backend.cpp) is these loops;
//   3. checks both against the float64 formula;
//   4. shows the two pairing conventions, and what mixing them up does: nothing
//      crashes, and the attention the model computes is simply different.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include <rope/rope.hpp>

#include "tutorial.hpp"

namespace {

// A small attention layer's q and k: 2 sequences, 4 heads, 128 tokens, 64 features.
const tutorial::Shape kShape{.batch = 2, .heads = 4, .seq = 128, .head_dim = 64};

// RoPE in loops, in place, on a contiguous [batch, heads, seq, head_dim] tensor
// at positions 0..seq-1. This is the specification every backend must meet.
void rotate_in_loops(std::vector<float>& x, const tutorial::Shape& shape, const rope::RopeConfig& config) {
    // theta_i for every pair, computed once in double and rounded to float32.
    const rope::FrequencyTable table = rope::make_frequency_table(config, shape.seq);
    const int64_t rotary_dim = config.effective_rotary_dim();
    for (int64_t b = 0; b < shape.batch; ++b)
        for (int64_t h = 0; h < shape.heads; ++h)
            for (int64_t s = 0; s < shape.seq; ++s) {
                float* row = x.data() + ((b * shape.heads + h) * shape.seq + s) * shape.head_dim;
                const int64_t position = s;
                for (int64_t i = 0; i < rotary_dim / 2; ++i) {
                    //! [the three rules]
                    // The angle in float32, exactly as HuggingFace computes it.
                    const float angle = rope::rope_angle(position, table.inv_freq[size_t(i)]);
                    // Which two features form pair i: the pairing convention.
                    const rope::PairIndex pair = rope::pair_elements(config.style, rotary_dim, i);
                    rope::rotate_pair(row[pair.first], row[pair.second], std::cos(angle), std::sin(angle));
                    //! [the three rules]
                }
            }
}

// The same, through the library's public interface: describe the memory with a
// TensorView, pick a backend by name, call rope::apply.
void rotate_with_library(rope::Backend& backend, const rope::RopeConfig& config, std::vector<float>& q,
                         std::vector<float>& k, const tutorial::Shape& shape) {
    const auto layout = rope::Layout::bhsd;
    //! [through the library]
    auto q_view = rope::TensorView::contiguous(q.data(), rope::DType::f32, rope::Device::host, layout, shape.in(layout));
    auto k_view = rope::TensorView::contiguous(k.data(), rope::DType::f32, rope::Device::host, layout, shape.in(layout));
    rope::apply(backend, config, rope::RopeArgs::in_place(q_view, k_view));  // Positions 0..seq-1 by default.
    //! [through the library]
}

// softmax(q_m . k_n / sqrt(d)) over keys n = 0..m: what token m attends to
// (causal attention), for head row `head` of a rotated [batch*heads, seq, d] tensor.
std::vector<double> attention_of(const std::vector<float>& q, const std::vector<float>& k, int64_t head, int64_t m) {
    const int64_t d = kShape.head_dim;
    const float* query = q.data() + (head * kShape.seq + m) * d;
    std::vector<double> weights(size_t(m + 1));
    double largest = -INFINITY, total = 0;
    for (int64_t n = 0; n <= m; ++n) {
        const float* key = k.data() + (head * kShape.seq + n) * d;
        double score = 0;
        for (int64_t j = 0; j < d; ++j) score += double(query[j]) * double(key[j]);
        weights[size_t(n)] = score / std::sqrt(double(d));
        largest = std::max(largest, weights[size_t(n)]);
    }
    for (double& w : weights) total += (w = std::exp(w - largest));
    for (double& w : weights) w /= total;
    return weights;
}

// Rearranges each head row: even features first, then odd ones. Feature 2i goes
// to i and 2i+1 to i + d/2, so interleaved pairs become half-split pairs.
std::vector<float> deinterleave(const std::vector<float>& x, int64_t d) {
    std::vector<float> out(x.size());
    for (size_t row = 0; row < x.size() / size_t(d); ++row)
        for (int64_t i = 0; i < d / 2; ++i) {
            out[row * d + i] = x[row * d + 2 * i];
            out[row * d + i + d / 2] = x[row * d + 2 * i + 1];
        }
    return out;
}

std::vector<float> reinterleave(const std::vector<float>& x, int64_t d) {
    std::vector<float> out(x.size());
    for (size_t row = 0; row < x.size() / size_t(d); ++row)
        for (int64_t i = 0; i < d / 2; ++i) {
            out[row * d + 2 * i] = x[row * d + i];
            out[row * d + 2 * i + 1] = x[row * d + i + d / 2];
        }
    return out;
}

bool all_finite(const std::vector<float>& x) {
    for (float v : x)
        if (!std::isfinite(v)) return false;
    return true;
}

// What the planted-key experiment of section 4 measures.
struct Planted {
    double attention;       // Weight the last query gives to the planted key.
    int64_t most_attended;  // The key it attends to most.
    bool finite;            // No NaN or infinity anywhere in the rotated q and k.
};

// Plants, in head row 0, a key `distance` tokens before the last query that is
// exactly what that query looks for under the `trained` pairing (the query
// turned by `distance` positions, so that after RoPE the two align), then
// rotates q and k with the `used` pairing and measures the last query's attention.
Planted run_planted(rope::Backend& backend, const rope::RopeConfig& trained, const rope::RopeConfig& used,
                    std::vector<float> q, std::vector<float> k, int64_t distance) {
    const int64_t d = kShape.head_dim, last = kShape.seq - 1, target = last - distance;
    float* query = q.data() + last * d;
    float* key = k.data() + target * d;
    std::copy(query, query + d, key);
    auto key_view = rope::TensorView::contiguous(key, rope::DType::f32, rope::Device::host, rope::Layout::bhsd,
                                                 {1, 1, 1, d});
    auto no_k = rope::TensorView::contiguous(nullptr, rope::DType::f32, rope::Device::host, rope::Layout::bhsd,
                                             {1, 0, 1, d});  // Zero heads: rotate one tensor only.
    rope::apply(backend, trained, rope::RopeArgs::in_place(key_view, no_k, rope::Positions::starting_at(distance)));
    for (int64_t j = 0; j < d; ++j) query[j] *= 2.0f;  // A confident query: a sharper softmax.

    rotate_with_library(backend, used, q, k, kShape);
    const std::vector<double> attention = attention_of(q, k, 0, last);
    const auto top = std::max_element(attention.begin(), attention.end()) - attention.begin();
    return {attention[size_t(target)], int64_t(top), all_finite(q) && all_finite(k)};
}

}  // namespace

int main() {
    tutorial::print_title(1, "Naive CPU: the specification in loops",
                          "RoPE is four loops and one 2-D rotation; which features pair up is a convention you must match");
    tutorial::Checks checks;
    const std::vector<float> q_input = tutorial::random_values(size_t(kShape.numel()), 11);
    const std::vector<float> k_input = tutorial::random_values(size_t(kShape.numel()), 12);
    rope::RopeConfig config;
    config.head_dim = kShape.head_dim;  // base 10000, half-split pairs, no scaling: the defaults.

    tutorial::print_section("1. The loops");
    std::vector<float> q_loops = q_input, k_loops = k_input;
    rotate_in_loops(q_loops, kShape, config);
    rotate_in_loops(k_loops, kShape, config);
    std::printf("rotated q and k of shape [%ld, %ld, %ld, %ld] (batch, heads, seq, head_dim) in loops\n",
                long(kShape.batch), long(kShape.heads), long(kShape.seq), long(kShape.head_dim));

    tutorial::print_section("2. The same through the library: rope::apply on cpu-naive");
    auto naive = rope::make_backend("cpu-naive");
    std::vector<float> q_naive = q_input, k_naive = k_input;
    rotate_with_library(*naive, config, q_naive, k_naive, kShape);
    const double loops_vs_library = std::max(tutorial::max_abs_difference(q_loops, q_naive),
                                             tutorial::max_abs_difference(k_loops, k_naive));
    std::printf("largest |loops - cpu-naive| = %g (the same float32 operations in the same order)\n", loops_vs_library);
    checks.expect(loops_vs_library <= 1e-6, "our loops and cpu-naive agree");

    tutorial::print_section("3. Against the formula in float64");
    const tutorial::Formula formula{};  // half-split, base 10000, positions 0..seq-1
    const double error = std::max(tutorial::relative_l2(q_naive, tutorial::rope_float64(q_input, kShape, formula)),
                                  tutorial::relative_l2(k_naive, tutorial::rope_float64(k_input, kShape, formula)));
    std::printf("relative L2 error of cpu-naive against float64: %.2e\n", error);
    std::printf("(float32 keeps 24 bits, about 6e-8 relative; the angle m*theta_i is rounded once, which\n"
                " costs more as the position grows: chapter 7)\n");
    checks.expect(error < 2e-6, "cpu-naive matches the float64 formula (relative L2 < 2e-6)");

    tutorial::print_section("4. Two pairing conventions");
    std::printf("which features rotate together, for head_dim 8:\n");
    for (rope::Style style : {rope::Style::half_split, rope::Style::interleaved}) {
        std::printf("  %-12s (%s):", style == rope::Style::half_split ? "half-split" : "interleaved",
                    std::string(rope::style_name(style)).c_str());
        for (int64_t i = 0; i < 4; ++i) {
            const rope::PairIndex pair = rope::pair_elements(style, 8, i);
            std::printf(" (%ld,%ld)", long(pair.first), long(pair.second));
        }
        std::printf("\n");
    }
    std::printf("LLaMA, Qwen, Mistral in HuggingFace: half-split (rotate_half); GPT-J, Meta's original LLaMA\n"
                "code and ggml's default: interleaved.\n");

    // A model trained with half-split pairs has learned which key each query
    // must find. We plant one such relationship and run the "model" with the
    // right pairing and with the wrong one. Every call succeeds and every value
    // is a plausible number; only the attention tells them apart.
    rope::RopeConfig wrong = config;
    wrong.style = rope::Style::interleaved;
    std::printf("\nthe last token's query must find the key `distance` tokens back; attention it gets:\n");
    std::printf("  %8s %15s %15s %22s\n", "distance", "right pairing", "wrong pairing", "most attended (wrong)");
    double far_right = 0, far_wrong = 0;  // Distance 60, for the check and the key figure.
    bool quiet_failure = true;
    for (int64_t distance : {1, 3, 7, 30, 60, 120}) {
        const Planted right = run_planted(*naive, config, config, q_input, k_input, distance);
        const Planted mixed = run_planted(*naive, config, wrong, q_input, k_input, distance);
        std::printf("  %8ld %15.3f %15.3f %22ld\n", long(distance), right.attention, mixed.attention,
                    long(mixed.most_attended));
        quiet_failure = quiet_failure && mixed.finite && right.attention > 0.5;
        if (distance == 60) far_right = right.attention, far_wrong = mixed.attention;
    }
    std::printf("Nearby keys survive the mix-up (slow pairs barely turn over a few tokens); distant ones are\n"
                "lost. A model with swapped pairing can look fine on short prompts and fail on long ones.\n");
    checks.expect(quiet_failure && far_wrong < 0.1,
                  "the wrong pairing raises no error and yields finite values, yet at distance 60 the query "
                  "loses its key (attention " + tutorial::fixed(far_right) + " -> " +
                      tutorial::fixed(far_wrong) + ")");

    // Both conventions are valid RoPEs; they differ by a fixed reordering of the
    // features. Interleaved RoPE of x = half-split RoPE of x with its even
    // features moved first, moved back. Checkpoint converters (HuggingFace's
    // convert_llama_weights_to_hf.py) apply this reordering to the rows of W_q
    // and W_k once, so that a model trained interleaved runs with rotate_half.
    std::vector<float> q_moved = deinterleave(q_input, kShape.head_dim);
    std::vector<float> k_moved = deinterleave(k_input, kShape.head_dim);
    rotate_with_library(*naive, config, q_moved, k_moved, kShape);  // half-split
    std::vector<float> q_wrong = q_input, k_wrong = k_input;
    rotate_with_library(*naive, wrong, q_wrong, k_wrong, kShape);  // interleaved
    const double reorder_difference = std::max(
        tutorial::max_abs_difference(reinterleave(q_moved, kShape.head_dim), q_wrong),
        tutorial::max_abs_difference(reinterleave(k_moved, kShape.head_dim), k_wrong));
    std::printf("\ninterleaved RoPE(x) vs half-split RoPE(x reordered), reordered back: largest difference %g\n",
                reorder_difference);
    checks.expect(reorder_difference == 0.0,
                  "the two conventions are the same rotation up to a fixed reordering of features (exactly)");

    return checks.finish("wrong pairing, no error raised: attention on a key 60 tokens back " +
                         tutorial::fixed(far_right) + " -> " + tutorial::fixed(far_wrong));
}
