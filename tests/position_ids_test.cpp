// The position builders of rope/position_ids.hpp. Every expected array is
// written out by hand from the behaviour it reproduces: transformers'
// Qwen2-VL get_rope_index (transformers 5: text after a picture continues at
// its start + max(grid_h, grid_w) / spatial_merge_size) and its vision tower's
// get_vision_position_ids (patches by spatial-merge windows), FlashAttention's
// cu_seqlens, and the models' M-RoPE sections. None is computed by the code
// under test.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>
#include <vector>

#include "rope/error.hpp"
#include "rope/position_ids.hpp"

using Ids = std::vector<int64_t>;
using rope::PromptSegment;

namespace {

// Row `axis` of an [axes, tokens] id array.
Ids row(const Ids& ids, int64_t axis, int64_t tokens) {
    return {ids.begin() + axis * tokens, ids.begin() + (axis + 1) * tokens};
}

}  // namespace

TEST_CASE("cu_seqlens_from_lengths: offsets of packed sequences, empty ones included") {
    CHECK(rope::cu_seqlens_from_lengths({3, 5, 0, 1}) == Ids{0, 3, 8, 8, 9});
    CHECK(rope::cu_seqlens_from_lengths({}) == Ids{0});
    CHECK_THROWS_WITH_AS(rope::cu_seqlens_from_lengths({4, -1}), doctest::Contains("lengths[1] = -1"), rope::Error);
    CHECK_THROWS_WITH_AS(rope::cu_seqlens_from_lengths({std::numeric_limits<int64_t>::max(), 1}),
                         doctest::Contains("lengths[1] = 1"), rope::Error);
}

TEST_CASE("mrope_position_ids: get_rope_index's docstring example, a video of 3 x 2 x 2 tokens then 5 text tokens") {
    // grid_thw (3, 4, 4) with the 2 x 2 merge: 3 frames of 2 x 2 tokens. The docstring:
    // temporal [0,0,0,0,1,1,1,1,2,2,2,2], height [0,0,1,1,...], width [0,1,0,1,...]; the
    // text then continues at 0 + max(4, 4) / 2 = 2 (transformers 5; transformers 4: 3).
    const rope::MropePositionIds m = rope::mrope_position_ids({PromptSegment::picture(3, 4, 4), PromptSegment::text(5)});
    REQUIRE(m.tokens == 17);
    REQUIRE(m.ids.size() == 3 * 17);
    CHECK(row(m.ids, 0, 17) == Ids{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 4, 5, 6});
    CHECK(row(m.ids, 1, 17) == Ids{0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 2, 3, 4, 5, 6});
    CHECK(row(m.ids, 2, 17) == Ids{0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 4, 5, 6});
    CHECK(m.rope_delta == 7 - 17);  // Largest id 6, plus 1, minus the 17 tokens.
}

TEST_CASE("mrope_position_ids: Qwen2.5-VL's video timestamps, the docstring's temporal step of 50") {
    // tokens_per_second 25 x 2 seconds per temporal patch: temporal ids [0 x4, 50 x4, 100 x4]; the
    // text continues at 0 + max(4, 4) / 2 = 2 all the same (transformers 5: Qwen2_5_VLModel.get_rope_index).
    const rope::MropePositionIds m =
        rope::mrope_position_ids({PromptSegment::picture(3, 4, 4, 50), PromptSegment::text(5)});
    REQUIRE(m.tokens == 17);
    CHECK(row(m.ids, 0, 17) == Ids{0, 0, 0, 0, 50, 50, 50, 50, 100, 100, 100, 100, 2, 3, 4, 5, 6});
    CHECK(row(m.ids, 1, 17) == Ids{0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 2, 3, 4, 5, 6});
    CHECK(row(m.ids, 2, 17) == Ids{0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 0, 1, 2, 3, 4, 5, 6});
    CHECK(m.rope_delta == 101 - 17);
    CHECK_THROWS_WITH_AS(rope::mrope_position_ids({PromptSegment::picture(3, 4, 4, 0)}),
                         doctest::Contains("segments[0].temporal_interval = 0"), rope::Error);
}

