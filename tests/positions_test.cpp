// Positions beyond one line, on every backend: packed (varlen) sequences,
// context-parallel shards, M-RoPE (contiguous and interleaved sections),
// axial vision RoPE, a caller's cos/sin table, and the precise mode with each.
//
// These are the places where public RoPE kernels shipped silent bugs, and each
// test here is built to catch one (see the comment on each): NaN on a one-head
// packed key; local instead of global positions under context parallelism;
// an M-RoPE kernel that reads only the first position row, or hard-codes
// half-split pairing; a kernel that ignores the caller's table, or reads past
// its end. Every result is checked against the float64 oracle (which states
// each form from its definition) and against cpu-naive, with the tolerances of
// backend_suite_test.cpp; the equalities the forms promise (text-only M-RoPE
// is plain RoPE, the union of all shards is the unsharded call) are bit for bit.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "backend_tags.hpp"
#include "support.hpp"

using testing::Call;
using testing::check_call;
using testing::check_close;
using testing::HostTensor;

namespace {

constexpr rope::Layout bhsd = rope::Layout::bhsd;
constexpr rope::Layout bshd = rope::Layout::bshd;

// The shape of a q or k tensor in layout order: [batch, heads, seq, dim] or [batch, seq, heads, dim].
std::array<int64_t, 4> shape_of(rope::Layout layout, int64_t batch, int64_t heads, int64_t seq, int64_t head_dim) {
    return layout == bhsd ? std::array<int64_t, 4>{batch, heads, seq, head_dim}
                          : std::array<int64_t, 4>{batch, seq, heads, head_dim};
}

int64_t largest(const std::vector<int64_t>& values) {
    int64_t result = 0;
    for (int64_t v : values) result = std::max(result, v);
    return result;
}

// ---------------------------------------------------------------------------
// Multi-axis position ids
// ---------------------------------------------------------------------------

// The M-RoPE position ids of one prompt, as Qwen2-VL's get_rope_index builds
// them: text tokens advance the temporal, height and width rows together; a
// vision block of frames x rows x cols tokens after `start` text positions has
// temporal start + frame * interval, height start + row and width start + col;
// the text after it goes on from the largest position so far + 1.
struct MropePrompt {
    std::vector<int64_t> rows[3];  // temporal, height, width

