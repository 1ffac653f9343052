#pragma once
// What every chapter needs and no chapter teaches: reproducible random inputs,
// RoPE evaluated in float64 to check against, distances between results, a
// median-of-N timer, the optional CSV output for the figures, and the verdict.
//
// Every chapter prints, besides its lesson:
//   "Lesson: ..."      its point in one line        (scripts/tour shows it)
//   "Key figure: ..."  its most telling number       (scripts/tour shows it)
//   "PASSED" / "FAILED" / "SKIPPED" as the last line, with exit code 0 / 1 / 77.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <rope/rope.hpp>

namespace tutorial {

/// Exit code for "could not run here" (no GPU, backend not built). CTest reports
/// it as Skipped (SKIP_RETURN_CODE 77), never as passed.
constexpr int kSkipExitCode = 77;

// ---------------------------------------------------------------------------
// Printing
// ---------------------------------------------------------------------------

inline void print_title(int number, std::string_view title, std::string_view lesson) {
    std::printf("Chapter %d: %.*s\n", number, int(title.size()), title.data());
    std::printf("Lesson: %.*s\n", int(lesson.size()), lesson.data());
}

inline void print_section(std::string_view heading) {
    std::printf("\n--- %.*s ---\n", int(heading.size()), heading.data());
}

/// Collects a chapter's checks and turns them into the verdict and exit code.
class Checks {
public:
    /// Records one check and prints it as "  [ok] what" or "  [FAILED] what".
    bool expect(bool passed, const std::string& what) {
        std::printf("  [%s] %s\n", passed ? "ok" : "FAILED", what.c_str());
        ++count_;
        if (!passed) ++failures_;
        return passed;
    }
    /// Prints the key figure and the verdict; returns the exit code for main.
    int finish(const std::string& key_figure) const {
        std::printf("\nKey figure: %s\n", key_figure.c_str());
        if (failures_ == 0) {
            std::printf("PASSED (%d checks)\n", count_);
            return 0;
        }
        std::printf("FAILED (%d of %d checks)\n", failures_, count_);
        return 1;
    }

private:
    int count_ = 0;
    int failures_ = 0;
};

/// Prints why the chapter cannot run here, then SKIPPED; returns 77 for main.
inline int skip(const std::string& key_figure, const std::string& reason) {
    std::printf("\nKey figure: %s\n", key_figure.c_str());
    std::printf("SKIPPED: %s\n", reason.c_str());
    return kSkipExitCode;
}

/// "1.23e-07" style, for messages built with std::string.
inline std::string sci(double value, int digits = 2) {
    char text[32];
    std::snprintf(text, sizeof text, "%.*e", digits, value);
    return text;
}

/// Fixed-point with @p digits decimals, for messages built with std::string.
inline std::string fixed(double value, int digits = 2) {
    char text[48];
    std::snprintf(text, sizeof text, "%.*f", digits, value);
    return text;
}

// ---------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------

/// @p count values uniform in [-1, 1), always the same for the same seed, so
/// that every run (and the output captured for the documentation) is reproducible.
inline std::vector<float> random_values(size_t count, uint32_t seed) {
    std::mt19937 generator(seed);
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    std::vector<float> values(count);
    for (float& value : values) value = uniform(generator);
    return values;
}

/// @p values as a tensor of @p dtype holds them, as raw bytes: float32 as is,
/// float16 and bfloat16 rounded to nearest even, as the library rounds its results.
inline std::vector<unsigned char> to_storage(const std::vector<float>& values, rope::DType dtype) {
    std::vector<unsigned char> bytes(values.size() * size_t(rope::dtype_size(dtype)));
    for (size_t i = 0; i < values.size(); ++i) {
        if (dtype == rope::DType::f32) {
            std::memcpy(bytes.data() + 4 * i, &values[i], 4);
            continue;
        }
        const uint16_t bits =
            dtype == rope::DType::f16 ? rope::to_float16(values[i]).bits : rope::to_bfloat16(values[i]).bits;
        std::memcpy(bytes.data() + 2 * i, &bits, 2);
    }
    return bytes;
}

/// The values held in @p bytes of a @p dtype tensor, widened to float (exact).
inline std::vector<float> from_storage(const std::vector<unsigned char>& bytes, rope::DType dtype) {
    std::vector<float> values(bytes.size() / size_t(rope::dtype_size(dtype)));
    for (size_t i = 0; i < values.size(); ++i) {
        if (dtype == rope::DType::f32) {
            std::memcpy(&values[i], bytes.data() + 4 * i, 4);
            continue;
        }
        uint16_t bits;
        std::memcpy(&bits, bytes.data() + 2 * i, 2);
        values[i] =
            dtype == rope::DType::f16 ? rope::to_float(rope::float16{bits}) : rope::to_float(rope::bfloat16{bits});
    }
    return values;
}

// ---------------------------------------------------------------------------
// RoPE in float64: the formula, written independently of the library
// ---------------------------------------------------------------------------

/// Sizes in logical order, whatever the layout in memory.
struct Shape {
    int64_t batch = 1, heads = 1, seq = 1, head_dim = 64;
    int64_t numel() const { return batch * heads * seq * head_dim; }
    /// The shape in the order @p layout names, as TensorView::contiguous wants it.
    std::array<int64_t, 4> in(rope::Layout layout) const {
        if (layout == rope::Layout::bhsd) return {batch, heads, seq, head_dim};
        return {batch, seq, heads, head_dim};
    }
};

/// What the float64 formula needs to know about a call. A token's position is
/// offset + s, or its id in `ids`, or, packed, its place in its sequence plus
/// that sequence's start; pair i turns by position * theta_i, or reads its cos
/// and sin from a caller's table.
struct Formula {
    rope::Style style = rope::Style::half_split;
    int64_t rotary_dim = 0;          ///< 0: the rest of head_dim from rotary_offset.
    int64_t rotary_offset = 0;       ///< First rotated feature: the window [rotary_offset, rotary_offset + rotary_dim).
    double magnitude = 1.0;          ///< Multiplies cos and sin (an attention factor).
    double base = 10000.0;
    double linear_factor = 1.0;      ///< Position interpolation (ScalingType::linear).
    int64_t offset = 0;
    const std::vector<int64_t>* ids = nullptr;  ///< [id_axes, seq]: explicit ids shared by the batch.
    rope::Layout layout = rope::Layout::bhsd;   ///< thd (packed) is stored as bshd with batch 1.
    bool inverse = false;
    int64_t id_axes = 1;             ///< Rows of `ids`: one per position axis.
    /// Which axis turns each pair (the config's multi_axis; see pair_rule).
    rope::AxisAssignment assignment = rope::AxisAssignment::single;
    std::vector<int64_t> sections{};
    /// Packed sequences: token s of sequence b (cu_seqlens[b] <= s < cu_seqlens[b+1]) is at
    /// s - cu_seqlens[b] + starts[b] (no starts: + offset).
    const std::vector<int64_t>* cu_seqlens = nullptr;
    const std::vector<int64_t>* starts = nullptr;
    /// A caller's cos/sin table [rows, rotary_dim]: row p holds cos of every pair's angle at
    /// position p, then their sines. The angle is not computed: it is read from the row.
    const std::vector<float>* table = nullptr;

