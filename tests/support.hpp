#pragma once
// Test support: host tensors with padding, random fill, NaN poisoning, the
// memory arrangements of a view inside its storage, the backend list for
// parameterised tests, and running a backend on host data (staging through
// device memory for CUDA backends).
#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "oracle.hpp"
#include "rope/rope.hpp"

namespace testing {

// The seed of this test process: fresh each run (std::random_device), or
// ROPE_TEST_SEED to reproduce a failure. Every failure message prints it.
uint64_t seed();
std::mt19937_64& rng();

struct StorageOptions;

// A host tensor that owns its storage. make()'s `pad` adds unused elements
// after each row and each block of rows, so views are non-contiguous;
// `dim_stride` > 1 spaces the features themselves. arranged() builds the other
// memory arrangements (below).
struct HostTensor {
    std::vector<uint16_t> storage;  // 2-byte units; f32 uses two per element.
    rope::TensorView view;
    int64_t offset_units = 0;       // Storage units before the view's first element (a misaligned view).

    HostTensor() = default;
    // A copy owns a copy of the storage, and its view points at that copy.
    HostTensor(const HostTensor& other) : storage(other.storage), view(other.view), offset_units(other.offset_units) {
        repoint();
    }
    HostTensor& operator=(const HostTensor& other) {
        storage = other.storage;
        view = other.view;
        offset_units = other.offset_units;
        repoint();
        return *this;
    }
    HostTensor(HostTensor&&) = default;  // Moving a vector keeps its buffer, so the view stays valid.
    HostTensor& operator=(HostTensor&&) = default;

    static HostTensor make(rope::DType dtype, rope::Layout layout, std::array<int64_t, 4> shape,
                           int64_t pad = 0, int64_t dim_stride = 1);
    // A tensor whose view sits in its storage as `options` says (see StorageOptions).
    static HostTensor arranged(rope::DType dtype, rope::Layout layout, std::array<int64_t, 4> shape,
                               const StorageOptions& options, std::mt19937_64& rng);
    // Uniform random values in [-2, -0.05] U [0.05, 2] (never zero), rounded to
    // the dtype, in every element of the view; NaN in the storage around it, so a
    // backend that reads outside the view spreads NaN into its result.
    void fill_random();
    // Every storage unit (padding included) set to NaN.
    void poison();
    std::vector<double> values() const { return oracle::values(view); }
    size_t bytes() const { return storage.size() * 2; }

private:
    void repoint() {
        if (view.data != nullptr) view.data = storage.data() + offset_units;
    }
};

// ---------------------------------------------------------------------------
// Memory arrangements: how a view sits inside its storage (the layout cases of
// the former CUDA self-check). The view's shape and layout stay the same; its
// strides, the offset of its first element and the storage around it change.
// ---------------------------------------------------------------------------

enum class Arrangement {
    dense,         // Row-major, no gaps.
    padded,        // Unused elements after every row and every block of rows: either
                   // multiples of 8 (rows stay 16-byte aligned) or odd counts (they do not).
    dim_stride_2,  // Features two elements apart.
    misaligned,    // The first element one element into the storage: off 16-byte alignment.
    transposed,    // Heads and seq swapped in memory (a bhsd view of bshd memory and vice versa).
};
inline constexpr Arrangement all_arrangements[] = {Arrangement::dense, Arrangement::padded, Arrangement::dim_stride_2,
                                                   Arrangement::misaligned, Arrangement::transposed};
const char* arrangement_name(Arrangement arrangement);

struct StorageOptions {
    Arrangement arrangement = Arrangement::dense;
    int64_t tail = 0;  // Elements of storage after the view's last element.
};
// E.g. "padded+tail3".
std::string storage_name(const StorageOptions& options);

// What a test asks a backend to do, on host data.
struct Call {
    rope::RopeConfig config;
    HostTensor q, k, q_out, k_out;
    std::vector<int64_t> ids;  // Explicit position ids, or empty.
    int64_t id_rows = 0;       // 1 or batch when ids is set.
    int64_t offset = 0;
    rope::Direction direction = rope::Direction::forward;
    bool in_place = false;     // When true, q_out/k_out are ignored and q/k are overwritten.

