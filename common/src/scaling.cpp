// The names of the scaling types, as HuggingFace's `rope_type` spells them.
#include <string>

#include "rope/config.hpp"
#include "rope/error.hpp"

namespace rope {

std::string_view scaling_type_name(ScalingType type) {
    switch (type) {
        case ScalingType::none: return "default";
        case ScalingType::linear: return "linear";
        case ScalingType::dynamic: return "dynamic";
        case ScalingType::yarn: return "yarn";
        case ScalingType::llama3: return "llama3";
        case ScalingType::longrope: return "longrope";
        case ScalingType::deepseek_yarn: return "deepseek_yarn";
    }
    return "unknown";
}

ScalingType parse_scaling_type(std::string_view rope_type) {
    // "none" is accepted too: it is this library's name for HuggingFace's "default".
    if (rope_type == "default" || rope_type == "none") return ScalingType::none;
    for (ScalingType type : {ScalingType::linear, ScalingType::dynamic, ScalingType::yarn, ScalingType::llama3,
                             ScalingType::longrope, ScalingType::deepseek_yarn})
        if (rope_type == scaling_type_name(type)) return type;
    fail("rope_type", std::string(rope_type), "expected default, linear, dynamic, yarn, llama3, longrope or deepseek_yarn");
}

}  // namespace rope