    /// The formula of @p config: its pairing, rotary_dim, base and axes (scaling not included).
    static Formula of(const rope::RopeConfig& config) {
        Formula f;
        f.style = config.style;
        f.rotary_dim = config.effective_rotary_dim();
        f.rotary_offset = config.rotary_offset;
        f.base = config.base;
        f.assignment = config.multi_axis.assignment;
        f.sections = config.multi_axis.sections;
        return f;
    }
};

/// Which position axis turns pair i, and its frequency, by the rules the chapters state:
/// single and M-RoPE use the global pair index, theta_i = base^(-2i/d); M-RoPE contiguous
/// takes the first sections[0] pairs for axis 0, the next sections[1] for axis 1, ...;
/// interleaved gives axis 1 the pairs i % 3 == 1 below 3*sections[1], axis 2 the pairs
/// i % 3 == 2 below 3*sections[2], axis 0 the rest; axial runs like contiguous but the
/// index restarts on each axis: the j-th pair of axis a has theta = base^(-j/sections[a]).
struct PairRule {
    int64_t axis = 0;
    int64_t theta_index = 0;  ///< i, or the restarting j of axial RoPE.
    double theta = 0;
};

inline PairRule pair_rule(const Formula& f, int64_t i, int64_t rotary_dim) {
    using rope::AxisAssignment;
    PairRule rule{0, i, std::pow(f.base, -2.0 * double(i) / double(rotary_dim)) / f.linear_factor};
    if (f.assignment == AxisAssignment::mrope_interleaved) {
        if (i % 3 == 1 && i < 3 * f.sections[1]) rule.axis = 1;
        if (i % 3 == 2 && i < 3 * f.sections[2]) rule.axis = 2;
    } else if (f.assignment != AxisAssignment::single) {
        int64_t j = i;
        while (j >= f.sections[size_t(rule.axis)]) j -= f.sections[size_t(rule.axis++)];
        if (f.assignment == AxisAssignment::axial) {
            rule.theta_index = j;
            rule.theta = std::pow(f.base, -double(j) / double(f.sections[size_t(rule.axis)])) / f.linear_factor;
        }
    }
    return rule;
}

/// RoPE of the contiguous tensor @p x in float64: angle = position * theta, both in double
/// (or the table's cos and sin). Pair i of the window is read at (i, i + d/2) half-split, at
/// (2i, 2i+1) interleaved and interleaved_to_half; written where it was read, except
/// interleaved_to_half (HF's DeepSeek order): at (i, i + d/2); half_to_interleaved is the
/// reverse, and an inverse reads where its forward wrote. It shares no code with the backends.
inline std::vector<double> rope_float64(const std::vector<float>& x, const Shape& shape, const Formula& f) {
    const int64_t rotary_dim = f.rotary_dim == 0 ? shape.head_dim - f.rotary_offset : f.rotary_dim;
    const int64_t half = rotary_dim / 2;
    // Position of token s on `axis`.
    auto position = [&](int64_t s, int64_t axis) -> double {
        if (f.ids) return double((*f.ids)[size_t(axis * shape.seq + s)]);
        if (f.cu_seqlens) {
            size_t b = 0;
            while ((*f.cu_seqlens)[b + 1] <= s) ++b;
            return double(s - (*f.cu_seqlens)[b] + (f.starts ? (*f.starts)[b] : f.offset));
        }
        return double(f.offset + s);
    };
    std::vector<double> out(x.begin(), x.end());  // Features past rotary_dim stay as they are.
    for (int64_t b = 0; b < shape.batch; ++b)
        for (int64_t h = 0; h < shape.heads; ++h)
            for (int64_t s = 0; s < shape.seq; ++s) {
                const int64_t token_row = f.layout == rope::Layout::bhsd
                                              ? (b * shape.heads + h) * shape.seq + s
                                              : (b * shape.seq + s) * shape.heads + h;
                double* row = out.data() + token_row * shape.head_dim + f.rotary_offset;
                const float* source = x.data() + token_row * shape.head_dim + f.rotary_offset;
                std::array<double, 4> positions{};  // One per axis (rope::kMaxPositionAxes).
                for (int64_t a = 0; a < f.id_axes; ++a) positions[size_t(a)] = position(s, a);
                for (int64_t i = 0; i < half; ++i) {
                    const PairRule rule = pair_rule(f, i, rotary_dim);
                    const double p = positions[size_t(rule.axis)];
                    double c = std::cos(p * rule.theta), sn = std::sin(p * rule.theta);
                    if (f.table) {
                        c = (*f.table)[size_t(int64_t(p) * rotary_dim + i)];
                        sn = (*f.table)[size_t(int64_t(p) * rotary_dim + half + i)];
                    }
                    if (f.inverse) sn = -sn;
                    c *= f.magnitude, sn *= f.magnitude;
                    const bool to_half = f.style == rope::Style::interleaved_to_half;
                    const bool to_interleaved = f.style == rope::Style::half_to_interleaved;
                    const bool read_adjacent = f.style == rope::Style::interleaved ||
                                               (to_half && !f.inverse) || (to_interleaved && f.inverse);
                    const bool write_adjacent = f.style == rope::Style::interleaved ||
                                                (to_half && f.inverse) || (to_interleaved && !f.inverse);
                    const double px = source[read_adjacent ? 2 * i : i];
                    const double py = source[read_adjacent ? 2 * i + 1 : i + half];
                    row[write_adjacent ? 2 * i : i] = px * c - py * sn;
                    row[write_adjacent ? 2 * i + 1 : i + half] = py * c + px * sn;
                }
            }
    return out;
}

// ---------------------------------------------------------------------------
// Distances between results
// ---------------------------------------------------------------------------

/// ||got - want|| / ||want||: how far a result is from the exact one, as a fraction.
template <typename Got, typename Want>
double relative_l2(const std::vector<Got>& got, const std::vector<Want>& want) {
    double difference = 0, reference = 0;
    for (size_t i = 0; i < got.size(); ++i) {
        const double d = double(got[i]) - double(want[i]);
        difference += d * d;
        reference += double(want[i]) * double(want[i]);
    }
    return std::sqrt(difference / reference);
}

/// Largest |a - b| over all elements (infinity if either holds a NaN).
template <typename A, typename B>
double max_abs_difference(const std::vector<A>& a, const std::vector<B>& b) {
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) {
        const double d = std::fabs(double(a[i]) - double(b[i]));
        if (!(d <= worst)) worst = std::isnan(d) ? INFINITY : d;
    }
    return worst;
}