    // Positions beyond one line (rope::Positions says what each means). Every
    // one set here goes into positions(), so a test can also combine forms the
    // library must reject.
    int64_t id_axes = 1;              // Id rows per token: ids holds id_axes * id_rows * seq ids.
    std::vector<int64_t> cu_seqlens;  // Packed sequences: sequences + 1 offsets, or empty.
    std::vector<int64_t> starts;      // First position of each packed sequence, or empty (offset).
    int64_t cp_size = 1;              // Context-parallel group size.
    int64_t cp_rank = 0;              // This shard's rank.
    // A caller's cos/sin table, float32 [table_rows, table_row_stride] (cos of
    // each pair, then sin, in the first table_cols entries of a row), or empty.
    std::vector<float> table;
    int64_t table_rows = 0;
    int64_t table_cols = 0;
    int64_t table_row_stride = 0;

    rope::Positions positions() const;
    // The table as the call hands it over (data null when there is none).
    rope::CosSinCache cos_sin_cache() const;
    // The tensors that hold the result after run().
    const HostTensor& q_result() const { return in_place ? q : q_out; }
    const HostTensor& k_result() const { return in_place ? k : k_out; }
};

// A call with random q/k of the given shapes (layout order), poisoned outputs of the same geometry.
Call make_call(const rope::RopeConfig& config, rope::DType dtype, rope::Layout layout,
               std::array<int64_t, 4> q_shape, std::array<int64_t, 4> k_shape, int64_t pad = 0,
               int64_t dim_stride = 1);

// Rebuilds the call's four tensors (q, k, q_out, k_out, in that order of
// `storage`) with the same dtype, layout and shapes in the given arrangements:
// fresh random inputs, poisoned outputs.
void arrange(Call& call, const std::array<StorageOptions, 4>& storage, std::mt19937_64& rng);

// What `after` (the call once run) wrote that it must not have, compared with
// `before` (the same call before running): for an out-of-place call, any unit
// of q or k, and any unit of q_out or k_out outside their views; in place, any
// unit of q or k outside their views, and any unit of the unused q_out, k_out.
// Empty when nothing was. A rejected call must leave even the views alone:
// compare storage directly for that.
std::string unexpected_writes(const Call& before, const Call& after);

// A call staged in device memory: each tensor's whole storage (padding, tail
// and a misaligned start included, at the same byte offsets), the position
// arrays (ids, cu_seqlens, starts) and the cos/sin table, with `args` pointing at them (default stream; set args.stream to use
// another). Tests that drive the device themselves (streams, graphs) use it;
// run() uses it for every CUDA call.
struct DeviceCall {
    struct Tensor {
        rope::Buffer buffer;    // A copy of the host tensor's storage.
        rope::TensorView view;  // The host view, re-pointed into `buffer`.
    };
    Tensor q, k, q_out, k_out;
    rope::Buffer ids, cu_seqlens, starts, table;  // Device copies of the call's position arrays and table.
    rope::RopeArgs args;

