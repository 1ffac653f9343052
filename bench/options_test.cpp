// rope-bench's command line: what parse_options accepts and what it refuses, and
// the position forms make_form builds from it. No device, no timing.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "forms.hpp"
#include "options.hpp"
#include "rope/backend.hpp"

namespace {

rope_bench::Options parse(std::vector<std::string> arguments) {
    arguments.insert(arguments.begin(), "rope-bench");
    std::vector<const char*> argv;
    for (const std::string& argument : arguments) argv.push_back(argument.c_str());
    return rope_bench::parse_options(int(argv.size()), argv.data());
}

}  // namespace

TEST_CASE("defaults: every backend, one shape, plain positions, one run") {
    const rope_bench::Options options = parse({});
    CHECK(options.backends.size() == rope::list_backends().size());
    REQUIRE(options.shapes.size() == 1);
    CHECK(options.shapes[0].heads == 32);
    CHECK(options.shapes[0].seq == 4096);
    CHECK(options.runs == 1);
    CHECK(options.layout == rope::Layout::bhsd);
    CHECK_FALSE(options.packed.enabled);
    CHECK(options.multi_axis == rope::AxisAssignment::single);
    CHECK_FALSE(options.help);
}

TEST_CASE("options are read as written") {
    const rope_bench::Options options =
        parse({"--backend", "cpu-naive", "--shape", "2,8,64,128", "--shape", "1,4,1,64", "--kv-heads", "2", "--dtype",
               "bf16", "--style", "gptj", "--layout", "bshd", "--placement", "out", "--threads", "1,2", "--reps", "7",
               "--runs", "3", "--position-offset", "4096", "--precise", "--graph", "--format", "csv"});
    CHECK(options.backends == std::vector<std::string>{"cpu-naive"});
    REQUIRE(options.shapes.size() == 2);
    CHECK(options.shapes[0].batch == 2);
    CHECK(options.shapes[1].head_dim == 64);
    CHECK(options.kv_heads == 2);
    CHECK(options.dtype == rope::DType::bf16);
    CHECK(options.style == rope::Style::interleaved);
    CHECK(options.layout == rope::Layout::bshd);
    CHECK_FALSE(options.in_place);
    CHECK(options.threads == std::vector<int>{1, 2});
    CHECK(options.reps == 7);
    CHECK(options.runs == 3);
    CHECK(options.position_offset == 4096);
    CHECK(options.precise);
    CHECK(options.graph);
    CHECK(options.format == "csv");
}

TEST_CASE("--help asks for the usage and neither throws nor exits") {
    const rope_bench::Options options = parse({"--help"});
    CHECK(options.help);
    CHECK(options.usage.find("--packed") != std::string::npos);
}

TEST_CASE("position forms") {
    SUBCASE("--packed implies thd unless a layout is given") {
        CHECK(parse({"--packed", "1..8192:32768"}).layout == rope::Layout::thd);
        CHECK(parse({"--packed", "8,8", "--layout", "bshd"}).layout == rope::Layout::bshd);
        const rope_bench::Options drawn = parse({"--packed", "1..8192:32768"});
        CHECK(drawn.packed.min_length == 1);
        CHECK(drawn.packed.max_length == 8192);
        CHECK(drawn.packed.total == 32768);
        CHECK(parse({"--packed", "3,0,5"}).packed.lengths == std::vector<int64_t>{3, 0, 5});
    }
    SUBCASE("--cp, --mrope, --sections, --axial, --table") {
        const rope_bench::Options cp = parse({"--cp", "4,3"});
        CHECK(cp.cp_size == 4);
        CHECK(cp.cp_rank == 3);
        const rope_bench::Options mrope = parse({"--mrope", "interleaved", "--sections", "24,20,20"});
        CHECK(mrope.multi_axis == rope::AxisAssignment::mrope_interleaved);
        CHECK(mrope.sections == std::vector<int64_t>{24, 20, 20});
        const rope_bench::Options axial = parse({"--axial", "8,28,28"});
        CHECK(axial.multi_axis == rope::AxisAssignment::axial);
        CHECK(axial.sections == std::vector<int64_t>{8, 28, 28});
        CHECK(parse({"--table"}).table);
        CHECK(parse({"--ids"}).ids);
    }
}

TEST_CASE("what parse_options refuses, each with a UsageError") {
    const std::vector<std::vector<std::string>> refused{
        {"--no-such-option"}, {"stray"}, {"--backend", "no-such-backend"}, {"--dtype", "fp64"}, {"--layout", "sbhd"},
        {"--format", "xml"}, {"--shape", "1,2,3"}, {"--shape", "1,2,3,4,5"}, {"--shape", "1,-2,3,4"},
        {"--shape", "1,x,3,4"}, {"--shape", ""}, {"--kv-heads", "-1"}, {"--runs", "0"}, {"--reps", "many"},
        {"--threads", "1,-1"}, {"--cp", "2,2"}, {"--cp", "0,0"}, {"--cp", "2"}, {"--packed", "5..3"},
        {"--packed", "0..4"}, {"--packed", "1..4:0"}, {"--packed", "1..4:"}, {"--packed", "..4"},
        {"--packed", "1,,2"}, {"--mrope", "diagonal"},
        {"--sections", "16,24,24"},                        // Without --mrope.
        {"--mrope", "contiguous", "--sections", "16,24"},  // Not 3 of them.
        {"--mrope", "contiguous", "--axial", "32,32"},     // Both.
        {"--axial", "64"},                                 // One axis.
        {"--axial", "8,8,8,8,8"},                          // More than kMaxPositionAxes.
        {"--ids", "--mrope", "contiguous"},                // Ids of one axis, or of three.
        {"--ids", "--axial", "32,32"},
    };
    for (const auto& arguments : refused) {
        std::string line;
        for (const std::string& argument : arguments) line += argument + " ";
        CAPTURE(line);
        CHECK_THROWS_AS(parse(arguments), rope_bench::UsageError);
    }
    CHECK_THROWS_AS(rope_bench::parse_options(0, nullptr), rope_bench::UsageError);
}

