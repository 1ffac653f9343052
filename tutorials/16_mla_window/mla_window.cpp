// Chapter 16: DeepSeek's multi-head latent attention, a rotary window.
//
// DeepSeek-V2/V3/R1 rotate only part of each head: q's 192 features are
// [nope 128 | pe 64] and only the pe window turns (rotary_offset 128, rotary_dim
// 64); the key's pe part is one head shared by every q head. HuggingFace writes
// the rotated window de-interleaved (Style::interleaved_to_half), vLLM in GPT-J
// order in place. The chapter checks the window on every backend available here
// against the float64 formula (tutorial.hpp), shows that the two orders give the
// same attention scores and different cached bytes, rotates in place, and
// reproduces the bugs (marked THE BUG): a cache written in one order and read in
// the other, an in-place kernel that writes pair by pair, and a softmax scale
// without deepseek_yarn's multiplier; each with the check that catches it.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <rope/rope.hpp>
#include <string>
#include <vector>

#include "every_backend.hpp"
#include "tutorial.hpp"

namespace {

using tutorial::Outcome;
using tutorial::PositionArrays;
using tutorial::Tensors;

constexpr int64_t kNope = 128, kPe = 64, kHead = kNope + kPe, kPairs = kPe / 2;
constexpr int64_t kTokens = 12, kQHeads = 8;

/// DeepSeek-V3's q head: [nope 128 | pe 64], the window at 128, in the pairing @p style.
rope::RopeConfig mla(rope::Style style) {
    rope::RopeConfig config;
    config.head_dim = kHead;
    config.rotary_offset = kNope;
    config.rotary_dim = kPe;
    config.style = style;
    return config;
}

/// Attention scores of q head 0 against the one key head, over the pe window only
/// (the NoPE part's score does not depend on the rotation): scores[t][u] = q_t . k_u.
std::vector<double> pe_scores(const std::vector<float>& q, const std::vector<float>& k) {
    std::vector<double> scores(static_cast<size_t>(kTokens * kTokens));
    for (int64_t t = 0; t < kTokens; ++t)
        for (int64_t u = 0; u < kTokens; ++u) {
            double sum = 0;
            for (int64_t d = kNope; d < kHead; ++d)
                sum += double(q[size_t(t * kQHeads * kHead + d)]) * double(k[size_t(u * kHead + d)]);
            scores[size_t(t * kTokens + u)] = sum;
        }
    return scores;
}

/// Rotates `x` ([tokens, heads, 192], bshd, float32) in place on `backend`, at positions 0, 1, ...
/// (by -angle when @p direction is inverse: RoPE's backward pass).
std::vector<float> rotate_in_place(rope::Backend& backend, const rope::RopeConfig& config, std::vector<float> x,
                                   int64_t heads, rope::Direction direction = rope::Direction::forward) {
    const rope::Device device = backend.device();
    const rope::Buffer buffer = tutorial::on_device(device, x);
    const auto view = rope::TensorView::contiguous(buffer.data(), rope::DType::f32, device, rope::Layout::bshd,
                                                   {1, kTokens, heads, kHead});
    const auto none = rope::TensorView::contiguous(nullptr, rope::DType::f32, device, rope::Layout::bshd,
                                                   {1, kTokens, 0, kHead});
    rope::apply(backend, config, rope::RopeArgs::in_place(view, none, {}, direction));
    if (device == rope::Device::cuda) rope::cuda_synchronize();
    buffer.copy_to_host(x.data());
    return x;
}

/// THE BUG: HF's order rotated in place pair by pair, each pair written as soon as it is
/// rotated: pair i's outputs (i, i + 32) are the inputs of pairs i/2 and 16 + i/2, which
/// are overwritten before they are read.
std::vector<float> pair_by_pair_in_place(std::vector<float> x, int64_t heads) {
    for (int64_t row = 0; row < kTokens * heads; ++row) {
        float* window = x.data() + row * kHead + kNope;
        const int64_t position = row / heads;
        for (int64_t i = 0; i < kPairs; ++i) {
            const double angle = double(position) * std::pow(10000.0, -2.0 * double(i) / double(kPe));
            const float a = window[2 * i], b = window[2 * i + 1];
            window[i] = float(a * std::cos(angle) - b * std::sin(angle));
            window[kPairs + i] = float(b * std::cos(angle) + a * std::sin(angle));
        }
    }
    return x;
}

/// Softmax of one row of scores times `scale`.
std::vector<double> softmax(const std::vector<double>& scores, int64_t row, double scale) {
    std::vector<double> weights(static_cast<size_t>(kTokens));
    double largest = -INFINITY, sum = 0;
    for (int64_t u = 0; u < kTokens; ++u) largest = std::fmax(largest, scale * scores[size_t(row * kTokens + u)]);
    for (int64_t u = 0; u < kTokens; ++u)
        sum += weights[size_t(u)] = std::exp(scale * scores[size_t(row * kTokens + u)] - largest);
    for (double& w : weights) w /= sum;
    return weights;
}

}  // namespace

