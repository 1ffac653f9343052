#pragma once
/// @file error.hpp
/// @brief The one exception type every rope entry point throws.

#include <sstream>
#include <stdexcept>
#include <string>
#include <string_view>

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

/// @brief Builds and throws an Error of the form `parameter = value: reason`.
/// @param parameter name of the argument or field, as the user spells it
/// @param value the offending value (anything that can be streamed)
/// @param reason what the value should have been
/// @tparam Value any type with an `operator<<` for std::ostream
/// @throws rope::Error always.
template <typename Value>
[[noreturn]] void fail(std::string_view parameter, const Value& value, std::string_view reason) {
    std::ostringstream message;
    message << "rope::Error: " << parameter << " = " << value << ": " << reason;
    throw Error(message.str());
}

}  // namespace rope
