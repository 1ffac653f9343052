// Parsing of the short names used on command lines and in configs.
#include <string>

#include "rope/config.hpp"
#include "rope/dtype.hpp"
#include "rope/error.hpp"
#include "rope/fp8.hpp"

namespace rope {

DType parse_dtype(std::string_view name) {
    if (name == "fp32" || name == "float32" || name == "f32") return DType::f32;
    if (name == "fp16" || name == "float16" || name == "f16") return DType::f16;
    if (name == "bf16" || name == "bfloat16") return DType::bf16;
    fail("dtype", std::string(name), "expected fp32, fp16 or bf16");
}

Style parse_style(std::string_view name) {
    if (name == "neox" || name == "half_split" || name == "half-split") return Style::half_split;
    if (name == "gptj" || name == "interleaved") return Style::interleaved;
    if (name == "interleaved_to_half" || name == "interleaved-to-half") return Style::interleaved_to_half;
    if (name == "half_to_interleaved" || name == "half-to-interleaved") return Style::half_to_interleaved;
    fail("style", std::string(name),
         "expected neox (half-split), gptj (interleaved), interleaved_to_half (HF's DeepSeek order) or "
         "half_to_interleaved");
}

std::string_view axis_assignment_name(AxisAssignment assignment) {
    switch (assignment) {
        case AxisAssignment::single: return "single";
        case AxisAssignment::mrope_contiguous: return "mrope";
        case AxisAssignment::mrope_interleaved: return "mrope-interleaved";
        case AxisAssignment::axial: return "axial";
    }
    return "unknown";
}

Fp8Format parse_fp8_format(std::string_view name) {
    if (name == "e4m3fn" || name == "float8_e4m3fn") return Fp8Format::e4m3fn;
    if (name == "e5m2" || name == "float8_e5m2") return Fp8Format::e5m2;
    fail("fp8_format", std::string(name), "expected e4m3fn or e5m2");
}

AxisAssignment parse_axis_assignment(std::string_view name) {
    for (AxisAssignment assignment : {AxisAssignment::single, AxisAssignment::mrope_contiguous,
                                      AxisAssignment::mrope_interleaved, AxisAssignment::axial})
        if (name == axis_assignment_name(assignment)) return assignment;
    fail("multi_axis.assignment", std::string(name), "expected single, mrope, mrope-interleaved or axial");
}

}  // namespace rope
