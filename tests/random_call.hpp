#pragma once
// One generator of random rope calls and one tolerance, shared by the
// randomised differential test (tests/differential_test.cpp) and the
// validation fuzzer (fuzz/validation_fuzzer.cpp), as ggml's test-backend-ops
// has one case generator and one metric for every backend.
//
// draw() turns a Source of choices into one call: a RopeConfig (every scaling
// field, multi_axis and its sections, precise_angles), four tensor views
// (sizes; strides dense, padded, transposed or, from a hostile source,
// arbitrary; dtypes; layouts including thd) with where each one's memory
// starts, positions in every form (offset, shared, per-sequence and
// multi-axis ids, packed cu_seqlens and starts, context-parallel shards), an
// optional cos/sin table and a direction.
// The call says where memory goes, not what it holds: each user lays it out
// (the fuzzer in one guarded arena, the test in host tensors it can stage on a
// GPU) and fills it.
//
// A hostile source (the fuzzer's bytes) also draws what rope must reject:
// edge integers and reals, sizes, dtypes, devices and layouts that disagree,
// wrong list lengths, partially overlapping operands. A valid source (the
// test's seeded std::mt19937_64) draws only calls rope must accept.
#include <array>
#include <cstdint>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "rope/rope.hpp"

namespace random_call {

// Where the generator's choices come from. The fuzzer's source forwards each
// method, in order, to one call of libFuzzer's FuzzedDataProvider
// (ConsumeIntegralInRange<int64_t>, ConsumeFloatingPointInRange<double>,
// ConsumeIntegral<int64_t>, ConsumeFloatingPoint<double>, ConsumeIntegral<uint64_t>):
// a byte string means the same call as long as draw() asks the same questions
// of a hostile source in the same order (the committed fuzz inputs rely on it).
class Source {
public:
    explicit Source(bool hostile) : hostile(hostile) {}
    virtual ~Source() = default;
    // Whether to draw calls rope must reject too (see above).
    const bool hostile;
    virtual int64_t integer_in(int64_t low, int64_t high) = 0;  // Uniform in [low, high].
    virtual double real_in(double low, double high) = 0;       // Uniform in [low, high].
    virtual int64_t any_integer() = 0;
    virtual double any_real() = 0;
    virtual uint64_t bits() = 0;  // 64 random bits.
};

// A valid source over a seeded engine.
class RngSource : public Source {
public:
    explicit RngSource(std::mt19937_64& rng) : Source(false), rng_(rng) {}
    int64_t integer_in(int64_t low, int64_t high) override {
        return std::uniform_int_distribution<int64_t>(low, high)(rng_);
    }
    double real_in(double low, double high) override { return std::uniform_real_distribution<double>(low, high)(rng_); }
    int64_t any_integer() override { return int64_t(rng_()); }
    double any_real() override { return real_in(-1e300, 1e300); }
    uint64_t bits() override { return rng_(); }

private:
    std::mt19937_64& rng_;
};

// The four tensors and the table each have a region of memory of their own.
// An operand may instead start inside an earlier region (hostile sources
// only): that is how in-place, separate and partially overlapping calls all
// come out of the same generator.
enum Region { kQ, kK, kQOut, kKOut, kCache, kRegions };
inline constexpr const char* kRegionNames[kRegions] = {"q", "k", "q_out", "k_out", "cos_sin_cache"};

struct Placement {
    int region = 0;           // The region whose start `data` is relative to.
    int64_t byte_offset = 0;  // Bytes past that start (a user reduces it to the region's size).
    int64_t tail_bytes = 0;   // Bytes of the region after the operand's last element.
};

// One drawn call. Its position arrays are allocated at their exact size (so
// AddressSanitizer sees an overread) and `positions` points into them: a Call
// can be moved (a vector keeps its buffer), not copied.
struct Call {
    rope::RopeConfig config;
    std::array<rope::TensorView, 4> views{};  // q, k, q_out, k_out; `data` is null until a user places them.
    std::array<Placement, kRegions> placements{};
    bool has_cache = false;
    rope::CosSinCache cache{};                     // `data` null until placed, when has_cache.
    std::vector<int64_t> ids, cu_seqlens, starts;  // The position arrays.
    rope::Positions positions{};                   // Points into the arrays above.
    rope::Direction direction = rope::Direction::forward;
    uint64_t fill_seed = 0;                        // For the user's fill of memory and input values.

