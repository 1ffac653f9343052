// Chapter 10: images and video in a language model, M-RoPE.
//
// Qwen2-VL's language model gives each token three positions (temporal,
// height, width), and each rotated pair turns with one of them. The chapter
// builds the ids of a prompt with text, an image and a video as HuggingFace's
// get_rope_index does (rope::mrope_position_ids), checks three models'
// M-RoPE on every backend available here against the float64 formula
// (tutorial.hpp), on text alone and on the mixed prompt, and reproduces the
// three bugs that shipped (marked THE BUG) with the test that catches each.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <rope/rope.hpp>
#include <string>
#include <vector>

#include "every_backend.hpp"
#include "tutorial.hpp"

namespace {

using tutorial::Outcome;
using tutorial::PositionArrays;
using tutorial::Tensors;
using tutorial::Verdict;

rope::RopeConfig mrope_config(int64_t rotary_dim, double base, rope::Style style, rope::AxisAssignment assignment,
                              std::vector<int64_t> sections) {
    rope::RopeConfig config;
    config.head_dim = 128;
    config.rotary_dim = rotary_dim;
    config.base = base;
    config.style = style;
    config.multi_axis = {assignment, std::move(sections)};
    return config;
}

/// The same head_dim, rotary_dim, base and pairing with one position per token.
rope::RopeConfig plain_of(rope::RopeConfig config) {
    config.multi_axis = {};
    return config;
}

}  // namespace