    int64_t next() const {
        int64_t next = 0;
        for (const auto& row : rows)
            if (!row.empty()) next = std::max(next, largest(row) + 1);
        return next;
    }
    MropePrompt& text(int64_t tokens) {
        const int64_t start = next();
        for (int64_t s = 0; s < tokens; ++s)
            for (auto& row : rows) row.push_back(start + s);
        return *this;
    }
    MropePrompt& vision(int64_t frames, int64_t height, int64_t width, int64_t interval = 1) {
        const int64_t start = next();
        for (int64_t f = 0; f < frames; ++f)
            for (int64_t y = 0; y < height; ++y)
                for (int64_t x = 0; x < width; ++x) {
                    rows[0].push_back(start + f * interval);
                    rows[1].push_back(start + y);
                    rows[2].push_back(start + x);
                }
        return *this;
    }
    int64_t length() const { return int64_t(rows[0].size()); }
};

// Ids [axes, prompts, seq] (Positions::multi_axis's layout) of prompts of equal length.
std::vector<int64_t> multi_axis_ids(const std::vector<MropePrompt>& prompts, int64_t axes = 3) {
    std::vector<int64_t> ids;
    for (int64_t a = 0; a < axes; ++a)
        for (const MropePrompt& prompt : prompts) ids.insert(ids.end(), prompt.rows[a].begin(), prompt.rows[a].end());
    return ids;
}

// Axial coordinates [axes, tokens] of a frames x height x width grid of
// patches, row-major; 2-D grids (frames 0) give (row, column), 3-D ones (frame, row, column).
std::vector<int64_t> grid_coordinates(int64_t frames, int64_t height, int64_t width) {
    const int64_t axes = frames == 0 ? 2 : 3;
    const int64_t tokens = std::max<int64_t>(frames, 1) * height * width;
    std::vector<int64_t> ids(size_t(axes * tokens));
    int64_t t = 0;
    for (int64_t f = 0; f < std::max<int64_t>(frames, 1); ++f)
        for (int64_t y = 0; y < height; ++y)
            for (int64_t x = 0; x < width; ++x, ++t) {
                const int64_t coordinate[3] = {f, y, x};
                for (int64_t a = 0; a < axes; ++a) ids[size_t(a * tokens + t)] = coordinate[3 - axes + a];
            }
    return ids;
}

rope::MultiAxis mrope(rope::AxisAssignment assignment) {
    // Qwen2-VL's sections for head_dim 128 (contiguous), Qwen3-VL's (interleaved).
    return {assignment, assignment == rope::AxisAssignment::mrope_contiguous ? std::vector<int64_t>{16, 24, 24}
                                                                             : std::vector<int64_t>{24, 20, 20}};
}

// ---------------------------------------------------------------------------
// Context-parallel shards, simulated on one machine
// ---------------------------------------------------------------------------

// Copies every head's row of token (b_from, s_from) of `from` to token (b_to, s_to) of `to`.
void copy_token(const HostTensor& from, int64_t b_from, int64_t s_from, HostTensor& to, int64_t b_to, int64_t s_to) {
    const rope::Geometry g = from.view.geometry(), o = to.view.geometry();
    const int64_t units = rope::dtype_size(from.view.dtype) / 2;  // 2-byte storage units per element
    for (int64_t h = 0; h < g.heads; ++h)
        for (int64_t d = 0; d < g.head_dim; ++d)
            std::memcpy(&to.storage[size_t(o.offset(b_to, h, s_to, d) * units)],
                        &from.storage[size_t(g.offset(b_from, h, s_from, d) * units)], size_t(units * 2));
}

// One token of a shard and where it sits in the unsharded tensors.
struct TokenHome {
    int64_t batch, local, global;
};

// The shard of `full` that rank `rank` of `cp_size` holds, and where each of its tokens came from.
std::pair<Call, std::vector<TokenHome>> shard_of(const Call& full, int64_t cp_size, int64_t rank) {
    Call shard;
    std::vector<TokenHome> homes;
    const rope::DType dtype = full.q.view.dtype;
    const rope::Geometry q = full.q.view.geometry(), k = full.k.view.geometry();
    if (full.cu_seqlens.empty()) {
        // Padded: every sequence of the batch is split alike.
        std::array<int64_t, 4> q_shape = full.q.view.shape, k_shape = full.k.view.shape;
        const int axis = full.q.view.layout == bhsd ? 2 : 1;
        q_shape[axis] /= cp_size;
        k_shape[axis] /= cp_size;
        shard = testing::make_call(full.config, dtype, full.q.view.layout, q_shape, k_shape);
        const std::vector<long> held = oracle::held_tokens(q.seq / cp_size, cp_size, rank);
        for (int64_t b = 0; b < q.batch; ++b)
            for (size_t j = 0; j < held.size(); ++j) homes.push_back({b, int64_t(j), held[j]});
    } else {
        // Packed: every sequence of the pack is split, and the shards packed again.
        std::vector<int64_t> lengths;
        for (size_t s = 0; s + 1 < full.cu_seqlens.size(); ++s)
            lengths.push_back((full.cu_seqlens[s + 1] - full.cu_seqlens[s]) / cp_size);
        shard = testing::make_packed_call(full.config, dtype, lengths, q.heads, k.heads);
        for (size_t s = 0; s < lengths.size(); ++s) {
            const std::vector<long> held = oracle::held_tokens(lengths[s], cp_size, rank);
            for (size_t j = 0; j < held.size(); ++j)
                homes.push_back({0, shard.cu_seqlens[s] + int64_t(j), full.cu_seqlens[s] + held[j]});
        }
    }
    shard.offset = full.offset;
    shard.starts = full.starts;
    shard.direction = full.direction;
    shard.cp_size = cp_size;
    shard.cp_rank = rank;
    for (const TokenHome& home : homes) {
        copy_token(full.q, home.batch, home.global, shard.q, home.batch, home.local);
        copy_token(full.k, home.batch, home.global, shard.k, home.batch, home.local);
    }
    return {shard, homes};
}

// Runs `full` unsharded and as every rank's shard; the shards' outputs, each
// token put back where it came from, must be the unsharded output bit for bit.
// `oracle_tolerance` > 0 also checks each shard against the oracle (which
// states the split independently); 0 skips it (scaling the oracle lacks).
void check_shards(rope::Backend& backend, const Call& full, int64_t cp_size, double oracle_tolerance,
                  int64_t max_position) {
    CAPTURE(cp_size);
    Call unsharded = full;
    testing::run(backend, unsharded);
    HostTensor q_union = full.q_out, k_union = full.k_out;  // Poisoned: an unfilled token shows.
    for (int64_t rank = 0; rank < cp_size; ++rank) {
        CAPTURE(rank);
        auto [shard, homes] = shard_of(full, cp_size, rank);
        if (oracle_tolerance > 0) {
            check_call(backend, shard, oracle_tolerance, testing::fp32_max_abs(max_position));
        }
        testing::run(backend, shard);
        for (const TokenHome& home : homes) {
            copy_token(shard.q_out, home.batch, home.local, q_union, home.batch, home.global);
            copy_token(shard.k_out, home.batch, home.local, k_union, home.batch, home.global);
        }
    }
    CHECK_MESSAGE(q_union.storage == unsharded.q_out.storage, "the ranks' q differ from the unsharded q");
    CHECK_MESSAGE(k_union.storage == unsharded.k_out.storage, "the ranks' k differ from the unsharded k");
}

// ---------------------------------------------------------------------------
// A caller's cos/sin table
// ---------------------------------------------------------------------------

// Fills the call's table with `rows` rows of `row_stride` floats: cos of each
// pair, then sin of each pair, from `entry(position, pair, is_sin)`; the
// spare entries past rotary_dim hold NaN, so reading them shows.
template <typename Entry>
void fill_table(Call& call, int64_t rows, int64_t row_stride, Entry entry) {
    const int64_t rotary_dim = call.config.effective_rotary_dim(), pairs = rotary_dim / 2;
    call.table.assign(size_t(rows * row_stride), std::nanf(""));
    for (int64_t p = 0; p < rows; ++p)
        for (int64_t i = 0; i < pairs; ++i) {
            call.table[size_t(p * row_stride + i)] = entry(p, i, false);
            call.table[size_t(p * row_stride + pairs + i)] = entry(p, i, true);
        }
    call.table_rows = rows;
    call.table_cols = rotary_dim;
    call.table_row_stride = row_stride;
}

// The table of the computed path itself: cos and sin of the very float32 angle
// every backend forms (rope_angle of the frequency table's theta_i).
void fill_real_table(Call& call, int64_t rows, int64_t row_stride) {
    const rope::FrequencyTable frequencies = rope::make_frequency_table(call.config, rows);
    fill_table(call, rows, row_stride, [&](int64_t p, int64_t i, bool is_sin) {
        const float angle = rope::rope_angle(p, frequencies.inv_freq[size_t(i)]);
        return is_sin ? std::sin(angle) : std::cos(angle);
    });
}

// Whether `got` is NaN exactly where `want` is, and within `tolerance` elsewhere.
bool same_nan_and_close(const std::vector<double>& got, const std::vector<double>& want, double tolerance) {
    if (got.size() != want.size()) return false;
    for (size_t i = 0; i < got.size(); ++i) {
        if (std::isnan(want[i]) != std::isnan(got[i])) return false;
        if (!std::isnan(want[i]) && !(std::fabs(got[i] - want[i]) <= tolerance)) return false;
    }
    return true;
}

}  // namespace