    Call() = default;
    Call(Call&&) = default;
    Call& operator=(Call&&) = default;
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;
    // In place: each output is its own input's very view.
    bool in_place() const { return placements[kQOut].region == kQ && placements[kKOut].region == kK; }
};

Call draw(Source& in);

// The call in words (printed by both users before any failure).
std::string describe(const Call& call);

// Largest position of a call rope accepted (so every form is well formed), by
// the definitions of rope::Positions: the largest id; the last position of the
// longest sharded run (offset + seq * cp_size - 1, or per packed sequence,
// start + length * cp_size - 1); 0 for an empty call.
int64_t largest_position(const rope::Positions& positions, int64_t seq);

// Bytes from a view's first element to the end of its last (or of a
// table's first row to the end of its last): what its memory must hold.
// Nothing when a size or stride is negative or the count does not fit in
// int64 (such views exist only as numbers, never in memory); 0 for an empty
// view or a malformed table (validation rejects it unread).
std::optional<int64_t> byte_extent(const rope::TensorView& view);
std::optional<int64_t> byte_extent(const rope::CosSinCache& cache);

// ---------------------------------------------------------------------------
// The tolerance
// ---------------------------------------------------------------------------

// Unit roundoff of the storage type: the rounding of the float32 result on store.
double storage_roundoff(rope::DType dtype);

// Whether the float64 oracle (tests/oracle.hpp) computes calls of this config:
// it knows every layout, position form and multi-axis assignment, and a
// caller's table, but of the scaling types only none and linear. The others
// only change the frequencies, which tests/scaling_test.cpp checks against
// HuggingFace's own; for them backends are compared with cpu-naive alone.
bool oracle_computes(const rope::RopeConfig& config);

// The largest absolute error against float64 that an accepted call may have:
// the angle position * theta_i carries a relative error of about 1.2e-7 in
// the float32 default (theta_i rounded, then the product) and 4e-15 in the
// precise mode or with a caller's table (exact_angles); times the largest
// pair norm of the inputs (2.9 > 2 sqrt 2, inputs in [-2, 2]); plus 1e-5 for
// cos, sin and the products, and one rounding to the storage type.
double oracle_max_abs(const rope::RopeConfig& config, bool exact_angles, int64_t largest_position,
                      rope::DType dtype);

// The factor an accepted call multiplies cos and sin by: yarn's and
// longrope's attention factor, 1 otherwise (rope::AngleRule::cos_scale).
double attention_factor(const rope::RopeConfig& config, const rope::RopeArgs& args);

// Whether a backend's output `got` agrees with cpu-naive's `want`: both
// compute the same float32 cos and sin and the same rotation, so within one
// storage ulp, and non-finite exactly where cpu-naive is. cos and sin may
// still differ by a few float32 ulps (another routine, e.g. Eigen's against
// std::cos and std::sin), and the attention factor multiplies that difference
// before the products: an output of a few units can be the small difference
// of two terms 72 times larger (yarn with factor 1.8e308), so the absolute
// term grows with the factor (fuzz/regressions/validation/
// yarn-attention-factor-scales-agreement).
bool agrees(double got, double want, rope::DType dtype, double attention);

// Index of the first element of `got` that does not agree with `want`, or -1.
int64_t first_disagreement(const std::vector<double>& got, const std::vector<double>& want, rope::DType dtype,
                           double attention);

}  // namespace random_call
