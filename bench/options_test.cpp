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

TEST_CASE("defaults, and options read as written") {
    const rope_bench::Options defaults = parse({});
    CHECK(defaults.backends.size() == rope::list_backends().size());
    REQUIRE(defaults.shapes.size() == 1);
    CHECK(defaults.shapes[0].text() == "1,32,4096,128");
    CHECK(defaults.layout == rope::Layout::bhsd);
    const rope_bench::Options options =
        parse({"--backend", "cpu-naive", "--shape", "2,8,64,128", "--kv-heads", "2", "--dtype", "bf16", "--style",
               "gptj", "--placement", "out", "--threads", "1,2", "--reps", "7", "--runs", "3", "--position-offset",
               "4096", "--precise", "--graph", "--format", "csv", "--packed", "1..64:128", "--cp", "4,3"});
    CHECK(options.backends == std::vector<std::string>{"cpu-naive"});
    CHECK(options.shapes[0].text() == "2,8,64,128");
    CHECK((options.kv_heads == 2 && options.dtype == rope::DType::bf16 && options.style == rope::Style::interleaved));
    CHECK((!options.in_place && options.threads == std::vector<int>{1, 2} && options.reps == 7 && options.runs == 3));
    CHECK((options.position_offset == 4096 && options.precise && options.graph && options.format == "csv"));
    CHECK((options.layout == rope::Layout::thd && options.packed.max_length == 64 && options.packed.total == 128));
    CHECK((options.cp_size == 4 && options.cp_rank == 3));
    CHECK(parse({"--mrope", "interleaved", "--sections", "24,20,20"}).sections == std::vector<int64_t>{24, 20, 20});
    CHECK(parse({"--axial", "8,28,28"}).multi_axis == rope::AxisAssignment::axial);
    CHECK(parse({"--help"}).help);
    const rope_bench::Options append = parse({"--op", "append", "--page-size", "32", "--cache", "e5m2"});
    CHECK((append.op == "append" && append.layout == rope::Layout::thd && append.page_size == 32 &&
           append.cache_dtype == rope::CacheDType::e5m2 && append.context == 2048 && !append.q_fp8));
    CHECK(parse({"--op", "append", "--cache", "e4m3fn", "--q-fp8"}).q_fp8);
    CHECK(append.fp8_scale == 0.03125f);
    CHECK(parse({"--op", "append", "--cache", "e4m3fn", "--fp8-scale", "0.0224"}).fp8_scale == 0.0224f);
    const rope_bench::Options qk = parse({"--op", "qknorm", "--rounding", "hf_qwen3"});
    CHECK((qk.op == "qknorm" && qk.rounding == rope::QkNormRounding::hf_qwen3));
    CHECK((parse({}).op == "rope" && parse({"--op", "qknorm"}).rounding == rope::QkNormRounding::float32));
    // --op rerotate: the shape's heads are the keys, so the set holds no k heads (kv_heads 0, given or not).
    const rope_bench::Options rerotate =
        parse({"--op", "rerotate", "--shape", "1,8,512,128", "--layout", "bshd", "--dtype", "bf16", "--placement",
               "out", "--position-offset", "4096"});
    CHECK((rerotate.op == "rerotate" && rerotate.kv_heads == 0 && rerotate.layout == rope::Layout::bshd));
    CHECK((!rerotate.in_place && rerotate.position_offset == 4096 && rerotate.dtype == rope::DType::bf16));
    CHECK(parse({"--op", "rerotate", "--kv-heads", "0"}).kv_heads == 0);
    CHECK(parse({"--op", "rerotate", "--layout", "thd"}).layout == rope::Layout::thd);
}

