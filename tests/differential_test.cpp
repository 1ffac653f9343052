// Randomised differential testing: a seeded generator of random valid calls
// (shapes including head_dim 2 and odd head counts, both layouts, both styles,
// partial rotary, small and very large positions, grouped-query heads, every
// dtype, inverse, in place, the precise-angle mode; every position form:
// offsets, shared and per-sequence ids, packed sequences in thd and batch-1
// views, context-parallel shards of both, M-RoPE with contiguous and
// interleaved sections, axial RoPE with 1 to 4 axes, and a caller's cos/sin
// table of real or arbitrary values; and for each of the four tensors a memory
// arrangement: dense, padded, features 2 apart, off 16-byte alignment, heads
// and seq swapped, sometimes a tail of storage beyond the view) run on every
// available backend against the float64 oracle and against cpu-naive. Every
// byte of storage the call must not write (outside the outputs' views; an
// out-of-place call's inputs) is checked too.
//
// ROPE_DIFFERENTIAL_CONFIGS sets how many calls (default 2000); a failure
// prints the process seed (ROPE_TEST_SEED reproduces the whole run) and the
// index and description of the failing call.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "support.hpp"

namespace {

struct RandomCall {
    testing::Call call;
    std::string description;
    int64_t max_position = 0;
};

template <typename T>
T pick(std::mt19937_64& rng, std::initializer_list<T> choices) {
    std::uniform_int_distribution<size_t> index(0, choices.size() - 1);
    return *(choices.begin() + index(rng));
}

int64_t uniform(std::mt19937_64& rng, int64_t low, int64_t high) {
    return std::uniform_int_distribution<int64_t>(low, high)(rng);
}

// ---------------------------------------------------------------------------
// Position forms
// ---------------------------------------------------------------------------

enum class Form { offset, shared_ids, per_sequence_ids, packed, sharded, multi_axis };

// A drawn position form and what it asks of the tensors' shapes.
struct PositionForm {
    Form form = Form::offset;
    std::vector<int64_t> lengths;  // packed: each sequence's (local) length
    int64_t cp_size = 1;           // packed and sharded: context-parallel group size
    bool thd = false;              // packed: a thd view (else a batch-1 bshd or bhsd view)
    bool table = false;            // a caller's cos/sin table replaces the computed angles
};

// One line of positions (offsets, ids) about half the time; packed, sharded and multi-axis the rest.
PositionForm draw_position_form(std::mt19937_64& rng) {
    PositionForm f;
    f.form = pick(rng, {Form::offset, Form::offset, Form::shared_ids, Form::per_sequence_ids, Form::packed,
                        Form::packed, Form::sharded, Form::multi_axis, Form::multi_axis});
    if (f.form == Form::packed) {
        f.cp_size = uniform(rng, 0, 2) == 0 ? uniform(rng, 2, 3) : 1;
        // Empty and one-token sequences are common draws; shards need even lengths.
        for (int64_t s = uniform(rng, 1, 4); s > 0; --s)
            f.lengths.push_back(f.cp_size > 1 ? 2 * uniform(rng, 0, 3) : uniform(rng, 0, 6));
        f.thd = uniform(rng, 0, 1) == 0;
    }
    if (f.form == Form::sharded) f.cp_size = uniform(rng, 2, 4);
    f.table = uniform(rng, 0, 6) == 0;
    return f;
}

// Pairs per axis, summing to `pairs` (each >= 1), that the assignment accepts.
std::vector<int64_t> draw_sections(std::mt19937_64& rng, rope::AxisAssignment assignment, int64_t pairs,
                                   int64_t axes) {
    if (assignment == rope::AxisAssignment::mrope_interleaved) {
        // Height takes pairs 1, 4, ... and width 2, 5, ...: both must stay below pairs.
        const int64_t height = uniform(rng, 1, (pairs - 2) / 3 + 1), width = uniform(rng, 1, (pairs - 3) / 3 + 1);
        return {pairs - height - width, height, width};
    }
    std::vector<int64_t> sections(size_t(axes), 1);
    for (int64_t extra = pairs - axes; extra > 0; --extra) ++sections[size_t(uniform(rng, 0, axes - 1))];
    return sections;
}

// Fills in the call's positions (and multi-axis sections, and table) for the drawn form;
// returns their description and sets r.max_position (largest position + 1).
std::string draw_positions(std::mt19937_64& rng, const PositionForm& form, int64_t batch, int64_t seq,
                           RandomCall& r) {
    testing::Call& call = r.call;
    // Mostly short, sometimes far into a long context (a table stays small).
    const int64_t largest = form.table ? pick<int64_t>(rng, {16, 300}) : pick<int64_t>(rng, {16, 4096, 131072, 1000000});
    std::ostringstream text;
    auto draw_ids = [&](int64_t count) {
        for (int64_t i = 0; i < count; ++i) call.ids.push_back(uniform(rng, 0, largest));
        for (int64_t id : call.ids) r.max_position = std::max(r.max_position, id + 1);
    };
    switch (form.form) {
        case Form::offset:
        case Form::sharded:
            call.offset = uniform(rng, 0, largest);
            call.cp_size = form.cp_size;
            call.cp_rank = uniform(rng, 0, form.cp_size - 1);
            r.max_position = call.offset + seq * form.cp_size;  // the unsharded sequence's end
            text << "offset " << call.offset;
            if (form.cp_size > 1) text << " rank " << call.cp_rank << " of " << form.cp_size;
            break;
        case Form::shared_ids:
        case Form::per_sequence_ids:
            call.id_rows = form.form == Form::shared_ids ? 1 : batch;
            draw_ids(call.id_rows * seq);
            text << (form.form == Form::shared_ids ? "shared ids" : "per-sequence ids");
            break;
        case Form::packed: {
            call.cu_seqlens = {0};
            for (int64_t length : form.lengths) call.cu_seqlens.push_back(call.cu_seqlens.back() + length);
            call.offset = uniform(rng, 0, largest);
            if (uniform(rng, 0, 1) == 0)
                for (size_t s = 0; s < form.lengths.size(); ++s) call.starts.push_back(uniform(rng, 0, largest));
            call.cp_size = form.cp_size;
            call.cp_rank = uniform(rng, 0, form.cp_size - 1);
            for (size_t s = 0; s < form.lengths.size(); ++s) {
                const int64_t start = call.starts.empty() ? call.offset : call.starts[s];
                if (form.lengths[s] > 0) r.max_position = std::max(r.max_position, start + form.lengths[s] * form.cp_size);
            }
            text << "packed lengths [";
            for (size_t s = 0; s < form.lengths.size(); ++s) text << (s ? "," : "") << form.lengths[s];
            text << "] " << (call.starts.empty() ? "offset " + std::to_string(call.offset) : std::string("starts"));
            if (form.cp_size > 1) text << " rank " << call.cp_rank << " of " << form.cp_size;
            break;
        }
        case Form::multi_axis: {
            const int64_t pairs = call.config.effective_rotary_dim() / 2;
            auto assignment = pick(rng, {rope::AxisAssignment::mrope_contiguous, rope::AxisAssignment::mrope_interleaved,
                                         rope::AxisAssignment::axial});
            if (pairs < 3) assignment = rope::AxisAssignment::axial;  // M-RoPE needs a pair per axis
            const bool mrope = assignment != rope::AxisAssignment::axial;
            const int64_t axes = mrope ? 3 : uniform(rng, 1, std::min<int64_t>(rope::kMaxPositionAxes, pairs));
            call.config.multi_axis = {assignment, draw_sections(rng, assignment, pairs, axes)};
            call.id_axes = axes;
            call.id_rows = uniform(rng, 0, 1) ? 1 : batch;
            draw_ids(axes * call.id_rows * seq);
            text << rope::axis_assignment_name(assignment) << " sections [";
            for (size_t a = 0; a < call.config.multi_axis.sections.size(); ++a)
                text << (a ? "," : "") << call.config.multi_axis.sections[a];
            text << "] " << (call.id_rows == 1 ? "shared" : "per-sequence") << " ids";
            break;
        }
    }
    if (form.table) {
        // Real cos/sin (computed in double from the frequency table) or arbitrary values in
        // [-0.7, 0.7], so no output exceeds a rotation's 2*sqrt(2) bound. Rows may be padded.
        call.config.precise_angles = false;  // a table and the precise mode exclude each other
        const int64_t rotary_dim = call.config.effective_rotary_dim(), pairs = rotary_dim / 2;
        const int64_t rows = r.max_position + uniform(rng, 1, 3);
        const int64_t row_stride = rotary_dim + (uniform(rng, 0, 1) ? 0 : uniform(rng, 1, 8));
        const bool real = uniform(rng, 0, 1) == 0;
        const rope::FrequencyTable frequencies = rope::make_frequency_table(call.config, rows);
        std::uniform_real_distribution<float> arbitrary(-0.7f, 0.7f);
        call.table.assign(size_t(rows * row_stride), 0.0f);
        for (int64_t p = 0; p < rows; ++p)
            for (int64_t i = 0; i < pairs; ++i) {
                const double angle = double(p) * double(frequencies.inv_freq[size_t(i)]);
                call.table[size_t(p * row_stride + i)] = real ? float(std::cos(angle)) : arbitrary(rng);
                call.table[size_t(p * row_stride + pairs + i)] = real ? float(std::sin(angle)) : arbitrary(rng);
            }
        call.table_rows = rows;
        call.table_cols = rotary_dim;
        call.table_row_stride = row_stride;
        text << (real ? ", cos/sin table" : ", arbitrary cos/sin table") << " of " << rows << " rows";
    }
    return text.str();
}

// ---------------------------------------------------------------------------
// Random calls
// ---------------------------------------------------------------------------

RandomCall random_call(std::mt19937_64& rng) {
    rope::RopeConfig config;
    config.head_dim = pick<int64_t>(rng, {2, 4, 6, 8, 16, 32, 34, 64, 80, 96, 128, 256});
    config.rotary_dim = uniform(rng, 0, 1) ? 0 : 2 * uniform(rng, 1, config.head_dim / 2);
    config.style = uniform(rng, 0, 1) ? rope::Style::half_split : rope::Style::interleaved;
    config.base = pick<double>(rng, {10000.0, 500000.0, 1000000.0, 100.0, 1.5e4 * double(uniform(rng, 1, 50))});
    config.precise_angles = uniform(rng, 0, 4) == 0;
    const rope::DType dtype = pick(rng, {rope::DType::f32, rope::DType::f32, rope::DType::bf16, rope::DType::f16});
    const PositionForm form = draw_position_form(rng);
    const rope::Layout layout = form.thd              ? rope::Layout::thd
                                : uniform(rng, 0, 1) ? rope::Layout::bhsd
                                                     : rope::Layout::bshd;
    // Packed sequences are one row of their total length; a shard holds two equal chunks.
    int64_t packed_tokens = 0;
    for (int64_t length : form.lengths) packed_tokens += length;
    const int64_t batch = form.form == Form::packed ? 1 : uniform(rng, 1, 3);
    const int64_t seq = form.form == Form::packed    ? packed_tokens
                        : form.form == Form::sharded ? 2 * uniform(rng, 1, 5)
                                                     : uniform(rng, 1, 9);
    const int64_t k_heads = uniform(rng, 0, 9) == 0 ? 0 : uniform(rng, 1, 3);
    const int64_t q_heads = std::max<int64_t>(k_heads, 1) * uniform(rng, 1, 4);
    std::array<testing::StorageOptions, 4> storage;  // q, k, q_out, k_out
    for (testing::StorageOptions& options : storage) options = testing::random_storage(rng);
    auto shape = [&](int64_t heads) {
        if (layout == rope::Layout::thd) return std::array<int64_t, 4>{seq, heads, config.head_dim, 1};
        return layout == rope::Layout::bhsd ? std::array<int64_t, 4>{batch, heads, seq, config.head_dim}
                                            : std::array<int64_t, 4>{batch, seq, heads, config.head_dim};
    };
    RandomCall r;
    r.call = testing::make_call(config, dtype, layout, shape(q_heads), shape(k_heads));
    testing::arrange(r.call, storage, rng);
    r.call.direction = uniform(rng, 0, 3) == 0 ? rope::Direction::inverse : rope::Direction::forward;
    r.call.in_place = uniform(rng, 0, 2) == 0;
    const std::string positions = draw_positions(rng, form, batch, seq, r);
    config = r.call.config;  // the form may have set sections, or turned the precise mode off
    std::ostringstream text;
    text << rope::style_name(config.style) << " " << rope::layout_name(layout) << " " << rope::dtype_name(dtype)
         << " q[" << batch << "," << q_heads << "," << seq << "," << config.head_dim << "] k_heads " << k_heads
         << " rotary " << config.effective_rotary_dim() << " base " << config.base << " storage "
         << testing::storage_name(storage[0]) << "/" << testing::storage_name(storage[1]) << "/"
         << testing::storage_name(storage[2]) << "/" << testing::storage_name(storage[3])
         << (config.precise_angles ? " precise" : "") << (r.call.in_place ? " in-place" : " out-of-place")
         << (r.call.direction == rope::Direction::inverse ? " inverse" : " forward") << " positions " << positions
         << " (max " << r.max_position << ")";
    r.description = text.str();
    return r;
}

// Unit roundoff of the storage type: the rounding of the float32 result on store.
double storage_roundoff(rope::DType dtype) {
    switch (dtype) {
        case rope::DType::bf16: return 1.0 / 256;
        case rope::DType::f16: return 1.0 / 2048;
        case rope::DType::f32: break;
    }
    return 0.0;
}

}  // namespace

