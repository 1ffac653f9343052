// The position forms rope-bench measures (see forms.hpp).
#include "forms.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <type_traits>

#include "rope/frequency_table.hpp"
#include "rope/rotation.hpp"

namespace rope_bench {
namespace {

constexpr uint64_t kPackedSeed = 2026;  // Fixed: one command, one batch of lengths.

// "a<separator>b<separator>c" from strings or numbers.
template <typename Part>
std::string join(const std::vector<Part>& parts, const char* separator) {
    std::string text;
    for (std::size_t i = 0; i < parts.size(); ++i) {
        if (i > 0) text += separator;
        if constexpr (std::is_arithmetic_v<Part>)
            text += std::to_string(parts[i]);
        else
            text += parts[i];
    }
    return text;
}

// M-RoPE's default sections, scaled from 64 pairs (head_dim 128) to `pairs`:
// Qwen2-VL's [16, 24, 24] (contiguous) or Qwen3-VL's [24, 20, 20] (interleaved).
std::vector<int64_t> default_mrope_sections(rope::AxisAssignment assignment, int64_t pairs) {
    const double spatial = assignment == rope::AxisAssignment::mrope_contiguous ? 24.0 : 20.0;
    const int64_t height = int64_t(std::lround(spatial * double(pairs) / 64.0));
    return {pairs - 2 * height, height, height};
}

// The smallest side s with s^axes >= count: a grid of `axes` dimensions that holds count patches.
int64_t grid_side(int64_t count, int64_t axes) {
    int64_t side = 1;
    while (std::pow(double(side), double(axes)) < double(count)) ++side;
    return side;
}

// M-RoPE ids as for an image in a prompt (HF qwen2_vl get_rope_index): a text
// prefix of seq/8 tokens at positions o, o+1, ... on all three axes, then the
// patches of a near-square grid in row-major order: temporal o+P, height o+P+row,
// width o+P+column. Distinct rows: a kernel that reads only row 0 is caught.
std::string fill_mrope_ids(Form& form) {
    const int64_t seq = form.seq, o = form.offset;
    const int64_t text = std::clamp<int64_t>(seq / 8, std::min<int64_t>(seq, 1), seq);
    const int64_t patches = seq - text;
    const int64_t width = std::max<int64_t>(grid_side(patches, 2), 1);
    const int64_t height = (patches + width - 1) / width;
    form.axes = 3;
    form.ids.assign(size_t(3 * seq), 0);
    for (int64_t t = 0; t < seq; ++t) {
        const int64_t patch = t - text;
        const bool is_text = patch < 0;
        form.ids[size_t(t)] = is_text ? o + t : o + text;
        form.ids[size_t(seq + t)] = is_text ? o + t : o + text + patch / width;
        form.ids[size_t(2 * seq + t)] = is_text ? o + t : o + text + patch % width;
    }
    return "text " + std::to_string(text) + " + image " + std::to_string(height) + "x" + std::to_string(width) +
           " grid (" + std::to_string(patches) + " patches)";
}

// Axial ids: the coordinates of the tokens as patches of a grid with one
// dimension per axis (the last axis fastest), each coordinate plus the offset.
std::string fill_axial_ids(Form& form) {
    const int64_t axes = int64_t(form.config.multi_axis.sections.size());
    const int64_t side = grid_side(form.seq, axes);
    form.axes = axes;
    form.ids.assign(size_t(axes * form.seq), 0);
    for (int64_t t = 0; t < form.seq; ++t)
        for (int64_t a = axes - 1, rest = t; a >= 0; --a, rest /= side)
            form.ids[size_t(a * form.seq + t)] = form.offset + rest % side;
    const std::string grid = join(std::vector<int64_t>(size_t(axes), side), "x");
    return "grid " + grid + " (" + std::to_string(form.seq) + " patches)";
}

// The largest position + 1 the form's calls use: the rows a cos/sin table needs.
int64_t positions_needed(const Form& form) {
    if (!form.ids.empty()) return *std::max_element(form.ids.begin(), form.ids.end()) + 1;
    int64_t longest = form.seq;  // Tokens of the longest local sequence.
    if (!form.cu_seqlens.empty()) {
        longest = 0;
        for (size_t b = 0; b + 1 < form.cu_seqlens.size(); ++b)
            longest = std::max(longest, form.cu_seqlens[b + 1] - form.cu_seqlens[b]);
    }
    // A shard's global positions reach cp_size x its length.
    return std::max<int64_t>(form.offset + longest * form.cp_size, 1);
}

// The table a serving engine would pass for this model: row p holds cos of
// every pair's float32 angle (rope's own frequencies and angle), then their sin.
void fill_table(Form& form) {
    const int64_t rows = positions_needed(form);
    const rope::FrequencyTable frequencies = rope::make_frequency_table(form.config, rows);
    const int64_t pairs = int64_t(frequencies.inv_freq.size());
    form.table_rows = rows;
    form.cos_sin.assign(size_t(rows * 2 * pairs), 0.0f);
    for (int64_t p = 0; p < rows; ++p) {
        float* row = form.cos_sin.data() + p * 2 * pairs;
        for (int64_t i = 0; i < pairs; ++i) {
            const double angle = rope::rope_angle(p, frequencies.inv_freq[size_t(i)]);
            row[i] = float(std::cos(angle) * frequencies.attention_factor);
            row[pairs + i] = float(std::sin(angle) * frequencies.attention_factor);
        }
    }
}

}  // namespace

std::vector<int64_t> packed_lengths(const PackedLengths& packed, int64_t total, int64_t granularity) {
    if (!packed.lengths.empty()) return packed.lengths;
    if (packed.total > 0) total = packed.total;
    const int64_t shortest = (packed.min_length + granularity - 1) / granularity * granularity;
    const int64_t longest = packed.max_length / granularity * granularity;
    if (shortest > longest || total % granularity != 0)
        throw UsageError("--packed: lengths " + std::to_string(packed.min_length) + ".." +
                         std::to_string(packed.max_length) + " totalling " + std::to_string(total) +
                         " cannot all be multiples of " + std::to_string(granularity) +
                         " (each shard of --cp splits into two equal chunks)");
    const int64_t choices = (longest - shortest) / granularity + 1;
    uint64_t state = kPackedSeed;
    std::vector<int64_t> lengths;
    for (int64_t sum = 0; sum < total;) {
        const int64_t drawn = shortest + int64_t(split_mix(state) % uint64_t(choices)) * granularity;
        lengths.push_back(std::min(drawn, total - sum));
        sum += lengths.back();
    }
    return lengths;
}

Form make_form(const Options& options, const Shape& shape, int64_t kv_heads) {
    Form form;
    form.layout = options.layout;
    form.batch = shape.batch;
    form.seq = shape.seq;
    form.q_heads = shape.heads;
    form.k_heads = kv_heads;
    form.head_dim = shape.head_dim;
    form.offset = options.position_offset;
    form.cp_size = options.cp_size;
    form.cp_rank = options.cp_rank;
    form.config.head_dim = shape.head_dim;
    form.config.style = options.style;
    form.config.precise_angles = options.precise;
    std::vector<std::string> parts, details;

    const bool packed = options.packed.enabled || options.layout == rope::Layout::thd;
    if (packed) {
        const int64_t tokens = shape.batch * shape.seq;
        const std::vector<int64_t> lengths =
            options.packed.enabled ? packed_lengths(options.packed, tokens, options.cp_size > 1 ? 2 : 1)
                                   : std::vector<int64_t>(size_t(shape.batch), shape.seq);
        const int64_t sum = std::accumulate(lengths.begin(), lengths.end(), int64_t(0));
        if (sum != tokens)
            throw UsageError("--packed: the lengths total " + std::to_string(sum) + " tokens but --shape " +
                             shape.text() + " holds " + std::to_string(tokens) + " (batch x seq)");
        form.cu_seqlens.push_back(0);
        for (int64_t length : lengths) form.cu_seqlens.push_back(form.cu_seqlens.back() + length);
        if (form.layout == rope::Layout::thd) {
            form.batch = 1;
            form.seq = tokens;
        }
        const auto [shortest, longest] = std::minmax_element(lengths.begin(), lengths.end());
        const std::string range = lengths.empty() ? "0" : std::to_string(*shortest) + ".." + std::to_string(*longest);
        const bool drawn = options.packed.enabled && options.packed.lengths.empty();
        parts.push_back("packed");
        details.push_back(std::to_string(lengths.size()) + (lengths.size() == 1 ? " sequence of " : " sequences of ") +
                          range + " tokens" + (drawn ? " (drawn, fixed seed)" : ""));
    }

    form.config.multi_axis.assignment = options.multi_axis;
    if (options.multi_axis != rope::AxisAssignment::single) {
        if (packed)
            throw UsageError("--mrope and --axial take one sequence of ids per batch (shape [axes, seq]), not "
                             "packed sequences: drop --packed and --layout thd");
        const bool axial = options.multi_axis == rope::AxisAssignment::axial;
        const bool contiguous = options.multi_axis == rope::AxisAssignment::mrope_contiguous;
        std::vector<int64_t>& sections = form.config.multi_axis.sections;
        sections = options.sections.empty()
                       ? default_mrope_sections(options.multi_axis, form.config.effective_rotary_dim() / 2)
                       : options.sections;
        const std::string grid = axial ? fill_axial_ids(form) : fill_mrope_ids(form);
        parts.push_back(axial ? "axial" : "mrope");
        details.push_back(grid + ", sections " + join(sections, ",") +
                          (axial ? "" : contiguous ? " contiguous" : " interleaved"));
    }
    if (options.ids) {
        if (packed)
            throw UsageError("--ids takes one row of ids shared by the batch, not packed sequences: drop --packed "
                             "and --layout thd");
        form.ids.resize(size_t(form.seq));
        std::iota(form.ids.begin(), form.ids.end(), form.offset);
        parts.push_back("ids");
        details.push_back("ids " + std::to_string(form.offset) + ".." + std::to_string(form.offset + form.seq - 1) +
                          " in memory, shared by the batch");
    }
    if (options.cp_size > 1) {
        parts.push_back("cp");
        details.push_back("rank " + std::to_string(options.cp_rank) + " of " + std::to_string(options.cp_size));
    }
    if (options.table) {
        fill_table(form);
        parts.push_back("table");
        details.push_back("table " + std::to_string(form.table_rows) + "x" +
                          std::to_string(form.config.effective_rotary_dim()) + " fp32");
    }
    form.name = parts.empty() ? "plain" : join(parts, "+");
    form.detail = join(details, "; ");
    return form;
}

rope::TensorView Form::view(void* data, int64_t heads, rope::DType dtype, rope::Device device) const {
    if (layout == rope::Layout::thd) return rope::TensorView::packed(data, dtype, device, {seq, heads, head_dim});
    using Sizes = std::array<int64_t, 4>;
    const Sizes sizes =
        layout == rope::Layout::bhsd ? Sizes{batch, heads, seq, head_dim} : Sizes{batch, seq, heads, head_dim};
    return rope::TensorView::contiguous(data, dtype, device, layout, sizes);
}

rope::Positions Form::positions(const int64_t* device_cu_seqlens, const int64_t* device_ids,
                                rope::Device device) const {
    rope::Positions positions = rope::Positions::starting_at(offset);
    if (!cu_seqlens.empty()) {
        positions = rope::Positions::packed(device_cu_seqlens, int64_t(cu_seqlens.size()) - 1, nullptr, device);
        positions.offset = offset;
    }
    if (!ids.empty()) positions = rope::Positions::multi_axis(device_ids, axes, 1, seq, device);
    return cp_size > 1 ? positions.sharded(cp_size, cp_rank) : positions;
}

rope::CosSinCache Form::cos_sin_cache(const float* device_table, rope::Device device) const {
    if (cos_sin.empty()) return {};
    return rope::CosSinCache::dense(device_table, table_rows, config.effective_rotary_dim(), device);
}

}  // namespace rope_bench
