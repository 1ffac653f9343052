// The bad-input matrix: every invalid input we know of, fed to every backend
// through rope::apply, and to the other public entry points. Each case must
// raise rope::Error whose message names the field and the value, and must
// leave every byte of the outputs (and of in-place inputs) unchanged.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <iostream>
#include <limits>
#include <string>
#include <vector>

#include "backend_tags.hpp"
#include "rope/detail/plan.hpp"  // make_plan: these tests check the plan itself
#include "support.hpp"

namespace {

constexpr rope::Layout bhsd = rope::Layout::bhsd;
constexpr double inf = std::numeric_limits<double>::infinity();

struct BadInput {
    const char* what;                                   // What is wrong, for the report.
    std::function<void(testing::Call&)> before_staging; // Edits the host-side call (shapes, config, ids).
    std::function<void(rope::RopeArgs&)> final_args;    // Edits the arguments the backend receives.
    std::string expected;                               // Must appear in the error message.
    std::string also_expected = {};                     // A second fragment that must appear, if any.
};

rope::Device other_device(rope::Device device) {
    return device == rope::Device::host ? rope::Device::cuda : rope::Device::host;
}

std::vector<BadInput> bad_inputs(rope::Device backend_device) {
    using Call = testing::Call;
    using Args = rope::RopeArgs;
    const std::string wrong_device(rope::device_name(other_device(backend_device)));
    auto config_case = [](const char* what, std::function<void(rope::RopeConfig&)> edit, std::string expected) {
        return BadInput{what, [edit](Call& c) { edit(c.config); }, nullptr, expected};
    };
    auto args_case = [](const char* what, std::function<void(Args&)> edit, std::string expected) {
        return BadInput{what, nullptr, edit, expected};
    };
    auto reshape = [](const char* what, std::array<int64_t, 4> q_shape, std::array<int64_t, 4> k_shape,
                      std::string expected) {
        return BadInput{what,
                        [=](Call& c) {
                            const bool in_place = c.in_place;
                            c = testing::make_call(c.config, rope::DType::f32, bhsd, q_shape, k_shape);
                            c.in_place = in_place;
                        },
                        nullptr, expected};
    };
    std::vector<BadInput> cases = {
        config_case("odd rotary_dim", [](auto& c) { c.rotary_dim = 63; }, "rotary_dim = 63: must be even"),
        config_case("rotary_dim > head_dim", [](auto& c) { c.rotary_dim = 128; },
                    "rotary_dim = 128: must not exceed head_dim = 64"),
        config_case("negative rotary_dim", [](auto& c) { c.rotary_dim = -2; }, "rotary_dim = -2"),
        config_case("head_dim 0", [](auto& c) { c.head_dim = 0; }, "head_dim = 0: must be > 0"),
        config_case("negative head_dim", [](auto& c) { c.head_dim = -64; }, "head_dim = -64"),
        config_case("infinite base", [](auto& c) { c.base = inf; }, "base = inf: must be finite"),
        config_case("NaN base", [](auto& c) { c.base = std::nan(""); }, "base = nan: must be finite"),
        config_case("zero base", [](auto& c) { c.base = 0.0; }, "base = 0: must be > 0"),
        config_case("negative base", [](auto& c) { c.base = -10000.0; }, "base = -10000: must be > 0"),
        config_case("zero linear factor", [](auto& c) { c.scaling.type = rope::ScalingType::linear; c.scaling.factor = 0; },
                    "scaling.factor = 0"),
        config_case("negative linear factor",
                    [](auto& c) { c.scaling.type = rope::ScalingType::linear; c.scaling.factor = -2; },
                    "scaling.factor = -2"),
        config_case("infinite linear factor",
                    [](auto& c) { c.scaling.type = rope::ScalingType::linear; c.scaling.factor = inf; },
                    "scaling.factor = inf"),
        args_case("negative batch in q", [](Args& a) { a.q.shape[0] = -1; }, "q.shape[0] = -1: sizes must be >= 0"),
        args_case("negative heads in q", [](Args& a) { a.q.shape[1] = -4; }, "q.shape[1] = -4"),
        args_case("negative seq in k", [](Args& a) { a.k.shape[2] = -1; }, "k.shape[2] = -1"),
        args_case("negative dim in q_out", [](Args& a) { a.q_out.shape[3] = -64; }, "q_out.shape[3] = -64"),
        args_case("negative size in k_out", [](Args& a) { a.k_out.shape[0] = -2; }, "k_out.shape[0] = -2"),
        config_case("q head_dim differs from config", [](auto& c) { c.head_dim = 32; },
                    "q head_dim = 64: must equal config.head_dim = 32"),
        reshape("k seq differs", {2, 4, 8, 64}, {2, 4, 7, 64}, "k seq = 7: must equal q seq = 8"),
        reshape("k batch differs", {2, 4, 8, 64}, {3, 4, 8, 64}, "k batch = 3: must equal q batch = 2"),
        reshape("k head_dim differs", {2, 4, 8, 64}, {2, 4, 8, 32}, "k head_dim = 32: must equal q head_dim = 64"),
        reshape("k heads do not divide q heads", {2, 8, 8, 64}, {2, 3, 8, 64}, "k heads = 3: must divide q heads = 8"),
        args_case("q_out seq differs", [](Args& a) { a.q_out.shape[2] = 9; }, "q_out seq = 9: must equal q seq = 8"),
        args_case("k_out heads differ", [](Args& a) { a.k_out.shape[1] = 2; }, "k_out heads = 2: must equal k heads = 4"),
        args_case("negative stride in q", [](Args& a) { a.q.strides[1] = -1; }, "q.strides[1] = -1: strides must be >= 0"),
        args_case("q_out rows overlap", [](Args& a) { a.q_out.strides[2] = 32; },
                  "q_out.strides[2] = 32: overlaps other elements of q_out"),
        args_case("k_out heads overlap (stride 0)", [](Args& a) { a.k_out.strides[1] = 0; },
                  "k_out.strides[1] = 0: overlaps other elements of k_out"),
        args_case("q_out shifted one element over q",
                  [](Args& a) {
                      a.q_out = a.q;
                      a.q_out.data = static_cast<float*>(a.q.data) + 1;
                  },
                  "partially aliases q"),
        args_case("q_out is k", [](Args& a) { a.q_out = a.k; }, "q_out.data = "),
        args_case("k_out overlaps q_out", [](Args& a) { a.k_out = a.q_out; }, "partially aliases k_out"),
        args_case("k_out is q (in place on the wrong tensor)", [](Args& a) { a.k_out = a.q; }, "partially aliases"),
        args_case("k of another dtype", [](Args& a) { a.k.dtype = rope::DType::bf16; },
                  "k.dtype = bf16: all tensors must share q's dtype fp32"),
        args_case("q_out of another dtype", [](Args& a) { a.q_out.dtype = rope::DType::f16; }, "q_out.dtype = fp16"),
        args_case("null q", [](Args& a) { a.q.data = nullptr; }, "q.data = null: a non-empty tensor needs memory"),
        args_case("null k_out", [](Args& a) { a.k_out.data = nullptr; }, "k_out.data = null"),
        args_case("q on the wrong device", [=](Args& a) { a.q.device = other_device(a.q.device); },
                  "q.device = " + wrong_device),
        args_case("k_out on the wrong device", [=](Args& a) { a.k_out.device = other_device(a.k_out.device); },
                  "k_out.device = " + wrong_device),
        BadInput{"ids of the wrong length",
                 [](Call& c) {
                     c.ids = {0, 1, 2, 3, 4};
                     c.id_rows = 1;
                 },
                 nullptr, "positions.length = 5: must equal seq = 8"},
        BadInput{"ids with 3 rows for batch 2",
                 [](Call& c) {
                     c.ids.assign(24, 1);
                     c.id_rows = 3;
                 },
                 nullptr, "positions.rows = 3: must be 1 or batch = 2"},
        BadInput{"ids with 0 rows",
                 [](Call& c) {
                     c.ids.assign(8, 1);
                     c.id_rows = 1;
                 },
                 [](Args& a) { a.positions.rows = 0; }, "positions.rows = 0"},
        BadInput{"ids on the wrong device",
                 [](Call& c) {
                     c.ids.assign(8, 1);
                     c.id_rows = 1;
                 },
                 [](Args& a) { a.positions.device = other_device(a.positions.device); },
                 "positions.device = " + wrong_device},
        BadInput{"negative offset", [](Call& c) { c.offset = -1; }, nullptr, "positions.offset = -1: must be >= 0"},
    };
    // Negative ids can only be checked where the ids can be read: in host memory.
    if (backend_device == rope::Device::host)
        cases.push_back(BadInput{"negative id",
                                 [](Call& c) {
                                     c.ids = {0, 1, 2, -3, 4, 5, 6, 7};
                                     c.id_rows = 1;
                                 },
                                 nullptr, "positions.ids[3] = -3: must be >= 0"});
    return cases;
}

// A packed call in place of the matrix's base call: thd [8 tokens, 4 heads, 64],
// sequences of 3 and 5 tokens (in place or not, as the base call was).
void make_packed(testing::Call& c) {
    const bool in_place = c.in_place;
    c = testing::make_packed_call(c.config, rope::DType::f32, {3, 5}, 4, 4);
    c.in_place = in_place;
}

// A caller's table of `rows` rows for the base call (rotary_dim 64), filled with 0.5.
void give_table(testing::Call& c, int64_t rows) {
    c.table.assign(size_t(rows * 64), 0.5f);
    c.table_rows = rows;
    c.table_cols = 64;
    c.table_row_stride = 64;
}

// The forms beyond one line of positions (packed sequences, context-parallel
// shards, multi-axis ids and sections) and a caller's cos/sin table. The
// contents of cu_seqlens, starts and ids are checked only where rope can read
// them, in host memory: on a CUDA backend those cases are not errors but
// in-bounds kernels (docs/api.md), tested in positions_test.cpp.
std::vector<BadInput> position_form_bad_inputs(rope::Device backend_device) {
    using Call = testing::Call;
    using Args = rope::RopeArgs;
    const bool host = backend_device == rope::Device::host;
    const std::string wrong_device(rope::device_name(other_device(backend_device)));
    auto packed = [](const char* what, std::function<void(Call&)> edit, std::string expected) {
        return BadInput{what,
                        [edit](Call& c) {
                            make_packed(c);
                            if (edit) edit(c);
                        },
                        nullptr, expected};
    };
    auto packed_args = [](const char* what, std::function<void(Args&)> edit, std::string expected) {
        return BadInput{what, make_packed, edit, expected};
    };
    auto call_case = [](const char* what, std::function<void(Call&)> edit, std::string expected) {
        return BadInput{what, edit, nullptr, expected};
    };
    auto sections = [](const char* what, rope::AxisAssignment assignment, std::vector<int64_t> counts,
                       std::string expected) {
        return BadInput{what, [=](Call& c) { c.config.multi_axis = {assignment, counts}; }, nullptr, expected};
    };
    auto table_case = [](const char* what, std::function<void(Args&)> edit, std::string expected) {
        return BadInput{what, [](Call& c) { give_table(c, 16); }, edit, expected};
    };
    constexpr auto contiguous = rope::AxisAssignment::mrope_contiguous;
    constexpr auto interleaved = rope::AxisAssignment::mrope_interleaved;
    constexpr auto axial = rope::AxisAssignment::axial;

    std::vector<BadInput> cases = {
        // Packed sequences.
        call_case("cu_seqlens with batch 2", [](Call& c) { c.cu_seqlens = {0, 3, 8}; },
                  "batch = 2: must be 1 with cu_seqlens"),
        packed("cu_seqlens and ids together", [](Call& c) { c.ids.assign(8, 1), c.id_rows = 1; },
               "positions.ids = set: must be null with cu_seqlens"),
        packed_args("cu_seqlens with 0 sequences", [](Args& a) { a.positions.sequences = 0; },
                    "positions.sequences = 0: must be >= 1 with cu_seqlens"),
        packed_args("cu_seqlens with -1 sequences", [](Args& a) { a.positions.sequences = -1; },
                    "positions.sequences = -1: must be >= 1"),
        BadInput{"sequences without cu_seqlens", nullptr, [](Args& a) { a.positions.sequences = 2; },
                 "positions.sequences = 2: must be 0 without cu_seqlens"},
        call_case("starts without cu_seqlens", [](Call& c) { c.starts = {0, 1}; },
                  "positions.starts = set: is only read with cu_seqlens"),
        packed_args("cu_seqlens on the wrong device",
                    [](Args& a) { a.positions.device = other_device(a.positions.device); },
                    "positions.device = " + wrong_device),
        packed_args("thd q with shape[3] 2", [](Args& a) { a.q.shape[3] = 2; },
                    "q.shape[3] = 2: must be 1 for a thd view"),
        packed_args("thd k_out with shape[3] 0", [](Args& a) { a.k_out.shape[3] = 0; },
                    "k_out.shape[3] = 0: must be 1 for a thd view"),
        packed("negative offset as every sequence's start", [](Call& c) { c.offset = -3; },
               "positions.offset = -3: must be >= 0"),
        // Context-parallel shards.
        call_case("cp_rank = cp_size", [](Call& c) { c.cp_size = 2, c.cp_rank = 2; },
                  "positions.cp_rank = 2: must be in [0, cp_size) = [0, 2)"),
        call_case("negative cp_rank", [](Call& c) { c.cp_size = 4, c.cp_rank = -1; },
                  "positions.cp_rank = -1: must be in [0, cp_size) = [0, 4)"),
        call_case("cp_size 0", [](Call& c) { c.cp_size = 0; }, "positions.cp_size = 0: must be >= 1"),
        call_case("negative cp_size", [](Call& c) { c.cp_size = -2; }, "positions.cp_size = -2: must be >= 1"),
        BadInput{"odd local length under context parallelism",
                 [](Call& c) {
                     const bool in_place = c.in_place;
                     c = testing::make_call(c.config, rope::DType::f32, bhsd, {2, 4, 7, 64}, {2, 4, 7, 64});
                     c.in_place = in_place;
                     c.cp_size = 2;
                 },
                 nullptr, "seq = 7: must be even with cp_size > 1"},
        call_case("context parallelism with ids",
                  [](Call& c) { c.ids.assign(8, 1), c.id_rows = 1, c.cp_size = 2, c.cp_rank = 1; },
                  "positions.cp_size = 2: must be 1 with explicit ids"),
        // Multi-axis sections (the configuration).
        sections("M-RoPE sections summing to 30 of 32 pairs", contiguous, {10, 10, 10},
                 "multi_axis.sections = sum 30: must equal rotary_dim/2 = 32"),
        sections("M-RoPE with 2 sections", contiguous, {16, 16}, "multi_axis.sections.size() = 2: must be 3 for mrope"),
        sections("interleaved M-RoPE with 4 sections", interleaved, {8, 8, 8, 8},
                 "multi_axis.sections.size() = 4: must be 3 for mrope-interleaved"),
        sections("a section of 0 pairs", contiguous, {0, 16, 16}, "multi_axis.sections[0] = 0: must be > 0"),
        sections("a negative section", contiguous, {8, -4, 28}, "multi_axis.sections[1] = -4: must be > 0"),
        sections("interleaved sections too long for their stride of 3", interleaved, {2, 15, 15},
                 "multi_axis.sections[1] = 15: too large for mrope-interleaved"),
        sections("sections for text RoPE", rope::AxisAssignment::single, {32},
                 "multi_axis.sections.size() = 1: must be 0 with one position axis"),
        sections("axial with 5 axes", axial, {8, 8, 8, 4, 4}, "multi_axis.sections.size() = 5: must be 1 to 4 for axial"),
        sections("axial with no sections", axial, {}, "multi_axis.sections.size() = 0: must be 1 to 4 for axial"),
        BadInput{"axial with linear scaling",
                 [](Call& c) {
                     c.config.multi_axis = {rope::AxisAssignment::axial, {16, 16}};
                     c.config.scaling = {.type = rope::ScalingType::linear, .factor = 2.0};
                     c.ids.assign(2 * 8, 1), c.id_axes = 2, c.id_rows = 1;
                 },
                 nullptr, "scaling.type = linear: must be default with axial RoPE"},
        // Multi-axis ids (the positions).
        call_case("axial without ids", [](Call& c) { c.config.multi_axis = {rope::AxisAssignment::axial, {16, 16}}; },
                  "positions.ids = null: axial RoPE needs explicit coordinates (ids with 2 axis rows)"),
        call_case("M-RoPE with one row of ids",
                  [](Call& c) {
                      c.config.multi_axis = {rope::AxisAssignment::mrope_contiguous, {16, 8, 8}};
                      c.ids.assign(8, 1), c.id_rows = 1;
                  },
                  "positions.axes = 1: must equal the config's position axes = 3"),
        call_case("three rows of ids for text RoPE", [](Call& c) { c.ids.assign(3 * 8, 1), c.id_axes = 3, c.id_rows = 1; },
                  "positions.axes = 3: must equal the config's position axes = 1 (multi_axis.assignment single)"),
        BadInput{"axes without ids", nullptr, [](Args& a) { a.positions.axes = 3; },
                 "positions.axes = 3: must be 1 without ids"},
        call_case("M-RoPE ids of the wrong length",
                  [](Call& c) {
                      c.config.multi_axis = {rope::AxisAssignment::mrope_interleaved, {12, 10, 10}};
                      c.ids.assign(3 * 7, 1), c.id_axes = 3, c.id_rows = 1;
                  },
                  "positions.length = 7: must equal seq = 8"),
        call_case("M-RoPE ids with 3 rows per axis for batch 2",
                  [](Call& c) {
                      c.config.multi_axis = {rope::AxisAssignment::mrope_contiguous, {16, 8, 8}};
                      c.ids.assign(3 * 3 * 8, 1), c.id_axes = 3, c.id_rows = 3;
                  },
                  "positions.rows = 3: must be 1 or batch = 2"),
        // A caller's cos/sin table.
        table_case("table of bf16", [](Args& a) { a.cos_sin_cache.dtype = rope::DType::bf16; },
                   "cos_sin_cache.dtype = bf16: must be fp32"),
        // A table of 1024 x 64 floats declared bf16: its bf16 bytes end halfway through its
        // memory, and k_out is moved to start there (it fits in the other half). Counted as
        // fp32 the table would reach into k_out, and the call would blame an overlap instead.
        BadInput{"table of bf16 whose bytes end where k_out begins", [](Call& c) { give_table(c, 1024); },
                 [](Args& a) {
                     a.cos_sin_cache.dtype = rope::DType::bf16;
                     const int64_t half = 1024 * 64 * 2;
                     REQUIRE(a.k_out.numel() * rope::dtype_size(a.k_out.dtype) <= half);
                     a.k_out.data = static_cast<char*>(const_cast<void*>(a.cos_sin_cache.data)) + half;
                 },
                 "cos_sin_cache.dtype = bf16: must be fp32"},
        call_case("table too short for the positions", [](Call& c) { give_table(c, 7); },
                  "positions = largest 7: must be < cos_sin_cache.rows = 7"),
        call_case("table too short for the unsharded positions of a shard",
                  [](Call& c) { give_table(c, 12), c.cp_size = 2; },
                  "positions = largest 15: must be < cos_sin_cache.rows = 12"),
        table_case("table columns != rotary_dim", [](Args& a) { a.cos_sin_cache.cols = 32; },
                   "cos_sin_cache.cols = 32: must equal rotary_dim = 64"),
        table_case("table row_stride < columns", [](Args& a) { a.cos_sin_cache.row_stride = 48; },
                   "cos_sin_cache.row_stride = 48: must be >= cols = 64"),
        table_case("table of 0 rows", [](Args& a) { a.cos_sin_cache.rows = 0; }, "cos_sin_cache.rows = 0: must be > 0"),
        table_case("table on the wrong device",
                   [](Args& a) { a.cos_sin_cache.device = other_device(a.cos_sin_cache.device); },
                   "cos_sin_cache.device = " + wrong_device),
        table_case("table overlapping q_out", [](Args& a) { a.cos_sin_cache.data = a.q_out.data; }, "q_out.data = "),
        table_case("table overlapping k_out", [](Args& a) { a.cos_sin_cache.data = a.k_out.data; }, "k_out.data = "),
    };
    cases[cases.size() - 2].also_expected = "overlaps cos_sin_cache";
    cases[cases.size() - 1].also_expected = "overlaps cos_sin_cache";
    if (host) {
        // Element checks: rope reads host arrays before anything is written.
        const std::vector<BadInput> readable = {
            packed("cu_seqlens not starting at 0", [](Call& c) { c.cu_seqlens = {1, 3, 8}; },
                   "positions.cu_seqlens[0] = 1: must be 0"),
            packed("decreasing cu_seqlens", [](Call& c) { c.cu_seqlens = {0, 5, 3, 8}; },
                   "positions.cu_seqlens[2] = 3: must be >= cu_seqlens[1] = 5 (non-decreasing)"),
            packed("cu_seqlens not ending at total tokens", [](Call& c) { c.cu_seqlens = {0, 3, 7}; },
                   "positions.cu_seqlens[2] = 7: must equal total tokens = 8"),
            packed("cu_seqlens past total tokens", [](Call& c) { c.cu_seqlens = {0, 9, 8}; },
                   "positions.cu_seqlens[1] = 9: must be <= total tokens = 8"),
            packed("a negative start", [](Call& c) { c.starts = {0, -4}; }, "positions.starts[1] = -4: must be >= 0"),
            packed("an odd packed sequence under context parallelism", [](Call& c) { c.cp_size = 2; },
                   "sequence 0 length = 3: must be even with cp_size > 1"),
            call_case("a negative height id",
                      [](Call& c) {
                          c.config.multi_axis = {rope::AxisAssignment::mrope_contiguous, {16, 8, 8}};
                          c.ids.assign(3 * 8, 1), c.id_axes = 3, c.id_rows = 1;
                          c.ids[8 + 3] = -1;
                      },
                      "positions.ids[11] = -1: must be >= 0"),
            call_case("table too short for host ids",
                      [](Call& c) {
                          give_table(c, 16);
                          c.ids = {0, 1, 2, 100, 4, 5, 6, 7}, c.id_rows = 1;
                      },
                      "positions = largest 100: must be < cos_sin_cache.rows = 16"),
        };
        cases.insert(cases.end(), readable.begin(), readable.end());
    }
    return cases;
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("bad-input matrix: rope::Error names the field and value, no byte written", B, matrix) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    int cases = 0, position_form_cases = 0;
    const std::vector<BadInput> one_line = bad_inputs(backend->device());
    const std::vector<BadInput> position_forms = position_form_bad_inputs(backend->device());
    for (bool in_place : {false, true}) {
        for (const std::vector<BadInput>* list : {&one_line, &position_forms}) {
            for (const BadInput& bad : *list) {
                const std::string what = bad.what;
                CAPTURE(what);
                CAPTURE(in_place);
                rope::RopeConfig config;
                config.head_dim = 64;
                testing::Call call = testing::make_call(config, rope::DType::f32, bhsd, {2, 4, 8, 64}, {2, 4, 8, 64});
                call.in_place = in_place;
                if (bad.before_staging) bad.before_staging(call);
                const testing::Call before = call;
                CHECK_THROWS_WITH_AS(testing::run(*backend, call, bad.final_args),
                                     doctest::Contains(bad.expected.c_str()), rope::Error);
                if (!bad.also_expected.empty())
                    CHECK_THROWS_WITH_AS(testing::run(*backend, call, bad.final_args),
                                         doctest::Contains(bad.also_expected.c_str()), rope::Error);
                CHECK(call.q.storage == before.q.storage);
                CHECK(call.k.storage == before.k.storage);
                CHECK(call.q_out.storage == before.q_out.storage);
                CHECK(call.k_out.storage == before.k_out.storage);
                ++cases;
                if (list == &position_forms) ++position_form_cases;
            }
        }
    }
    std::cout << "bad-input matrix: " << B::name << ": " << cases << " rejected calls checked, "
              << position_form_cases << " of them on packed, sharded or multi-axis positions or a cos/sin table"
              << std::endl;
    CHECK(cases >= 160);
    CHECK(position_form_cases >= 2 * 40);  // in place and not
}
TEST_CASE_TEMPLATE_APPLY(matrix, AllBackends);

TEST_CASE("bad input to the other public entry points") {
    int cases = 0;
    auto expect = [&](const std::function<void()>& call, const char* expected) {
        CAPTURE(expected);
        CHECK_THROWS_WITH_AS(call(), doctest::Contains(expected), rope::Error);
        ++cases;
    };
    expect([] { rope::make_backend("cpu-fast"); }, "backend = cpu-fast: unknown");
    expect([] { rope::make_backend(""); }, "backend = : unknown");
    expect([] { rope::backend_info("gpu"); }, "backend = gpu: unknown");
    expect([] { rope::make_backend("cpu-naive", rope::BackendOptions{-2}); }, "threads = -2");
    expect([] { rope::parse_dtype("fp8"); }, "dtype = fp8");
    expect([] { rope::parse_style("llama"); }, "style = llama");
    rope::RopeConfig bad;
    bad.head_dim = 64;
    bad.rotary_dim = 65;
    expect([&] { rope::validate(bad); }, "rotary_dim = 65");
    expect([&] { rope::make_frequency_table(bad, 16); }, "rotary_dim = 65");
    bad.rotary_dim = 0;
    bad.base = -1;
    expect([&] { rope::make_frequency_table(bad, 16); }, "base = -1");
    // Device-resident ids cannot be read, so length-dependent scaling needs their bound.
    {
        rope::RopeConfig dynamic;
        dynamic.head_dim = 64;
        dynamic.scaling.type = rope::ScalingType::dynamic;
        dynamic.scaling.factor = 2.0;
        dynamic.scaling.original_max_position_embeddings = 256;
        float dummy = 0;
        const int64_t fake_ids = 0;
        auto view = rope::TensorView::contiguous(&dummy, rope::DType::f32, rope::Device::cuda, rope::Layout::bhsd,
                                                 {1, 1, 1, 64});
        rope::RopeArgs args = rope::RopeArgs::in_place(view, view, rope::Positions::shared(&fake_ids, 1, rope::Device::cuda));
        args.k.shape[1] = 0;  // Rotate q only.
        args.k_out = args.k;
        expect([&] { rope::make_plan(dynamic, args, rope::Device::cuda); }, "positions.max_position = 0: must be given");
        args.positions.max_position = -5;
        expect([&] { rope::make_plan(dynamic, args, rope::Device::cuda); }, "positions.max_position = -5");
        args.positions.max_position = 4096;
        CHECK(rope::make_plan(dynamic, args, rope::Device::cuda).angles.inv_freq !=
              rope::make_frequency_table(dynamic, 256).inv_freq);
    }
    std::cout << "bad-input matrix: other entry points: " << cases << " cases checked" << std::endl;
}

TEST_CASE("an empty tensor is a valid no-op on every available backend") {
    for (const rope::BackendInfo& info : rope::list_backends()) {
        if (!info.available) continue;
        CAPTURE(info.name);
        auto backend = rope::make_backend(info.name);
        rope::RopeConfig config;
        config.head_dim = 64;
        testing::Call call = testing::make_call(config, rope::DType::f32, bhsd, {0, 4, 8, 64}, {0, 4, 8, 64});
        CHECK_NOTHROW(testing::run(*backend, call));
    }
}