TEST_CASE("mrope_position_ids: text, an image, text, a video, text (chapter 10's prompt)") {
    // text 4 | image 1 x 6 x 8 patches = 3 x 4 tokens from 4 | text 2 from 4 + 4 = 8 |
    // video 2 x 4 x 6 = 2 frames of 2 x 3 from 10 | text 3 from 10 + 3 = 13.
    const rope::MropePositionIds m =
        rope::mrope_position_ids({PromptSegment::text(4), PromptSegment::picture(1, 6, 8), PromptSegment::text(2),
                                  PromptSegment::picture(2, 4, 6), PromptSegment::text(3)});
    REQUIRE(m.tokens == 33);
    CHECK(row(m.ids, 0, 33) == Ids{0, 1, 2, 3, 4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  4,  8,
                                   9, 10, 10, 10, 10, 10, 10, 11, 11, 11, 11, 11, 11, 13, 14, 15});
    CHECK(row(m.ids, 1, 33) == Ids{0, 1, 2,  3,  4,  4,  4,  4,  5,  5,  5,  5,  6,  6,  6,  6,  8,
                                   9, 10, 10, 10, 11, 11, 11, 10, 10, 10, 11, 11, 11, 13, 14, 15});
    CHECK(row(m.ids, 2, 33) == Ids{0, 1, 2,  3,  4,  5,  6,  7,  4,  5,  6,  7,  4,  5,  6,  7,  8,
                                   9, 10, 11, 12, 10, 11, 12, 10, 11, 12, 10, 11, 12, 13, 14, 15});
    CHECK(m.rope_delta == -17);  // Decoding continues at 33 - 17 = 16.
}

TEST_CASE("mrope_position_ids: text only is 0..n-1 on all three rows; a merge of 1 keeps the patch grid") {
    const rope::MropePositionIds text = rope::mrope_position_ids({PromptSegment::text(3)});
    CHECK(text.ids == Ids{0, 1, 2, 0, 1, 2, 0, 1, 2});
    CHECK(text.rope_delta == 0);
    const rope::MropePositionIds unmerged = rope::mrope_position_ids({PromptSegment::picture(1, 1, 3)}, 1);
    CHECK(unmerged.ids == Ids{0, 0, 0, 0, 0, 0, 0, 1, 2});
    CHECK(unmerged.rope_delta == 0);
}

TEST_CASE("mrope_position_ids: bad segments and merge sizes are refused by name") {
    CHECK_THROWS_WITH_AS(rope::mrope_position_ids({PromptSegment::text(0)}),
                         doctest::Contains("segments[0].text_tokens = 0"), rope::Error);
    CHECK_THROWS_WITH_AS(rope::mrope_position_ids({PromptSegment::text(2), PromptSegment::picture(1, 5, 4)}),
                         doctest::Contains("segments[1].grid_h = 5"), rope::Error);
    CHECK_THROWS_WITH_AS(rope::mrope_position_ids({PromptSegment::picture(0, 4, 4)}),
                         doctest::Contains("segments[0].grid_t = 0"), rope::Error);
    CHECK_THROWS_WITH_AS(rope::mrope_position_ids({PromptSegment{2, 1, 2, 2, 1}}),
                         doctest::Contains("segments[0].text_tokens = 2"), rope::Error);
    CHECK_THROWS_WITH_AS(rope::mrope_position_ids({PromptSegment::text(1)}, 0),
                         doctest::Contains("spatial_merge_size = 0"), rope::Error);
    const int64_t huge = int64_t(1) << 40;
    CHECK_THROWS_AS(rope::mrope_position_ids({PromptSegment::picture(huge, huge, huge)}), rope::Error);
}