// ===========================================================================
// Packed sequences
// ===========================================================================

TEST_CASE_TEMPLATE_DEFINE("packed sequences: lengths 0 and 1, one-head and grouped keys, thd and batch-1 views, starts",
                          B, packed) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    const std::vector<int64_t> lengths = {5, 0, 1, 17, 0, 3, 1};  // 27 tokens; empty and one-token sequences
    SUBCASE("thd, 8 query heads and a one-head key (a public kernel gave NaN there), positions from 0") {
        const rope::RopeConfig config{.head_dim = 64};
        check_call(*backend, testing::make_packed_call(config, rope::DType::f32, lengths, 8, 1),
                   testing::fp32_tolerance(17), testing::fp32_max_abs(17));
    }
    SUBCASE("thd, grouped-query key, per-sequence starts, partial rotary, interleaved pairs, padded rows") {
        const rope::RopeConfig config{.head_dim = 64, .rotary_dim = 48, .style = rope::Style::interleaved};
        Call call = testing::make_packed_call(config, rope::DType::f32, lengths, 8, 2, 3);
        std::uniform_int_distribution<int64_t> start(0, 5000);
        for (size_t s = 0; s < lengths.size(); ++s) call.starts.push_back(start(testing::rng()));
        check_call(*backend, call, testing::fp32_tolerance(5017), testing::fp32_max_abs(5017));
        call.direction = rope::Direction::inverse;
        check_call(*backend, call, testing::fp32_tolerance(5017), testing::fp32_max_abs(5017));
    }
    SUBCASE("an offset shared by every sequence, in place") {
        const rope::RopeConfig config{.head_dim = 128, .base = 500000.0};
        Call call = testing::make_packed_call(config, rope::DType::f32, lengths, 4, 4);
        call.offset = 1000;
        call.in_place = true;
        check_call(*backend, call, testing::fp32_tolerance(1017), testing::fp32_max_abs(1017));
    }
    SUBCASE("batch-1 bshd and bhsd views of one packed row, padded") {
        for (rope::Layout layout : {bshd, bhsd}) {
            CAPTURE(rope::layout_name(layout));
            const rope::RopeConfig config{.head_dim = 32};
            Call call = testing::make_call(config, rope::DType::f32, layout, shape_of(layout, 1, 6, 27, 32),
                                           shape_of(layout, 1, 3, 27, 32), 2);
            call.cu_seqlens = {0, 5, 5, 6, 23, 23, 26, 27};
            call.starts = {7, 0, 3, 100, 9, 0, 41};
            check_call(*backend, call, testing::fp32_tolerance(117), testing::fp32_max_abs(117));
        }
    }
    SUBCASE("every sequence empty: a valid no-op") {
        Call call = testing::make_packed_call(rope::RopeConfig{.head_dim = 64}, rope::DType::f32, {0, 0, 0}, 4, 1);
        CHECK_NOTHROW(testing::run(*backend, call));
    }
}
TEST_CASE_TEMPLATE_APPLY(packed, AllBackends);