TEST_CASE("packed lengths: fixed seed, within range, exact total") {
    rope_bench::PackedLengths packed;
    packed.enabled = true;
    packed.min_length = 1;
    packed.max_length = 8192;
    const std::vector<int64_t> lengths = rope_bench::packed_lengths(packed, 32768, 1);
    CHECK(std::accumulate(lengths.begin(), lengths.end(), int64_t(0)) == 32768);
    CHECK(lengths.size() > 2);
    for (int64_t length : lengths) {
        CHECK(length >= 1);
        CHECK(length <= 8192);
    }
    CHECK(rope_bench::packed_lengths(packed, 32768, 1) == lengths);  // The same batch every time.
    std::set<int64_t> distinct(lengths.begin(), lengths.end());
    CHECK(distinct.size() > 1);
    for (int64_t length : rope_bench::packed_lengths(packed, 32768, 2)) CHECK(length % 2 == 0);  // --cp: even.
    CHECK_THROWS_AS(rope_bench::packed_lengths(packed, 32767, 2), rope_bench::UsageError);
}

TEST_CASE("make_form: geometry, ids and table of each form") {
    const rope_bench::Shape shape{1, 4, 64, 128};
    SUBCASE("plain") {
        const rope_bench::Form form = rope_bench::make_form(parse({}), shape, 4);
        CHECK(form.name == "plain");
        CHECK(form.elements() == 64 * 8 * 128);
    }
    SUBCASE("packed: a thd tensor whose cu_seqlens total the tokens") {
        const rope_bench::Form form = rope_bench::make_form(parse({"--packed", "1..20", "--cp", "2,1"}), shape, 2);
        CHECK(form.name == "packed+cp");
        CHECK(form.layout == rope::Layout::thd);
        CHECK(form.cu_seqlens.front() == 0);
        CHECK(form.cu_seqlens.back() == 64);
        CHECK(form.elements() == 64 * 6 * 128);
        CHECK_THROWS_AS(rope_bench::make_form(parse({"--packed", "10,10"}), shape, 2), rope_bench::UsageError);
    }
    SUBCASE("mrope: Qwen2-VL's sections and three distinct rows") {
        const rope_bench::Form form = rope_bench::make_form(parse({"--mrope", "contiguous"}), shape, 4);
        CHECK(form.name == "mrope");
        CHECK(form.config.multi_axis.sections == std::vector<int64_t>{16, 24, 24});
        REQUIRE(form.ids.size() == 3 * 64);
        CHECK(form.ids[63] != form.ids[64 + 63]);         // temporal != height for the last patch
        CHECK(form.ids[64 + 63] != form.ids[128 + 63]);   // height != width
        CHECK(form.ids[0] == form.ids[64]);                // a text token: equal rows
        const rope_bench::Form half = rope_bench::make_form(parse({"--mrope", "interleaved"}), {1, 4, 64, 64}, 4);
        CHECK(half.config.multi_axis.sections == std::vector<int64_t>{12, 10, 10});  // [24,20,20] for 32 pairs.
    }
    SUBCASE("axial: grid coordinates") {
        const rope_bench::Form form = rope_bench::make_form(parse({"--axial", "32,32"}), shape, 4);
        CHECK(form.axes == 2);
        CHECK(form.ids[9] == 1);       // token 9 of an 8x8 grid: row 1
        CHECK(form.ids[64 + 9] == 1);  // column 1
        CHECK_THROWS_AS(rope_bench::make_form(parse({"--axial", "32,32", "--layout", "thd"}), shape, 4),
                        rope_bench::UsageError);
    }
    SUBCASE("ids: the plain positions, in memory") {
        const rope_bench::Form form = rope_bench::make_form(parse({"--ids", "--position-offset", "10"}), shape, 4);
        CHECK(form.name == "ids");
        CHECK(form.axes == 1);
        REQUIRE(form.ids.size() == 64);
        CHECK(form.ids.front() == 10);
        CHECK(form.ids.back() == 73);
        CHECK_THROWS_AS(rope_bench::make_form(parse({"--ids", "--layout", "thd"}), shape, 4), rope_bench::UsageError);
    }
    SUBCASE("table: cos then sin of rope's own angles, one row per position") {
        const rope_bench::Form form = rope_bench::make_form(parse({"--table", "--position-offset", "10"}), shape, 4);
        CHECK(form.name == "table");
        CHECK(form.table_rows == 74);
        REQUIRE(form.cos_sin.size() == 74 * 128);
        CHECK(form.cos_sin[0] == 1.0f);    // position 0: cos 0
        CHECK(form.cos_sin[64] == 0.0f);   // sin 0
        const float c = form.cos_sin[128], s = form.cos_sin[128 + 64];  // position 1, pair 0 (theta 1)
        CHECK(c == doctest::Approx(std::cos(1.0)));
        CHECK(s == doctest::Approx(std::sin(1.0)));
    }
}
