// rope-bench's one writer (see report.hpp).
#include "report.hpp"

#include <algorithm>
#include <cstdio>
#include <utility>

namespace rope_bench {
namespace {

struct Cell {
    std::string text;
    bool number = false;  // Right-aligned in a table.
};
using Cells = std::vector<std::pair<const char*, Cell>>;  // Column name, cell.

std::string fixed(double value, int decimals) {
    char text[64];
    std::snprintf(text, sizeof text, "%.*f", decimals, value);
    return text;
}

// The columns, in order. Columns after `timing` were appended later, so that existing consumers keep their
// column positions. The measurements are empty in a row that did not run (status says why).
Cells cells_of(const Row& row) {
    const bool ran = row.not_run.empty();
    const Measurement& m = row.summary.reported;
    auto measured = [&](const std::string& text) { return Cell{ran ? text : "", true}; };
    auto gbps = [&](double us) { return fixed(row.bytes / (us * 1e3), 1); };
    return {{"backend", {row.backend}},
            {"shape", {row.shape}},
            {"kv_heads", {std::to_string(row.kv_heads), true}},
            {"dtype", {row.dtype}},
            {"style", {row.style}},
            {"layout", {row.layout}},
            {"placement", {row.placement}},
            {"threads", {row.threads, row.threads != "-"}},
            {"sets", measured(std::to_string(row.sets))},  // Spanning twice `cache`.
            {"calls", measured(std::to_string(m.reps))},   // Timed repetitions per run (GPU: batches >= 1 ms).
            {"median_us", measured(fixed(m.call_us, m.call_us < 100 ? 2 : 1))},  // Of the reported run.
            {"GBps", measured(gbps(m.call_us))},
            {"copy_GBps", measured(gbps(m.ceiling.us))},
            {"pct_of_copy", measured(fixed(m.percent_of_copy(), 1))},  // The median ratio of the runs.
            {"status", {ran ? "ok" : row.not_run}},
            {"precise", {row.precise ? "1" : "0", true}},
            {"position_offset", {std::to_string(row.position_offset), true}},
            {"timing", {row.timing}},
            {"form", {row.form}},
            {"runs", measured(std::to_string(row.summary.runs))},
            {"pct_min", measured(fixed(row.summary.pct_min, 1))},  // The smallest and largest ratio of the runs.
            {"pct_max", measured(fixed(row.summary.pct_max, 1))},
            {"ceiling", {ran ? m.ceiling.name : ""}},           // Which copy was fastest.
            {"form_detail", {row.form_detail}},
            {"ceilings", {ran ? m.ceiling.describe() : ""}},    // Every candidate's median microseconds.
            {"cache", {row.cache}},
            {"op", {row.op}},
            {"cache_dtype", {row.cache_dtype}}};
}

// The column names: those of any row's cells.
std::vector<std::string> column_names() {
    std::vector<std::string> names;
    for (const auto& [name, cell] : cells_of(Row{})) names.push_back(name);
    return names;
}

void write_table(std::ostream& out, const std::vector<Cells>& rows) {
    const std::vector<std::string> columns = column_names();
    std::vector<size_t> widths;
    std::vector<bool> right(columns.size(), false);
    for (const std::string& name : columns) widths.push_back(name.size());
    for (const Cells& row : rows)
        for (size_t c = 0; c < row.size(); ++c) {
            widths[c] = std::max(widths[c], std::max<size_t>(row[c].second.text.size(), 1));
            right[c] = right[c] || (row[c].second.number && !row[c].second.text.empty());
        }
    auto line = [&](auto text_of) {
        std::string text;
        for (size_t c = 0; c < columns.size(); ++c) {
            const std::string cell = text_of(c).empty() ? "-" : text_of(c);
            const std::string pad(widths[c] - cell.size(), ' ');
            text += (c ? "  " : "") + (right[c] ? pad + cell : cell + (c + 1 < columns.size() ? pad : ""));
        }
        out << text << "\n";
    };
    line([&](size_t c) { return columns[c]; });
    for (const Cells& row : rows) line([&](size_t c) { return row[c].second.text; });
}

// RFC 4180: a field with a comma, quote or line break is quoted, its quotes doubled.
std::string csv_field(const std::string& text) {
    if (text.find_first_of(",\"\n\r") == std::string::npos) return text;
    std::string quoted = "\"";
    for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
    return quoted + "\"";
}

}  // namespace

void write_rows(std::ostream& out, const std::vector<Row>& rows, const std::string& format,
                const std::string& preamble) {
    std::vector<Cells> cells;
    for (const Row& row : rows) cells.push_back(cells_of(row));
    if (format == "table") {
        out << preamble << "\n";
        write_table(out, cells);
    } else {  // csv
        const std::vector<std::string> columns = column_names();
        for (size_t c = 0; c < columns.size(); ++c) out << (c ? "," : "") << columns[c];
        out << "\n";
        for (const Cells& row : cells) {
            for (size_t c = 0; c < row.size(); ++c) out << (c ? "," : "") << csv_field(row[c].second.text);
            out << "\n";
        }
    }
}

}  // namespace rope_bench