// ===========================================================================
// Context parallelism
// ===========================================================================

TEST_CASE_TEMPLATE_DEFINE("context-parallel shards: the union of all ranks is the unsharded call, bit for bit", B,
                          context_parallel) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    // Lengths divisible by 2 * cp_size for cp_size 2, 3 and 4 (and 0).
    const std::vector<int64_t> lengths = {48, 0, 96, 24};
    for (rope::Style style : {rope::Style::half_split, rope::Style::interleaved}) {
        CAPTURE(rope::style_name(style));
        const rope::RopeConfig config{.head_dim = 64, .rotary_dim = 48, .style = style};
        for (int64_t cp_size : {1, 2, 3, 4}) {
            for (rope::Layout layout : {bshd, bhsd}) {
                CAPTURE(rope::layout_name(layout));
                Call full = testing::make_call(config, rope::DType::f32, layout, shape_of(layout, 2, 4, 48, 64),
                                               shape_of(layout, 2, 2, 48, 64), 1);
                full.offset = 300;
                check_shards(*backend, full, cp_size, testing::fp32_tolerance(348), 348);
            }
            Call packed = testing::make_packed_call(config, rope::DType::f32, lengths, 4, 1);
            packed.starts = {0, 5, 1000, 77};
            check_shards(*backend, packed, cp_size, testing::fp32_tolerance(1096), 1096);
        }
    }
    SUBCASE("dynamic NTK: every rank uses the unsharded length's frequencies") {
        // The unsharded calls reach position 96 + 1000 and 48 + 300, far past the original 32; a rank
        // that scaled by its own local length (24 or fewer tokens per sequence at cp_size 4) would not
        // scale at all, and differ.
        rope::RopeConfig config{.head_dim = 64};
        config.scaling = {.type = rope::ScalingType::dynamic, .factor = 4.0, .original_max_position_embeddings = 32};
        for (int64_t cp_size : {2, 3, 4}) {
            Call full = testing::make_call(config, rope::DType::f32, bshd, {2, 48, 4, 64}, {2, 48, 2, 64});
            check_shards(*backend, full, cp_size, 0, 48);
            Call packed = testing::make_packed_call(config, rope::DType::f32, lengths, 4, 2);
            packed.starts = {0, 5, 1000, 77};
            check_shards(*backend, packed, cp_size, 0, 1096);
        }
        // The scaling is in effect here (else the test above would prove nothing): the dynamic
        // result differs from the unscaled one.
        Call scaled = testing::make_packed_call(config, rope::DType::f32, lengths, 4, 2);
        Call plain = scaled;
        plain.config.scaling = {};
        testing::run(*backend, scaled);
        testing::run(*backend, plain);
        CHECK(oracle::compare(scaled.q_out.values(), plain.q_out.values()).rel_l2 > 1e-2);
        // And it agrees with cpu-naive (device-resident cu_seqlens carry their bound to rope).
        Call reference = testing::make_packed_call(config, rope::DType::f32, lengths, 4, 2);
        reference.q = scaled.q;
        reference.k = scaled.k;
        auto naive = rope::make_backend("cpu-naive");
        testing::run(*naive, reference);
        check_close(scaled.q_out.values(), reference.q_out.values(), testing::agree_rel_l2, testing::agree_max_abs,
                    "dynamic packed q vs cpu-naive");
    }
}
TEST_CASE_TEMPLATE_APPLY(context_parallel, AllBackends);

