#pragma once
/// @file error.hpp
/// @brief The one exception type every rope entry point throws.

#include <cstdio>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace rope {

/// @brief Raised for every invalid argument and every failed device call.
///
/// The message always names the offending parameter and its value, so a user
/// can fix the call without reading rope's source, e.g.
/// `rope::Error: rotary_dim = 63: must be even`.
class Error : public std::runtime_error {
public:
    /// @brief Wraps an already formatted message.
    /// @param message the full text what() returns.
    explicit Error(const std::string& message) : std::runtime_error(message) {}
};

/// @brief A value as rope's messages print it: integers in full, other numbers as
/// printf's %g (4, 0.5, 1e+06, inf, nan), pointers in hex, text as it is.
///
/// Plain snprintf rather than an ostringstream: the error path then needs no
/// iostreams, whose static state a Python extension loaded into a foreign
/// process was seen to find uninitialised (a crash on the GPU machine).
/// @tparam Value an integer, floating-point, pointer or text type
/// @param value the value to print.
/// @return its text.
template <typename Value>
std::string to_text(const Value& value) {
    if constexpr (std::is_same_v<Value, bool>) {
        return value ? "true" : "false";
    } else if constexpr (std::is_integral_v<Value>) {
        return std::to_string(value);
    } else if constexpr (std::is_floating_point_v<Value>) {
        char text[32];
        std::snprintf(text, sizeof text, "%g", double(value));
        return text;
    } else if constexpr (std::is_convertible_v<const Value&, std::string_view>) {
        return std::string(std::string_view(value));
    } else {
        static_assert(std::is_pointer_v<Value>, "rope::to_text: unsupported value type");
        char text[32];
        std::snprintf(text, sizeof text, "%p", static_cast<const void*>(value));
        return text;
    }
}

/// @brief Builds and throws an Error of the form `parameter = value: reason`.
/// @param parameter name of the argument or field, as the user spells it
/// @param value the offending value (see to_text)
/// @param reason what the value should have been
/// @tparam Value an integer, floating-point, pointer or text type
/// @throws rope::Error always.
template <typename Value>
[[noreturn]] void fail(std::string_view parameter, const Value& value, std::string_view reason) {
    throw Error("rope::Error: " + std::string(parameter) + " = " + to_text(value) + ": " + std::string(reason));
}

}  // namespace rope
