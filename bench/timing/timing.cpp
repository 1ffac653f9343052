// The timing method's device-independent part and the host's clock, cache and ceilings (see timing.hpp).
#include "timing.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>

#include <unistd.h>
#if defined(__linux__)
#include <sched.h>
#endif
#if ROPE_BENCH_OPENMP
#include <omp.h>
#endif

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

namespace {

constexpr std::size_t kMiB = std::size_t(1) << 20;

// The first line of a small text file, or "" if it cannot be read.
std::string first_line(const std::string& path) {
    std::ifstream file(path);
    std::string line;
    std::getline(file, line);
    return line;
}

// A sysfs cache size such as "32768K" or "1M" in bytes; 0 if unreadable.
std::size_t parse_cache_size(const std::string& text) {
    char* end = nullptr;
    const unsigned long long value = std::strtoull(text.c_str(), &end, 10);
    if (end == text.c_str()) return 0;
    const char unit = *end;
    const std::size_t scale = unit == 'K' ? 1024 : unit == 'M' ? kMiB : unit == 'G' ? kMiB * 1024 : 1;
    return std::size_t(value) * scale;
}

std::string mib_text(std::size_t bytes) {
    const double mib = double(bytes) / double(kMiB);
    char text[32];
    std::snprintf(text, sizeof text, mib == double(int64_t(mib)) ? "%.0f MiB" : "%.2f MiB", mib);
    return text;
}

// The highest-level data or unified cache of the CPUs this process may run on,
// each instance (a distinct shared_cpu_list) counted once. Empty if sysfs says nothing.
CacheSize cache_from_sysfs() {
#if defined(__linux__)
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (sched_getaffinity(0, sizeof allowed, &allowed) != 0) return {};
    long level = 0;
    std::map<std::string, std::size_t> instances;  // shared_cpu_list -> size.
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
        if (!CPU_ISSET(cpu, &allowed)) continue;
        for (int index = 0;; ++index) {
            const std::string dir =
                "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/cache/index" + std::to_string(index) + "/";
            const std::string level_text = first_line(dir + "level");
            if (level_text.empty()) break;
            if (first_line(dir + "type") == "Instruction") continue;
            const long this_level = std::strtol(level_text.c_str(), nullptr, 10);
            const std::size_t size = parse_cache_size(first_line(dir + "size"));
            if (this_level < level || size == 0) continue;
            if (this_level > level) instances.clear();
            level = this_level;
            instances[first_line(dir + "shared_cpu_list")] = size;
        }
    }
    if (instances.empty()) return {};
    CacheSize cache;
    std::string cpus;
    for (const auto& [shared_cpu_list, size] : instances) {
        cache.bytes += size;
        cpus += (cpus.empty() ? "" : "; ") + shared_cpu_list;
    }
    cache.source = "sysfs: L" + std::to_string(level) + " " + mib_text(instances.begin()->second) + " x " +
                   std::to_string(instances.size()) + " instance" + (instances.size() > 1 ? "s" : "") + " (cpus " +
                   cpus + ")";
    return cache;
#else
    return {};
#endif
}

// glibc's sysconf answers from CPUID, which a VM passes through from its host: capped.
CacheSize cache_from_sysconf() {
    constexpr std::size_t kCap = 256 * kMiB;
#if defined(_SC_LEVEL3_CACHE_SIZE) && defined(_SC_LEVEL2_CACHE_SIZE)
    for (const auto& [name, label] : {std::pair{_SC_LEVEL3_CACHE_SIZE, "_SC_LEVEL3_CACHE_SIZE"},
                                      std::pair{_SC_LEVEL2_CACHE_SIZE, "_SC_LEVEL2_CACHE_SIZE"}}) {
        const long bytes = sysconf(name);
        if (bytes <= 0) continue;
        const std::size_t reported = std::size_t(bytes);
        return {std::min(reported, kCap), std::string("sysconf(") + label + ") = " + mib_text(reported) +
                                              " (glibc reads CPUID)" + (reported > kCap ? ", capped at 256 MiB" : "")};
    }
#endif
    return {};
}

// Each of `threads` threads calls body(begin, end) on its share of [0, bytes),
// shares cut at multiples of 64 bytes (a cache line).
template <typename Body>
void in_parallel_shares([[maybe_unused]] int threads, std::size_t bytes, Body&& body) {
#if ROPE_BENCH_OPENMP
#pragma omp parallel num_threads(threads)
    {
        const std::size_t count = std::size_t(omp_get_num_threads());
        const std::size_t share = bytes / count / 64 * 64;
        const std::size_t index = std::size_t(omp_get_thread_num());
        body(share * index, index + 1 == count ? bytes : share * (index + 1));
    }
#else
    body(std::size_t(0), bytes);
#endif
}