// ===========================================================================
// M-RoPE
// ===========================================================================

TEST_CASE_TEMPLATE_DEFINE("M-RoPE on text (three equal rows) is plain RoPE, bit for bit", B, mrope_text) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    for (auto assignment : {rope::AxisAssignment::mrope_contiguous, rope::AxisAssignment::mrope_interleaved}) {
        for (rope::Style style : {rope::Style::half_split, rope::Style::interleaved}) {
            CAPTURE(rope::axis_assignment_name(assignment));
            CAPTURE(rope::style_name(style));
            const rope::RopeConfig plain_config{.head_dim = 128, .base = 1000000.0, .style = style};
            rope::RopeConfig config = plain_config;
            config.multi_axis = mrope(assignment);
            Call plain = testing::make_call(plain_config, rope::DType::f32, bshd, {2, 17, 4, 128}, {2, 17, 2, 128});
            std::uniform_int_distribution<int64_t> id(0, 40000);
            for (int i = 0; i < 2 * 17; ++i) plain.ids.push_back(id(testing::rng()));
            plain.id_rows = 2;
            // The same ids on all three rows.
            Call multi = plain;
            multi.config = config;
            multi.id_axes = 3;
            multi.ids.clear();
            for (int a = 0; a < 3; ++a) multi.ids.insert(multi.ids.end(), plain.ids.begin(), plain.ids.end());
            check_call(*backend, multi, testing::fp32_tolerance(40001), testing::fp32_max_abs(40001));
            testing::run(*backend, plain);
            testing::run(*backend, multi);
            CHECK(multi.q_out.storage == plain.q_out.storage);
            CHECK(multi.k_out.storage == plain.k_out.storage);
            // Without ids (an offset), an M-RoPE configuration turns every axis by the same position.
            Call offset_plain = testing::make_call(plain_config, rope::DType::f32, bhsd, {1, 3, 9, 128}, {1, 1, 9, 128});
            offset_plain.offset = 777;
            Call offset_multi = offset_plain;
            offset_multi.config = config;
            testing::run(*backend, offset_plain);
            testing::run(*backend, offset_multi);
            CHECK(offset_multi.q_out.storage == offset_plain.q_out.storage);
        }
    }
}
TEST_CASE_TEMPLATE_APPLY(mrope_text, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("M-RoPE with images and video: distinct temporal, height and width rows", B, mrope_vision) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    // Two prompts of 41 tokens: text, a 4 x 6 image, text; and text, a 3-frame 2 x 3 video
    // (temporal interval 2), text. Positions stay small, as in the models.
    MropePrompt image, video;
    image.text(5).vision(1, 4, 6).text(12);
    video.text(3).vision(3, 2, 3, 2).text(20);
    REQUIRE(image.length() == video.length());
    const int64_t seq = image.length();
    for (auto assignment : {rope::AxisAssignment::mrope_contiguous, rope::AxisAssignment::mrope_interleaved}) {
        for (rope::Style style : {rope::Style::half_split, rope::Style::interleaved}) {
            CAPTURE(rope::axis_assignment_name(assignment));
            CAPTURE(rope::style_name(style));
            rope::RopeConfig config{.head_dim = 128, .base = 1000000.0, .style = style};
            config.multi_axis = mrope(assignment);
            // One row of ids per prompt ([3, 2, seq]), bshd, grouped-query k.
            Call call = testing::make_call(config, rope::DType::f32, bshd, {2, seq, 4, 128}, {2, seq, 2, 128});
            call.ids = multi_axis_ids({image, video});
            call.id_axes = 3;
            call.id_rows = 2;
            const int64_t max_position = largest(call.ids) + 1;
            check_call(*backend, call, testing::fp32_tolerance(max_position), testing::fp32_max_abs(max_position));
            // Shared by the batch ([3, seq]), bhsd.
            Call shared = testing::make_call(config, rope::DType::f32, bhsd, {2, 3, seq, 128}, {2, 1, seq, 128});
            shared.ids = multi_axis_ids({video});
            shared.id_axes = 3;
            shared.id_rows = 1;
            check_call(*backend, shared, testing::fp32_tolerance(max_position), testing::fp32_max_abs(max_position));
        }
    }
    SUBCASE("GLM-4V's form: partial rotary (64 of 128), contiguous sections, interleaved pairs") {
        rope::RopeConfig config{.head_dim = 128, .rotary_dim = 64, .style = rope::Style::interleaved};
        config.multi_axis = {rope::AxisAssignment::mrope_contiguous, {8, 12, 12}};
        Call call = testing::make_packed_call(config, rope::DType::f32, {seq}, 4, 2);
        call.cu_seqlens.clear();  // One sequence, positions from the ids: a thd view without cu_seqlens.
        call.ids = multi_axis_ids({image});
        call.id_axes = 3;
        call.id_rows = 1;
        check_call(*backend, call, testing::fp32_tolerance(64), testing::fp32_max_abs(64));
    }
}
TEST_CASE_TEMPLATE_APPLY(mrope_vision, AllBackends);