// ---------------------------------------------------------------------------
// Timing: the median of N, after one warm-up run
// ---------------------------------------------------------------------------

/// Median wall-clock seconds of @p repeats calls of @p work. The median, not the
/// mean: one call disturbed by another process does not move it.
template <typename Work>
double median_seconds(int repeats, Work&& work) {
    work();  // Warm-up: first-touch page faults, thread start-up, caches.
    std::vector<double> seconds;
    for (int r = 0; r < repeats; ++r) {
        const auto start = std::chrono::steady_clock::now();
        work();
        seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(seconds.begin(), seconds.end());
    return seconds[seconds.size() / 2];
}

// ---------------------------------------------------------------------------
// CSV output for the figures (tutorials/plots/make_figures.sh)
// ---------------------------------------------------------------------------

/// Where this chapter writes its CSV: `--csv FILE` on the command line, else
/// $ROPE_TUTORIAL_CSV_DIR/<program>.csv (the folder must exist), else nowhere
/// (empty string). `--csv` without a file name is a usage error: exit code 2.
inline std::string csv_path(int argc, char** argv, std::string_view program) {
    for (int i = 1; i < argc; ++i) {
        if (std::string_view(argv[i]) != "--csv") continue;
        if (i + 1 == argc || *argv[i + 1] == '\0') {
            std::fprintf(stderr, "usage: %s [--csv FILE]: --csv needs a file name\n", argv[0]);
            std::exit(2);
        }
        return argv[i + 1];
    }
    if (const char* dir = std::getenv("ROPE_TUTORIAL_CSV_DIR"); dir && *dir)
        return std::string(dir) + "/" + std::string(program) + ".csv";
    return "";
}

/// Writes tables as CSV blocks that gnuplot reads with `index N`: each block is
/// a "# name" line, a "# column,column" header line, the rows, and two blank lines.
/// Creates no folder. Whether every write reached the file is known only once
/// it is flushed and closed: finish() does that and makes it one of the checks,
/// so a CSV that could not be written (a missing folder, a full disk) FAILS the
/// chapter, with the path named.
class Csv {
public:
    explicit Csv(const std::string& path) : path_(path) {
        if (path.empty()) return;
        errno = 0;
        file_.open(path);
        if (!file_) {
            error_ = errno;
            std::fprintf(stderr, "error: cannot open the CSV %s: %s\n", path.c_str(), reason().c_str());
        }
        file_.precision(9);
    }
    bool enabled() const { return !path_.empty(); }
    void table(std::string_view name, std::string_view header) {
        if (!enabled()) return;
        if (tables_++ > 0) file_ << "\n\n";
        file_ << "# " << name << "\n# " << header << "\n";
    }
    template <typename... Values>
    void row(const Values&... values) {
        if (!enabled()) return;
        bool first = true;
        ((file_ << (first ? "" : ",") << values, first = false), ...);
        file_ << "\n";
    }
    /// Flushes and closes the file and records, as one of @p checks, whether
    /// every write reached it (nothing when no CSV was asked for).
    void finish(Checks& checks) {
        if (!enabled()) return;
        if (file_.is_open()) {
            errno = 0;
            file_.flush();
            file_.close();
            if (!file_) error_ = errno;
        }
        checks.expect(bool(file_), bool(file_) ? "CSV for the figures written to " + path_
                                               : "CSV for the figures NOT written to " + path_ + ": " + reason());
    }

private:
    std::string reason() const { return error_ ? std::strerror(error_) : "a write failed"; }

    std::string path_;
    std::ofstream file_;
    int tables_ = 0;
    int error_ = 0;  ///< errno of the failed open or write, if it told one.
};

}  // namespace tutorial
