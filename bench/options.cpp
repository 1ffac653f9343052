// rope-bench's command line (see options.hpp), parsed with CLI11 (Debian: libcli11-dev).
#include "options.hpp"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <regex>
#include <sstream>
#include <tuple>

#include "rope/backend.hpp"

namespace rope_bench {
namespace {

constexpr const char* kFooter = R"(
Position forms (each measured against a copy of the same q and k bytes):
  plain     positions P, ..., P+N-1 of each sequence (the default; P = --position-offset)
  ids       --ids: the same positions as an int64 ids tensor [N] in memory, shared by the batch
            (the plain path's cost of reading positions, beside mrope, packed and table)
  packed    --layout thd or --packed: the sequences packed into one [tokens, heads, head_dim]
            tensor with cu_seqlens; --packed 1..8192:32768 draws lengths (fixed seed),
            --packed 100,3000,28 lists them
  cp        --cp SIZE,RANK: this rank's shard of every sequence (load-balanced two-chunk split),
            padded or packed; the global positions
  mrope     --mrope contiguous|interleaved: [3, N] ids of a text prefix then an image grid
  axial     --axial S,S[,S]: the coordinates of a patch grid, S pairs per axis
  table     --table: a [max_position, rotary_dim] float32 cos/sin table built from rope's own
            frequencies, passed as RopeArgs::cos_sin_cache
RoPE + KV append (--op append, CUDA backends, thd layout: B sequences of N new tokens each):
  append    the fused call (rope::append_kv) into paged NHD k and v caches of --page-size slots
            (default 16), pages in a random order, each sequence after [0, --context) cached tokens;
            unfused: the backend's RoPE call, then a plain scatter of k and v into the same slots;
            both against a copy of the bytes the fused call moves; --cache model|e4m3fn|e5m2;
            --q-fp8: q written in the caches' FP8 format (no unfused row); --fp8-scale S: k's and
            q's scale, v's 2S (default 2^-5, a power of two; at a scale that is not one, as a
            calibrated amax / 448 is, rope's division by S and FlashInfer's multiplication by 1/S
            can round to different codes)
QK-RMSNorm + RoPE (--op qknorm, CUDA backends; per-head norm, Llama-style weight of the dtype):
  qknorm    the fused call (rope::apply_qk_norm), rounding as --rounding says (default float32)
  unfused   bench/qk_norm_baseline.cu's RMSNorm of q, then of k, then the backend's RoPE call;
            both against a copy of the same q and k bytes
Re-rotation (--op rerotate, every backend; the shape's H heads are the keys, there is no q):
  rerotate  rope::rerotate of keys rotated at positions P+1024, ... to positions P, ... (P =
            --position-offset): a window shift of 1,024 positions, as after StreamingLLM's eviction;
            in place, or into outputs with --placement out; against a copy of the keys' bytes.
            The plain positions only (any --layout: thd packs the B sequences); --kv-heads 0 or left
            out; always the precise angle path (its `precise` column says 1)
Bounds (beyond them an option is refused before any work): the ranges above; each of B, H, N, D from 1
  to 2^31-1; q and k of one shape at most 2^34 elements; --table at most 2^24 rows (the position offset
  plus the tokens times --cp SIZE); a --packed total or list adds up to the shape's B x N tokens.
Examples:
  rope-bench --backend cpu-naive --shape 1,4,64,64 --reps 3
  rope-bench --backend cuda-optimized --shape 1,32,32768,128 --kv-heads 8 --dtype bf16 --packed 1..8192:32768 --runs 3
  rope-bench --backend cuda-optimized --op append --shape 64,32,1,128 --kv-heads 8 --dtype bf16 --graph
  rope-bench --backend cuda-optimized --op qknorm --layout thd --shape 64,32,1,128 --kv-heads 8 --dtype bf16 --graph
  rope-bench --backend cuda-optimized --op rerotate --shape 1,8,32768,128 --layout bshd --dtype bf16
)";
static_assert(kRerotateShift == 1024, "kFooter states --op rerotate's shift: update it with the constant");

// A comma-separated list of non-negative integers, e.g. "1,32,4096,128".
std::vector<int64_t> parse_integers(const std::string& text, const std::string& option) {
    std::vector<int64_t> values;
    std::size_t begin = 0;
    while (true) {
        const std::size_t end = std::min(text.find(',', begin), text.size());
        int64_t value = -1;
        const char* first = text.data() + begin;
        const char* last = text.data() + end;
        const auto [stop, error] = std::from_chars(first, last, value);
        if (first == last || error != std::errc() || stop != last || value < 0 || value > kMaxSize)
            throw UsageError(option + ": expected integers from 0 to " + std::to_string(kMaxSize) +
                             " separated by commas, got '" + text + "'");
        values.push_back(value);
        if (end == text.size()) return values;
        begin = end + 1;
    }
}

Shape parse_shape(const std::string& text) {
    const std::vector<int64_t> sizes = parse_integers(text, "--shape");
    if (sizes.size() != 4 || *std::min_element(sizes.begin(), sizes.end()) < 1)
        throw UsageError("--shape: expected B,H,N,D (4 integers, each at least 1), got '" + text + "'");
    return {sizes[0], sizes[1], sizes[2], sizes[3]};
}

// "MIN..MAX[:TOTAL]" or "L,L,...".
PackedLengths parse_packed(const std::string& text) {
    PackedLengths packed;
    packed.enabled = true;
    std::smatch range;
    if (!std::regex_match(text, range, std::regex(R"((\d+)\.\.(\d+)(:(\d+))?)"))) {
        packed.lengths = parse_integers(text, "--packed (MIN..MAX[:TOTAL] or L,L,...)");
        return packed;
    }
    packed.min_length = parse_integers(range[1], "--packed (MIN)")[0];
    packed.max_length = parse_integers(range[2], "--packed (MAX)")[0];
    if (range[4].matched) packed.total = parse_integers(range[4], "--packed (TOTAL)")[0];
    if (packed.min_length < 1 || packed.max_length < packed.min_length || (range[4].matched && packed.total < 1))
        throw UsageError("--packed: need 1 <= MIN <= MAX and TOTAL >= 1, got '" + text + "'");
    return packed;
}

// A check that a number lies in [least, most], before any conversion to an integer or a size (CLI11 names the
// option in front of the message; NaN and infinity fail it).
CLI::Validator within(double least, double most) {
    std::ostringstream range;
    range << std::setprecision(15) << least << " to " << most;
    return CLI::Validator(
        [least, most, range = range.str()](std::string& text) {
            char* end = nullptr;
            const double value = std::strtod(text.c_str(), &end);
            if (end == text.c_str() || *end != '\0' || !(value >= least && value <= most))
                return "must be a number from " + range + ", got " + text;
            return std::string();
        },
        "[" + range.str() + "]");
}

// What a size of [B, N, H + K, D] elements refuses: more than kMaxElements, or, with --table, a table of more
// than kMaxTableRows positions. Checked in long double, so no product overflows.
void check_size(const Shape& shape, int64_t kv_heads, int64_t tokens, const Options& options) {
    const long double elements = (long double)tokens * (long double)(shape.heads + kv_heads) * shape.head_dim;
    if (elements > (long double)kMaxElements)
        throw UsageError("--shape " + shape.text() + " with " + std::to_string(kv_heads) + " k heads and " +
                         std::to_string(tokens) + " tokens: q and k hold more than " +
                         std::to_string(kMaxElements) + " elements");
    const long double rows = (long double)options.position_offset + (long double)tokens * options.cp_size;
    if (options.table && rows > (long double)kMaxTableRows)
        throw UsageError("--table with --position-offset " + std::to_string(options.position_offset) +
                         " and --shape " + shape.text() + ": the table would have more than " +
                         std::to_string(kMaxTableRows) + " rows");
}

}  // namespace

Options parse_options(int argc, const char* const* argv) {
    Options options;
    std::vector<std::string> backend_names{"all"};
    for (const rope::BackendInfo& info : rope::list_backends()) backend_names.push_back(info.name);

    CLI::App app{"rope-bench: the median time of a RoPE call, and its bandwidth as a percentage of a copy of the "
                 "same bytes measured in the same run (the method: bench/main.cpp, bench/timing/timing.hpp)",
                 "rope-bench"};
    app.footer(kFooter);
    app.get_formatter()->column_width(34);

    std::vector<std::string> shape_texts;
    std::pair<int64_t, int64_t> cp{1, 0};
    std::string dtype = "fp32", style = "neox", layout = "bhsd", placement = "in", mrope, packed_spec;
    app.add_option("--backend", options.backends, "backend to run (repeatable; default all)")
        ->check(CLI::IsMember(backend_names));
    app.add_option("--shape", shape_texts, "B,H,N,D: batch, q heads, tokens per sequence, head_dim "
                                           "(repeatable; default 1,32,4096,128)");
    app.add_option("--kv-heads", options.kv_heads, "k heads (default: as q; 0 rotates q only; --op rerotate: 0)")
        ->check(within(0, kMaxHeads));
    app.add_option("--dtype", dtype, "storage type: fp32, bf16 or fp16 (default fp32)")
        ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
    app.add_option("--style", style, "pairs: neox (half-split) or gptj (interleaved) (default neox)")
        ->check(CLI::IsMember({"neox", "gptj"}));
    CLI::Option* layout_option = app.add_option("--layout", layout, "bhsd, bshd or thd (packed) (default bhsd)")
                                     ->check(CLI::IsMember({"bhsd", "bshd", "thd"}));
    app.add_option("--placement", placement, "in: rotate in place (default); out: into separate outputs")
        ->check(CLI::IsMember({"in", "out"}));
    app.add_option("--threads", options.threads, "CPU thread counts, e.g. 1,2 (0: OpenMP's default)")
        ->delimiter(',')
        ->check(within(0, kMaxThreads));
    app.add_option("--reps", options.reps, "timed repetitions per run (default: ~1 s on a CPU, 50 on a GPU)")
        ->check(within(0, kMaxReps));
    app.add_option("--runs", options.runs, "whole measurements (call and ceiling) per row: the median ratio "
                                           "and its spread are reported (default 1)")
        ->check(within(1, kMaxRuns));
    app.add_option("--llc-mb", options.llc_mb, "cache (MiB) the rotating sets must span twice (default, or 0: detected)")
        ->check(within(0, kMaxCacheMiB));
    app.add_flag("--precise", options.precise, "RopeConfig::precise_angles (a backend without it: 'unsupported')");
    app.add_option("--position-offset", options.position_offset, "position of each sequence's first token (default 0)")
        ->check(within(0, kMaxPosition));
    app.add_flag("--graph", options.graph, "CUDA backends: time by replaying a CUDA graph of the calls");
    app.add_option("--packed", packed_spec, "packed sequences: MIN..MAX[:TOTAL] (drawn, fixed seed) or L,L,...");
    app.add_option("--cp", cp, "SIZE,RANK: context-parallel shard of rank RANK of SIZE")->delimiter(',');
    CLI::Option* mrope_option = app.add_option("--mrope", mrope, "M-RoPE sections: contiguous (Qwen2-VL) or "
                                                                 "interleaved (Qwen3-VL)")
                                    ->check(CLI::IsMember({"contiguous", "interleaved"}));
    std::vector<int64_t> sections;
    app.add_option("--sections", sections, "M-RoPE pairs per axis T,H,W (default [16,24,24] contiguous, "
                                           "[24,20,20] interleaved, scaled to rotary_dim/2)")
        ->delimiter(',')
        ->expected(3)
        ->check(within(1, kMaxSize))
        ->needs(mrope_option);
    std::vector<int64_t> axial;
    app.add_option("--axial", axial, "axial RoPE: pairs per axis of a patch grid, e.g. 32,32 or 8,28,28")
        ->delimiter(',')
        ->check(within(1, kMaxSize))
        ->excludes(mrope_option);
    app.add_flag("--table", options.table, "rotate with a caller's cos/sin table built from rope's frequencies");
    app.add_flag("--ids", options.ids, "plain positions as an int64 ids tensor [N] shared by the batch")
        ->excludes(mrope_option)
        ->excludes("--axial");
    std::string rounding = "float32";
    std::string cache = "model";
    CLI::Option* op_option = app.add_option("--op", options.op,
                                            "rope (default), append (RoPE + KV append), qknorm (QK-RMSNorm + RoPE) "
                                            "or rerotate (keys moved back " + std::to_string(kRerotateShift) +
                                                " positions)")
                                 ->check(CLI::IsMember({"rope", "append", "qknorm", "rerotate"}));
    app.add_option("--page-size", options.page_size, "--op append: slots per cache page (default 16)")
        ->check(within(1, kMaxPageSize))
        ->needs(op_option);
    app.add_option("--context", options.context, "--op append: cached tokens per sequence drawn from [0, C) "
                                                 "(default 2048)")
        ->check(within(1, kMaxContext))
        ->needs(op_option);
    app.add_option("--cache", cache, "--op append: what the caches store: model, e4m3fn or e5m2 (default model)")
        ->check(CLI::IsMember({"model", "e4m3fn", "e5m2"}))
        ->needs(op_option);
    app.add_flag("--q-fp8", options.q_fp8, "--op append: rotated q written in the caches' FP8 format, as "
                                               "FlashInfer's fused kernel writes it (needs --cache e4m3fn or e5m2)")
            ->needs(op_option);
    CLI::Option* fp8_scale_option =
        app.add_option("--fp8-scale", options.fp8_scale, "--op append, FP8 caches: k's and q's dequantisation scale, "
                                                         "v's twice it (default 0.03125, a power of two)")
            ->check(within(kMinFp8Scale, kMaxFp8Scale))
            ->needs(op_option);
    CLI::Option* rounding_option =
        app.add_option("--rounding", rounding, "--op qknorm: float32, hf_qwen3, hf_gemma3 or hf_olmo2 "
                                               "(default float32)")
            ->check(CLI::IsMember({"float32", "hf_qwen3", "hf_gemma3", "hf_olmo2"}))
            ->needs(op_option);
    app.add_option("--format", options.format, "table or csv (default table)")
        ->check(CLI::IsMember({"table", "csv"}));

    options.usage = app.help();
    if (argc < 1 || argv == nullptr)
        throw UsageError("argc = " + std::to_string(argc) + ": argv[0] must be the program's name");
    try {
        app.parse(argc, argv);
    } catch (const CLI::Success&) {  // --help: CLI11 signals it as a success (CLI::CallForHelp).
        options.help = true;
        return options;
    } catch (const CLI::ParseError& error) {
        throw UsageError(error.what());
    }

    // Names the check above accepted, so these conversions cannot fail.
    options.dtype = rope::parse_dtype(dtype);
    options.style = rope::parse_style(style);
    options.layout = rope::parse_layout(layout);
    options.in_place = placement == "in";
    options.cache_dtype = cache == "model"    ? rope::CacheDType::model
                          : cache == "e4m3fn" ? rope::CacheDType::e4m3fn
                                              : rope::CacheDType::e5m2;
    if (options.op == "append") {  // [tokens, heads, head_dim] tensors, as rope::append_kv takes them.
        if (layout_option->count() > 0 && options.layout != rope::Layout::thd)
            throw UsageError("--layout " + layout + ": --op append takes thd ([tokens, heads, head_dim]) only");
        if (cp.first > 1)
            throw UsageError("--cp: --op append measures unsharded sequences only");
        options.layout = rope::Layout::thd;
    }
    if (options.q_fp8 && (options.op != "append" || options.cache_dtype == rope::CacheDType::model))
        throw UsageError("--q-fp8: needs --op append with --cache e4m3fn or e5m2 (q goes to the caches' FP8 format; "
                         "here --op " + options.op + " --cache " + cache + ")");
    if (fp8_scale_option->count() > 0 && (options.op != "append" || options.cache_dtype == rope::CacheDType::model))
        throw UsageError("--fp8-scale: needs --op append with --cache e4m3fn or e5m2 (here --op " + options.op +
                         " --cache " + cache + ")");
    if (options.op == "rerotate") {  // Keys alone, at the plain positions: a window shift (see kFooter).
        const std::string op = ": --op rerotate ";
        if (options.kv_heads > 0)
            throw UsageError("--kv-heads " + std::to_string(options.kv_heads) + op +
                             "takes no q: the shape's H heads are the keys (leave --kv-heads out, or give 0)");
        const std::string plain = "measures the plain positions only (keys moved from P+" +
                                  std::to_string(kRerotateShift) + ", ... to P, ...)";
        if (options.ids) throw UsageError("--ids" + op + plain);
        if (!mrope.empty()) throw UsageError("--mrope " + mrope + op + plain);
        if (!axial.empty()) throw UsageError("--axial" + op + plain);
        if (!packed_spec.empty()) throw UsageError("--packed " + packed_spec + op + plain);
        if (cp.first > 1)
            throw UsageError("--cp " + std::to_string(cp.first) + "," + std::to_string(cp.second) + op + plain);
        if (options.table)
            throw UsageError("--table" + op + "takes no cos/sin table: rope::rerotate refuses one (a table holds "
                             "cos and sin of float32 angles, whose difference would not be formed before rounding)");
        options.kv_heads = 0;  // The set is the keys alone: the form's q tensor, and no k.
    }
    options.rounding = rope::parse_qk_norm_rounding(rounding);
    if (rounding_option->count() > 0 && options.op != "qknorm")
        throw UsageError("--rounding " + rounding + ": only with --op qknorm, got --op " + options.op);
    if (options.backends.empty() || std::count(options.backends.begin(), options.backends.end(), "all") > 0)
        options.backends.assign(backend_names.begin() + 1, backend_names.end());
    for (const std::string& text : shape_texts) options.shapes.push_back(parse_shape(text));
    if (options.shapes.empty()) options.shapes.push_back(Shape{});

    if (!packed_spec.empty()) {
        options.packed = parse_packed(packed_spec);
        if (layout_option->count() == 0) options.layout = rope::Layout::thd;
    }
    if (cp.first < 1 || cp.first > kMaxThreads || cp.second < 0 || cp.second >= cp.first)
        throw UsageError("--cp: expected SIZE,RANK with 1 <= SIZE <= " + std::to_string(kMaxThreads) +
                         " and 0 <= RANK < SIZE, got " + std::to_string(cp.first) + "," + std::to_string(cp.second));
    std::tie(options.cp_size, options.cp_rank) = cp;
    if (!mrope.empty()) {
        options.multi_axis = mrope == "contiguous" ? rope::AxisAssignment::mrope_contiguous
                                                   : rope::AxisAssignment::mrope_interleaved;
        options.sections = sections;
    }
    if (!axial.empty()) {
        if (axial.size() < 2 || int64_t(axial.size()) > rope::kMaxPositionAxes)
            throw UsageError("--axial: expected 2 to " + std::to_string(rope::kMaxPositionAxes) +
                             " pairs-per-axis counts, got " + std::to_string(axial.size()));
        options.multi_axis = rope::AxisAssignment::axial;
        options.sections = axial;
    }
    // Every size at once, before anything is allocated: each shape with its k heads and its tokens (a --packed
    // total or list must hold the shape's B x N tokens, as make_form requires).
    for (const Shape& shape : options.shapes) {
        const int64_t kv_heads = options.kv_heads >= 0 ? options.kv_heads : shape.heads;
        check_size(shape, kv_heads, shape.batch * shape.seq, options);
        const PackedLengths& packed = options.packed;
        int64_t total = packed.total;
        for (int64_t length : packed.lengths) total += length;  // Each <= kMaxSize: no overflow for a sane count.
        if (packed.enabled && total > 0 && total != shape.batch * shape.seq)
            throw UsageError("--packed: the lengths total " + std::to_string(total) + " tokens but --shape " +
                             shape.text() + " holds " + std::to_string(shape.batch * shape.seq) + " (B x N)");
    }
    return options;
}

}  // namespace rope_bench