TEST_CASE("vision_position_ids: Qwen2-VL's vision tower stores patches by 2 x 2 merge windows") {
    // 4 x 4 patches: windows (0,0) (0,1) (1,0) (1,1), each window's patches row by row.
    const Ids image = rope::vision_position_ids(1, 4, 4, 2);
    CHECK(row(image, 0, 16) == Ids{0, 0, 1, 1, 0, 0, 1, 1, 2, 2, 3, 3, 2, 2, 3, 3});
    CHECK(row(image, 1, 16) == Ids{0, 1, 0, 1, 2, 3, 2, 3, 0, 1, 0, 1, 2, 3, 2, 3});
    // A video of 2 frames of 2 x 4 patches: each frame repeats the same ids.
    const Ids video = rope::vision_position_ids(2, 2, 4, 2);
    CHECK(row(video, 0, 16) == Ids{0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1});
    CHECK(row(video, 1, 16) == Ids{0, 1, 0, 1, 2, 3, 2, 3, 0, 1, 0, 1, 2, 3, 2, 3});
    CHECK_THROWS_WITH_AS(rope::vision_position_ids(1, 4, 3, 2), doctest::Contains("grid_w = 3"), rope::Error);
    CHECK_THROWS_WITH_AS(rope::vision_position_ids(0, 4, 4, 2), doctest::Contains("grid_t = 0"), rope::Error);
    CHECK_THROWS_WITH_AS(rope::vision_position_ids(1, 4, 4, -2), doctest::Contains("spatial_merge_size = -2"),
                         rope::Error);
}

TEST_CASE("axial_position_ids: a grid in row-major order, the last axis fastest") {
    CHECK(rope::axial_position_ids({2, 3}) == Ids{0, 0, 0, 1, 1, 1, /**/ 0, 1, 2, 0, 1, 2});
    CHECK(rope::axial_position_ids({2, 1, 2}) == Ids{0, 0, 1, 1, /**/ 0, 0, 0, 0, /**/ 0, 1, 0, 1});
    CHECK(rope::axial_position_ids({3}) == Ids{0, 1, 2});
    CHECK_THROWS_WITH_AS(rope::axial_position_ids({}), doctest::Contains("grid = 0 axes"), rope::Error);
    CHECK_THROWS_WITH_AS(rope::axial_position_ids({2, 0}), doctest::Contains("grid[1] = 0"), rope::Error);
    CHECK_THROWS_WITH_AS(rope::axial_position_ids({1, 1, 1, 1, 1}), doctest::Contains("grid = 5 axes"), rope::Error);
    CHECK_THROWS_AS(rope::axial_position_ids({int64_t(1) << 40, int64_t(1) << 40}), rope::Error);
}

TEST_CASE("default_mrope_sections: the models' sections, scaled to the rotated pairs") {
    using rope::AxisAssignment;
    CHECK(rope::default_mrope_sections(AxisAssignment::mrope_contiguous, 64) == Ids{16, 24, 24});   // Qwen2-VL
    CHECK(rope::default_mrope_sections(AxisAssignment::mrope_interleaved, 64) == Ids{24, 20, 20});  // Qwen3-VL
    CHECK(rope::default_mrope_sections(AxisAssignment::mrope_contiguous, 32) == Ids{8, 12, 12});    // GLM-4.1V
    CHECK(rope::default_mrope_sections(AxisAssignment::mrope_interleaved, 3) == Ids{1, 1, 1});
    CHECK(rope::default_mrope_sections(AxisAssignment::mrope_contiguous, 4) == Ids{2, 1, 1});  // temporal keeps one
    CHECK_THROWS_WITH_AS(rope::default_mrope_sections(AxisAssignment::axial, 64), doctest::Contains("assignment = axial"),
                         rope::Error);
    CHECK_THROWS_WITH_AS(rope::default_mrope_sections(AxisAssignment::mrope_contiguous, 2), doctest::Contains("pairs = 2"),
                         rope::Error);
}
