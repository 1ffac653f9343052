// Chapter 7: precision.
//
// Where RoPE's rounding errors come from, measured against the float64 formula:
//   1. storage: float32, float16 and bfloat16 hold q and k with 24, 11 and 8
//      significant bits; the arithmetic is float32 whatever the storage;
//   2. the angle: float32(position) * float32(theta_i) is rounded once, and that
//      error grows with the position: harmless at 256, visible at 1e6;
//   3. fast sine: sin of a large angle is only as good as the reduction of the
//      angle to [-pi, pi], which fast intrinsics do in float32;
//   4. the precise mode (RopeConfig::precise_angles), which removes 2 and 3.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include <rope/rope.hpp>

#include "tutorial.hpp"

namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr int64_t kHeadDim = 128;

// One head vector rotated at many positions in one call: row s of a
// [1, 1, n, 128] tensor holds the same vector at position ids[s]. Storage in
// `dtype`; returns the rotated rows widened to float, and (through `stored`)
// the input values as actually stored.
std::vector<float> rotate_at(const std::vector<float>& head, const std::vector<int64_t>& ids, rope::DType dtype,
                             bool precise, std::vector<float>& stored) {
    const int64_t n = int64_t(ids.size());
    std::vector<float> values;
    for (int64_t s = 0; s < n; ++s) values.insert(values.end(), head.begin(), head.end());
    std::vector<uint16_t> half(values.size());
    for (size_t i = 0; i < values.size(); ++i) {
        if (dtype == rope::DType::bf16) half[i] = rope::to_bfloat16(values[i]).bits;
        if (dtype == rope::DType::f16) half[i] = rope::to_float16(values[i]).bits;
    }
    auto widen = [&](std::vector<float>& out) {
        for (size_t i = 0; i < values.size(); ++i) {
            if (dtype == rope::DType::bf16) out[i] = rope::to_float(rope::bfloat16{half[i]});
            if (dtype == rope::DType::f16) out[i] = rope::to_float(rope::float16{half[i]});
        }
    };
    stored = values;
    widen(stored);
    void* data = dtype == rope::DType::f32 ? static_cast<void*>(values.data()) : static_cast<void*>(half.data());
    auto q = rope::TensorView::contiguous(data, dtype, rope::Device::host, rope::Layout::bhsd, {1, 1, n, kHeadDim});
    auto no_k = rope::TensorView::contiguous(nullptr, dtype, rope::Device::host, rope::Layout::bhsd, {1, 0, n, kHeadDim});
    rope::RopeConfig config;
    config.head_dim = kHeadDim;
    config.precise_angles = precise;
    auto backend = rope::make_backend("cpu-naive");
    rope::apply(*backend, config, rope::RopeArgs::in_place(q, no_k, rope::Positions::shared(ids.data(), n)));
    widen(values);
    return values;
}

// Relative L2 error of each row of `got` against the float64 formula applied to `input`.
std::vector<double> row_errors(const std::vector<float>& got, const std::vector<float>& input,
                               const std::vector<int64_t>& ids) {
    tutorial::Formula formula;
    formula.ids = &ids;
    const tutorial::Shape shape{.batch = 1, .heads = 1, .seq = int64_t(ids.size()), .head_dim = kHeadDim};
    const std::vector<double> exact = tutorial::rope_float64(input, shape, formula);
    std::vector<double> errors;
    for (size_t s = 0; s < ids.size(); ++s) {
        const std::vector<float> row(got.begin() + s * kHeadDim, got.begin() + (s + 1) * kHeadDim);
        const std::vector<double> want(exact.begin() + s * kHeadDim, exact.begin() + (s + 1) * kHeadDim);
        errors.push_back(tutorial::relative_l2(row, want));
    }
    return errors;
}

// What a fast sine does with a large argument: it reduces x to [-pi, pi] in
// float32 (x / 2pi rounded to float, minus the nearest integer) and takes an
// accurate sine of the rest. The rounding of x / 2pi costs about |x| * 6e-8
// radians: nothing near 0, hundredths of a radian near 1e6. This mimics the
// mechanism of __sinf / --use_fast_math, not its exact bits.
float sin_reduced_in_float(float x) {
    const float turns = x * 0.159154943f;        // x / 2pi, rounded to float32.
    const float fraction = turns - std::rint(turns);  // In [-0.5, 0.5].
    return std::sin(6.28318531f * fraction);
}

}  // namespace