// Every option with a number or a name: accepted at its bounds (options.hpp), refused beyond them at once, the
// message naming the option and the value ("" = accepted). Each refusal is checked for what it says, so a
// refusal for another reason fails.
TEST_CASE("the table of accepted and refused options") {
    const std::vector<std::pair<std::vector<std::string>, std::string>> table{
        {{"--threads", "1024"}, ""},
        {{"--threads", "100000"}, "--threads: must be a number from 0 to 1024, got 100000"},  // Was a segfault.
        {{"--threads", "20000"}, "--threads: must be a number from 0 to 1024, got 20000"},    // Was a hang.
        {{"--threads", "1,-1"}, "--threads: must be a number from 0 to 1024, got -1"},
        {{"--reps", "1000000"}, ""},
        {{"--reps", "1e9"}, "--reps: must be a number from 0 to 1000000, got 1e9"},
        {{"--reps", "many"}, "--reps: must be a number from 0 to 1000000, got many"},
        {{"--runs", "0"}, "--runs: must be a number from 1 to 100, got 0"},
        {{"--runs", "101"}, "--runs: must be a number from 1 to 100, got 101"},
        {{"--llc-mb", "0.001"}, ""},
        {{"--llc-mb", "1e30"}, "--llc-mb: must be a number from 0 to 65536, got 1e30"},  // Was 0 MiB, exit 0.
        {{"--llc-mb", "nan"}, "--llc-mb: must be a number from 0 to 65536, got nan"},
        {{"--llc-mb", "inf"}, "--llc-mb: must be a number from 0 to 65536, got inf"},
        {{"--position-offset", "2147483647"}, ""},
        {{"--position-offset", "1e12"}, "--position-offset: must be a number from 0 to 2147483647, got 1e12"},
        {{"--table", "--position-offset", "100000000"}, "--table with --position-offset 100000000"},  // Was bad_alloc.
        {{"--kv-heads", "-1"}, "--kv-heads: must be a number from 0 to 1048576, got -1"},
        {{"--kv-heads", "1e7"}, "--kv-heads: must be a number from 0 to 1048576, got 1e7"},
        {{"--shape", "1,1,1,2"}, ""},
        {{"--shape", "1,32,0,128"}, "--shape: expected B,H,N,D (4 integers, each at least 1), got '1,32,0,128'"},
        {{"--shape", "1,2,3"}, "--shape: expected B,H,N,D"},
        {{"--shape", "1,-2,3,4"}, "--shape: expected integers from 0 to 2147483647 separated by commas, got '1,-2"},
        {{"--shape", "1,2,99999999999,4"}, "--shape: expected integers from 0 to 2147483647"},
        {{"--shape", "65536,1024,65536,128"}, "q and k hold more than 17179869184 elements"},
        {{"--shape", "1,x,3,4"}, "--shape: expected integers"},
        {{"--packed", "1..4096:4096"}, ""},
        {{"--packed", "1..8:1000000000000000"}, "--packed (TOTAL): expected integers from 0 to 2147483647"},
        {{"--packed", "1..8:8192"}, "--packed: the lengths total 8192 tokens but --shape 1,32,4096,128"},  // Was 36 s.
        {{"--packed", "100,3000"}, "--packed: the lengths total 3100 tokens but --shape 1,32,4096,128"},
        {{"--packed", "5..3"}, "--packed: need 1 <= MIN <= MAX"},
        {{"--packed", "1..4:0"}, "--packed: need 1 <= MIN <= MAX and TOTAL >= 1"},
        {{"--cp", "1024,0"}, ""},
        {{"--cp", "5000,1"}, "--cp: expected SIZE,RANK with 1 <= SIZE <= 1024 and 0 <= RANK < SIZE, got 5000,1"},
        {{"--cp", "2,2"}, "--cp: expected SIZE,RANK"},
        {{"--mrope", "contiguous", "--sections", "16,24,3000000000"}, "--sections: must be a number from 1 to"},
        {{"--axial", "8,0"}, "--axial: must be a number from 1 to 2147483647, got 0"},
        {{"--axial", "64"}, "--axial: expected 2 to"},
        {{"--axial", "8,8,8,8,8"}, "--axial: expected 2 to"},
        {{"--sections", "16,24,24"}, "--sections requires --mrope"},
        {{"--mrope", "contiguous", "--axial", "32,32"}, "excludes"},
        {{"--ids", "--axial", "32,32"}, "excludes"},
        {{"--backend", "no-such-backend"}, "--backend: no-such-backend not in"},
        {{"--dtype", "fp64"}, "--dtype: fp64 not in"},
        {{"--format", "xml"}, "--format: xml not in"},
        {{"--no-such-option"}, "--no-such-option"},
        {{"--op", "append", "--page-size", "65536", "--context", "1048576", "--cache", "e4m3fn"}, ""},
        {{"--op", "fuse"}, "--op: fuse not in"},
        {{"--op", "append", "--page-size", "0"}, "--page-size: must be a number from 1 to 65536, got 0"},
        {{"--op", "append", "--page-size", "1e9"}, "--page-size: must be a number from 1 to 65536, got 1e9"},
        {{"--op", "append", "--context", "0"}, "--context: must be a number from 1 to 1048576, got 0"},
        {{"--op", "append", "--context", "2e6"}, "--context: must be a number from 1 to 1048576, got 2e6"},
        {{"--op", "append", "--cache", "int8"}, "--cache: int8 not in"},
        {{"--op", "append", "--cache", "e5m2", "--q-fp8"}, ""},
        {{"--op", "append", "--q-fp8"}, "--q-fp8: needs --op append with --cache e4m3fn or e5m2"},
        {{"--op", "rope", "--q-fp8"}, "--q-fp8: needs --op append with --cache e4m3fn or e5m2"},
        {{"--q-fp8"}, "--q-fp8 requires --op"},
        {{"--op", "append", "--cache", "e4m3fn", "--fp8-scale", "0"}, "--fp8-scale: must be a number from"},
        {{"--op", "append", "--cache", "e4m3fn", "--fp8-scale", "nan"}, "--fp8-scale: must be a number from"},
        {{"--op", "append", "--cache", "e5m2", "--fp8-scale", "2e6"}, "--fp8-scale: must be a number from"},
        {{"--op", "append", "--fp8-scale", "0.5"}, "--fp8-scale: needs --op append with --cache e4m3fn or e5m2"},
        {{"--fp8-scale", "0.5"}, "--fp8-scale requires --op"},
        {{"--page-size", "16"}, "--page-size requires --op"},
        {{"--op", "append", "--layout", "bshd"}, "--layout bshd: --op append takes thd"},
        {{"--op", "append", "--cp", "2,0"}, "--cp: --op append measures unsharded sequences only"},
        {{"--op", "qknorm", "--rounding", "hf_olmo2"}, ""},
        {{"--op", "norm"}, "--op: norm not in"},
        {{"--op", "qknorm", "--rounding", "bf16"}, "--rounding: bf16 not in"},
        {{"--rounding", "hf_qwen3"}, "--rounding requires --op"},
        {{"--op", "rope", "--rounding", "hf_qwen3"}, "--rounding hf_qwen3: only with --op qknorm, got --op rope"},
        {{"--op", "append", "--rounding", "float32"}, "--rounding float32: only with --op qknorm, got --op append"},
        {{"--op", "rerotate", "--shape", "8,8,4096,128", "--layout", "bshd", "--graph", "--precise"}, ""},
        {{"--op", "rerotate", "--kv-heads", "8"}, "--kv-heads 8: --op rerotate takes no q: the shape's H heads are"},
        {{"--op", "rerotate", "--ids"}, "--ids: --op rerotate measures the plain positions only"},
        {{"--op", "rerotate", "--mrope", "contiguous"}, "--mrope contiguous: --op rerotate measures the plain"},
        {{"--op", "rerotate", "--axial", "32,32"}, "--axial: --op rerotate measures the plain positions only"},
        {{"--op", "rerotate", "--packed", "1..64:4096"}, "--packed 1..64:4096: --op rerotate measures the plain"},
        {{"--op", "rerotate", "--cp", "2,1"}, "--cp 2,1: --op rerotate measures the plain positions only"},
        {{"--op", "rerotate", "--cp", "1,0"}, ""},  // One rank: no split.
        {{"--op", "rerotate", "--table"}, "--table: --op rerotate takes no cos/sin table: rope::rerotate refuses"},
        {{"--op", "rerotate", "--rounding", "float32"}, "--rounding float32: only with --op qknorm, got --op rerotate"},
        // Sized as the keys alone: 2^34 elements of keys are accepted (as q and k of 2^34 are for --op rope).
        {{"--op", "rerotate", "--shape", "1,64,2097152,128"}, ""},
        {{"--op", "rerotate", "--shape", "1,65,2097152,128"}, "q and k hold more than 17179869184 elements"},
    };
    for (const auto& [arguments, refusal] : table) {
        std::string line;
        for (const std::string& argument : arguments) line += argument + " ";
        CAPTURE(line);
        std::string said;
        try {
            parse(arguments);
        } catch (const rope_bench::UsageError& error) {
            said = error.what();
        }
        CAPTURE(said);
        CHECK((refusal.empty() ? said.empty() : said.find(refusal) != std::string::npos));
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
    SUBCASE("rerotate: the set is the shape's heads alone (the keys), at the plain positions") {
        const rope_bench::Options options = parse({"--op", "rerotate", "--position-offset", "10"});
        const rope_bench::Form form = rope_bench::make_form(options, shape, options.kv_heads);
        CHECK(form.name == "plain");
        CHECK((form.q_heads == 4 && form.k_heads == 0 && form.offset == 10));
        CHECK(form.elements() == 64 * 4 * 128);
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