TEST_CASE("M-RoPE test inputs tell apart what a wrong kernel would confuse") {
    // A kernel that reads only row 0, hard-codes half-split pairing or mixes up
    // the section styles passes every text-only test; on the image prompt used
    // above the oracle's answers differ by far more than the tolerances, so the
    // suite above would catch each. This checks the inputs, not a backend.
    MropePrompt image;
    image.text(5).vision(1, 4, 6).text(12);
    const int64_t seq = image.length();
    rope::RopeConfig config{.head_dim = 128, .base = 1000000.0};
    config.multi_axis = mrope(rope::AxisAssignment::mrope_interleaved);
    Call call = testing::make_call(config, rope::DType::f32, bhsd, {1, 2, seq, 128}, {1, 2, seq, 128});
    call.ids = multi_axis_ids({image});
    call.id_axes = 3;
    call.id_rows = 1;
    const std::vector<double> right = testing::oracle_for(call).q;
    auto differs = [&](const Call& wrong, const char* what) {
        const double gap = oracle::compare(testing::oracle_for(wrong).q, right).rel_l2;
        INFO(what << ": rel_l2 " << gap);
        CHECK(gap > 1e3 * testing::fp32_tolerance(64));
    };
    Call row0_only = call;
    for (int64_t a = 1; a < 3; ++a)
        std::copy(call.ids.begin(), call.ids.begin() + seq, row0_only.ids.begin() + a * seq);
    differs(row0_only, "reading only the temporal row");
    Call other_pairing = call;
    other_pairing.config.style = rope::Style::interleaved;
    differs(other_pairing, "interleaved pairs instead of half-split");
    Call other_sections = call;
    other_sections.config.multi_axis.assignment = rope::AxisAssignment::mrope_contiguous;
    differs(other_sections, "contiguous sections instead of interleaved ones");
}

// ===========================================================================
// Axial RoPE (vision)
// ===========================================================================

TEST_CASE_TEMPLATE_DEFINE("axial RoPE: Qwen2-VL's 2-D vision form and a 3-D video form", B, axial) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    SUBCASE("2-D: head_dim 80, sections [20, 20] (row, column), half-split, thd") {
        // Qwen2-VL's vision tower: theta = base^(-j/20) on each axis; pair j < 20 turns with the row,
        // pair 20 + j with the column, pairs (i, i + 40).
        rope::RopeConfig config{.head_dim = 80};
        config.multi_axis = {rope::AxisAssignment::axial, {20, 20}};
        Call call = testing::make_packed_call(config, rope::DType::f32, {6 * 8}, 16, 16);
        call.cu_seqlens.clear();
        call.ids = grid_coordinates(0, 6, 8);
        call.id_axes = 2;
        call.id_rows = 1;
        check_call(*backend, call, testing::fp32_tolerance(8), testing::fp32_max_abs(8));
    }
    SUBCASE("3-D: axes dims (16, 56, 56) -> sections [8, 28, 28], interleaved pairs, bshd") {
        rope::RopeConfig config{.head_dim = 128, .base = 256.0, .style = rope::Style::interleaved};
        config.multi_axis = {rope::AxisAssignment::axial, {8, 28, 28}};
        Call call = testing::make_call(config, rope::DType::f32, bshd, {2, 40, 3, 128}, {2, 40, 3, 128});
        call.ids = grid_coordinates(2, 4, 5);
        call.id_axes = 3;
        call.id_rows = 1;
        check_call(*backend, call, testing::fp32_tolerance(5), testing::fp32_max_abs(5));
    }
    SUBCASE("axial coordinates far from 0, one row per image, inverse") {
        rope::RopeConfig config{.head_dim = 64};
        config.multi_axis = {rope::AxisAssignment::axial, {12, 20}};
        Call call = testing::make_call(config, rope::DType::f32, bhsd, {2, 2, 12, 64}, {2, 1, 12, 64});
        std::uniform_int_distribution<int64_t> coordinate(0, 3000);
        for (int i = 0; i < 2 * 2 * 12; ++i) call.ids.push_back(coordinate(testing::rng()));
        call.id_axes = 2;
        call.id_rows = 2;
        call.direction = rope::Direction::inverse;
        check_call(*backend, call, testing::fp32_tolerance(3001), testing::fp32_max_abs(3001));
    }
}
TEST_CASE_TEMPLATE_APPLY(axial, AllBackends);