int main(int argc, char** argv) {
    tutorial::print_title(10, "Images and video in a language model: M-RoPE",
                          "each token has a temporal, a height and a width position and each pair turns with one "
                          "of them; on text the three are equal, so only a test with pictures sees a wrong row "
                          "or a wrong assignment");
    tutorial::Checks checks;
    tutorial::Csv csv(tutorial::csv_path(argc, argv, "tutorial-10-mrope"));
    tutorial::BugCount bugs;
    const tutorial::Backends backends = tutorial::every_backend();
    auto naive = rope::make_backend("cpu-naive");  // Where the bugs are reproduced.

    tutorial::print_section("The ids: get_rope_index");
    // 4 text tokens, an image of 6 x 8 patches (3 x 4 tokens after the 2 x 2 merge), 2 text
    // tokens, a video of 2 frames of 4 x 6 patches (2 x 3 tokens), and 3 text tokens.
    using Segment = rope::PromptSegment;
    const std::vector<Segment> prompt_segments{Segment::text(4), Segment::picture(1, 6, 8), Segment::text(2),
                                               Segment::picture(2, 4, 6), Segment::text(3)};
    const rope::MropePositionIds m = rope::mrope_position_ids(prompt_segments);
    const std::vector<int64_t>& ids = m.ids;
    const int64_t tokens = m.tokens;
    std::vector<int> kind;  // 0 text, 1 image, 2 video: the segments' tokens in order.
    for (const Segment& s : prompt_segments)
        kind.insert(kind.end(), size_t(s.text_tokens + s.grid_t * s.grid_h * s.grid_w / 4),
                    s.text_tokens ? 0 : s.grid_t > 1 ? 2 : 1);
    std::printf("text(4) image(1x3x4) text(2) video(2x2x3) text(3): %ld tokens, ids as get_rope_index makes them:\n",
                long(tokens));
    std::printf("  kind      ");
    for (int k : kind) std::printf(" %2s", k == 0 ? "T" : k == 1 ? "I" : "V");
    const char* names[] = {"temporal", "height", "width"};
    for (int64_t axis = 0; axis < 3; ++axis) {
        std::printf("\n  %-9s ", names[axis]);
        for (int64_t t = 0; t < tokens; ++t) std::printf(" %2ld", long(ids[size_t(axis * tokens + t)]));
    }
    const int64_t largest = *std::max_element(ids.begin(), ids.end());
    std::printf(
        "\nThe last id is %ld for %ld tokens: the next generated token is at %ld = %ld + rope_delta (%ld),\n"
        "on all three rows, and so on: decoding is plain RoPE with an offset.\n",
        long(largest), long(tokens), long(tokens + m.rope_delta), long(tokens), long(m.rope_delta));
    checks.expect(largest == 15 && m.rope_delta == -17,
                  "a picture's ids grow by its longest side, not its token count: 33 tokens end at id 15, "
                  "rope_delta -17");
    csv.table("M-RoPE ids of text(4) image(1x3x4) text(2) video(2x2x3) text(3); kind 0 text, 1 image, 2 video",
              "token,temporal,height,width,kind");
    for (int64_t t = 0; t < tokens; ++t)
        csv.row(t, ids[size_t(t)], ids[size_t(tokens + t)], ids[size_t(2 * tokens + t)], kind[size_t(t)]);

    tutorial::print_section("Three models, on text and on the prompt");
    // Qwen2-VL (contiguous [16, 24, 24], half-split pairs, base 1e6), Qwen3-VL (interleaved
    // [24, 20, 20], half-split, base 5e6) and GLM-4.1V (contiguous [8, 12, 12] over rotary_dim 64
    // of head_dim 128, interleaved pairs, base 10000).
    const rope::RopeConfig qwen2vl = mrope_config(0, 1e6, rope::Style::half_split,
                                                  rope::AxisAssignment::mrope_contiguous, {16, 24, 24});
    const rope::RopeConfig qwen3vl = mrope_config(0, 5e6, rope::Style::half_split,
                                                  rope::AxisAssignment::mrope_interleaved, {24, 20, 20});
    const rope::RopeConfig glm4v = mrope_config(64, 10000.0, rope::Style::interleaved,
                                                rope::AxisAssignment::mrope_contiguous, {8, 12, 12});
    const Tensors prompt = tutorial::random_tensors(1, tokens, 4, 2, 128, false, 806);
    const PositionArrays at_ids{.ids = ids, .axes = 3};
    // The text-only test: three equal rows 0..tokens-1 must give plain RoPE, bit for bit.
    const PositionArrays text_ids{.ids = rope::mrope_position_ids({Segment::text(tokens)}).ids, .axes = 3};
    auto text_check = [&](rope::Backend& backend, const rope::RopeConfig& config, const rope::RopeConfig& model) {
        const Outcome mrope = tutorial::run(backend, config, prompt, text_ids);
        const Outcome reference = tutorial::run(backend, plain_of(model), prompt, {});
        return tutorial::identical(mrope.q, reference.q) && tutorial::identical(mrope.k, reference.k);
    };
    struct Model {
        const char* name;
        const rope::RopeConfig& config;
    };
    for (const Model& model : {Model{"Qwen2-VL, contiguous [16,24,24], half-split", qwen2vl},
                               Model{"Qwen3-VL, interleaved [24,20,20], half-split", qwen3vl},
                               Model{"GLM-4.1V, contiguous [8,12,12] of rotary_dim 64, interleaved pairs", glm4v}}) {
        tutorial::expect_everywhere(
            checks, backends, std::string(model.name) + ": text-only = plain RoPE bit for bit; the prompt matches float64",
            [&](rope::Backend& backend) {
                const bool text = text_check(backend, model.config, model.config);
                const Verdict verdict = tutorial::matches_float64(backend, model.config, prompt, at_ids);
                return Verdict{text && verdict.passed, (text ? "text identical, " : "text DIFFERS, ") + verdict.detail};
            });
    }
    // Contiguous against interleaved sections, same frequencies: only the assignment differs.
    rope::RopeConfig contiguous_qwen3 = qwen3vl;  // Also THE BUG below: Qwen3-VL's sections taken as contiguous.
    contiguous_qwen3.multi_axis.assignment = rope::AxisAssignment::mrope_contiguous;
    const Outcome a = tutorial::run(*naive, contiguous_qwen3, prompt, at_ids);
    const Outcome b = tutorial::run(*naive, qwen3vl, prompt, at_ids);
    bool text_same = true;
    double vision_gap = 0;
    for (int64_t t = 0; t < tokens; ++t) {
        const std::vector<float> x = tutorial::token_rows(a.q, t, t + 1, 4 * 128);
        const std::vector<float> y = tutorial::token_rows(b.q, t, t + 1, 4 * 128);
        if (kind[size_t(t)] == 0)
            text_same = text_same && tutorial::identical(x, y);
        else
            vision_gap = std::max(vision_gap, tutorial::max_abs_difference(x, y));
    }
    std::printf("Sections [24,20,20] contiguous vs interleaved: text tokens %s, image/video tokens differ by up to %.2f\n",
                text_same ? "identical" : "DIFFER", vision_gap);
    checks.expect(text_same && vision_gap > 0.1,
                  "contiguous and interleaved sections agree on text (three equal ids: the axis does not matter) "
                  "and differ on images");

    tutorial::print_section("Three bugs that shipped, each run on cpu-naive");
    std::vector<int64_t> row0(ids.begin(), ids.begin() + tokens);  // THE BUG: row 0 three times.
    for (int copy = 0; copy < 2; ++copy) row0.insert(row0.end(), ids.begin(), ids.begin() + tokens);
    rope::RopeConfig half_split_glm = glm4v;  // THE BUG: half-split pairs hard-coded.
    half_split_glm.style = rope::Style::half_split;
    struct Bug {
        const char* name;
        const rope::RopeConfig& run_as;
        const rope::RopeConfig& model;
        PositionArrays call_ids;
        bool text_test_sees_it;
    };
    const std::vector<Bug> shipped{
        {"reads only row 0 of the ids (Qwen2-VL)", qwen2vl, qwen2vl, {.ids = row0, .axes = 3}, false},
        {"half-split pairs hard-coded (GLM-4.1V)", half_split_glm, glm4v, at_ids, true},
        {"interleaved sections run as contiguous (Qwen3-VL)", contiguous_qwen3, qwen3vl, at_ids, false}};
    std::printf("  %-52s %-16s %s\n", "bug", "text-only test", "image test (vs float64)");
    for (const Bug& bug : shipped) {
        const bool text_passes = text_check(*naive, bug.run_as, bug.model);
        const tutorial::Distance image = tutorial::distance(tutorial::run(*naive, bug.run_as, prompt, bug.call_ids).q,
                                                            tutorial::reference(prompt.q, 4, prompt, bug.model, at_ids));
        std::printf("  %-52s %-16s %s (%s)\n", bug.name, text_passes ? "passes" : "FAILS",
                    image.within() ? "passes" : "FAILS", image.text().c_str());
        bugs.expect_caught(checks, !image.within() && text_passes != bug.text_test_sees_it,
                           std::string(bug.name) + ": caught by the image test" +
                               (bug.text_test_sees_it ? " (and by the text-only one)" : ", invisible to a text-only test"));
    }
    csv.finish(checks);

    return checks.finish("33 tokens of text, image and video end at id 15 (rope_delta -17); " + bugs.text() +
                         ", 2 of them invisible to a text-only test; every model matches float64 on " +
                         std::to_string(backends.available.size()) + " backends");
}
