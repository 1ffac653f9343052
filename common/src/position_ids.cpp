// Builders of position arrays (see rope/position_ids.hpp).
#include "rope/position_ids.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "rope/error.hpp"

namespace rope {
namespace {

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// a * b, or rope::Error naming `what` when it does not fit int64 (a, b >= 0).
int64_t checked_product(int64_t a, int64_t b, const char* what) {
    if (b != 0 && a > kInt64Max / b) fail(what, std::to_string(a) + " x " + std::to_string(b), "overflows int64");
    return a * b;
}

// Appends one token's ids to the three rows of an M-RoPE id array.
struct ThreeRows {
    std::vector<int64_t> t, h, w;
    void add(int64_t temporal, int64_t height, int64_t width) {
        t.push_back(temporal);
        h.push_back(height);
        w.push_back(width);
    }
};

void check_merge(int64_t spatial_merge_size) {
    if (spatial_merge_size < 1) fail("spatial_merge_size", spatial_merge_size, "must be >= 1");
}

// A picture side: positive and a multiple of the merge window.
void check_side(const std::string& name, int64_t side, int64_t spatial_merge_size) {
    if (side < 1 || side % spatial_merge_size != 0)
        fail(name, side, "must be a positive multiple of spatial_merge_size " + std::to_string(spatial_merge_size));
}

}  // namespace

std::vector<int64_t> cu_seqlens_from_lengths(const std::vector<int64_t>& lengths) {
    std::vector<int64_t> cu{0};
    cu.reserve(lengths.size() + 1);
    for (size_t b = 0; b < lengths.size(); ++b) {
        const std::string name = "lengths[" + std::to_string(b) + "]";
        if (lengths[b] < 0) fail(name, lengths[b], "must be >= 0");
        if (lengths[b] > kInt64Max - cu.back()) fail(name, lengths[b], "makes the total overflow int64");
        cu.push_back(cu.back() + lengths[b]);
    }
    return cu;
}

MropePositionIds mrope_position_ids(const std::vector<PromptSegment>& segments, int64_t spatial_merge_size) {
    check_merge(spatial_merge_size);
    // Check everything and count the tokens before building anything.
    int64_t tokens = 0;
    for (size_t s = 0; s < segments.size(); ++s) {
        const PromptSegment& segment = segments[s];
        const std::string name = "segments[" + std::to_string(s) + "]";
        int64_t count = segment.text_tokens;
        if (segment.grid_t == 0 && segment.grid_h == 0 && segment.grid_w == 0) {
            if (segment.text_tokens < 1) fail(name + ".text_tokens", segment.text_tokens, "must be >= 1 for text");
        } else {
            if (segment.text_tokens != 0)
                fail(name + ".text_tokens", segment.text_tokens, "must be 0 for a picture (one segment each)");
            if (segment.grid_t < 1) fail(name + ".grid_t", segment.grid_t, "must be >= 1");
            if (segment.temporal_interval < 1 || segment.temporal_interval > kInt64Max / 4 / segment.grid_t)
                fail(name + ".temporal_interval", segment.temporal_interval, "must be >= 1 (and the ids fit int64)");
            check_side(name + ".grid_h", segment.grid_h, spatial_merge_size);
            check_side(name + ".grid_w", segment.grid_w, spatial_merge_size);
            count = checked_product(checked_product(segment.grid_t, segment.grid_h / spatial_merge_size, "tokens"),
                                    segment.grid_w / spatial_merge_size, "tokens");
        }
        if (count > kInt64Max / 3 - tokens) fail("tokens", name, "the prompt's ids overflow int64");
        tokens += count;
    }
    ThreeRows rows;
    int64_t next = 0;  // The running position: where the next segment starts.
    for (const PromptSegment& segment : segments) {
        const int64_t start = next;
        for (int64_t n = 0; n < segment.text_tokens; ++n) rows.add(start + n, start + n, start + n);
        next += segment.text_tokens;
        const int64_t height = segment.grid_h / spatial_merge_size, width = segment.grid_w / spatial_merge_size;
        for (int64_t f = 0; f < segment.grid_t; ++f)
            for (int64_t r = 0; r < height; ++r)
                for (int64_t c = 0; c < width; ++c) rows.add(start + f * segment.temporal_interval, start + r, start + c);
        next += std::max(height, width);
    }
    MropePositionIds result;
    result.tokens = tokens;
    result.ids = std::move(rows.t);
    result.ids.insert(result.ids.end(), rows.h.begin(), rows.h.end());
    result.ids.insert(result.ids.end(), rows.w.begin(), rows.w.end());
    const int64_t largest = result.ids.empty() ? -1 : *std::max_element(result.ids.begin(), result.ids.end());
    result.rope_delta = largest + 1 - tokens;
    return result;
}

std::vector<int64_t> vision_position_ids(int64_t grid_t, int64_t grid_h, int64_t grid_w,
                                         int64_t spatial_merge_size) {
    check_merge(spatial_merge_size);
    if (grid_t < 1) fail("grid_t", grid_t, "must be >= 1");
    check_side("grid_h", grid_h, spatial_merge_size);
    check_side("grid_w", grid_w, spatial_merge_size);
    const int64_t patches = checked_product(checked_product(grid_t, grid_h, "grid_t x grid_h"), grid_w, "patches");
    checked_product(patches, 2, "ids");
    const int64_t m = spatial_merge_size;
    std::vector<int64_t> rows, cols;
    rows.reserve(size_t(patches));
    cols.reserve(size_t(patches));
    for (int64_t f = 0; f < grid_t; ++f)
        for (int64_t window_row = 0; window_row < grid_h / m; ++window_row)
            for (int64_t window_col = 0; window_col < grid_w / m; ++window_col)
                for (int64_t r = 0; r < m; ++r)
                    for (int64_t c = 0; c < m; ++c) {
                        rows.push_back(window_row * m + r);
                        cols.push_back(window_col * m + c);
                    }
    rows.insert(rows.end(), cols.begin(), cols.end());
    return rows;
}

std::vector<int64_t> axial_position_ids(const std::vector<int64_t>& grid) {
    const int64_t axes = int64_t(grid.size());
    if (axes < 1 || axes > kMaxPositionAxes)
        fail("grid", std::to_string(axes) + " axes", "must have 1 to " + std::to_string(kMaxPositionAxes));
    int64_t tokens = 1;
    for (int64_t a = 0; a < axes; ++a) {
        if (grid[size_t(a)] < 1) fail("grid[" + std::to_string(a) + "]", grid[size_t(a)], "must be >= 1");
        tokens = checked_product(tokens, grid[size_t(a)], "grid");
    }
    checked_product(tokens, axes, "ids");
    std::vector<int64_t> ids(size_t(axes * tokens));
    for (int64_t t = 0; t < tokens; ++t)
        for (int64_t a = axes - 1, rest = t; a >= 0; rest /= grid[size_t(a)], --a)
            ids[size_t(a * tokens + t)] = rest % grid[size_t(a)];
    return ids;
}

std::vector<int64_t> default_mrope_sections(AxisAssignment assignment, int64_t pairs) {
    if (assignment != AxisAssignment::mrope_contiguous && assignment != AxisAssignment::mrope_interleaved)
        fail("assignment", axis_assignment_name(assignment), "must be mrope or mrope-interleaved");
    if (pairs < 3) fail("pairs", pairs, "must be >= 3 (one pair per M-RoPE axis)");
    const double spatial = assignment == AxisAssignment::mrope_contiguous ? 24.0 : 20.0;
    const int64_t scaled = int64_t(std::llround(spatial * double(pairs) / 64.0));
    const int64_t height = std::clamp<int64_t>(scaled, 1, (pairs - 1) / 2);
    return {pairs - 2 * height, height, height};
}

}  // namespace rope
