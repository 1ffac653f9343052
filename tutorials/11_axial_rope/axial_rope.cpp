// Chapter 11: axial RoPE, for vision towers and diffusion models.
//
// A patch has one coordinate per axis (row and column; frame, row and column),
// and each axis gets a RoPE of its own: a block of pairs whose frequency index
// restarts at the axis. The chapter builds the ids (rope::vision_position_ids
// for Qwen2-VL's vision tower, rope::axial_position_ids for a video latent),
// checks both on every backend available here against the float64 formula
// (tutorial.hpp), reproduces three mistakes (marked THE BUG) that the same
// comparison catches, and ends with the picture of which pair belongs to which
// axis under M-RoPE (chapter 10) and axial RoPE.
#include <cstdint>
#include <cstdio>
#include <rope/rope.hpp>
#include <string>
#include <vector>

#include "every_backend.hpp"
#include "tutorial.hpp"

namespace {

using tutorial::PositionArrays;
using tutorial::Tensors;

rope::RopeConfig multi_axis_config(int64_t head_dim, double base, rope::Style style, rope::AxisAssignment assignment,
                                   std::vector<int64_t> sections) {
    rope::RopeConfig config;
    config.head_dim = head_dim;
    config.base = base;
    config.style = style;
    config.multi_axis = {assignment, std::move(sections)};
    return config;
}

}  // namespace