int main(int argc, char** argv) {
    tutorial::print_title(16, "DeepSeek's MLA: a rotary window",
                          "DeepSeek rotates a 64-feature window at feature 128 of q's 192 and one key head shared by "
                          "all; HF's de-interleaved order and vLLM's GPT-J order give the same scores and different "
                          "caches, and deepseek_yarn leaves part of its magnitude to the softmax scale");
    (void)argc, (void)argv;  // No figure data.
    tutorial::Checks checks;
    tutorial::BugCount bugs;
    const tutorial::Backends backends = tutorial::every_backend();
    auto naive = rope::make_backend("cpu-naive");

    tutorial::print_section("The window on every backend");
    // q: 12 tokens x 8 heads x [nope 128 | pe 64]; k: the same tokens, one head (k_pe shared by all q heads).
    const Tensors x = tutorial::random_tensors(1, kTokens, kQHeads, 1, kHead, false, 1601);
    const PositionArrays from_zero{};
    std::printf("q [12 tokens, 8 heads, 192], k [12 tokens, 1 head, 192]; features 128..191 rotate\n");
    for (rope::Style style : {rope::Style::interleaved, rope::Style::interleaved_to_half}) {
        const rope::RopeConfig config = mla(style);
        tutorial::expect_everywhere(
            checks, backends, std::string(rope::style_name(style)) + ": the window matches float64, one key head",
            [&](rope::Backend& backend) { return tutorial::matches_float64(backend, config, x, from_zero); });
        tutorial::expect_everywhere(checks, backends,
                                    std::string(rope::style_name(style)) + ": features 0..127 keep their bits",
                                    [&](rope::Backend& backend) {
                                        const Outcome out = tutorial::run(backend, config, x, from_zero);
                                        bool kept = out.error.empty();
                                        for (size_t e = 0; e < out.q.size(); ++e)
                                            if (int64_t(e) % kHead < kNope)
                                                kept = kept && std::memcmp(&out.q[e], &x.q[e], 4) == 0;
                                        return tutorial::Verdict{kept, kept ? "bit for bit" : "changed"};
                                    });
    }

    tutorial::print_section("HF's order and vLLM's order");
    const Outcome gptj = tutorial::run(*naive, mla(rope::Style::interleaved), x, from_zero);
    const Outcome hf = tutorial::run(*naive, mla(rope::Style::interleaved_to_half), x, from_zero);
    int64_t moved = 0;
    bool permutation = true;
    for (int64_t row = 0; row < kTokens * kQHeads; ++row)
        for (int64_t i = 0; i < kPairs; ++i) {
            const size_t window = size_t(row * kHead + kNope);
            // GPT-J keeps pair i at (2i, 2i+1); HF writes it at (i, i + 32).
            permutation = permutation && hf.q[window + size_t(i)] == gptj.q[window + size_t(2 * i)] &&
                          hf.q[window + size_t(kPairs + i)] == gptj.q[window + size_t(2 * i + 1)];
        }
    for (size_t e = 0; e < hf.q.size(); ++e) moved += hf.q[e] != gptj.q[e];
    const int64_t window_features = kTokens * kQHeads * kPe;
    std::printf("  %ld of the %ld rotated q features differ between the two orders\n", long(moved),
                long(window_features));
    checks.expect(permutation, "HF's window is GPT-J's window, evens then odds, bit for bit");
    const std::vector<double> hf_scores = pe_scores(hf.q, hf.k), gptj_scores = pe_scores(gptj.q, gptj.k);
    const double score_gap = tutorial::max_abs_difference(hf_scores, gptj_scores);
    std::printf("  scores q.k over the window: the orders differ by at most %s\n", tutorial::sci(score_gap).c_str());
    checks.expect(score_gap < 1e-5, "the two orders give the same attention scores (each sums the same products)");
    // THE BUG: q rotated in vLLM's order against keys cached in HF's order.
    const std::vector<double> mixed = pe_scores(gptj.q, hf.k);
    const double mixed_gap = tutorial::max_abs_difference(mixed, gptj_scores);
    std::printf("  q in GPT-J order against a cache in HF's order: scores off by up to %s\n",
                tutorial::sci(mixed_gap).c_str());
    bugs.expect_caught(checks, mixed_gap > 1e-2,
                       "a cache written in one order and read in the other: caught by comparing scores");

    tutorial::print_section("In place");
    const rope::RopeConfig hf_config = mla(rope::Style::interleaved_to_half);
    tutorial::expect_everywhere(checks, backends, "HF's order in place gives the out-of-place bits",
                                [&](rope::Backend& backend) {
                                    const std::vector<float> q = rotate_in_place(backend, hf_config, x.q, kQHeads);
                                    const bool same = tutorial::identical(q, tutorial::run(backend, hf_config, x, from_zero).q);
                                    return tutorial::Verdict{same, same ? "identical" : "different"};
                                });
    // The backward pass: the inverse reads HF's order and writes the interleaved one, the transpose.
    tutorial::expect_everywhere(checks, backends, "the inverse of HF's order in place gives the input back",
                                [&](rope::Backend& backend) {
                                    const std::vector<float> back = rotate_in_place(
                                        backend, hf_config, rotate_in_place(backend, hf_config, x.q, kQHeads), kQHeads,
                                        rope::Direction::inverse);
                                    const double error = tutorial::max_abs_difference(back, x.q);
                                    return tutorial::Verdict{error < 1e-6, "max abs " + tutorial::sci(error, 1)};
                                });
    const std::vector<double> want_q = tutorial::reference(x.q, kQHeads, x, hf_config, from_zero);
    const tutorial::Distance careless = tutorial::distance(pair_by_pair_in_place(x.q, kQHeads), want_q);
    std::printf("  pair-by-pair in-place writes: %s from float64\n", careless.text().c_str());
    bugs.expect_caught(checks, !careless.within(),
                       "an in-place kernel that writes each pair before reading the others: caught against float64");

    tutorial::print_section("deepseek_yarn: two magnitudes");
    rope::RopeConfig v3 = mla(rope::Style::interleaved_to_half);
    v3.scaling = {.type = rope::ScalingType::deepseek_yarn, .factor = 40.0, .original_max_position_embeddings = 4096,
                  .mscale = 1.0, .mscale_all_dim = 1.0};
    const double by_hand = std::pow(0.1 * 1.0 * std::log(40.0) + 1.0, 2);  // yarn_get_mscale(40, 1)^2
    const double multiplier = rope::softmax_scale_multiplier(v3.scaling);
    const float on_cos_sin = rope::make_frequency_table(v3, 0).attention_factor;
    std::printf("  cos/sin carry mscale(40, 1) / mscale(40, 1) = %.4f; the softmax scale needs %.4f\n",
                double(on_cos_sin), multiplier);
    checks.expect(on_cos_sin == 1.0f && std::fabs(multiplier - by_hand) < 1e-12,
                  "DeepSeek-V3: cos/sin magnitude 1, softmax multiplier (0.1 ln 40 + 1)^2 = " +
                      tutorial::fixed(by_hand, 4));
    // THE BUG: the softmax scale without the multiplier. The scores here are of random inputs;
    // the model's own are larger, and so is the damage.
    const double scale = 1.0 / std::sqrt(double(kHead));
    double weight_gap = 0;
    for (int64_t t = 0; t < kTokens; ++t)
        weight_gap = std::fmax(weight_gap, tutorial::max_abs_difference(softmax(hf_scores, t, scale * multiplier),
                                                                        softmax(hf_scores, t, scale)));
    std::printf("  attention weights without the multiplier: off by up to %s\n", tutorial::sci(weight_gap).c_str());
    bugs.expect_caught(checks, weight_gap > 1e-3,
                       "a softmax scale without deepseek_yarn's multiplier: caught against the model's attention");

    return checks.finish("the two orders differ in " + std::to_string(moved) + " of " + std::to_string(window_features) +
                         " rotated q features and by " + tutorial::sci(score_gap) + " in scores; the softmax needs x" +
                         tutorial::fixed(multiplier, 3) + "; " + bugs.text());
}
