#pragma once
/// @file options.hpp
/// @brief rope-bench's command line, parsed from argv into one struct (with CLI11). Parsing never exits and
/// never touches a device, so a fuzz target can call parse_options on any argv.

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "rope/config.hpp"
#include "rope/dtype.hpp"
#include "rope/kv_append.hpp"
#include "rope/qk_norm.hpp"
#include "rope/tensor.hpp"

namespace rope_bench {

/// @name Bounds: a number beyond one is refused while parsing, before anything is allocated or started.
/// @{
constexpr int kMaxThreads = 1024;                      ///< --threads (each count) and --cp SIZE.
constexpr int kMaxReps = 1000000;                      ///< --reps.
constexpr int kMaxRuns = 100;                          ///< --runs.
constexpr double kMaxCacheMiB = 65536;                 ///< --llc-mb (64 GiB).
constexpr int64_t kMaxSize = (int64_t(1) << 31) - 1;   ///< Each of B, H, N, D, a --packed length or total, a section.
constexpr int64_t kMaxHeads = int64_t(1) << 20;        ///< --kv-heads.
constexpr int64_t kMaxPosition = (int64_t(1) << 31) - 1;  ///< --position-offset.
constexpr int64_t kMaxElements = int64_t(1) << 34;     ///< q + k elements of one shape (64 GiB in fp32).
constexpr int64_t kMaxTableRows = int64_t(1) << 24;    ///< --table: position offset + tokens x --cp SIZE.
constexpr int64_t kMaxPageSize = int64_t(1) << 16;     ///< --page-size.
constexpr int64_t kMaxContext = int64_t(1) << 20;      ///< --context: tokens already cached per sequence.
constexpr double kMinFp8Scale = 0x1p-20;               ///< --fp8-scale: inputs of magnitude ~1 against e4m3fn's
constexpr double kMaxFp8Scale = 0x1p20;                ///< 448 and e5m2's 57344 leave any wider range all 0 or max.
/// @}

/// @brief --op rerotate: how far the keys move back, in positions (from P + shift, ... to P, ...), as a window
/// shift after an eviction (StreamingLLM) moves them. Not a knob: the call's work does not depend on the
/// distance (one rotation by the angle difference on the precise angle path, whatever the difference), so one
/// shift stands for all; a power of two, so that it is a whole number of pages of any power-of-two page size.
constexpr int64_t kRerotateShift = 1024;

/// @brief --fp8-scale's default: 2^-5, so that inputs of magnitude ~1 use most of e4m3fn's range.
constexpr float kDefaultFp8Scale = 0.03125f;

/// @brief One --shape B,H,N,D: batch, q heads, tokens per sequence, head_dim (thd: B x N packed tokens).
struct Shape {
    int64_t batch = 1, heads = 32, seq = 4096, head_dim = 128;
    /// @brief "B,H,N,D".
    std::string text() const {
        return std::to_string(batch) + "," + std::to_string(heads) + "," + std::to_string(seq) + "," +
               std::to_string(head_dim);
    }
};

/// @brief --packed: an explicit list of lengths (`--packed 100,3000,28`), or lengths drawn uniformly from
/// [min_length, max_length] with a fixed seed until they reach `total` tokens, the last one cut to fit
/// (`--packed 1..8192:32768`). Without --packed, a thd layout packs the shape's batch of equal sequences.
struct PackedLengths {
    bool enabled = false;           ///< --packed was given.
    std::vector<int64_t> lengths;   ///< The explicit list (empty: drawn).
    int64_t min_length = 0;         ///< Drawn: shortest length, >= 1.
    int64_t max_length = 0;         ///< Drawn: longest length, >= min_length.
    int64_t total = 0;              ///< Drawn: tokens in all (0: batch x seq of the shape).
};

/// @brief Everything the command line says.
struct Options {
    std::vector<std::string> backends;  ///< Registered names; "all" expanded (default: all).
    std::vector<Shape> shapes;          ///< Default: one Shape{}.
    int64_t kv_heads = -1;              ///< k heads; -1: as many as q; 0: rotate q only (--op rerotate: always 0).
    rope::DType dtype = rope::DType::f32;
    rope::Style style = rope::Style::half_split;
    rope::Layout layout = rope::Layout::bhsd;  ///< thd when --packed is given without --layout.
    bool in_place = true;               ///< --placement in (true) or out.
    std::vector<int> threads{0};        ///< CPU thread counts; 0: OpenMP's default.
    int reps = 0;                       ///< Timed repetitions per run; 0: chosen per device.
    int runs = 1;                       ///< Whole measurements (call and ceiling) per row.
    double llc_mb = 0.0;                ///< Cache the sets must span twice; 0: detected.
    bool precise = false;               ///< RopeConfig::precise_angles.
    int64_t position_offset = 0;        ///< Position of each sequence's first token.
    bool graph = false;                 ///< GPU: time by CUDA graph replay.
    // The position forms (options.cpp's help text describes them).
    PackedLengths packed;               ///< --packed.
    int64_t cp_size = 1;                ///< --cp SIZE,RANK: context-parallel ranks (1: no split).
    int64_t cp_rank = 0;                ///< --cp SIZE,RANK: this rank.
    /// --mrope (mrope_contiguous, mrope_interleaved) or --axial (axial); single otherwise.
    rope::AxisAssignment multi_axis = rope::AxisAssignment::single;
    /// Pairs per axis: --axial's list, or --sections (M-RoPE); empty: --mrope's default.
    std::vector<int64_t> sections;
    bool table = false;                 ///< --table: a caller's cos/sin table (RopeArgs::cos_sin_cache).
    bool ids = false;                   ///< --ids: the plain positions as an int64 ids tensor in memory.
    std::string format = "table";       ///< table or csv.
    /// --op: rope (the RoPE call), append (RoPE + KV append: the fused call, the unfused pair, their ceiling),
    /// qknorm (QK-RMSNorm + RoPE: the fused call, the unfused steps) or rerotate (rope::rerotate of keys: the
    /// shape's H heads, kRerotateShift positions back).
    std::string op = "rope";
    int64_t page_size = 16;             ///< --op append: slots per cache page.
    int64_t context = 2048;             ///< --op append: each sequence's cached tokens drawn from [0, context).
    rope::CacheDType cache_dtype = rope::CacheDType::model;  ///< --op append: --cache model, e4m3fn or e5m2.
    bool q_fp8 = false;  ///< --op append: --q-fp8, rotated q written in the caches' FP8 format (rope::Fp8Output).
    /// --op append, FP8 caches: --fp8-scale, k's and q's dequantisation scale (v's is twice it). A power of two
    /// by default; at one that is not, x / scale (rope's) and x * (1 / scale) (FlashInfer's) can round apart.
    float fp8_scale = kDefaultFp8Scale;
    rope::QkNormRounding rounding = rope::QkNormRounding::float32;  ///< --op qknorm: --rounding.
    bool help = false;                  ///< --help: print usage and do nothing else.
    std::string usage;                  ///< The help text (always filled).
};

/// @brief A command line that cannot be understood; what() says which option and why.
class UsageError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// @brief Parses rope-bench's command line.
/// @param argc number of entries of @p argv, >= 1 (argv[0] is the program's name, not read).
/// @param argv the arguments, each a non-null NUL-terminated string.
/// @return the options; with --help, `help` is set and nothing else is checked.
/// @throws UsageError for anything it cannot accept (and nothing else).
Options parse_options(int argc, const char* const* argv);

}  // namespace rope_bench