// Zero at run time; volatile, so the compiler cannot prove the XOR does nothing.
volatile uint64_t g_read_modify_write_mask = 0;

// Microseconds that work(call) takes, on std::chrono::steady_clock.
double host_us(const std::function<void(int64_t)>& work, int64_t call) {
    const auto start = std::chrono::steady_clock::now();
    work(call);
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
}

// Copies `bytes` from `from` to `to`, each of `threads` threads a share.
void parallel_memcpy(void* to, const void* from, std::size_t bytes, int threads) {
    in_parallel_shares(threads, bytes, [&](std::size_t begin, std::size_t end) {
        std::memcpy(static_cast<char*>(to) + begin, static_cast<const char*>(from) + begin, end - begin);
    });
}

// Loads and stores back every 8-byte word of `data` (8-byte aligned), XORed with the mask: the data is
// unchanged. Each of `threads` threads takes a share.
void parallel_read_modify_write(void* data, std::size_t bytes, int threads) {
    const uint64_t mask = g_read_modify_write_mask;
    unsigned char* const base = static_cast<unsigned char*>(data);
    in_parallel_shares(threads, bytes, [base, mask](std::size_t begin, std::size_t end) {
        // Local copies: the stores below could alias the lambda's own members, so the
        // compiler would reload them after every store and keep the loop scalar.
        unsigned char* const at = base;
        const uint64_t flip = mask;
        // The share is walked as 4 stretches side by side, 512 bytes of each in turn,
        // as cpu-eigen walks 4 heads a visit of its rows at a time: the hardware prefetcher
        // then follows 4 streams at once. On the project's 2-core VM one stream per thread moved
        // the bytes about 20% slower, a ceiling that cpu-eigen's in-place calls beat.
        constexpr std::size_t kStretches = 4, kStep = 512;
        const std::size_t stretch = (end - begin) / kStretches / kStep * kStep;
        for (std::size_t step = 0; step < stretch; step += kStep) {
            for (std::size_t s = 0; s < kStretches; ++s) {
                unsigned char* const row = at + begin + s * stretch + step;
                for (std::size_t i = 0; i < kStep; i += 8) {  // memcpy in and out: no aliasing rule broken.
                    uint64_t word;
                    std::memcpy(&word, row + i, 8);
                    word ^= flip;
                    std::memcpy(row + i, &word, 8);
                }
            }
        }
        for (std::size_t i = begin + kStretches * stretch; i < end; ++i) at[i] ^= static_cast<unsigned char>(flip);
    });
}

}  // namespace

CacheSize host_last_level_cache() {
    constexpr std::size_t kSysfsCap = 1024 * kMiB;  // Sets spanning twice this take 2 GiB, and their copy as much.
    if (CacheSize cache = cache_from_sysfs(); cache.bytes > 0) {
        if (cache.bytes > kSysfsCap) {
            cache.bytes = kSysfsCap;
            cache.source += ", capped at 1 GiB";
        }
        return cache;
    }
    if (CacheSize cache = cache_from_sysconf(); cache.bytes > 0) return cache;
    return {32 * kMiB, "assumed 32 MiB (neither sysfs nor sysconf reports a cache)"};
}

Measurement host_measure(const std::function<void(int64_t)>& call, const Sets& sets, int threads, int reps) {
    auto memcpy_pass = [&](int64_t s) {
        parallel_memcpy(sets.at(sets.copy_destination, s), sets.at(sets.inputs, s), sets.set_bytes, threads);
    };
    auto read_modify_write_pass = [&](int64_t s) {
        parallel_read_modify_write(sets.at(sets.inputs, s), sets.set_bytes, threads);
    };
    // The passes take the sets in turn (timing.hpp: why).
    std::vector<double> warmup_us;
    for (int64_t r = 0; r < sets.sets; ++r) {
        warmup_us.push_back(host_us(call, 3 * r));
        host_us(memcpy_pass, 3 * r + 1);
        host_us(read_modify_write_pass, 3 * r + 2);
    }
    Measurement measurement;
    measurement.reps = reps > 0 ? reps : std::clamp(int(1e6 / std::max(median(warmup_us), 1e-3)), 15, 2000);
    std::vector<double> call_us, memcpy_us, read_modify_write_us;
    for (int64_t r = sets.sets; r < sets.sets + measurement.reps; ++r) {
        call_us.push_back(host_us(call, 3 * r));
        memcpy_us.push_back(host_us(memcpy_pass, 3 * r + 1));
        read_modify_write_us.push_back(host_us(read_modify_write_pass, 3 * r + 2));
    }
    measurement.call_us = median(call_us);
    measurement.ceiling = fastest({{"memcpy", median(memcpy_us)}, {"rmw", median(read_modify_write_us)}});
    return measurement;
}

}  // namespace rope_bench
