// Chapter 8: packed batches, images and video.
//
// Five ways a token gets its position, beyond "token s is at position s":
//   1. packed batches: sequences concatenated, cu_seqlens and per-sequence starts;
//   2. context-parallel shards: each rank holds two chunks of every sequence;
//   3. images and video in a language model: M-RoPE's three position rows,
//      with contiguous (Qwen2-VL) or interleaved (Qwen3-VL) sections;
//   4. axial RoPE of vision towers and diffusion models: one coordinate per
//      axis, the frequency index restarting on each;
//   5. a caller's cos/sin table (the serving engines' format).
// For each: the bookkeeping, checked on every backend available here against
// float64 RoPE written in this file from the chapter's formulas (not the
// library's code); then the bug that shipped in public kernels, reproduced here
// and marked THE BUG, and the check that catches it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <rope/rope.hpp>
#include <string>
#include <vector>

#include "tutorial.hpp"

namespace {

constexpr double kPi = 3.14159265358979323846;

// ---------------------------------------------------------------------------
// RoPE in float64, from the chapter's formulas
// ---------------------------------------------------------------------------

/// cos and sin of the angle one pair of one token turns by.
struct CosSin {
    double cos = 1, sin = 0;
};

CosSin turn(double angle) { return {std::cos(angle), std::sin(angle)}; }

/// theta_i = base^(-2i/d): the frequency of pair i of a RoPE over d features.
double theta(double base, int64_t i, int64_t d) { return std::pow(base, -2.0 * double(i) / double(d)); }

/// Rotates x in float64: x holds tokens of `heads` rows of head_dim features,
/// token after token (as bshd and thd store them). Pair i of token t turns by
/// rotation(t, i), a CosSin: each section supplies its own bookkeeping.
/// Half-split pairs are (i, i + rotary_dim/2), interleaved ones (2i, 2i+1);
/// features past rotary_dim pass through.
template <typename Rotation>
std::vector<double> rotate_float64(const std::vector<float>& x, int64_t heads, int64_t head_dim, int64_t rotary_dim,
                                   rope::Style style, Rotation rotation) {
    const int64_t tokens = int64_t(x.size()) / (heads * head_dim);
    const int64_t half = rotary_dim / 2;
    std::vector<double> out(x.begin(), x.end());
    for (int64_t t = 0; t < tokens; ++t)
        for (int64_t i = 0; i < half; ++i) {
            const CosSin r = rotation(t, i);
            const int64_t first = style == rope::Style::half_split ? i : 2 * i;
            const int64_t second = style == rope::Style::half_split ? i + half : 2 * i + 1;
            for (int64_t h = 0; h < heads; ++h) {
                double* row = out.data() + (t * heads + h) * head_dim;
                const double x0 = row[first], x1 = row[second];
                row[first] = x0 * r.cos - x1 * r.sin;
                row[second] = x1 * r.cos + x0 * r.sin;
            }
        }
    return out;
}

// Tolerances of every float64 comparison here. float32 angles at positions
// below 200 carry errors near position * 6e-8 radians (chapter 7): relative L2
// errors of 1e-7 to 1e-6. Every bug below is off by 1e-4 (an fp16 table) to 1.
constexpr double kRelTolerance = 4e-6;
constexpr double kAbsTolerance = 4e-5;

/// How far a float32 result is from float64 (a NaN anywhere makes it fail).
struct Distance {
    double rel_l2 = 0, max_abs = 0;
    bool within() const { return rel_l2 < kRelTolerance && max_abs < kAbsTolerance; }
    std::string text() const { return "rel L2 " + tutorial::sci(rel_l2, 1) + ", max abs " + tutorial::sci(max_abs, 1); }
};

Distance distance(const std::vector<float>& got, const std::vector<double>& want) {
    return {tutorial::relative_l2(got, want), tutorial::max_abs_difference(got, want)};
}

// ---------------------------------------------------------------------------
// One call on one backend: host vectors in, host vectors out
// ---------------------------------------------------------------------------

/// q and k of one call, on the host, token after token: q is [tokens, q_heads,
/// head_dim], k [tokens, k_heads, head_dim]. Stored as bshd [batch, seq, heads,
/// head_dim], or as one packed thd tensor [seq, heads, head_dim].
struct Tensors {
    int64_t batch = 1, seq = 0;  ///< Packed: batch 1 and seq = total tokens.
    int64_t q_heads = 0, k_heads = 0, head_dim = 0;
    bool packed = false;
    std::vector<float> q, k;
};

/// Random q and k (never zeros: an unrotated zero looks rotated).
Tensors random_tensors(int64_t batch, int64_t seq, int64_t q_heads, int64_t k_heads, int64_t head_dim, bool packed,
                       uint32_t seed) {
    Tensors t{batch, seq, q_heads, k_heads, head_dim, packed, {}, {}};
    t.q = tutorial::random_values(size_t(batch * seq * q_heads * head_dim), seed);
    t.k = tutorial::random_values(size_t(batch * seq * k_heads * head_dim), seed + 1000);
    return t;
}

/// Host copies of what a call's positions read. run() copies the arrays to
/// the backend's memory and builds rope::Positions from those copies.
struct PositionArrays {
    int64_t offset = 0;
    std::vector<int64_t> ids{};  ///< Explicit ids [axes, seq], shared by the batch; empty: none.
    int64_t axes = 1;
    std::vector<int64_t> cu_seqlens{};  ///< Packed sequences; empty: none.
    std::vector<int64_t> starts{};      ///< First position of each packed sequence; empty: 0 (or offset).
    int64_t cp_size = 1, cp_rank = 0;
};

/// What a call left in its outputs, and the rope::Error's message if it was refused.
struct Outcome {
    std::vector<float> q, k;
    std::string error;
};

/// The outputs start as quiet NaN, so an element a backend never writes is visible.
const float kPoison = std::nanf("");

/// Copies `values` into memory of `device` (a plain host copy for CPU backends).
template <typename T>
rope::Buffer on_device(rope::Device device, const std::vector<T>& values) {
    rope::Buffer buffer(device, values.size() * sizeof(T));
    buffer.copy_from_host(values.data());
    return buffer;
}

/// Rotates `in` out of place on `backend`, with the positions `arrays`
/// describe and, if `table` is not empty, that cos/sin table ([rows,
/// rotary_dim], float32). Everything goes through the backend's memory, so a
/// CUDA backend gets device copies of the tensors, ids and table.
Outcome run(rope::Backend& backend, const rope::RopeConfig& config, const Tensors& in, const PositionArrays& arrays,
            const std::vector<float>& table = {}) {
    const rope::Device device = backend.device();
    const rope::Buffer q_in = on_device(device, in.q), k_in = on_device(device, in.k);
    const rope::Buffer q_out = on_device(device, std::vector<float>(in.q.size(), kPoison));
    const rope::Buffer k_out = on_device(device, std::vector<float>(in.k.size(), kPoison));
    const rope::Buffer ids = on_device(device, arrays.ids), cu_seqlens = on_device(device, arrays.cu_seqlens);
    const rope::Buffer starts = on_device(device, arrays.starts), cos_sin = on_device(device, table);

    auto view = [&](const rope::Buffer& buffer, int64_t heads) {
        if (in.packed)
            return rope::TensorView::packed(buffer.data(), rope::DType::f32, device, {in.seq, heads, in.head_dim});
        return rope::TensorView::contiguous(buffer.data(), rope::DType::f32, device, rope::Layout::bshd,
                                            {in.batch, in.seq, heads, in.head_dim});
    };
    rope::Positions positions = rope::Positions::starting_at(arrays.offset);
    if (!arrays.ids.empty()) {
        positions =
            rope::Positions::multi_axis(static_cast<const int64_t*>(ids.data()), arrays.axes, 1, in.seq, device);
    } else if (!arrays.cu_seqlens.empty()) {
        positions = rope::Positions::packed(static_cast<const int64_t*>(cu_seqlens.data()),
                                            int64_t(arrays.cu_seqlens.size()) - 1,
                                            static_cast<const int64_t*>(starts.data()), device);
        positions.offset = arrays.offset;  // Every sequence's start when there are no starts.
    }
    if (arrays.cp_size > 1) positions = positions.sharded(arrays.cp_size, arrays.cp_rank);
    rope::RopeArgs args = rope::RopeArgs::out_of_place(view(q_in, in.q_heads), view(k_in, in.k_heads),
                                                       view(q_out, in.q_heads), view(k_out, in.k_heads), positions);
    if (!table.empty()) {
        const int64_t cols = config.effective_rotary_dim();
        args.cos_sin_cache = rope::CosSinCache::dense(static_cast<const float*>(cos_sin.data()),
                                                      int64_t(table.size()) / cols, cols, device);
    }
    Outcome outcome{std::vector<float>(in.q.size()), std::vector<float>(in.k.size()), ""};
    try {
        rope::apply(backend, config, args);
        if (device == rope::Device::cuda) rope::cuda_synchronize();  // The launch is asynchronous.
    } catch (const rope::Error& error) {
        outcome.error = error.what();
    }
    q_out.copy_to_host(outcome.q.data());
    k_out.copy_to_host(outcome.k.data());
    return outcome;
}

/// Whether two results are the same bits, NaN for NaN (memcmp, not ==).
bool identical(const std::vector<float>& a, const std::vector<float>& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

/// Whether every output element still holds the poison: nothing was written.
bool untouched(const std::vector<float>& out) { return identical(out, std::vector<float>(out.size(), kPoison)); }

// ---------------------------------------------------------------------------
// Every backend available here
// ---------------------------------------------------------------------------

struct Backends {
    std::vector<std::unique_ptr<rope::Backend>> available;
    int64_t skipped = 0;
};

Backends every_backend() {
    Backends backends;
    for (const rope::BackendInfo& info : rope::list_backends()) {
        if (!info.available) {
            std::printf("  %-15s skipped: %s\n", info.name.c_str(), info.reason.c_str());
            ++backends.skipped;
            continue;
        }
        std::printf("  %-15s runs every check below\n", info.name.c_str());
        backends.available.push_back(rope::make_backend(info.name));
    }
    return backends;
}

/// One line of a check: passed or not, and what it measured.
struct Verdict {
    bool passed = false;
    std::string detail;
};

/// Runs `measure` (Backend& -> Verdict) on every available backend and records
/// one check: passed on all of them. The line lists each backend's detail.
template <typename Measure>
void expect_everywhere(tutorial::Checks& checks, const Backends& backends, const std::string& what, Measure measure) {
    bool passed = true;
    std::string details;
    for (const auto& backend : backends.available) {
        const Verdict verdict = measure(*backend);
        passed = passed && verdict.passed;
        details += (details.empty() ? "" : "; ") + backend->name() + " " + verdict.detail;
    }
    checks.expect(passed && !backends.available.empty(), what + " [" + details + "]");
}

/// A float64 comparison as a Verdict (a refused call fails, with rope's message).
Verdict against_float64(const Outcome& outcome, const std::vector<double>& q_want, const std::vector<double>& k_want) {
    if (!outcome.error.empty()) return {false, "refused: " + outcome.error};
    const Distance q = distance(outcome.q, q_want), k = distance(outcome.k, k_want);
    const Distance worst = q.rel_l2 >= k.rel_l2 || std::isnan(q.rel_l2) ? q : k;
    return {q.within() && k.within(), worst.text()};
}

std::string join(const std::vector<int64_t>& values, const char* separator = " ") {
    std::string text;
    for (size_t i = 0; i < values.size(); ++i) text += (i ? separator : "") + std::to_string(values[i]);
    return text;
}

// ---------------------------------------------------------------------------
// 1. Packed batches
// ---------------------------------------------------------------------------

/// Position of every token of a pack, the obvious way: walk the sequences.
/// Token t of sequence b (cu_seqlens[b] <= t < cu_seqlens[b+1]) is at
/// t - cu_seqlens[b] + starts[b] (starts empty: every sequence starts at 0).
std::vector<int64_t> packed_positions(const std::vector<int64_t>& cu_seqlens, const std::vector<int64_t>& starts) {
    std::vector<int64_t> positions;
    for (size_t b = 0; b + 1 < cu_seqlens.size(); ++b)
        for (int64_t t = cu_seqlens[b]; t < cu_seqlens[b + 1]; ++t)
            positions.push_back(t - cu_seqlens[b] + (starts.empty() ? 0 : starts[b]));
    return positions;
}

/// What a grid of one block per token does instead: token t finds its sequence
/// by binary search, the last b with cu_seqlens[b] <= t (empty sequences are
/// skipped by construction). The caller guards t < cu_seqlens.back().
int64_t sequence_of(const std::vector<int64_t>& cu_seqlens, int64_t t) {
    return int64_t(std::upper_bound(cu_seqlens.begin(), cu_seqlens.end() - 1, t) - cu_seqlens.begin()) - 1;
}

/// float64 rotation of a pack whose token t is at positions[t] (one axis, plain theta_i).
std::vector<double> rotate_at_positions(const std::vector<float>& x, int64_t heads, const rope::RopeConfig& config,
                                        const std::vector<int64_t>& positions) {
    const int64_t d = config.effective_rotary_dim();
    return rotate_float64(x, heads, config.head_dim, d, config.style, [&](int64_t t, int64_t i) {
        return turn(double(positions[size_t(t)]) * theta(config.base, i, d));
    });
}

/// The issue's packed batch: lengths from 1 to 8192 totalling 32768 tokens.
/// Every power of two from 8192 down to 1 twice (32766 tokens), and two more
/// one-token sequences: 30 sequences.
std::vector<int64_t> issue_batch_lengths() {
    std::vector<int64_t> lengths;
    for (int64_t length = 8192; length >= 1; length /= 2) lengths.insert(lengths.end(), {length, length});
    lengths.insert(lengths.end(), {1, 1});
    return lengths;
}

std::vector<int64_t> cumulative(const std::vector<int64_t>& lengths) {
    std::vector<int64_t> cu{0};
    for (int64_t length : lengths) cu.push_back(cu.back() + length);
    return cu;
}

/// Token rows [first, last) of x, whose tokens are `row` floats each.
std::vector<float> token_rows(const std::vector<float>& x, int64_t first, int64_t last, int64_t row) {
    return {x.begin() + first * row, x.begin() + last * row};
}

/// Whether a packed call rotates every sequence exactly as a call of that
/// sequence alone, from its start, does: bit for bit (the same position gives
/// the same float32 angle, whatever else is in the tensor).
Verdict packed_equals_alone(rope::Backend& backend, const rope::RopeConfig& config, const Tensors& pack,
                            const std::vector<int64_t>& cu_seqlens, const std::vector<int64_t>& starts) {
    const Outcome together = run(backend, config, pack, {.cu_seqlens = cu_seqlens, .starts = starts});
    const int64_t q_row = pack.q_heads * pack.head_dim, k_row = pack.k_heads * pack.head_dim;
    bool same = together.error.empty();
    for (size_t b = 0; b + 1 < cu_seqlens.size(); ++b) {
        const int64_t first = cu_seqlens[b], last = cu_seqlens[b + 1];
        const Tensors alone{1,
                            last - first,
                            pack.q_heads,
                            pack.k_heads,
                            pack.head_dim,
                            false,
                            token_rows(pack.q, first, last, q_row),
                            token_rows(pack.k, first, last, k_row)};
        const Outcome single = run(backend, config, alone, {.offset = starts.empty() ? 0 : starts[b]});
        same = same && identical(single.q, token_rows(together.q, first, last, q_row)) &&
               identical(single.k, token_rows(together.k, first, last, k_row));
    }
    return {same, same ? "identical" : "DIFFERS"};
}

/// THE BUG (a stand-in): a kernel that rotates key heads two at a time, for
/// h < 2 * (heads / 2). With an even head count it is right; with one key head
/// it writes nothing, and k_out keeps what it held (NaN here, stale memory in
/// a real run). One fused kernel shipped NaN for exactly that case: a packed
/// call with a single key head, while the multi-head query was fine.
std::vector<float> two_heads_at_a_time(std::vector<float> k_out, int64_t heads, int64_t head_dim) {
    const int64_t written = 2 * (heads / 2);
    for (size_t e = 0; e < k_out.size(); ++e)
        if (int64_t(e) / head_dim % heads >= written) k_out[e] = kPoison;  // Never written.
    return k_out;
}

// ---------------------------------------------------------------------------
// 2. Context-parallel shards
// ---------------------------------------------------------------------------

/// Global index of local token j on rank r of a group of n, for a sequence
/// of local length L on this rank (two chunks of L/2): chunk r, then chunk 2n-1-r.
int64_t global_index(int64_t j, int64_t L, int64_t r, int64_t n) {
    const int64_t half = L / 2;
    return j < half ? r * half + j : (2 * n - 1 - r) * half + (j - half);
}

/// For rank r of n: which token of the unsharded pack each of its local tokens is.
/// `lengths` are the global (unsharded) lengths of the sequences, each a multiple of 2n.
std::vector<int64_t> shard_tokens(const std::vector<int64_t>& lengths, int64_t r, int64_t n) {
    std::vector<int64_t> tokens;
    int64_t first = 0;
    for (int64_t length : lengths) {
        const int64_t local = length / n;
        for (int64_t j = 0; j < local; ++j) tokens.push_back(first + global_index(j, local, r, n));
        first += length;
    }
    return tokens;
}

/// The rows of x ([tokens, heads, head_dim]) at `tokens`, in that order.
std::vector<float> gather(const std::vector<float>& x, const std::vector<int64_t>& tokens, int64_t row) {
    std::vector<float> out;
    for (int64_t t : tokens) out.insert(out.end(), x.begin() + t * row, x.begin() + (t + 1) * row);
    return out;
}

/// Writes the rows of `shard` back to their places `tokens` in `full`.
void scatter(const std::vector<float>& shard, const std::vector<int64_t>& tokens, int64_t row,
             std::vector<float>& full) {
    for (size_t j = 0; j < tokens.size(); ++j)
        std::copy(shard.begin() + int64_t(j) * row, shard.begin() + int64_t(j + 1) * row,
                  full.begin() + tokens[j] * row);
}

/// Causal attention work of a rank: each query attends to every key up to
/// its own global index g, so it costs g + 1.
int64_t causal_work(const std::vector<int64_t>& global_indices) {
    int64_t work = 0;
    for (int64_t g : global_indices) work += g + 1;
    return work;
}

/// Rotates every rank's shard of `full` (cut by the two-chunk split) and puts
/// the rotated rows back in place: the union of the ranks. `shard_positions`
/// gives rank r's PositionArrays (with or without .sharded: see the bug).
template <typename ShardPositions>
std::vector<float> union_of_ranks(rope::Backend& backend, const rope::RopeConfig& config, const Tensors& full,
                                  const std::vector<int64_t>& lengths, int64_t n, ShardPositions shard_positions,
                                  std::vector<float>& k_union) {
    const int64_t q_row = full.q_heads * full.head_dim, k_row = full.k_heads * full.head_dim;
    std::vector<float> q_union(full.q.size(), kPoison);
    k_union.assign(full.k.size(), kPoison);
    for (int64_t r = 0; r < n; ++r) {
        const std::vector<int64_t> tokens = shard_tokens(lengths, r, n);
        Tensors shard = full;
        if (!full.packed)
            shard.seq = full.seq / n;  // Padded: every sequence has seq / n tokens here.
        else
            shard.seq = int64_t(tokens.size());
        shard.q = gather(full.q, tokens, q_row);
        shard.k = gather(full.k, tokens, k_row);
        const Outcome outcome = run(backend, config, shard, shard_positions(r));
        scatter(outcome.q, tokens, q_row, q_union);
        scatter(outcome.k, tokens, k_row, k_union);
    }
    return q_union;
}

// ---------------------------------------------------------------------------
// 3. M-RoPE
// ---------------------------------------------------------------------------

/// A piece of a multimodal prompt: `text` text tokens, or a picture of
/// frames x rows x cols tokens (an image has one frame; one token per 2x2
/// merged patch, as the language model sees it).
struct Piece {
    int64_t text = 0, frames = 0, rows = 0, cols = 0;
};

/// The three position rows (temporal, height, width) of one sequence, as
/// HuggingFace's Qwen2-VL get_rope_index builds them: text continues at
/// (largest id so far) + 1 on all three rows; a picture starts at that same
/// next id s, and its token (f, r, c) gets (s + f, s + r, s + c). Returns
/// [3, tokens] row-major; `kind` gets 0 for text, 1 for image, 2 for video.
std::vector<int64_t> mrope_ids(const std::vector<Piece>& pieces, std::vector<int>& kind) {
    std::vector<int64_t> t, h, w;
    int64_t next = 0;  // Largest id so far + 1.
    for (const Piece& piece : pieces) {
        const int64_t start = next;
        for (int64_t s = 0; s < piece.text; ++s) {
            t.push_back(start + s);
            h.push_back(start + s);
            w.push_back(start + s);
            kind.push_back(0);
            next = start + s + 1;
        }
        for (int64_t f = 0; f < piece.frames; ++f)
            for (int64_t r = 0; r < piece.rows; ++r)
                for (int64_t c = 0; c < piece.cols; ++c) {
                    t.push_back(start + f);
                    h.push_back(start + r);
                    w.push_back(start + c);
                    kind.push_back(piece.frames > 1 ? 2 : 1);
                    next = std::max({next, start + f + 1, start + r + 1, start + c + 1});
                }
    }
    std::vector<int64_t> ids = t;
    ids.insert(ids.end(), h.begin(), h.end());
    ids.insert(ids.end(), w.begin(), w.end());
    return ids;
}

/// Which position row turns pair i (0 temporal, 1 height, 2 width), as HF's
/// functions pick it. Contiguous (apply_multimodal_rotary_pos_emb): the first
/// sections[0] pairs, the next sections[1], the last sections[2].
/// Interleaved (apply_interleaved_mrope): height takes pairs 1, 4, 7, ... below
/// 3*sections[1], width 2, 5, 8, ... below 3*sections[2], the rest stay temporal.
int64_t mrope_axis(bool interleaved, const std::vector<int64_t>& sections, int64_t i) {
    if (interleaved) {
        if (i % 3 == 1 && i < 3 * sections[1]) return 1;
        if (i % 3 == 2 && i < 3 * sections[2]) return 2;
        return 0;
    }
    if (i < sections[0]) return 0;
    if (i < sections[0] + sections[1]) return 1;
    return 2;
}

/// float64 M-RoPE: pair i of token t turns by ids[axis(i)][t] * theta_i, with
/// theta_i over the whole rotary_dim (the global pair index).
std::vector<double> mrope_float64(const std::vector<float>& x, int64_t heads, const rope::RopeConfig& config,
                                  const std::vector<int64_t>& ids) {
    const int64_t d = config.effective_rotary_dim(), tokens = int64_t(ids.size()) / 3;
    const bool interleaved = config.multi_axis.assignment == rope::AxisAssignment::mrope_interleaved;
    return rotate_float64(x, heads, config.head_dim, d, config.style, [&](int64_t t, int64_t i) {
        const int64_t axis = mrope_axis(interleaved, config.multi_axis.sections, i);
        return turn(double(ids[size_t(axis * tokens + t)]) * theta(config.base, i, d));
    });
}

rope::RopeConfig multi_axis_config(int64_t head_dim, int64_t rotary_dim, double base, rope::Style style,
                                   rope::AxisAssignment assignment, std::vector<int64_t> sections) {
    rope::RopeConfig config;
    config.head_dim = head_dim;
    config.rotary_dim = rotary_dim;
    config.base = base;
    config.style = style;
    config.multi_axis = {assignment, std::move(sections)};
    return config;
}

// ---------------------------------------------------------------------------
// 4. Axial RoPE
// ---------------------------------------------------------------------------

/// float64 axial RoPE: the pairs run in contiguous blocks of sections[a] per
/// axis a; the j-th pair of axis a turns by coordinate[a] * base^(-j / sections[a]),
/// the frequency index j restarting on each axis (each axis is a RoPE of its
/// own over 2 * sections[a] features). ids: [axes, tokens].
std::vector<double> axial_float64(const std::vector<float>& x, int64_t heads, const rope::RopeConfig& config,
                                  const std::vector<int64_t>& ids) {
    const std::vector<int64_t>& sections = config.multi_axis.sections;
    const int64_t tokens = int64_t(ids.size()) / int64_t(sections.size());
    return rotate_float64(x, heads, config.head_dim, config.effective_rotary_dim(), config.style,
                          [&](int64_t t, int64_t i) {
                              int64_t axis = 0, j = i;
                              while (j >= sections[size_t(axis)]) j -= sections[size_t(axis++)];
                              const double frequency = theta(config.base, j, 2 * sections[size_t(axis)]);
                              return turn(double(ids[size_t(axis * tokens + t)]) * frequency);
                          });
}

/// The patch coordinates (row, column) of one image of rows x cols patches in
/// the order Qwen2-VL's vision tower stores them (rot_pos_emb): by 2x2 merge
/// windows, window after window, each window's four patches row by row.
/// Returns [2, tokens]: the row ids, then the column ids ([H, W] order).
std::vector<int64_t> vision_patch_ids(int64_t rows, int64_t cols) {
    std::vector<int64_t> h, w;
    for (int64_t window_row = 0; window_row < rows / 2; ++window_row)
        for (int64_t window_col = 0; window_col < cols / 2; ++window_col)
            for (int64_t r = 0; r < 2; ++r)
                for (int64_t c = 0; c < 2; ++c) {
                    h.push_back(2 * window_row + r);
                    w.push_back(2 * window_col + c);
                }
    h.insert(h.end(), w.begin(), w.end());
    return h;
}

// ---------------------------------------------------------------------------
// 5. Caller-supplied cos/sin tables
// ---------------------------------------------------------------------------

/// A table in the serving engines' format: row p = cos of the pairs' angles
/// at position p, then their sines; [rows, 2 * pairs], float32. angle(p, i)
/// gives the angles, computed in double and rounded once.
template <typename Angle>
std::vector<float> cos_sin_table(int64_t rows, int64_t pairs, Angle angle) {
    std::vector<float> table(size_t(rows * 2 * pairs));
    for (int64_t p = 0; p < rows; ++p)
        for (int64_t i = 0; i < pairs; ++i) {
            const double a = angle(p, i);
            table[size_t(p * 2 * pairs + i)] = float(std::cos(a));
            table[size_t(p * 2 * pairs + pairs + i)] = float(std::sin(a));
        }
    return table;
}

/// float64 rotation with the cos and sin a table holds for each token's id.
std::vector<double> table_float64(const std::vector<float>& x, int64_t heads, const rope::RopeConfig& config,
                                  const std::vector<float>& table, const std::vector<int64_t>& ids) {
    const int64_t pairs = config.effective_rotary_dim() / 2;
    return rotate_float64(x, heads, config.head_dim, 2 * pairs, config.style, [&](int64_t t, int64_t i) {
        const float* row = table.data() + ids[size_t(t)] * 2 * pairs;
        return CosSin{double(row[i]), double(row[pairs + i])};
    });
}

}  // namespace

int main(int argc, char** argv) {
    tutorial::print_title(8, "Packed batches, images and video",
                          "a token's position is bookkeeping (an offset in a pack, a chunk of a shard, three ids, "
                          "a patch's coordinates, a table row); each form has shipped a silent bug, and each bug "
                          "has a check that catches it");
    tutorial::Checks checks;
    tutorial::Csv csv(tutorial::csv_path(argc, argv, "tutorial-08-packed-images-video"));
    int bugs_caught = 0, bugs_shown = 0;
    // Records that a check catches a reproduced bug.
    auto caught = [&](bool catches, const std::string& what) {
        ++bugs_shown;
        if (catches) ++bugs_caught;
        checks.expect(catches, what);
    };

    tutorial::print_section("Backends");
    const Backends backends = every_backend();
    auto naive = rope::make_backend("cpu-naive");  // Where the bugs are reproduced.

    // -----------------------------------------------------------------------
    tutorial::print_section("1. Packed batches: cu_seqlens and starts");
    rope::RopeConfig plain;
    plain.head_dim = 64;
    {
        // Four sequences of 3, 5, 1 and 7 tokens. Sequence 1 continues 10 cached
        // tokens and sequence 3 four (chunked prefill), so they start there.
        const std::vector<int64_t> cu{0, 3, 8, 9, 16}, starts{0, 10, 0, 4};
        const std::vector<int64_t> positions = packed_positions(cu, starts);
        std::printf("cu_seqlens [%s], starts [%s]\n", join(cu, ", ").c_str(), join(starts, ", ").c_str());
        std::printf("token t of sequence b is at t - cu_seqlens[b] + starts[b]:\n  positions ");
        for (size_t b = 0; b + 1 < cu.size(); ++b)
            std::printf("%s%s", b ? " | " : "",
                        join({positions.begin() + cu[b], positions.begin() + cu[b + 1]}).c_str());
        std::printf("\n");

        // q [16 tokens, 4 heads, 64] and k with ONE head: the case that shipped NaN.
        const Tensors pack = random_tensors(1, 16, 4, 1, 64, true, 801);
        PositionArrays packed{.cu_seqlens = cu, .starts = starts};
        const std::vector<double> q_want = rotate_at_positions(pack.q, 4, plain, positions);
        const std::vector<double> k_want = rotate_at_positions(pack.k, 1, plain, positions);
        expect_everywhere(
            checks, backends, "packed thd call, q 4 heads, k 1 head: matches float64",
            [&](rope::Backend& backend) { return against_float64(run(backend, plain, pack, packed), q_want, k_want); });
        // Packing changes nothing: each sequence alone, at its start, rotates the same.
        expect_everywhere(
            checks, backends, "packed call = each sequence rotated alone from its start, bit for bit",
            [&](rope::Backend& backend) { return packed_equals_alone(backend, plain, pack, cu, starts); });

        // The one-head bug, reproduced on cpu-naive's correct output.
        std::printf("THE BUG, a stand-in for the one-head NaN: key heads rotated two at a time (h < 2*(heads/2)).\n");
        const Tensors eight = random_tensors(1, 16, 8, 8, 64, true, 802);
        const Outcome right8 = run(*naive, plain, eight, packed), right1 = run(*naive, plain, pack, packed);
        const Distance with8 =
            distance(two_heads_at_a_time(right8.k, 8, 64), rotate_at_positions(eight.k, 8, plain, positions));
        const Distance with1 = distance(two_heads_at_a_time(right1.k, 1, 64), k_want);
        std::printf("  test with 8 key heads: %s (%s)\n  test with 1 key head:  %s (%s)\n",
                    with8.within() ? "passes" : "FAILS", with8.text().c_str(), with1.within() ? "passes" : "FAILS",
                    with1.text().c_str());
        caught(with8.within() && !with1.within(),
               "the bug passes a test with 8 key heads; a test with 1 key head and NaN-poisoned outputs catches it");
    }
    const std::vector<int64_t> issue_lengths = issue_batch_lengths();
    const std::vector<int64_t> issue_cu = cumulative(issue_lengths);
    const int64_t total_tokens = issue_cu.back(), sequences = int64_t(issue_lengths.size());
    const int64_t longest = *std::max_element(issue_lengths.begin(), issue_lengths.end());
    const int64_t longest_grid = sequences * longest;
    {
        std::printf(
            "\nThe issue's batch: %ld sequences, every power of two from 8192 down to 1 twice, plus two of 1:\n"
            "%ld tokens. One block per token:\n",
            long(sequences), long(total_tokens));
        std::printf("  grid sized by batch x longest: %ld x %ld = %ld blocks, %ld useful (%.1f%%), %ld idle\n",
                    long(sequences), long(longest), long(longest_grid), long(total_tokens),
                    100.0 * double(total_tokens) / double(longest_grid), long(longest_grid - total_tokens));
        std::printf(
            "  grid sized by total tokens:    %ld blocks, all useful; each finds its sequence by binary "
            "search over cu_seqlens\n",
            long(total_tokens));
        // The worst batch of the same size: one 8192-token sequence and 24576 of one token.
        const int64_t worst = (1 + (total_tokens - longest)) * longest;
        std::printf(
            "  at worst (one sequence of 8192, 24576 of 1 token) the longest-sequence grid launches %ld blocks\n"
            "  for the same %ld tokens: %.2f%% idle, the regime of the 157M-block report.\n",
            long(worst), long(total_tokens), 100.0 * (1.0 - double(total_tokens) / double(worst)));
        csv.table(
            "the issue's packed batch: sequence lengths, and the longest (the grid row of a longest-sequence grid)",
            "sequence,length,longest");
        for (int64_t b = 0; b < sequences; ++b) csv.row(b, issue_lengths[size_t(b)], longest);

        // The total-token grid's bookkeeping: the binary search finds every token's sequence.
        bool found = true;
        for (int64_t b = 0; b < sequences; ++b)
            for (int64_t t = issue_cu[size_t(b)]; t < issue_cu[size_t(b) + 1]; ++t)
                found = found && sequence_of(issue_cu, t) == b;
        checks.expect(found, "binary search over cu_seqlens finds the sequence of each of the " +
                                 std::to_string(total_tokens) + " tokens (as a walk over the sequences does)");
        // And the library on that batch: packed = every sequence alone (q 2 heads, k 1, head_dim 64).
        const Tensors batch = random_tensors(1, total_tokens, 2, 1, 64, true, 803);
        expect_everywhere(
            checks, backends, "the issue's batch packed = its 30 sequences rotated alone, bit for bit",
            [&](rope::Backend& backend) { return packed_equals_alone(backend, plain, batch, issue_cu, {}); });
        std::printf(
            "What catches a longest-sequence grid is not a check of values (they are right) but a\n"
            "benchmark: rope-bench's packed batch must run within 3%% of the plain path's %% of copy.\n");
    }

    // -----------------------------------------------------------------------
    tutorial::print_section("2. Context-parallel shards: two chunks per rank");
    {
        const int64_t n = 4;
        std::printf(
            "cp_size %ld: each sequence is cut into %ld chunks; rank r holds chunks r and %ld-r.\n"
            "A sequence of 16 tokens (chunks of 2), local length L = 4:\n",
            long(n), long(2 * n), long(2 * n - 1));
        for (int64_t r = 0; r < n; ++r) {
            std::vector<int64_t> global;
            for (int64_t j = 0; j < 4; ++j) global.push_back(global_index(j, 4, r, n));
            std::printf("  rank %ld: chunks %ld and %ld, global indices %s\n", long(r), long(r), long(2 * n - 1 - r),
                        join(global).c_str());
        }
        // Why two chunks: causal attention's work per query grows with its index.
        const int64_t sequence = 8192, L = sequence / n;
        std::printf("Causal attention work (keys per query, summed) of a %ld-token sequence per rank:\n",
                    long(sequence));
        std::vector<int64_t> balanced, contiguous;
        for (int64_t r = 0; r < n; ++r) {
            std::vector<int64_t> two_chunks, one_block;
            for (int64_t j = 0; j < L; ++j) {
                two_chunks.push_back(global_index(j, L, r, n));
                one_block.push_back(r * L + j);
            }
            balanced.push_back(causal_work(two_chunks));
            contiguous.push_back(causal_work(one_block));
            std::printf("  rank %ld: two chunks %10ld   one contiguous quarter %10ld\n", long(r), long(balanced.back()),
                        long(contiguous.back()));
        }
        const double imbalance = double(contiguous.back()) / double(contiguous.front());
        checks.expect(std::all_of(balanced.begin(), balanced.end(), [&](int64_t w) { return w == balanced[0]; }),
                      "two-chunk split: every rank does exactly the same causal work (chunks r and 2n-1-r "
                      "sum to the same; contiguous quarters: last rank " +
                          tutorial::fixed(imbalance, 1) + "x the first)");

        // Padded: batch 2, 32 tokens per sequence, offset 5 (a cached prefix); 8 local tokens per rank.
        const rope::RopeConfig& config = plain;  // head_dim 64, base 10000, half-split.
        const Tensors full = random_tensors(2, 32, 4, 2, 64, false, 804);
        const std::vector<int64_t> padded_lengths{32, 32};
        std::vector<int64_t> padded_positions;
        for (int64_t b = 0; b < 2; ++b)
            for (int64_t g = 0; g < 32; ++g) padded_positions.push_back(5 + g);
        const std::vector<double> q_want = rotate_at_positions(full.q, 4, config, padded_positions);
        const std::vector<double> k_want = rotate_at_positions(full.k, 2, config, padded_positions);
        auto sharded = [&](int64_t r) { return PositionArrays{.offset = 5, .cp_size = n, .cp_rank = r}; };
        expect_everywhere(checks, backends,
                          "padded bshd [2, 32], offset 5, cp_size 4: union of the 4 ranks' rotations = the "
                          "unsharded rotation bit for bit, which matches float64",
                          [&](rope::Backend& backend) {
                              const Outcome whole = run(backend, config, full, {.offset = 5});
                              std::vector<float> k_union;
                              const std::vector<float> q_union =
                                  union_of_ranks(backend, config, full, padded_lengths, n, sharded, k_union);
                              Verdict verdict = against_float64(whole, q_want, k_want);
                              const bool same = identical(q_union, whole.q) && identical(k_union, whole.k);
                              return Verdict{verdict.passed && same,
                                             (same ? "union identical, " : "union DIFFERS, ") + verdict.detail};
                          });

        // Packed: three sequences of 16, 32 and 8 tokens (multiples of 2 * cp_size), starts 0, 100, 7.
        // TransformerEngine passes the global cu_seqlens and divides them by cp_size; rope takes this
        // rank's own, which is the same thing.
        const std::vector<int64_t> lengths{16, 32, 8}, starts{0, 100, 7};
        const std::vector<int64_t> global_cu = cumulative(lengths);
        std::vector<int64_t> local_cu;
        for (int64_t c : global_cu) local_cu.push_back(c / n);
        std::printf("Packed: global cu_seqlens [%s] / cp_size = this rank's [%s], starts [%s]\n",
                    join(global_cu, ", ").c_str(), join(local_cu, ", ").c_str(), join(starts, ", ").c_str());
        const Tensors pack = random_tensors(1, global_cu.back(), 4, 1, 64, true, 805);
        const std::vector<int64_t> pack_positions = packed_positions(global_cu, starts);
        auto packed_shard = [&](int64_t r) {
            return PositionArrays{.cu_seqlens = local_cu, .starts = starts, .cp_size = n, .cp_rank = r};
        };
        expect_everywhere(
            checks, backends,
            "packed thd, 3 sequences, cp_size 4: union of the ranks = the unsharded packed rotation "
            "bit for bit, which matches float64",
            [&](rope::Backend& backend) {
                const Outcome whole = run(backend, config, pack, {.cu_seqlens = global_cu, .starts = starts});
                std::vector<float> k_union;
                const std::vector<float> q_union =
                    union_of_ranks(backend, config, pack, lengths, n, packed_shard, k_union);
                Verdict verdict = against_float64(whole, rotate_at_positions(pack.q, 4, config, pack_positions),
                                                  rotate_at_positions(pack.k, 1, config, pack_positions));
                const bool same = identical(q_union, whole.q) && identical(k_union, whole.k);
                return Verdict{verdict.passed && same,
                               (same ? "union identical, " : "union DIFFERS, ") + verdict.detail};
            });
        // Handing rope the global cu_seqlens on a rank is refused: their last entry is not this rank's token count.
        Tensors rank0 = pack;
        rank0.seq = local_cu.back();
        rank0.q.resize(size_t(rank0.seq * 4 * 64));
        rank0.k.resize(size_t(rank0.seq * 64));
        const Outcome global = run(*naive, config, rank0, {.cu_seqlens = global_cu, .starts = starts, .cp_size = n});
        std::printf("Global cu_seqlens on rank 0 -> %s\n", global.error.c_str());
        checks.expect(!global.error.empty() && untouched(global.q),
                      "TransformerEngine's global cu_seqlens passed unconverted: a rope::Error, nothing written");

        // THE BUG: each rank rotates its shard at local positions 0..L-1, forgetting the shard's place.
        std::vector<int64_t> right, wrong;
        for (int64_t j = 0; j < 8; ++j) {
            right.push_back(5 + global_index(j, 8, 0, n));
            wrong.push_back(5 + j);
        }
        std::printf(
            "THE BUG: ranks rotate at local positions. Rank 0 of the padded batch must use %s,\n"
            "         the bug uses %s.\n",
            join(right).c_str(), join(wrong).c_str());
        const Outcome whole = run(*naive, config, full, {.offset = 5});
        std::vector<float> k_union;
        const std::vector<float> q_union = union_of_ranks(
            *naive, config, full, padded_lengths, n, [&](int64_t) { return PositionArrays{.offset = 5}; }, k_union);
        const Distance off = distance(q_union, q_want);
        std::printf("  union vs unsharded: %s; vs float64: %s\n", identical(q_union, whole.q) ? "identical" : "DIFFERS",
                    off.text().c_str());
        caught(!identical(q_union, whole.q) && !off.within(),
               "the union-equals-unsharded check catches ranks rotating at local positions");
    }

    // -----------------------------------------------------------------------
    tutorial::print_section("3. Images and video in a language model: M-RoPE");
    std::vector<int> kind;
    // 4 text tokens, an image of 3 x 4 merged patches, 2 text tokens, a video of
    // 2 frames of 2 x 3, and 3 text tokens: 33 tokens.
    const std::vector<int64_t> ids =
        mrope_ids({{4, 0, 0, 0}, {0, 1, 3, 4}, {2, 0, 0, 0}, {0, 2, 2, 3}, {3, 0, 0, 0}}, kind);
    const int64_t tokens = int64_t(kind.size());
    {
        auto row = [&](int64_t axis) {
            return std::vector<int64_t>(ids.begin() + axis * tokens, ids.begin() + (axis + 1) * tokens);
        };
        std::printf(
            "text(4) image(1x3x4) text(2) video(2x2x3) text(3): %ld tokens, ids as get_rope_index makes them:\n",
            long(tokens));
        std::printf("  kind      ");
        for (int k : kind) std::printf(" %2s", k == 0 ? "T" : k == 1 ? "I" : "V");
        const char* names[] = {"temporal", "height", "width"};
        for (int64_t axis = 0; axis < 3; ++axis) {
            std::printf("\n  %-9s ", names[axis]);
            for (int64_t id : row(axis)) std::printf(" %2ld", long(id));
        }
        const int64_t largest = *std::max_element(ids.begin(), ids.end());
        std::printf(
            "\nThe last id is %ld for %ld tokens: the next generated token is at %ld = %ld + rope_delta (%ld),\n"
            "on all three rows, and so on: decoding is plain RoPE with an offset.\n",
            long(largest), long(tokens), long(largest + 1), long(tokens), long(largest + 1 - tokens));
        csv.table("M-RoPE ids of text(4) image(1x3x4) text(2) video(2x2x3) text(3); kind 0 text, 1 image, 2 video",
                  "token,temporal,height,width,kind");
        for (int64_t t = 0; t < tokens; ++t)
            csv.row(t, ids[size_t(t)], ids[size_t(tokens + t)], ids[size_t(2 * tokens + t)], kind[size_t(t)]);
    }
    // Three models' M-RoPE: Qwen2-VL (contiguous [16, 24, 24], half-split pairs, base 1e6),
    // Qwen3-VL (interleaved [24, 20, 20], half-split, base 5e6) and GLM-4.1V (contiguous
    // [8, 12, 12] over rotary_dim 64 of head_dim 128, interleaved pairs, base 10000).
    const rope::RopeConfig qwen2vl =
        multi_axis_config(128, 0, 1e6, rope::Style::half_split, rope::AxisAssignment::mrope_contiguous, {16, 24, 24});
    const rope::RopeConfig qwen3vl =
        multi_axis_config(128, 0, 5e6, rope::Style::half_split, rope::AxisAssignment::mrope_interleaved, {24, 20, 20});
    const rope::RopeConfig glm4v = multi_axis_config(128, 64, 10000.0, rope::Style::interleaved,
                                                     rope::AxisAssignment::mrope_contiguous, {8, 12, 12});
    const Tensors prompt = random_tensors(1, tokens, 4, 2, 128, false, 806);
    std::vector<int64_t> text_ids;  // The text-only test: three equal rows 0..tokens-1.
    for (int64_t axis = 0; axis < 3; ++axis)
        for (int64_t t = 0; t < tokens; ++t) text_ids.push_back(t);
    // Plain RoPE with the same head_dim, rotary_dim, base and pairing.
    auto plain_of = [](rope::RopeConfig config) {
        config.multi_axis = {};
        return config;
    };
    // The text-only check: with three equal rows, M-RoPE must be plain RoPE, bit for bit.
    auto text_check = [&](rope::Backend& backend, const rope::RopeConfig& config, const rope::RopeConfig& model) {
        const Outcome mrope = run(backend, config, prompt, {.ids = text_ids, .axes = 3});
        const Outcome reference = run(backend, plain_of(model), prompt, {});
        return identical(mrope.q, reference.q) && identical(mrope.k, reference.k);
    };
    // The image check: the mixed prompt against float64 with the model's own rule.
    auto image_check = [&](rope::Backend& backend, const rope::RopeConfig& config, const rope::RopeConfig& model,
                           const std::vector<int64_t>& call_ids) {
        return distance(run(backend, config, prompt, {.ids = call_ids, .axes = 3}).q,
                        mrope_float64(prompt.q, 4, model, ids));
    };
    {
        struct Model {
            const char* name;
            const rope::RopeConfig& config;
        };
        for (const Model& model :
             {Model{"Qwen2-VL, contiguous [16,24,24], half-split", qwen2vl},
              Model{"Qwen3-VL, interleaved [24,20,20], half-split", qwen3vl},
              Model{"GLM-4.1V, contiguous [8,12,12] of rotary_dim 64, interleaved pairs", glm4v}}) {
            expect_everywhere(checks, backends,
                              std::string(model.name) +
                                  ": text-only = plain RoPE bit for bit; "
                                  "the mixed prompt matches float64",
                              [&](rope::Backend& backend) {
                                  const bool text = text_check(backend, model.config, model.config);
                                  const Outcome mixed = run(backend, model.config, prompt, {.ids = ids, .axes = 3});
                                  Verdict verdict =
                                      against_float64(mixed, mrope_float64(prompt.q, 4, model.config, ids),
                                                      mrope_float64(prompt.k, 2, model.config, ids));
                                  return Verdict{text && verdict.passed,
                                                 (text ? "text identical, " : "text DIFFERS, ") + verdict.detail};
                              });
        }
        // Contiguous against interleaved sections, same frequencies: only the assignment differs.
        rope::RopeConfig contiguous = qwen3vl;
        contiguous.multi_axis.assignment = rope::AxisAssignment::mrope_contiguous;
        const Outcome a = run(*naive, contiguous, prompt, {.ids = ids, .axes = 3});
        const Outcome b = run(*naive, qwen3vl, prompt, {.ids = ids, .axes = 3});
        bool text_same = true;
        double vision_gap = 0;
        const int64_t row = 4 * 128;
        for (int64_t t = 0; t < tokens; ++t) {
            const std::vector<float> x = token_rows(a.q, t, t + 1, row), y = token_rows(b.q, t, t + 1, row);
            if (kind[size_t(t)] == 0)
                text_same = text_same && identical(x, y);
            else
                vision_gap = std::max(vision_gap, tutorial::max_abs_difference(x, y));
        }
        std::printf(
            "Sections [24,20,20] contiguous vs interleaved: text tokens %s, image/video tokens differ by up to %.2f\n",
            text_same ? "identical" : "DIFFER", vision_gap);
        checks.expect(text_same && vision_gap > 0.1,
                      "contiguous and interleaved sections agree on text (three equal ids: the axis does not matter) "
                      "and differ on images");
    }
    {
        std::printf("Three bugs that shipped, each run on cpu-naive:\n");
        std::vector<int64_t> row0_ids(ids.begin(), ids.begin() + tokens);  // THE BUG: row 0 three times.
        for (int copy = 0; copy < 2; ++copy) row0_ids.insert(row0_ids.end(), ids.begin(), ids.begin() + tokens);
        rope::RopeConfig half_split_glm = glm4v;  // THE BUG: half-split pairs hard-coded.
        half_split_glm.style = rope::Style::half_split;
        rope::RopeConfig contiguous_qwen3 = qwen3vl;  // THE BUG: Qwen3-VL's sections taken as contiguous.
        contiguous_qwen3.multi_axis.assignment = rope::AxisAssignment::mrope_contiguous;
        struct Bug {
            const char* name;
            const rope::RopeConfig& run_as;
            const rope::RopeConfig& model;
            const std::vector<int64_t>& call_ids;
            bool text_test_sees_it;
        };
        const std::vector<Bug> bugs{
            {"reads only row 0 of the ids (Qwen2-VL)", qwen2vl, qwen2vl, row0_ids, false},
            {"half-split pairs hard-coded (GLM-4.1V)", half_split_glm, glm4v, ids, true},
            {"interleaved sections run as contiguous (Qwen3-VL)", contiguous_qwen3, qwen3vl, ids, false}};
        std::vector<bool> text_passes;
        std::vector<Distance> images;
        std::printf("  %-52s %-16s %s\n", "bug", "text-only test", "image test (vs float64)");
        for (const Bug& bug : bugs) {
            text_passes.push_back(text_check(*naive, bug.run_as, bug.model));
            images.push_back(image_check(*naive, bug.run_as, bug.model, bug.call_ids));
            std::printf("  %-52s %-16s %s (%s)\n", bug.name, text_passes.back() ? "passes" : "FAILS",
                        images.back().within() ? "passes" : "FAILS", images.back().text().c_str());
        }
        for (size_t b = 0; b < bugs.size(); ++b)
            caught(!images[b].within() && text_passes[b] != bugs[b].text_test_sees_it,
                   std::string(bugs[b].name) + ": caught by the image test" +
                       (bugs[b].text_test_sees_it ? " (and by the text-only one)" : ", invisible to a text-only test"));
    }

    // -----------------------------------------------------------------------
    tutorial::print_section("4. Axial RoPE: vision towers and diffusion models");
    {
        // Qwen2-VL's vision tower: head_dim 80, pairs (i, i+40); pairs 0-19 turn with
        // the patch's row, 20-39 with its column, theta_j = 10000^(-j/20) on each.
        rope::RopeConfig vision;
        vision.head_dim = 80;
        vision.multi_axis = {rope::AxisAssignment::axial, {20, 20}};
        const std::vector<int64_t> patch_ids = vision_patch_ids(4, 6);  // An image of 4 x 6 patches.
        const int64_t patches = int64_t(patch_ids.size()) / 2;
        std::printf("Qwen2-VL vision: 4 x 6 patches stored by 2x2 merge windows; (row, col) of the first 8:\n  ");
        for (int64_t t = 0; t < 8; ++t)
            std::printf("(%ld,%ld) ", long(patch_ids[size_t(t)]), long(patch_ids[size_t(patches + t)]));
        std::printf("\n  (a video's frames repeat the same (row, col) ids: the tower has no temporal axis)\n");
        const Tensors image = random_tensors(1, patches, 4, 4, 80, false, 807);
        expect_everywhere(checks, backends, "axial 2-D [20, 20] (Qwen2-VL vision, head_dim 80): matches float64",
                          [&](rope::Backend& backend) {
                              return against_float64(run(backend, vision, image, {.ids = patch_ids, .axes = 2}),
                                                     axial_float64(image.q, 4, vision, patch_ids),
                                                     axial_float64(image.k, 4, vision, patch_ids));
                          });

        // A video diffusion model: axes dims (16, 56, 56) of head_dim 128, i.e. 8, 28 and 28
        // pairs for (frame, row, col), interleaved pairs (2i, 2i+1), base 10000.
        rope::RopeConfig diffusion;
        diffusion.head_dim = 128;
        diffusion.style = rope::Style::interleaved;
        diffusion.multi_axis = {rope::AxisAssignment::axial, {8, 28, 28}};
        std::vector<int64_t> f, r, c;  // A latent of 2 frames x 3 x 4.
        for (int64_t frame = 0; frame < 2; ++frame)
            for (int64_t y = 0; y < 3; ++y)
                for (int64_t x = 0; x < 4; ++x) {
                    f.push_back(frame);
                    r.push_back(y);
                    c.push_back(x);
                }
        std::vector<int64_t> latent_ids = f;
        latent_ids.insert(latent_ids.end(), r.begin(), r.end());
        latent_ids.insert(latent_ids.end(), c.begin(), c.end());
        const Tensors latent = random_tensors(1, 24, 4, 4, 128, false, 808);
        expect_everywhere(checks, backends, "axial 3-D (16,56,56) -> [8, 28, 28], interleaved pairs: matches float64",
                          [&](rope::Backend& backend) {
                              return against_float64(run(backend, diffusion, latent, {.ids = latent_ids, .axes = 3}),
                                                     axial_float64(latent.q, 4, diffusion, latent_ids),
                                                     axial_float64(latent.k, 4, diffusion, latent_ids));
                          });

        std::printf("Three mistakes, each run on cpu-naive against the float64 reference:\n");
        // THE BUG: [W, H] coordinates given to a model that reads [H, W].
        std::vector<int64_t> swapped(patch_ids.begin() + patches, patch_ids.end());
        swapped.insert(swapped.end(), patch_ids.begin(), patch_ids.begin() + patches);
        const Distance swap = distance(run(*naive, vision, image, {.ids = swapped, .axes = 2}).q,
                                       axial_float64(image.q, 4, vision, patch_ids));
        // THE BUG: the frequency index not restarted: theta_i = 10000^(-2i/80) over all 40
        // pairs, as M-RoPE would have it (written here in float64: rope cannot be asked for it).
        const std::vector<double> global_index_bug =
            rotate_float64(image.q, 4, 80, 80, rope::Style::half_split, [&](int64_t t, int64_t i) {
                const int64_t axis = i < 20 ? 0 : 1;
                return turn(double(patch_ids[size_t(axis * patches + t)]) * theta(10000.0, i, 80));
            });
        const double restart = tutorial::relative_l2(global_index_bug, axial_float64(image.q, 4, vision, patch_ids));
        // THE BUG: half-split pairs hard-coded for the diffusion model's interleaved ones.
        rope::RopeConfig half = diffusion;
        half.style = rope::Style::half_split;
        const Distance pairing = distance(run(*naive, half, latent, {.ids = latent_ids, .axes = 3}).q,
                                          axial_float64(latent.q, 4, diffusion, latent_ids));
        std::printf("  row and column swapped ([W, H] for an [H, W] model):   %s\n", swap.text().c_str());
        std::printf("  frequency index not restarted per axis:               rel L2 %s\n",
                    tutorial::sci(restart, 1).c_str());
        std::printf("  half-split pairs on the (16,56,56) interleaved model: %s\n", pairing.text().c_str());
        caught(!swap.within(), "axes swapped: caught by a non-square image against float64");
        caught(restart > kRelTolerance, "frequency index not restarted: caught against float64");
        caught(!pairing.within(), "wrong pairing on the diffusion model: caught against float64");
    }

    // -----------------------------------------------------------------------
    tutorial::print_section("5. Caller-supplied cos/sin tables");
    {
        // head_dim 128, rotary_dim 64 (32 pairs), a table of 64 positions; 24 tokens at scattered ids.
        rope::RopeConfig config;
        config.head_dim = 128;
        config.rotary_dim = 64;
        const int64_t rows = 64, pairs = 32;
        const std::vector<int64_t> token_ids{0, 1,  2,  3,  63, 62, 17, 5,  40, 41, 8,  33,
                                             9, 10, 60, 11, 12, 50, 13, 14, 27, 15, 16, 31};
        const Tensors x = random_tensors(1, 24, 4, 2, 128, false, 809);
        const PositionArrays at_ids{.ids = token_ids};
        const std::vector<float> real =
            cos_sin_table(rows, pairs, [&](int64_t p, int64_t i) { return double(p) * theta(config.base, i, 64); });
        std::mt19937 generator(810);  // Angles no formula would produce.
        std::uniform_real_distribution<double> any_angle(-kPi, kPi);
        std::vector<double> random_angles(size_t(rows * pairs));
        for (double& angle : random_angles) angle = any_angle(generator);
        const std::vector<float> random =
            cos_sin_table(rows, pairs, [&](int64_t p, int64_t i) { return random_angles[size_t(p * pairs + i)]; });
        std::printf("table [%ld rows, 64]: row p = cos of the 32 pairs' angles at p, then their sines (float32)\n",
                    long(rows));
        struct Table {
            const char* name;
            const std::vector<float>& values;
        };
        for (const Table& table : {Table{"real angles p * theta_i", real}, Table{"random angles", random}})
            expect_everywhere(checks, backends,
                              std::string("table of ") + table.name + ": matches float64 with the table's cos/sin",
                              [&](rope::Backend& backend) {
                                  return against_float64(run(backend, config, x, at_ids, table.values),
                                                         table_float64(x.q, 4, config, table.values, token_ids),
                                                         table_float64(x.k, 2, config, table.values, token_ids));
                              });

        std::printf("Bugs, on cpu-naive:\n");
        // THE BUG: a kernel that ignores the table and computes cos/sin from theta_i itself.
        const std::vector<float> ignored = run(*naive, config, x, at_ids).q;
        const Distance real_test = distance(ignored, table_float64(x.q, 4, config, real, token_ids));
        const Distance random_test = distance(ignored, table_float64(x.q, 4, config, random, token_ids));
        std::printf("  table ignored:  test with real angles %s (%s), with random angles %s (%s)\n",
                    real_test.within() ? "passes" : "FAILS", real_test.text().c_str(),
                    random_test.within() ? "passes" : "FAILS", random_test.text().c_str());
        caught(real_test.within() && !random_test.within(),
               "a kernel ignoring the table passes a real-angle test; the random-angle test catches it");
        // THE BUG: the table stored in fp16, as some engines did.
        std::vector<float> fp16_table = random;
        for (float& value : fp16_table) value = rope::to_float(rope::to_float16(value));
        const Distance fp16 =
            distance(run(*naive, config, x, at_ids, fp16_table).q, table_float64(x.q, 4, config, random, token_ids));
        std::printf("  fp16 table:     %s\n", fp16.text().c_str());
        caught(!fp16.within(), "an fp16 table: caught against float64 (10 bits of cos and sin)");
        std::vector<uint16_t> fp16_bits(random.size());
        for (size_t e = 0; e < random.size(); ++e) fp16_bits[e] = rope::to_float16(random[e]).bits;
        std::vector<float> q = x.q, no_k;
        auto q_view = rope::TensorView::contiguous(q.data(), rope::DType::f32, rope::Device::host, rope::Layout::bshd,
                                                   {1, 24, 4, 128});
        auto k_view = rope::TensorView::contiguous(nullptr, rope::DType::f32, rope::Device::host, rope::Layout::bshd,
                                                   {1, 24, 0, 128});
        rope::RopeArgs fp16_args =
            rope::RopeArgs::in_place(q_view, k_view, rope::Positions::shared(token_ids.data(), 24));
        fp16_args.cos_sin_cache = {fp16_bits.data(), rope::DType::f16, rope::Device::host, rows, 64, 64};
        std::string refusal;
        try {
            rope::apply(*naive, config, fp16_args);
        } catch (const rope::Error& error) {
            refusal = error.what();
        }
        std::printf("  rope given an fp16 table -> %s\n", refusal.c_str());
        checks.expect(!refusal.empty() && identical(q, x.q), "rope refuses an fp16 table, naming cos_sin_cache.dtype");

        // Out of range: id 64 in a table of 64 rows.
        std::vector<int64_t> beyond = token_ids;
        beyond[4] = rows;
        const PositionArrays past_end{.ids = beyond};
        const Outcome refused = run(*naive, config, x, past_end, real);
        std::printf("  host id 64, table of 64 rows -> %s\n", refused.error.c_str());
        checks.expect(!refused.error.empty() && untouched(refused.q) && untouched(refused.k),
                      "host ids past the table: a rope::Error, every output element untouched");
        // THE BUG: a kernel that clamps the id into the table: a plausible, wrong rotation.
        std::vector<int64_t> clamped = beyond;
        clamped[4] = rows - 1;
        const Outcome clamp = run(*naive, config, x, {.ids = clamped}, real);
        bool token4_flagged = !clamp.error.empty();  // The out-of-range test: refused, or NaN in the token.
        for (int64_t e = 4 * 4 * 128; e < 5 * 4 * 128; ++e)
            if (e % 128 < 64) token4_flagged = token4_flagged || std::isnan(clamp.q[size_t(e)]);
        std::printf("  clamping kernel: token 4 silently gets row 63's rotation, finite and wrong\n");
        caught(!token4_flagged,
               "a kernel clamping ids into the table fails the out-of-range test (a refusal or NaN, "
               "never a finite rotation)");

        // On a device the ids cannot be checked before the launch: the kernels write NaN
        // into that token's rotated features, copy its pass-through features, and read nothing outside.
        bool any_cuda = false;
        for (const auto& backend : backends.available) {
            if (backend->device() != rope::Device::cuda) continue;
            any_cuda = true;
            const Outcome outcome = run(*backend, config, x, past_end, real);
            const std::vector<double> want = table_float64(x.q, 4, config, real, token_ids);
            bool nan_rotated = outcome.error.empty(), rest_right = outcome.error.empty();
            for (int64_t t = 0; t < 24; ++t)
                for (int64_t e = 0; e < 4 * 128; ++e) {
                    const size_t at = size_t(t * 4 * 128 + e);
                    const bool rotated = e % 128 < 64;
                    if (t == 4 && rotated)
                        nan_rotated = nan_rotated && std::isnan(outcome.q[at]);
                    else if (t == 4)
                        rest_right = rest_right && outcome.q[at] == x.q[at];
                    else
                        rest_right = rest_right && std::fabs(outcome.q[at] - want[at]) < kAbsTolerance;
                }
            checks.expect(nan_rotated && rest_right,
                          backend->name() +
                              ": device id 64 past a 64-row table: NaN in that token's 64 rotated "
                              "features, its pass-through copied, every other token right");
        }
        if (!any_cuda)
            std::printf(
                "  device ids past the table (NaN in that token's rotated features): skipped, no CUDA backend "
                "runs here (%ld skipped above)\n",
                long(backends.skipped));
    }

    // -----------------------------------------------------------------------
    tutorial::print_section("6. Which pair belongs to which axis");
    {
        // The figure's data: the library's pair_axis for four configurations, checked
        // against this chapter's rules (mrope_axis, and the axial runs of section 4).
        struct PairLayout {
            const char* name;
            rope::RopeConfig config;
        };
        const std::vector<PairLayout> layouts{
            {"M-RoPE contiguous, Qwen2-VL [16,24,24]", qwen2vl},
            {"M-RoPE interleaved, Qwen3-VL [24,20,20]", qwen3vl},
            {"axial 2-D, Qwen2-VL vision (head_dim 80) [20,20]",
             multi_axis_config(80, 0, 10000.0, rope::Style::half_split, rope::AxisAssignment::axial, {20, 20})},
            {"axial 3-D, diffusion (16,56,56) -> [8,28,28]",
             multi_axis_config(128, 0, 10000.0, rope::Style::interleaved, rope::AxisAssignment::axial, {8, 28, 28})}};
        bool agree = true;
        for (const PairLayout& layout : layouts) {
            const rope::RopeConfig& config = layout.config;
            const int64_t pairs = config.effective_rotary_dim() / 2;
            const bool axial = config.multi_axis.assignment == rope::AxisAssignment::axial;
            const std::vector<uint8_t> library = rope::make_frequency_table(config, 1).pair_axis;
            csv.table(layout.name,
                      "pair,axis,theta_index,half_split_first,half_split_second,interleaved_first,interleaved_second,"
                      "axis_name");
            std::printf("  %-50s axis of pairs 0..%ld: ", layout.name, long(pairs - 1));
            for (int64_t i = 0; i < pairs; ++i) {
                int64_t axis = 0, index = i;  // The axis and the theta index, by this chapter's rules.
                if (axial) {
                    while (index >= config.multi_axis.sections[size_t(axis)])
                        index -= config.multi_axis.sections[size_t(axis++)];
                } else {
                    axis = mrope_axis(config.multi_axis.assignment == rope::AxisAssignment::mrope_interleaved,
                                      config.multi_axis.sections, i);
                }
                agree = agree && int64_t(library[size_t(i)]) == axis;
                // Axis names: M-RoPE and 3-D axial have (t, h, w); 2-D axial has (h, w).
                const char* name = (axial && pairs == 40) ? (axis == 0 ? "h" : "w")
                                                          : (axis == 0   ? "t"
                                                             : axis == 1 ? "h"
                                                                         : "w");
                std::printf("%s", name);
                csv.row(i, axis, index, i, i + pairs, 2 * i, 2 * i + 1, name);
            }
            std::printf("\n");
        }
        checks.expect(agree,
                      "the library's FrequencyTable::pair_axis follows the chapter's rules for all four layouts");
    }
    csv.announce();

    return checks.finish("a longest-sequence grid launches " + std::to_string(longest_grid) + " blocks for " +
                         std::to_string(total_tokens) + " tokens (" +
                         tutorial::fixed(100.0 * double(longest_grid - total_tokens) / double(longest_grid), 1) +
                         "% idle); " + std::to_string(bugs_caught) + " of " + std::to_string(bugs_shown) +
                         " reproduced bugs caught; every form matches float64 on " +
                         std::to_string(backends.available.size()) + " backends");
}
