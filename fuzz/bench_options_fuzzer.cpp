// Fuzz target `bench_options`: rope-bench's command line (rope_bench::parse_options,
// bench/options.hpp), which promises to throw UsageError for anything it cannot
// accept, and nothing else, and never to exit.
//
// Input: the bytes, cut at every NUL, are the arguments after the program's
// name (so libFuzzer's text mutations edit one argument, and the dictionary's
// option names splice in whole ones). The parser must either
//   - throw rope_bench::UsageError with a message; or
//   - return options that keep the promises its header and its checks make:
//     registered backends only ("all" expanded), at least one shape, counts
//     in their ranges (kv_heads >= -1, threads and reps >= 0, runs >= 1, a
//     cache size that is a finite number >= 0, position offset >= 0, a
//     context-parallel rank below its size), packed lengths 1 <= MIN <= MAX,
//     sections as --mrope or --axial take them, a known output format, and
//     the usage text.
// Anything else (another exception, a sanitizer report, a failed check) aborts.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "options.hpp"
#include "rope/rope.hpp"

namespace {

[[noreturn]] void failure(const std::vector<std::string>& args, const std::string& what) {
    std::fprintf(stderr, "\n=== rope-fuzz-bench_options: rope-bench");
    for (const std::string& arg : args) std::fprintf(stderr, " '%s'", arg.c_str());
    std::fprintf(stderr, "\n%s\n", what.c_str());
    std::abort();
}

// Empty when @p options keep the parser's promises, else the first one broken.
std::string broken_promise(const rope_bench::Options& options) {
    if (options.usage.empty()) return "no usage text";
    if (options.help) return "";  // --help: nothing else is checked
    if (options.backends.empty()) return "no backend";
    for (const std::string& name : options.backends) {
        const std::vector<rope::BackendInfo> known = rope::list_backends();
        if (std::none_of(known.begin(), known.end(), [&](const rope::BackendInfo& info) { return info.name == name; }))
            return "backend '" + name + "' is not registered";
    }
    if (options.shapes.empty()) return "no shape";
    if (options.kv_heads < -1) return "kv_heads " + std::to_string(options.kv_heads);
    for (int threads : options.threads)
        if (threads < 0) return "threads " + std::to_string(threads);
    if (options.reps < 0) return "reps " + std::to_string(options.reps);
    if (options.runs < 1) return "runs " + std::to_string(options.runs);
    if (!std::isfinite(options.llc_mb) || options.llc_mb < 0) return "llc_mb " + std::to_string(options.llc_mb);
    if (options.position_offset < 0) return "position_offset " + std::to_string(options.position_offset);
    if (options.cp_size < 1 || options.cp_rank < 0 || options.cp_rank >= options.cp_size)
        return "cp " + std::to_string(options.cp_size) + "," + std::to_string(options.cp_rank);
    const rope_bench::PackedLengths& packed = options.packed;
    if (packed.enabled && packed.lengths.empty() && (packed.min_length < 1 || packed.max_length < packed.min_length))
        return "packed " + std::to_string(packed.min_length) + ".." + std::to_string(packed.max_length);
    for (int64_t section : options.sections)
        if (section < 1) return "section " + std::to_string(section);
    const bool mrope = options.multi_axis == rope::AxisAssignment::mrope_contiguous ||
                       options.multi_axis == rope::AxisAssignment::mrope_interleaved;
    if (mrope && !options.sections.empty() && options.sections.size() != 3)
        return std::to_string(options.sections.size()) + " M-RoPE sections";
    if (options.multi_axis == rope::AxisAssignment::axial &&
        (options.sections.size() < 2 || int64_t(options.sections.size()) > rope::kMaxPositionAxes))
        return std::to_string(options.sections.size()) + " axial sections";
    if (options.multi_axis == rope::AxisAssignment::single && !options.sections.empty()) return "sections without --mrope";
    if (options.format != "table" && options.format != "csv")
        return "format '" + options.format + "'";
    return "";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    // The arguments, cut at NUL bytes (none for an empty input); at most 64.
    std::vector<std::string> args;
    if (size > 0) args.emplace_back();
    for (size_t i = 0; i < size; ++i) {
        if (data[i] != 0) args.back() += char(data[i]);
        else if (args.size() < 64) args.emplace_back();
        else break;
    }
    std::vector<const char*> argv{"rope-bench"};
    for (const std::string& arg : args) argv.push_back(arg.c_str());

    try {
        const rope_bench::Options options = rope_bench::parse_options(int(argv.size()), argv.data());
        const std::string broken = broken_promise(options);
        if (!broken.empty()) failure(args, "accepted, but: " + broken);
    } catch (const rope_bench::UsageError& error) {
        if (std::string(error.what()).empty()) failure(args, "UsageError without a message");
    }
    // Any other exception escapes to libFuzzer, which reports it as a crash.
    return 0;
}
