// rope-bench's one writer (see report.hpp).
#include "report.hpp"

#include <algorithm>
#include <cstdio>

namespace rope_bench {
namespace {

// The columns, in order. The first 18 are the original ones; later columns are
// appended, so that existing consumers keep their column positions.
//   sets         sets of q and k the calls rotate through (spanning twice `cache`)
//   calls        timed repetitions per run (GPU: each a batch of calls >= 1 ms)
//   median_us    median time of one call, of the reported run
//   GBps         bytes moved / median_us; copy_GBps: the same bytes / the ceiling's time
//   pct_of_copy  100 x ceiling time / call time, of the reported run (the median ratio)
//   status       ok, or "skipped: why" / "unsupported: why" (then the numbers are empty)
//   timing       clock (host), events or graph (GPU)
//   form         plain, packed, mrope, axial; cp and table alone or joined with '+'
//   runs         whole measurements; pct_min, pct_max: their smallest and largest ratio
//   ceiling      which copy was fastest; ceilings: every candidate's median microseconds
//   form_detail  the form's contents (lengths, grid, sections, shard, table size)
//   cache        the cache the sets defeat, and what it was read from
const std::vector<std::string> kColumns{
    "backend", "shape", "kv_heads", "dtype", "style", "layout", "placement", "threads", "sets", "calls",
    "median_us", "GBps", "copy_GBps", "pct_of_copy", "status", "precise", "position_offset", "timing",
    // Position forms, the spread over runs, and which copy was the ceiling.
    "form", "runs", "pct_min", "pct_max", "ceiling", "form_detail", "ceilings", "cache"};

struct Cell {
    std::string text;
    bool number = false;  // Right-aligned in a table, unquoted in JSON (null when empty).
};

std::string fixed(double value, int decimals) {
    char text[64];
    std::snprintf(text, sizeof text, "%.*f", decimals, value);
    return text;
}

std::vector<Cell> cells_of(const Row& row) {
    const bool ran = row.not_run.empty();
    const Measurement& m = row.summary.reported;
    auto number = [&](const std::string& text) { return Cell{ran ? text : "", true}; };
    auto gbps = [&](double us) { return fixed(row.bytes / (us * 1e3), 1); };
    return {{row.backend},
            {row.shape},
            {std::to_string(row.kv_heads), true},
            {row.dtype},
            {row.style},
            {row.layout},
            {row.placement},
            {row.threads, row.threads != "-"},
            number(std::to_string(row.sets)),
            number(std::to_string(m.reps)),
            number(fixed(m.call_us, m.call_us < 100 ? 2 : 1)),
            number(gbps(m.call_us)),
            number(gbps(m.ceiling.us)),
            number(fixed(m.percent_of_copy(), 1)),
            {ran ? "ok" : row.not_run},
            {row.precise ? "1" : "0", true},
            {std::to_string(row.position_offset), true},
            {row.timing},
            {row.form},
            number(std::to_string(row.summary.runs)),
            number(fixed(row.summary.pct_min, 1)),
            number(fixed(row.summary.pct_max, 1)),
            {ran ? m.ceiling.name : ""},
            {row.form_detail},
            {ran ? m.ceiling.describe() : ""},
            {row.cache}};
}

void write_table(std::ostream& out, const std::vector<std::vector<Cell>>& rows) {
    std::vector<size_t> widths;
    std::vector<bool> right(kColumns.size(), false);
    for (const std::string& column : kColumns) widths.push_back(column.size());
    for (const auto& row : rows)
        for (size_t c = 0; c < row.size(); ++c) {
            widths[c] = std::max(widths[c], std::max<size_t>(row[c].text.size(), 1));
            right[c] = right[c] || (row[c].number && !row[c].text.empty());
        }
    auto line = [&](const std::vector<std::string>& texts) {
        std::string text;
        for (size_t c = 0; c < texts.size(); ++c) {
            const std::string cell = texts[c].empty() ? "-" : texts[c];
            const std::string pad(widths[c] - cell.size(), ' ');
            text += (c ? "  " : "") + (right[c] ? pad + cell : cell + (c + 1 < texts.size() ? pad : ""));
        }
        out << text << "\n";
    };
    line(kColumns);
    for (const auto& row : rows) {
        std::vector<std::string> texts;
        for (const Cell& cell : row) texts.push_back(cell.text);
        line(texts);
    }
}

// RFC 4180: a field with a comma, quote or line break is quoted, its quotes doubled.
std::string csv_field(const std::string& text) {
    if (text.find_first_of(",\"\n\r") == std::string::npos) return text;
    std::string quoted = "\"";
    for (char c : text) quoted += c == '"' ? std::string("\"\"") : std::string(1, c);
    return quoted + "\"";
}

void write_csv(std::ostream& out, const std::vector<std::vector<Cell>>& rows) {
    for (size_t c = 0; c < kColumns.size(); ++c) out << (c ? "," : "") << kColumns[c];
    out << "\n";
    for (const auto& row : rows) {
        for (size_t c = 0; c < row.size(); ++c) out << (c ? "," : "") << csv_field(row[c].text);
        out << "\n";
    }
}

// A JSON string literal (error messages may hold quotes or backslashes).
std::string json_string(const std::string& text) {
    std::string quoted = "\"";
    for (char c : text) {
        if (c == '"' || c == '\\') {
            quoted += '\\';
            quoted += c;
        } else if (static_cast<unsigned char>(c) < 0x20) {
            char escaped[8];
            std::snprintf(escaped, sizeof escaped, "\\u%04x", unsigned(static_cast<unsigned char>(c)));
            quoted += escaped;
        } else {
            quoted += c;
        }
    }
    return quoted + "\"";
}

void write_json(std::ostream& out, const std::vector<std::vector<Cell>>& rows) {
    out << "[\n";
    for (size_t r = 0; r < rows.size(); ++r) {
        out << "  {";
        for (size_t c = 0; c < rows[r].size(); ++c) {
            const Cell& cell = rows[r][c];
            const std::string value = cell.number ? (cell.text.empty() ? "null" : cell.text) : json_string(cell.text);
            out << (c ? ", " : "") << "\"" << kColumns[c] << "\": " << value;
        }
        out << (r + 1 < rows.size() ? "},\n" : "}\n");
    }
    out << "]\n";
}

}  // namespace

void write_rows(std::ostream& out, const std::vector<Row>& rows, const std::string& format, const std::string& preamble) {
    std::vector<std::vector<Cell>> cells;
    for (const Row& row : rows) cells.push_back(cells_of(row));
    if (format == "csv") {
        write_csv(out, cells);
    } else if (format == "json") {
        write_json(out, cells);
    } else {
        out << preamble << "\n";
        write_table(out, cells);
    }
}

}  // namespace rope_bench
