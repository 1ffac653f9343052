// Chapter 7: precision.
//
// Where RoPE's rounding errors come from, measured against the float64 formula:
//   1. storage: float32, float16 and bfloat16 hold q and k with 24, 11 and 8
//      significant bits; the arithmetic is float32 whatever the storage;
//   2. the angle: float32(position) * float32(theta_i) is rounded once, and that
//      error grows with the position: harmless at 256, visible at 1e6;
//   3. fast sine: sin of a large angle is only as good as the reduction of the
//      angle to [-pi, pi], which fast intrinsics do in float32;
//   4. the precise mode (RopeConfig::precise_angles), which removes 2 and 3;
//   5. every backend available here, float32 and bfloat16, default and precise
//      angles, at positions up to 4M (2^22): the same errors everywhere.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <rope/rope.hpp>

#include "tutorial.hpp"

namespace {

constexpr double kPi = 3.14159265358979323846;
constexpr int64_t kHeadDim = 128;

// The error of the rows at one position against the float64 formula.
struct PositionError {
    double rel_l2 = 0, max_abs = 0;
};

// Rotates x = [1, heads, ids.size(), 128] (bhsd), stored in `dtype`, with `backend`:
// row s of every head at position ids[s], so one call covers every position.
// The tensor and the ids go through memory of the backend's device (copies for
// a GPU backend), and the result comes back widened to float. Returns the error
// at each position against the float64 formula applied to x as stored (so that
// bfloat16's rounding of the input is not counted as RoPE's error).
// Throws rope::Error if the backend refuses the call.
std::vector<PositionError> errors_at(rope::Backend& backend, const std::vector<float>& x, int64_t heads,
                                     const std::vector<int64_t>& ids, rope::DType dtype, bool precise) {
    const int64_t n = int64_t(ids.size());
    const rope::Device device = backend.device();
    std::vector<unsigned char> bytes = tutorial::to_storage(x, dtype);
    const std::vector<float> stored = tutorial::from_storage(bytes, dtype);
    rope::Buffer tensor(device, bytes.size()), positions(device, ids.size() * sizeof(int64_t));
    tensor.copy_from_host(bytes.data());
    positions.copy_from_host(ids.data());
    auto q = rope::TensorView::contiguous(tensor.data(), dtype, device, rope::Layout::bhsd, {1, heads, n, kHeadDim});
    auto no_k = rope::TensorView::contiguous(nullptr, dtype, device, rope::Layout::bhsd, {1, 0, n, kHeadDim});
    rope::RopeConfig config;
    config.head_dim = kHeadDim;
    config.precise_angles = precise;
    const auto* device_ids = static_cast<const int64_t*>(positions.data());
    rope::apply(backend, config, rope::RopeArgs::in_place(q, no_k, rope::Positions::shared(device_ids, n, device)));
    if (device == rope::Device::cuda) rope::cuda_synchronize();  // The launch is asynchronous.
    tensor.copy_to_host(bytes.data());
    const std::vector<float> got = tutorial::from_storage(bytes, dtype);

    tutorial::Formula formula;
    formula.ids = &ids;
    const tutorial::Shape shape{.batch = 1, .heads = heads, .seq = n, .head_dim = kHeadDim};
    const std::vector<double> exact = tutorial::rope_float64(stored, shape, formula);
    std::vector<PositionError> errors;
    for (int64_t s = 0; s < n; ++s) {
        std::vector<float> rows;  // Every head's row at position ids[s].
        std::vector<double> want;
        for (int64_t h = 0; h < heads; ++h) {
            const size_t first = size_t((h * n + s) * kHeadDim);
            rows.insert(rows.end(), got.begin() + first, got.begin() + first + kHeadDim);
            want.insert(want.end(), exact.begin() + first, exact.begin() + first + kHeadDim);
        }
        errors.push_back({tutorial::relative_l2(rows, want), tutorial::max_abs_difference(rows, want)});
    }
    return errors;
}

// Sections 1 and 2: one head vector repeated at every position, on cpu-naive;
// the relative L2 error per position.
std::vector<double> naive_errors(const std::vector<float>& head, const std::vector<int64_t>& ids, rope::DType dtype,
                                 bool precise) {
    std::vector<float> x;
    for (size_t s = 0; s < ids.size(); ++s) x.insert(x.end(), head.begin(), head.end());
    auto naive = rope::make_backend("cpu-naive");
    std::vector<double> errors;
    for (const PositionError& e : errors_at(*naive, x, 1, ids, dtype, precise)) errors.push_back(e.rel_l2);
    return errors;
}

// Section 5: one measurement, a backend x dtype x mode over all the positions.
struct Run {
    std::string backend;
    rope::DType dtype;
    bool precise;
    std::vector<PositionError> errors;  // One per position; empty if the call failed.
    std::string failure;                // The rope::Error's message if it failed.
};

constexpr int64_t kHeads = 4, kShort = 4096, kLong = int64_t(1) << 22;

std::string label(const Run& run) {
    return run.backend + " " + std::string(rope::dtype_name(run.dtype)) + (run.precise ? " precise" : " default");
}

// The run of `backend` in `dtype` and mode `precise`, or null if it failed or did not run.
const Run* find_run(const std::vector<Run>& runs, const std::string& backend, rope::DType dtype, bool precise) {
    for (const Run& run : runs)
        if (run.backend == backend && run.dtype == dtype && run.precise == precise && run.failure.empty()) return &run;
    return nullptr;
}

// Rotates x ([1, kHeads, ids.size(), 128]) on every backend available here, in
// float32 and bfloat16, with default and precise angles. A backend that refuses
// a call (a rope::Error) gets a failed Run instead of stopping the program;
// an unavailable one (a CUDA backend without a GPU) is listed and skipped.
std::vector<Run> run_every_backend(const std::vector<float>& x, const std::vector<int64_t>& ids) {
    std::vector<Run> runs;
    for (const rope::BackendInfo& info : rope::list_backends()) {
        if (!info.available) {
            std::printf("  %-15s skipped: %s\n", info.name.c_str(), info.reason.c_str());
            continue;
        }
        std::printf("  %-15s measured\n", info.name.c_str());
        auto backend = rope::make_backend(info.name);
        for (rope::DType dtype : {rope::DType::f32, rope::DType::bf16})
            for (bool precise : {false, true}) {
                Run run{info.name, dtype, precise, {}, ""};
                try {
                    run.errors = errors_at(*backend, x, kHeads, ids, dtype, precise);
                } catch (const rope::Error& error) {
                    run.failure = error.what();
                }
                runs.push_back(run);
            }
    }
    return runs;
}

// One table per dtype: a row per power of four (the CSV has every position, and
// the max abs error too), a column per backend and mode.
void print_error_table(const std::vector<Run>& runs, const std::vector<std::string>& backends,
                       const std::vector<int64_t>& ids, rope::DType dtype) {
    std::printf("\n%s: relative L2 error against float64 per position\n%9s",
                std::string(rope::dtype_name(dtype)).c_str(), "");
    for (const std::string& name : backends) std::printf(" %19s", name.c_str());
    std::printf("\n%9s", "position");
    for (size_t b = 0; b < backends.size(); ++b) std::printf(" %9s %9s", "default", "precise");
    std::printf("\n");
    for (size_t s = 0; s < ids.size(); ++s) {
        const auto position = uint64_t(ids[s]);
        if (!std::has_single_bit(position) || std::countr_zero(position) % 2 != 0) continue;
        std::printf("%9ld", long(position));
        for (const std::string& name : backends)
            for (bool precise : {false, true}) {
                const Run* run = find_run(runs, name, dtype, precise);
                if (run) std::printf(" %9.2e", run->errors[s].rel_l2);
                else std::printf(" %9s", "failed");
            }
        std::printf("\n");
    }
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
        // Against the formula applied to the values as stored: only RoPE's own rounding counts.
        double worst = 0;
        for (double e : naive_errors(head, prompt, dtype, false)) worst = std::max(worst, e);
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
    const std::vector<double> f32 = naive_errors(head, ids, rope::DType::f32, false);
    const std::vector<double> precise = naive_errors(head, ids, rope::DType::f32, true);
    const std::vector<double> bf16 = naive_errors(head, ids, rope::DType::bf16, false);
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

    tutorial::print_section("5. Every backend, up to position 4M");
    // Positions 1 to 2^22 = 4,194,304, four per octave. Every fourth is a power
    // of two (4096 and 4M among them), where float32(p) * theta_i is exact and
    // only theta_i's rounding shows; the others add the product's rounding.
    std::vector<int64_t> long_ids;
    for (int k = 0; k <= 88; ++k) {
        const int64_t position = std::llround(std::exp2(k / 4.0));
        if (long_ids.empty() || position != long_ids.back()) long_ids.push_back(position);
    }
    // Different random values in every head and row: the error at a position is
    // measured over 4 x 128 features, enough for a stable relative L2.
    const std::vector<float> x = tutorial::random_values(size_t(kHeads * int64_t(long_ids.size()) * kHeadDim), 75);
    std::printf("q = [1, %ld heads, %zu positions, %ld], random values in [-1, 1), base 10000, half-split; one call\n"
                "per backend, dtype and mode, positions as ids. Backends:\n",
                long(kHeads), long_ids.size(), long(kHeadDim));
    const std::vector<Run> runs = run_every_backend(x, long_ids);
    std::vector<std::string> backends;  // Those that ran, in list_backends() order.
    for (const Run& run : runs)
        if (backends.empty() || backends.back() != run.backend) backends.push_back(run.backend);

    // Long form, one row per (series, position), series after series: gnuplot
    // picks a series with a condition on columns 2 to 4 (plots/precision_backends.gp).
    csv.table("error against position, every backend: q [1, 4, n, 128], base 10000, half-split, vs float64",
              "position,backend,dtype,precise,rel_l2,max_abs");
    for (const Run& run : runs)
        for (size_t s = 0; s < run.errors.size(); ++s)
            csv.row(long_ids[s], run.backend, rope::dtype_name(run.dtype), run.precise ? 1 : 0, run.errors[s].rel_l2,
                    run.errors[s].max_abs);
    for (rope::DType dtype : {rope::DType::f32, rope::DType::bf16}) print_error_table(runs, backends, long_ids, dtype);
    std::printf("\nDefault angles: in every backend (all form the same float32 angle) the error grows in\n"
                "proportion to the position; in bfloat16 it hides below the storage rounding up to about 1e5,\n"
                "then takes over. Precise angles: flat up to 4M, at float32's or bfloat16's rounding.\n"
                "Tolerances: precise float32 at 4M within 10x of 4096 (issue 5) and default float32 more than 100x\n"
                "larger (growth in proportion to the position gives 1024x); every backend within 10%% of cpu-naive's\n"
                "error or 2^-21 (a few float32 roundings: sinf vs sincosf, fused multiply-adds), whichever is larger.\n");

    for (const Run& run : runs)
        if (!run.failure.empty()) checks.expect(false, label(run) + ": rope::Error: " + run.failure);
    // The criterion: precise angles keep the error of short contexts.
    // Growth in proportion to the position would be x1024 from 4096 to 4M.
    auto at = [&](const Run* run, int64_t position) {
        return run->errors[size_t(std::find(long_ids.begin(), long_ids.end(), position) - long_ids.begin())].rel_l2;
    };
    for (const std::string& name : backends) {
        if (const Run* run = find_run(runs, name, rope::DType::f32, true))
            checks.expect(at(run, kLong) <= 10 * at(run, kShort),
                          name + ": fp32 precise error at 4194304 (" + tutorial::sci(at(run, kLong), 1) +
                              ") within 10x of its error at 4096 (" + tutorial::sci(at(run, kShort), 1) + ")");
        if (const Run* run = find_run(runs, name, rope::DType::f32, false))
            checks.expect(at(run, kLong) > 100 * at(run, kShort),
                          name + ": fp32 default error grows with position, " + tutorial::sci(at(run, kShort), 1) +
                              " at 4096 to " + tutorial::sci(at(run, kLong), 1) + " at 4194304 (more than 100x)");
    }
    // Agreement. Every backend forms the same float32 (or precise) angle and
    // rounds its stores the same way; they may differ only in sin/cos (glibc's
    // sinf vs CUDA's sincosf, each within 1-2 ulp) and in fused multiply-adds:
    // a few float32 roundings, 2^-21 relative. Hence the tolerance: each error
    // within 10% of cpu-naive's, or within 2^-21 of it where that is larger.
    double largest_difference = 0;
    std::string where;
    bool agree = true;
    for (const Run& run : runs) {
        const Run* naive = find_run(runs, "cpu-naive", run.dtype, run.precise);
        if (run.backend == "cpu-naive" || !run.failure.empty() || !naive) continue;
        for (size_t s = 0; s < long_ids.size(); ++s) {
            const double reference = naive->errors[s].rel_l2;
            const double difference = std::fabs(run.errors[s].rel_l2 - reference);
            agree = agree && difference <= std::max(0.1 * reference, 0x1p-21);
            if (difference > largest_difference) {
                largest_difference = difference;
                where = label(run) + " at position " + std::to_string(long_ids[s]) + ", against " +
                        tutorial::sci(reference, 1);
            }
        }
    }
    if (backends.size() > 1)
        checks.expect(agree, std::to_string(backends.size()) +
                                 " backends: every error within 10% (or 2^-21) of cpu-naive's, at every position, "
                                 "dtype and mode; " +
                                 (where.empty() ? std::string("all identical")
                                                : "largest difference " + tutorial::sci(largest_difference, 1) + " (" +
                                                      where + ")"));
    else
        std::printf("  (only one backend here: no agreement between backends to check)\n");
    csv.finish(checks);

    // At 4M, from section 5's cpu-naive runs (the specification, in every build).
    auto at_4m = [&](bool precise_mode) {
        const Run* run = find_run(runs, "cpu-naive", rope::DType::f32, precise_mode);
        return run ? tutorial::sci(at(run, kLong), 1) : std::string("failed");
    };
    return checks.finish("float32 angles: error " + tutorial::sci(f32_small, 1) + " at position 10, " +
                         tutorial::sci(f32_large, 1) + " at 1e6, " + at_4m(false) + " at 4M; precise angles " +
                         at_4m(true) + " at 4M (" + std::to_string(backends.size()) + " backends measured)");
}