int main(int argc, char** argv) {
    tutorial::print_title(7, "Precision",
                          "storage rounds values, float32 angles lose accuracy with position, fast sines with large "
                          "angles; measure each against float64");
    tutorial::Checks checks;
    tutorial::Csv csv(tutorial::csv_path(argc, argv, "tutorial-07-precision"));
    const std::vector<float> head = tutorial::random_values(kHeadDim, 71);

    tutorial::print_section("1. Storage: float32, float16, bfloat16");
    // A short prompt, positions 0..15, so that the angle's own rounding (section 2) stays negligible.
    std::vector<int64_t> prompt(16);
    for (int64_t s = 0; s < 16; ++s) prompt[size_t(s)] = s;
    std::printf("%-10s %20s %30s\n", "storage", "significant bits", "relative L2 vs float64, pos 0..15");
    double bf16_prompt_error = 0, f32_prompt_error = 0;
    for (rope::DType dtype : {rope::DType::f32, rope::DType::f16, rope::DType::bf16}) {
        std::vector<float> stored;
        const std::vector<float> got = rotate_at(head, prompt, dtype, false, stored);
        // Against the formula applied to the values as stored: only RoPE's own rounding counts.
        double worst = 0;
        for (double e : row_errors(got, stored, prompt)) worst = std::max(worst, e);
        std::printf("%-10s %20d %30.1e\n", std::string(rope::dtype_name(dtype)).c_str(),
                    dtype == rope::DType::f32 ? 24 : dtype == rope::DType::f16 ? 11 : 8, worst);
        if (dtype == rope::DType::bf16) bf16_prompt_error = worst;
        if (dtype == rope::DType::f32) f32_prompt_error = worst;
    }
    std::printf("The arithmetic is float32 in every case; the error is the final rounding to the storage type.\n");
    checks.expect(f32_prompt_error < 1e-6 && bf16_prompt_error < 4e-3,
                  "storage rounding: float32 " + tutorial::sci(f32_prompt_error, 1) + ", bfloat16 " +
                      tutorial::sci(bf16_prompt_error, 1) + " (about 2^-9 per element)");
    std::printf("\nNever store positions, angles or cos/sin tables in bfloat16: it has 8 significant bits,\n"
                "so integers above 256 are not all representable:\n  ");
    for (float position : {255.0f, 256.0f, 257.0f, 1001.0f, 4097.0f, 100003.0f})
        std::printf("%.0f -> %.0f   ", position, rope::to_float(rope::to_bfloat16(position)));
    std::printf("\n");

    tutorial::print_section("2. The float32 angle: error against position");
    // Positions 1 to 1e6, ten per decade.
    std::vector<int64_t> ids;
    for (int k = 0; k <= 60; ++k) {
        const int64_t position = int64_t(std::llround(std::pow(10.0, k / 10.0)));
        if (ids.empty() || position != ids.back()) ids.push_back(position);
    }
    std::vector<float> stored_f32, stored_bf16, stored_precise;
    const std::vector<double> f32 = row_errors(rotate_at(head, ids, rope::DType::f32, false, stored_f32), stored_f32, ids);
    const std::vector<double> precise =
        row_errors(rotate_at(head, ids, rope::DType::f32, true, stored_precise), stored_precise, ids);
    const std::vector<double> bf16 =
        row_errors(rotate_at(head, ids, rope::DType::bf16, false, stored_bf16), stored_bf16, ids);
    rope::RopeConfig config;
    config.head_dim = kHeadDim;
    const std::vector<float> theta = rope::make_frequency_table(config, 1).inv_freq;
    csv.table("error against position: relative L2 of one head vector (d = 128, base 10000) vs float64",
              "position,fp32,fp32_precise,bf16,angle_error,bound");
    std::printf("%10s %13s %13s %13s %16s %13s\n", "position", "fp32", "fp32 precise", "bf16", "worst angle err",
                "bound p*2^-23");
    bool within_bound = true, precise_flat = true;
    double f32_small = 0, f32_large = 0, precise_large = 0;
    for (size_t s = 0; s < ids.size(); ++s) {
        const int64_t p = ids[s];
        // The float32 angle the library forms, against the exact one, worst over the pairs.
        double angle_error = 0;
        for (size_t i = 0; i < theta.size(); ++i) {
            const double exact = double(p) * std::pow(10000.0, -2.0 * double(i) / double(kHeadDim));
            angle_error = std::max(angle_error, std::fabs(double(rope::rope_angle(p, theta[i])) - exact));
        }
        const double bound = double(p) * 0x1p-23 + 1e-6;  // Angle rounding + theta rounding, plus sin/cos/rotation.
        within_bound = within_bound && f32[s] <= bound;
        precise_flat = precise_flat && precise[s] < 2e-6;
        if (p <= 10) f32_small = std::max(f32_small, f32[s]);
        if (p == ids.back()) f32_large = f32[s], precise_large = precise[s];
        csv.row(p, f32[s], precise[s], bf16[s], angle_error, bound);
        const bool power_of_ten = std::fabs(std::log10(double(p)) - std::round(std::log10(double(p)))) < 1e-12;
        if (power_of_ten)
            std::printf("%10ld %13.2e %13.2e %13.2e %16.2e %13.2e\n", long(p), f32[s], precise[s], bf16[s], angle_error,
                        bound);
    }
    std::printf("The angle p * theta_i is rounded to float32: its error grows like p * 6e-8 radians, and so does\n"
                "the result's. At a million positions it exceeds bfloat16's storage rounding.\n");
    checks.expect(within_bound, "float32 error stays within p * 2^-23 + 1e-6 at every position");
    checks.expect(f32_large > 100 * f32_small, "float32 error grows with position: " + tutorial::sci(f32_small, 1) +
                                                   " up to position 10, " + tutorial::sci(f32_large, 1) + " at 1e6");

    tutorial::print_section("3. Fast sine: the reduction to [-pi, pi]");
    std::printf("%10s %18s %22s\n", "x", "|sinf(x) - sin(x)|", "|fast sin(x) - sin(x)|");
    double accurate_worst = 0, fast_at_million = 0;
    for (float x : {1.0f, 10.0f, 100.0f, 1e3f, 1e4f, 1e5f, 1e6f}) {
        const double exact = std::sin(double(x));  // The sine of the float x itself, in double.
        const double accurate = std::fabs(double(std::sin(x)) - exact);
        const double fast = std::fabs(double(sin_reduced_in_float(x)) - exact);
        accurate_worst = std::max(accurate_worst, accurate);
        if (x == 1e6f) fast_at_million = fast;
        std::printf("%10.0f %18.1e %22.1e\n", x, accurate, fast);
    }
    std::printf("sinf reduces exactly and is accurate at any x; a sine that reduces in float32 loses about\n"
                "|x| * 6e-8. GPU fast intrinsics (__sinf, --use_fast_math) are likewise accurate only near\n"
                "[-pi, pi], and RoPE's angles are not reduced beforehand, so rope's CUDA backends keep the\n"
                "accurate sincosf: computed once per (position, pair), it costs little.\n");
    checks.expect(accurate_worst < 1e-7 && fast_at_million > 1e-3,
                  "accurate sinf stays within 1e-7; the float32 reduction is off by " +
                      tutorial::sci(fast_at_million, 1) + " at 1e6");

    tutorial::print_section("4. The precise mode: RopeConfig::precise_angles");
    std::printf("precise_angles = true forms p * theta_i in double, reduces it to [-pi, pi] in double, and only\n"
                "then rounds to float32 for sin and cos. Column \"fp32 precise\" above: flat at every position.\n");
    checks.expect(precise_flat, "precise angles: relative error below 2e-6 at every position up to 1e6 (" +
                                    tutorial::sci(precise_large, 1) + " at 1e6)");
    csv.announce();

    return checks.finish("float32 angles: error " + tutorial::sci(f32_small, 1) + " at position 10, " +
                         tutorial::sci(f32_large, 1) + " at 1e6; precise angles " + tutorial::sci(precise_large, 1));
}