// ===========================================================================
// A caller's cos/sin table
// ===========================================================================

TEST_CASE_TEMPLATE_DEFINE("cos/sin table: real angles give the computed path, other angles are read as given", B,
                          cos_sin_table) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    // Whether the backend computes cos and sin as the real table below was filled: with std::cos and std::sin.
    const bool std_sin_cos = backend->name() == "cpu-naive";
    // Forms the table combines with: ids, packed sequences with starts, M-RoPE (each pair's row is
    // that of its axis's position), the inverse rotation; rows padded with 16 spare floats.
    std::vector<Call> calls;
    {
        const rope::RopeConfig config{.head_dim = 64, .rotary_dim = 48};
        Call call = testing::make_call(config, rope::DType::f32, bshd, {2, 11, 4, 64}, {2, 11, 2, 64});
        std::uniform_int_distribution<int64_t> id(0, 499);
        for (int i = 0; i < 2 * 11; ++i) call.ids.push_back(id(testing::rng()));
        call.id_rows = 2;
        calls.push_back(call);
        call.direction = rope::Direction::inverse;
        calls.push_back(call);
    }
    {
        Call call = testing::make_packed_call(rope::RopeConfig{.head_dim = 64, .style = rope::Style::interleaved},
                                              rope::DType::f32, {3, 0, 9, 1}, 4, 1);
        call.starts = {10, 0, 480, 2};
        calls.push_back(call);
    }
    {
        rope::RopeConfig config{.head_dim = 128};
        config.multi_axis = mrope(rope::AxisAssignment::mrope_interleaved);
        MropePrompt image;
        image.text(3).vision(1, 3, 4).text(2);
        Call call = testing::make_call(config, rope::DType::f32, bhsd, {1, 2, image.length(), 128},
                                       {1, 2, image.length(), 128});
        call.ids = multi_axis_ids({image});
        call.id_axes = 3;
        call.id_rows = 1;
        calls.push_back(call);
    }
    for (const Call& base : calls) {
        CAPTURE(base.q.view.numel());
        CAPTURE(int(base.direction));
        // Real angles: the computed path's own cos and sin.
        Call computed = base, tabled = base;
        fill_real_table(tabled, 500, tabled.config.effective_rotary_dim() + 16);
        testing::run(*backend, computed);
        testing::run(*backend, tabled);
        if (std_sin_cos) {
            // The same float cos/sin by either path: the same bits.
            CHECK(tabled.q_out.storage == computed.q_out.storage);
            CHECK(tabled.k_out.storage == computed.k_out.storage);
        } else {
            // cpu-eigen's SIMD sin/cos and the GPU's sincosf may differ from std::sin/std::cos by an ulp or two.
            check_close(tabled.q_out.values(), computed.q_out.values(), testing::agree_rel_l2, testing::agree_max_abs,
                        "q, table vs computed");
            check_close(tabled.k_out.values(), computed.k_out.values(), testing::agree_rel_l2, testing::agree_max_abs,
                        "k, table vs computed");
        }
        // Against the oracle reading the table: float32 arithmetic only.
        Call fresh = base;
        fill_real_table(fresh, 500, 128);
        check_call(*backend, fresh, testing::fp32_tolerance(0), testing::fp32_max_abs(0));
        // Angles no formula would produce: independent random cos and sin in [-1, 1]. A kernel
        // that ignored the table and computed cos/sin itself fails here.
        Call random = base;
        std::uniform_real_distribution<float> entry(-1.0f, 1.0f);
        fill_table(random, 500, 64 + random.config.effective_rotary_dim(),
                   [&](int64_t, int64_t, bool) { return entry(testing::rng()); });
        check_call(*backend, random, testing::fp32_tolerance(0), testing::fp32_max_abs(0));
    }
}
TEST_CASE_TEMPLATE_APPLY(cos_sin_table, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("cos/sin table: positions past its end are an error on the host, NaN for device ids", B,
                          table_out_of_range) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    CAPTURE(testing::seed());
    // Rows 0..31; two of the ids point past them. Partial rotary, so pass-through features show.
    const rope::RopeConfig config{.head_dim = 64, .rotary_dim = 32};
    Call call = testing::make_call(config, rope::DType::f32, bshd, {2, 8, 3, 64}, {2, 8, 1, 64});
    call.ids = {0, 1, 2, 31, 32, 5, 6, 7, 9, 1000, 3, 4, 5, 6, 7, 8};
    call.id_rows = 2;
    fill_real_table(call, 32, 32);
    if (backend->device() == rope::Device::host) {
        // Host ids are read before anything is written.
        const Call before = call;
        CHECK_THROWS_WITH_AS(testing::run(*backend, call),
                             doctest::Contains("positions = largest 1000: must be < cos_sin_cache.rows = 32"),
                             rope::Error);
        CHECK(call.q_out.storage == before.q_out.storage);
        CHECK(call.k_out.storage == before.k_out.storage);
        return;
    }
    // Device ids cannot be checked beforehand: the documented result is NaN in the rotated
    // features of those tokens (never a read outside the table) and the pass-through features
    // copied, exactly as the oracle states it.
    const testing::Expected want = testing::oracle_for(call);
    testing::run(*backend, call);
    CHECK(same_nan_and_close(call.q_out.values(), want.q, testing::fp32_max_abs(0)));
    CHECK(same_nan_and_close(call.k_out.values(), want.k, testing::fp32_max_abs(0)));
    long nan_count = 0;
    for (double x : want.q) nan_count += std::isnan(x) ? 1 : 0;
    CHECK(nan_count == 2 * 3 * 32);  // two tokens, three heads, 32 rotated features each
}
TEST_CASE_TEMPLATE_APPLY(table_out_of_range, AllBackends);