    explicit DeviceCall(const Call& call);
    // Waits for the device, then copies all four tensors back into `call`
    // (inputs too, so tests see whether an out-of-place call wrote them).
    void copy_back(Call& call) const;
};

// A packed (thd) view [tokens, heads, head_dim] of a batch-1 bshd tensor with
// the same padding options, so packed tests get padded and spaced rows too.
HostTensor make_packed(rope::DType dtype, std::array<int64_t, 3> shape, int64_t pad = 0, int64_t dim_stride = 1);

// A call on packed sequences: random q/k of [tokens, heads, head_dim] (thd)
// with cu_seqlens built from `lengths`, poisoned outputs.
Call make_packed_call(const rope::RopeConfig& config, rope::DType dtype, const std::vector<int64_t>& lengths,
                      int64_t q_heads, int64_t k_heads, int64_t pad = 0);

// Runs the call on `backend`. Host backends work on the host tensors directly;
// CUDA backends get device copies of every tensor (padding included), of the
// ids, cu_seqlens, starts and table, and the results are copied back, so tests
// see the device's writes byte for byte.
// `adjust`, if given, edits the final arguments just before rope::apply (after
// staging), so tests can hand a backend deliberately wrong arguments, e.g. a
// host pointer for a CUDA backend.
void run(rope::Backend& backend, Call& call, const std::function<void(rope::RopeArgs&)>& adjust = {});

// The backend, or null after printing "ROPE_SKIPPED <name>: <reason>" (CTest
// reports the test as skipped when it sees that text).
std::unique_ptr<rope::Backend> backend_or_skip(const std::string& name);

// Prints "ROPE_SKIPPED <what>: <reason>" and counts the skip, for a test that
// needs more than a backend (a second GPU, device memory).
void report_skip(const std::string& what, const std::string& reason);

// How many test cases this process skipped (printed at exit by main).
int& skipped_backend_tests();

// Oracle results for the call's q and k (from the call's inputs, before any in-place run).
struct Expected {
    std::vector<double> q, k;
};
Expected oracle_for(const Call& call);

// Relative-L2 tolerance against the float64 oracle for an all-float32 pipeline
// whose largest position is `max_position`: the float32 angle position*theta
// carries a relative rounding error near 6e-8, so the error grows with the
// position (about 1e-6 at position 256, 1.5e-4 at 32768).
double fp32_tolerance(int64_t max_position);

// Max-abs tolerance against the oracle for the same pipeline: the angle error
// (float32 rounding of theta_i and of position*theta_i, each up to 6e-8
// relative) times the largest pair norm of our inputs (2*sqrt(2)), plus the
// rounding of cos, sin and the products.
double fp32_max_abs(int64_t max_position);

// Tolerances against the float64 oracle for a call of `dtype` storage whose
// largest position is `max_position`: the float32 pipeline's (above), plus for
// 2-byte storage the rounding of the result to it: at most half a unit in the
// last place of values below 4 (2^-7 in bf16, 2^-10 in fp16), and a relative
// L2 error near that half-ulp over sqrt(3) (a uniform rounding error), bounded
// here by 4e-3 (bf16) and 5e-4 (fp16).
struct Tolerance {
    double rel_l2;
    double max_abs;
};
Tolerance oracle_tolerance(rope::DType dtype, int64_t max_position);

// Tolerances between a backend and cpu-naive, which compute the same float32
// angles and products: a few float32 ulps of values up to about 3 for fp32
// storage; for 2-byte storage, float32 results that differ in their last bits
// can round to neighbouring storage values: one storage ulp of values below 4
// (2^-6 in bf16, 2^-9 in fp16).
Tolerance naive_agreement(rope::DType dtype);

// The float32 row of naive_agreement, for tests that compare two fp32 results directly.
inline constexpr double agree_rel_l2 = 5e-7;
inline constexpr double agree_max_abs = 4e-6;

// CHECKs that `got` matches `want` within the relative L2 and max-abs
// tolerances and holds no NaN or inf, reporting the measured errors.
void check_close(const std::vector<double>& got, const std::vector<double>& want, double rel_tol, double abs_tol,
                 const char* what);

// Runs `call` on the backend and on cpu-naive; checks the result against the
// oracle (within oracle_rel / oracle_abs) and cpu-naive's (naive_agreement),
// and that no byte of storage outside the outputs' views (nor any byte of an
// out-of-place call's inputs) was written.
void check_call(rope::Backend& backend, Call call, double oracle_rel, double oracle_abs);

}  // namespace testing