int main(int argc, char** argv) {
    tutorial::print_title(11, "Axial RoPE: vision towers and diffusion models",
                          "each axis of a patch grid is a RoPE of its own, its frequency index restarting; swapped "
                          "axes, an index that does not restart and the wrong pairing all fail a float64 check on "
                          "a non-square grid");
    tutorial::Checks checks;
    tutorial::Csv csv(tutorial::csv_path(argc, argv, "tutorial-11-axial-rope"));
    tutorial::BugCount bugs;
    const tutorial::Backends backends = tutorial::every_backend();
    auto naive = rope::make_backend("cpu-naive");  // Where the mistakes are reproduced.

    tutorial::print_section("Qwen2-VL's vision tower: 2-D");
    // head_dim 80, pairs (i, i+40); pairs 0-19 turn with the patch's row, 20-39 with its
    // column, theta_j = 10000^(-j/20) on each.
    const rope::RopeConfig vision =
        multi_axis_config(80, 10000.0, rope::Style::half_split, rope::AxisAssignment::axial, {20, 20});
    const std::vector<int64_t> patch_ids = rope::vision_position_ids(1, 4, 6);  // An image of 4 x 6 patches.
    const int64_t patches = int64_t(patch_ids.size()) / 2;
    std::printf("4 x 6 patches stored by 2x2 merge windows; (row, col) of the first 8:\n  ");
    for (int64_t t = 0; t < 8; ++t)
        std::printf("(%ld,%ld) ", long(patch_ids[size_t(t)]), long(patch_ids[size_t(patches + t)]));
    std::printf("\n  (a video's frames repeat the same (row, col) ids: the tower has no temporal axis)\n");
    const Tensors image = tutorial::random_tensors(1, patches, 4, 4, 80, false, 807);
    const PositionArrays image_ids{.ids = patch_ids, .axes = 2};
    tutorial::expect_everywhere(
        checks, backends, "axial 2-D [20, 20] (Qwen2-VL vision, head_dim 80): matches float64",
        [&](rope::Backend& backend) { return tutorial::matches_float64(backend, vision, image, image_ids); });

    tutorial::print_section("A video diffusion model: 3-D");
    // Axes dims (16, 56, 56) of head_dim 128, i.e. 8, 28 and 28 pairs for (frame, row, col),
    // interleaved pairs (2i, 2i+1), base 10000. A latent of 2 frames x 3 x 4.
    const rope::RopeConfig diffusion =
        multi_axis_config(128, 10000.0, rope::Style::interleaved, rope::AxisAssignment::axial, {8, 28, 28});
    const PositionArrays latent_ids{.ids = rope::axial_position_ids({2, 3, 4}), .axes = 3};
    const Tensors latent = tutorial::random_tensors(1, 24, 4, 4, 128, false, 808);
    tutorial::expect_everywhere(
        checks, backends, "axial 3-D (16,56,56) -> [8, 28, 28], interleaved pairs: matches float64",
        [&](rope::Backend& backend) { return tutorial::matches_float64(backend, diffusion, latent, latent_ids); });

    tutorial::print_section("Three mistakes, each run on cpu-naive against float64");
    const std::vector<double> image_want = tutorial::reference(image.q, 4, image, vision, image_ids);
    // THE BUG: [W, H] coordinates given to a model that reads [H, W].
    std::vector<int64_t> swapped(patch_ids.begin() + patches, patch_ids.end());
    swapped.insert(swapped.end(), patch_ids.begin(), patch_ids.begin() + patches);
    const tutorial::Distance swap =
        tutorial::distance(tutorial::run(*naive, vision, image, {.ids = swapped, .axes = 2}).q, image_want);
    // THE BUG: the frequency index not restarted: theta_i = 10000^(-2i/80) over all 40 pairs,
    // as M-RoPE would have it: contiguous blocks of 20 with the global index, written here
    // with the float64 formula (rope cannot be asked for it).
    rope::RopeConfig global_index = vision;
    global_index.multi_axis.assignment = rope::AxisAssignment::mrope_contiguous;
    const double restart = tutorial::relative_l2(tutorial::reference(image.q, 4, image, global_index, image_ids),
                                                 image_want);
    // THE BUG: half-split pairs hard-coded for the diffusion model's interleaved ones.
    rope::RopeConfig half = diffusion;
    half.style = rope::Style::half_split;
    const tutorial::Distance pairing = tutorial::distance(tutorial::run(*naive, half, latent, latent_ids).q,
                                                          tutorial::reference(latent.q, 4, latent, diffusion, latent_ids));
    std::printf("  row and column swapped ([W, H] for an [H, W] model):   %s\n", swap.text().c_str());
    std::printf("  frequency index not restarted per axis:               rel L2 %s\n", tutorial::sci(restart, 1).c_str());
    std::printf("  half-split pairs on the (16,56,56) interleaved model: %s\n", pairing.text().c_str());
    bugs.expect_caught(checks, !swap.within(), "axes swapped: caught by a non-square image against float64");
    bugs.expect_caught(checks, restart > tutorial::kRelTolerance, "frequency index not restarted: caught against float64");
    bugs.expect_caught(checks, !pairing.within(), "wrong pairing on the diffusion model: caught against float64");

    tutorial::print_section("Which pair belongs to which axis");
    // The figure's data: the library's pair_axis for four configurations, checked against the
    // rules of tutorial.hpp's float64 formula (tutorial::pair_rule).
    struct PairLayout {
        const char* name;
        rope::RopeConfig config;
    };
    const std::vector<PairLayout> layouts{
        {"M-RoPE contiguous, Qwen2-VL [16,24,24]",
         multi_axis_config(128, 1e6, rope::Style::half_split, rope::AxisAssignment::mrope_contiguous, {16, 24, 24})},
        {"M-RoPE interleaved, Qwen3-VL [24,20,20]",
         multi_axis_config(128, 5e6, rope::Style::half_split, rope::AxisAssignment::mrope_interleaved, {24, 20, 20})},
        {"axial 2-D, Qwen2-VL vision (head_dim 80) [20,20]", vision},
        {"axial 3-D, diffusion (16,56,56) -> [8,28,28]", diffusion}};
    bool agree = true;
    for (const PairLayout& layout : layouts) {
        const rope::RopeConfig& config = layout.config;
        const int64_t pairs = config.effective_rotary_dim() / 2;
        const bool two_axes = config.multi_axis.sections.size() == 2;
        const std::vector<uint8_t> library = rope::make_frequency_table(config, 1).pair_axis;
        csv.table(layout.name,
                  "pair,axis,theta_index,half_split_first,half_split_second,interleaved_first,interleaved_second,"
                  "axis_name");
        std::printf("  %-50s axis of pairs 0..%ld: ", layout.name, long(pairs - 1));
        for (int64_t i = 0; i < pairs; ++i) {
            const tutorial::PairRule rule = tutorial::pair_rule(tutorial::Formula::of(config), i, 2 * pairs);
            agree = agree && int64_t(library[size_t(i)]) == rule.axis;
            // Axis names: M-RoPE and 3-D axial have (t, h, w); 2-D axial has (h, w).
            static const char* const kThw[] = {"t", "h", "w"};
            const char* name = two_axes ? kThw[rule.axis + 1] : kThw[rule.axis];
            std::printf("%s", name);
            csv.row(i, rule.axis, rule.theta_index, i, i + pairs, 2 * i, 2 * i + 1, name);
        }
        std::printf("\n");
    }
    checks.expect(agree, "the library's FrequencyTable::pair_axis follows the chapter's rules for all four layouts");
    csv.finish(checks);

    return checks.finish("Qwen2-VL's vision [20,20] and a (16,56,56) video latent match float64 on " +
                         std::to_string(backends.available.size()) + " backends; index not restarted: rel L2 " +
                         tutorial::sci(restart, 1) + "; " + bugs.text());
}