// ===========================================================================
// The precise mode with each form
// ===========================================================================

TEST_CASE_TEMPLATE_DEFINE("precise angles with packed sequences, shards, M-RoPE and axial RoPE at positions near 3M",
                          B, precise_forms) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    // At position 3M the default float32 angle is off by up to 0.2 radians; the precise
    // mode's error stays at that of short positions, so the short-position tolerance holds.
    const double rel = testing::fp32_tolerance(0), abs = testing::fp32_max_abs(0);
    const int64_t far = 3000000;
    SUBCASE("packed, starts near 3M") {
        Call call = testing::make_packed_call(rope::RopeConfig{.head_dim = 128, .precise_angles = true},
                                              rope::DType::f32, {4, 0, 7, 1}, 4, 1);
        call.starts = {far, 0, far + 12345, far - 1};
        check_call(*backend, call, rel, abs);
    }
    SUBCASE("context-parallel shard, offset near 3M") {
        Call call = testing::make_call(rope::RopeConfig{.head_dim = 64, .precise_angles = true}, rope::DType::f32,
                                       bshd, {2, 8, 2, 64}, {2, 8, 2, 64});
        call.offset = far;
        call.cp_size = 3;
        call.cp_rank = 1;
        check_call(*backend, call, rel, abs);
    }
    SUBCASE("M-RoPE, both section styles, ids near 3M") {
        for (auto assignment : {rope::AxisAssignment::mrope_contiguous, rope::AxisAssignment::mrope_interleaved}) {
            CAPTURE(rope::axis_assignment_name(assignment));
            rope::RopeConfig config{.head_dim = 128, .base = 1000000.0, .precise_angles = true};
            config.multi_axis = mrope(assignment);
            MropePrompt image;
            image.text(3).vision(1, 3, 4).text(2);
            Call call = testing::make_call(config, rope::DType::f32, bhsd, {1, 2, image.length(), 128},
                                           {1, 2, image.length(), 128});
            call.ids = multi_axis_ids({image});
            for (int64_t& id : call.ids) id += far;
            call.id_axes = 3;
            call.id_rows = 1;
            check_call(*backend, call, rel, abs);
        }
    }
    SUBCASE("axial, coordinates near 3M") {
        rope::RopeConfig config{.head_dim = 80, .precise_angles = true};
        config.multi_axis = {rope::AxisAssignment::axial, {20, 20}};
        Call call = testing::make_call(config, rope::DType::f32, bshd, {1, 12, 2, 80}, {1, 12, 2, 80});
        call.ids = grid_coordinates(0, 3, 4);
        for (int64_t& id : call.ids) id += far;
        call.id_axes = 2;
        call.id_rows = 1;
        check_call(*backend, call, rel, abs);
    }
}
TEST_CASE_TEMPLATE_APPLY(precise_forms, AllBackends);
