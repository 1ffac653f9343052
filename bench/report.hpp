#pragma once
/// @file report.hpp
/// @brief rope-bench's results: one row type, one writer for both formats (an aligned table, CSV), the same
/// columns in the same order in both.

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "timing.hpp"

namespace rope_bench {

/// @brief One backend on one shape, form and thread count.
struct Row {
    std::string backend;
    std::string shape;      ///< "B,H,N,D" as given.
    int64_t kv_heads = 0;
    std::string dtype, style, layout, placement;
    std::string threads;    ///< Resolved count for CPU backends, "-" for GPU backends.
    std::string timing;     ///< How calls were timed: "clock" (host), "events" or "graph" (GPU).
    bool precise = false;
    int64_t position_offset = 0;
    std::string form;       ///< plain, packed, cp, mrope, axial, ids, table, or several joined by '+'.
    std::string form_detail;
    std::string cache;      ///< The cache the sets span twice: "32 MiB (sysfs: L3 ...)".
    std::string not_run;    ///< Why it did not run ("skipped: ...", "unsupported: ..."); empty when it ran.
    int64_t sets = 0;       ///< Sets of q and k the calls rotate through.
    double bytes = 0;       ///< Bytes one call moves: q and k read once and written once.
    Summary summary;        ///< The measurement, when it ran.
    /// rope; append (RoPE + KV append, fused) or append-unfused (RoPE, then a scatter); qknorm (QK-RMSNorm +
    /// RoPE, fused) or qknorm-unfused (RMSNorm of q and of k, then RoPE); rerotate (rope::rerotate of keys).
    std::string op = "rope";
    std::string cache_dtype;  ///< --op append: what the KV caches store (model, e4m3fn, e5m2); else empty.
};

/// @brief Writes @p rows in @p format ("table" or "csv") to @p out; a table is preceded by
/// @p preamble (comment lines on the method and the machine).
void write_rows(std::ostream& out, const std::vector<Row>& rows, const std::string& format,
                const std::string& preamble);

}  // namespace rope_bench
