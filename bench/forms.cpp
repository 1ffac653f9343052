// The position forms rope-bench measures (see forms.hpp).
#include "forms.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <type_traits>

#include "rope/frequency_table.hpp"
#include "rope/position_ids.hpp"
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

// The smallest side s with s^axes >= count: a grid of `axes` dimensions that holds count patches.
int64_t grid_side(int64_t count, int64_t axes) {
    int64_t side = 1;
    while (std::pow(double(side), double(axes)) < double(count)) ++side;
    return side;
}

// The first `seq` tokens of each of the `axes` rows of `ids` ([axes, tokens]), plus `offset`.
std::vector<int64_t> first_tokens(const std::vector<int64_t>& ids, int64_t axes, int64_t seq, int64_t offset) {
    const int64_t tokens = int64_t(ids.size()) / axes;
    std::vector<int64_t> kept;
    kept.reserve(size_t(axes * seq));
    for (int64_t a = 0; a < axes; ++a)
        for (int64_t t = 0; t < seq; ++t) kept.push_back(offset + ids[size_t(a * tokens + t)]);
    return kept;
}

// M-RoPE ids as for an image in a prompt (rope::mrope_position_ids, HF qwen2_vl
// get_rope_index): a text prefix of seq/8 tokens, then the patches of a
// near-square grid (no merge), the last row cut short; everything plus the offset.
// Distinct rows: a kernel that reads only row 0 is caught.
std::string fill_mrope_ids(Form& form) {
    const int64_t seq = form.seq;
    const int64_t text = std::clamp<int64_t>(seq / 8, std::min<int64_t>(seq, 1), seq);
    const int64_t patches = seq - text;
    const int64_t width = std::max<int64_t>(grid_side(patches, 2), 1);
    const int64_t height = (patches + width - 1) / width;
    std::vector<rope::PromptSegment> prompt{rope::PromptSegment::text(text)};
    if (patches > 0) prompt.push_back(rope::PromptSegment::picture(1, height, width));
    const rope::MropePositionIds m = rope::mrope_position_ids(prompt, 1);
    form.axes = 3;
    form.ids = first_tokens(m.ids, 3, seq, form.offset);
    return "text " + std::to_string(text) + " + image " + std::to_string(height) + "x" + std::to_string(width) +
           " grid (" + std::to_string(patches) + " patches)";
}

// Axial ids: the coordinates of the tokens as patches of a grid with one
// dimension per axis (rope::axial_position_ids: the last axis fastest), each
// coordinate plus the offset.
std::string fill_axial_ids(Form& form) {
    const int64_t axes = int64_t(form.config.multi_axis.sections.size());
    const std::vector<int64_t> grid(size_t(axes), grid_side(form.seq, axes));
    form.axes = axes;
    form.ids = first_tokens(rope::axial_position_ids(grid), axes, form.seq, form.offset);
    return "grid " + join(grid, "x") + " (" + std::to_string(form.seq) + " patches)";
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
        form.cu_seqlens = rope::cu_seqlens_from_lengths(lengths);
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
                       ? rope::default_mrope_sections(options.multi_axis, form.config.effective_rotary_dim() / 2)
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
