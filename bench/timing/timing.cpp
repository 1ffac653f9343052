// The device-independent part of the timing method (see timing.hpp).
#include "timing.hpp"

#include <algorithm>
#include <cstdio>

namespace rope_bench {

double median(std::vector<double> values) {
    const auto middle = values.begin() + std::ptrdiff_t(values.size() / 2);
    std::nth_element(values.begin(), middle, values.end());
    return *middle;
}

std::string Ceiling::describe() const {
    std::string text;
    for (const CeilingCandidate& candidate : candidates) {
        char us[32];
        std::snprintf(us, sizeof us, "%.2f", candidate.us);
        text += (text.empty() ? "" : ";") + candidate.name + "=" + us;
    }
    return text;
}

Ceiling fastest(std::vector<CeilingCandidate> candidates) {
    const auto best = std::min_element(candidates.begin(), candidates.end(),
                                       [](const auto& a, const auto& b) { return a.us < b.us; });
    return {best->us, best->name, std::move(candidates)};
}

Summary summarize(const std::vector<Measurement>& runs) {
    std::vector<const Measurement*> by_ratio;
    for (const Measurement& run : runs) by_ratio.push_back(&run);
    std::sort(by_ratio.begin(), by_ratio.end(), [](const Measurement* a, const Measurement* b) {
        return a->percent_of_copy() < b->percent_of_copy();
    });
    Summary summary;
    summary.reported = *by_ratio[by_ratio.size() / 2];  // The same middle as median().
    summary.runs = int(runs.size());
    summary.pct_min = by_ratio.front()->percent_of_copy();
    summary.pct_max = by_ratio.back()->percent_of_copy();
    return summary;
}

int64_t sets_spanning_twice(std::size_t set_bytes, std::size_t cache_bytes) {
    const std::size_t bytes = std::max<std::size_t>(set_bytes, 1);
    return std::clamp<int64_t>(int64_t((2 * cache_bytes + bytes - 1) / bytes), 1, int64_t(1) << 16);
}

std::size_t set_stride(std::size_t set_bytes) { return (set_bytes + 255) / 256 * 256; }

}  // namespace rope_bench
