// Fuzz target `parsers`: the functions that turn a user's text into rope's enums
// (command lines, config files): rope::parse_scaling_type (HuggingFace's
// `rope_type`), rope::parse_style, rope::parse_dtype, rope::parse_layout and
// rope::parse_axis_assignment.
//
// Input: the first byte picks the parser, the rest is the text (any bytes,
// NUL included). Each parser must either
//   - accept, and then the text is one of the spellings its documentation
//     lists (written out below, from the headers: no prefix matching, no case
//     folding, no trailing garbage) and the value's own name parses back to
//     the same value; or
//   - throw rope::Error whose message names the parameter and quotes the text.
// Anything else (another exception, a sanitizer report, a failed check) aborts.
//
// rope has no C++ parser of config dictionaries (the Python package reads
// HuggingFace's config dicts in Python), so there is none to fuzz here.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "rope/rope.hpp"

namespace {

[[noreturn]] void failure(std::string_view parser, std::string_view text, const std::string& what) {
    std::fprintf(stderr, "\n=== rope-fuzz-parsers: %.*s(\"%.*s\"): %s\n", int(parser.size()), parser.data(),
                 int(text.size()), text.data(), what.c_str());
    std::abort();
}

// One parser: its documented spellings, and a round trip through the name of what it returned.
struct Parser {
    std::string_view name;       // the function, for messages
    std::string_view parameter;  // what its rope::Error names
    std::vector<std::string_view> spellings;
    // Parses the text; on success, returns the canonical name of the value and
    // whether that name parses back to the same value.
    std::function<std::pair<std::string, bool>(std::string_view)> parse_and_round_trip;
};

// Parses @p text with @p parse, names the value with @p name, parses the name again.
template <typename Parse, typename Name>
std::pair<std::string, bool> round_trip(Parse parse, Name name, std::string_view text) {
    const auto value = parse(text);
    const std::string canonical(name(value));
    return {canonical, parse(canonical) == value};
}

const std::vector<Parser>& parsers() {
    static const std::vector<Parser> all = {
        {"parse_scaling_type", "rope_type", {"default", "none", "linear", "dynamic", "yarn", "llama3", "longrope",
                                                "deepseek_yarn"},
         [](std::string_view text) { return round_trip(rope::parse_scaling_type, rope::scaling_type_name, text); }},
        {"parse_style", "style", {"neox", "half_split", "half-split", "gptj", "interleaved", "interleaved_to_half",
                                     "interleaved-to-half", "half_to_interleaved", "half-to-interleaved"},
         [](std::string_view text) { return round_trip(rope::parse_style, rope::style_name, text); }},
        {"parse_dtype", "dtype", {"fp32", "float32", "f32", "fp16", "float16", "f16", "bf16", "bfloat16"},
         [](std::string_view text) { return round_trip(rope::parse_dtype, rope::dtype_name, text); }},
        {"parse_layout", "layout", {"bhsd", "bshd", "thd"},
         [](std::string_view text) { return round_trip(rope::parse_layout, rope::layout_name, text); }},
        {"parse_axis_assignment", "multi_axis.assignment", {"single", "mrope", "mrope-interleaved", "axial"},
         [](std::string_view text) {
             return round_trip(rope::parse_axis_assignment, rope::axis_assignment_name, text);
         }},
    };
    return all;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
    if (size == 0) return 0;
    const Parser& parser = parsers()[data[0] % parsers().size()];
    const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);
    bool documented = false;
    for (std::string_view spelling : parser.spellings) documented = documented || spelling == text;
    try {
        const auto [canonical, same] = parser.parse_and_round_trip(text);
        if (!documented) failure(parser.name, text, "accepted a spelling its documentation does not list");
        if (!same) failure(parser.name, text, "the value's name \"" + canonical + "\" parses to another value");
    } catch (const rope::Error& error) {
        if (documented) failure(parser.name, text, std::string("rejected a documented spelling: ") + error.what());
        // The message is `rope::Error: <parameter> = <text>: <reason>`.
        const std::string expected = "rope::Error: " + std::string(parser.parameter) + " = " + std::string(text) + ": ";
        const std::string message = error.what();
        // what() is a C string: text with a NUL byte is cut there, so compare up to it.
        const size_t compared = std::min(expected.size(), expected.find('\0'));
        if (message.compare(0, compared, expected, 0, compared) != 0)
            failure(parser.name, text, "message does not name the parameter and the text: " + message);
    }
    return 0;
}