TEST_CASE("randomised differential run: every available backend vs the oracle and cpu-naive") {
    const char* env = std::getenv("ROPE_DIFFERENTIAL_CONFIGS");
    const long configs = env ? std::atol(env) : 2000;
    std::mt19937_64 rng(testing::seed() ^ 0x5eedULL);
    auto naive = rope::make_backend("cpu-naive");
    std::vector<std::unique_ptr<rope::Backend>> backends;
    for (const rope::BackendInfo& info : rope::list_backends())
        if (info.available && info.name != "cpu-naive") backends.push_back(rope::make_backend(info.name));

    long runs = 0, failures = 0;
    for (long index = 0; index < configs; ++index) {
        RandomCall r = random_call(rng);
        const testing::Expected want = testing::oracle_for(r.call);
        testing::Call reference = r.call;
        testing::run(*naive, reference);
        // Against the oracle: the float32 angle error (grows with position; the
        // precise mode and a caller's table remove it, so there its bound is that of position 0) plus
        // one rounding to the storage type of outputs up to 2*sqrt(2) in magnitude.
        const bool exact_angles = r.call.config.precise_angles || !r.call.table.empty();
        const int64_t angle_position = exact_angles ? 0 : r.max_position;
        const double oracle_abs = testing::fp32_max_abs(angle_position) + 2.9 * storage_roundoff(reference.q.view.dtype);
        const double agree_rel = 2 * storage_roundoff(reference.q.view.dtype);  // one storage ulp
        for (size_t b = 0; b <= backends.size(); ++b) {
            testing::Call call = r.call;
            rope::Backend& backend = b == 0 ? *naive : *backends[b - 1];
            if (b > 0) testing::run(backend, call);
            const testing::Call& result = b == 0 ? reference : call;
            bool ok = true;
            std::ostringstream why;
            const std::string writes = testing::unexpected_writes(r.call, result);
            if (!writes.empty()) {
                ok = false;
                why << " " << writes;
            }
            for (int which = 0; which < 2; ++which) {
                const auto got = (which == 0 ? result.q_result() : result.k_result()).values();
                const auto& exact = which == 0 ? want.q : want.k;
                const oracle::ErrorStats stats = oracle::compare(got, exact);
                if (stats.non_finite > 0 || stats.max_abs > oracle_abs) {
                    ok = false;
                    why << (which ? " k" : " q") << " vs oracle: max_abs " << stats.max_abs << " > " << oracle_abs
                        << ", non-finite " << stats.non_finite << ";";
                }
                if (b == 0) continue;
                const auto ref = (which == 0 ? reference.q_result() : reference.k_result()).values();
                for (size_t i = 0; i < got.size(); ++i) {
                    if (!(std::fabs(got[i] - ref[i]) <= agree_rel * std::fabs(ref[i]) + 4e-6)) {
                        ok = false;
                        why << (which ? " k" : " q") << "[" << i << "] = " << got[i] << " vs cpu-naive " << ref[i] << ";";
                        break;
                    }
                }
            }
            ++runs;
            if (!ok) {
                ++failures;
                if (failures <= 10)
                    FAIL_CHECK("seed " << testing::seed() << " call #" << index << " on " << backend.name() << ": "
                                       << r.description << ":" << why.str());
            }
        }
    }
    std::cout << "randomised differential run: " << configs << " configurations, " << runs
              << " backend runs (cpu-naive + " << backends.size() << " other available backend(s)), " << failures
              << " failures; seed " << testing::seed() << std::endl;
    CHECK(failures == 0);
}
