// The backend registry: one table of every backend, whether or not this build
// or this machine can run it, so users always see the full picture and why a
// backend is missing.
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "rope/detail/backend_factories.hpp"
#include "rope/detail/plan.hpp"
#include "rope/device.hpp"
#include "rope/error.hpp"

namespace rope {
namespace {

struct Entry {
    BackendInfo info;
    std::function<std::unique_ptr<Backend>(const BackendOptions&)> create;  // Empty when unavailable.
};

std::vector<Entry> registry() {
    std::vector<Entry> entries;
    entries.push_back({{"cpu-naive", "plain loops that follow the formula: the readable specification",
                        Device::host, true, ""},
                       [](const BackendOptions&) { return make_cpu_naive_backend(); }});
#if ROPE_HAVE_EIGEN
    entries.push_back({{"cpu-eigen", "Eigen arrays and OpenMP threads, cos/sin reused across heads",
                        Device::host, true, ""},
                       [](const BackendOptions& options) { return make_cpu_eigen_backend(options); }});
#else
    entries.push_back({{"cpu-eigen", "Eigen arrays and OpenMP threads, cos/sin reused across heads",
                        Device::host, false, "built without Eigen/OpenMP"},
                       nullptr});
#endif
    const std::string cuda_reason = cuda_unavailable_reason();
    const bool cuda_ok = cuda_reason.empty();
    std::function<std::unique_ptr<Backend>(const BackendOptions&)> naive, optimized;
#if ROPE_HAVE_CUDA
    if (cuda_ok) {
        naive = [](const BackendOptions&) { return make_cuda_naive_backend(); };
        optimized = [](const BackendOptions&) { return make_cuda_optimized_backend(); };
    }
#endif
    entries.push_back({{"cuda-naive", "the direct CUDA port: one thread per rotated pair", Device::cuda,
                        cuda_ok, cuda_reason},
                       naive});
    entries.push_back({{"cuda-optimized", "coalesced 16-byte pair access, cos/sin shared across heads",
                        Device::cuda, cuda_ok, cuda_reason},
                       optimized});
    return entries;
}

std::string known_names() {
    std::string names;
    for (const Entry& entry : registry()) names += (names.empty() ? "" : ", ") + entry.info.name;
    return names;
}

// --- The frequency table of a configuration, shared by its calls ----------------------------
// A program calls rope::apply with one configuration (or a few, one per layer type) again and
// again, and each configuration's theta_i (a pow per pair) are the same on every call: they are
// built on a configuration's first call and kept. The tables are immutable and shared
// (shared_ptr: one evicted from the cache stays valid for a call still using it); a calling
// thread's last configuration and table are compared first, without the lock. Bounded: at most
// kCachedConfigs tables, each of at most kMaxCachedPairs pairs; a configuration beyond that, or
// one whose table depends on the call (dynamic, longrope), gets its table built per call.
using SharedTable = std::shared_ptr<const FrequencyTable>;
constexpr size_t kCachedConfigs = 16;
constexpr int64_t kMaxCachedPairs = 4096;

// Every field of RopeConfig as bytes: two configurations with the same key have the same table.
// A field added to RopeConfig is added here too.
void config_bytes(const RopeConfig& config, std::string& key) {
    key.clear();
    auto put = [&key](const auto& value) { key.append(reinterpret_cast<const char*>(&value), sizeof value); };
    auto put_all = [&](const auto& values) {
        put(values.size());
        for (const auto& value : values) put(value);
    };
    const Scaling& s = config.scaling;
    put(config.head_dim), put(config.rotary_dim), put(config.base), put(config.style), put(config.precise_angles);
    put(s.type), put(s.factor), put(s.original_max_position_embeddings), put(s.attention_factor.has_value());
    put(s.attention_factor.value_or(0.0)), put(s.beta_fast), put(s.beta_slow), put(s.truncate), put(s.mscale);
    put(s.mscale_all_dim), put(s.low_freq_factor), put(s.high_freq_factor), put_all(s.short_factor);
    put_all(s.long_factor), put(config.multi_axis.assignment), put_all(config.multi_axis.sections);
}

// The shared table of @p config, or null where make_plan must build the call's own.
SharedTable shared_frequency_table(const RopeConfig& config) {
    const int64_t pairs = config.effective_rotary_dim() / 2;
    if (config.scaling.type == ScalingType::dynamic || config.scaling.type == ScalingType::longrope || pairs <= 0 ||
        pairs > kMaxCachedPairs)
        return nullptr;  // make_plan builds the table (or refuses the configuration).
    thread_local std::string key, last_key;
    thread_local SharedTable last;
    config_bytes(config, key);
    if (last != nullptr && key == last_key) return last;

    static std::mutex mutex;
    static std::vector<std::pair<std::string, SharedTable>> tables;
    static size_t next = 0;  // The entry replaced when the cache is full (the oldest added).
    auto remember = [&](SharedTable table) {
        last_key = key;
        last = std::move(table);
        return last;
    };
    auto find = [&]() -> SharedTable {
        for (const auto& [bytes, table] : tables)
            if (bytes == key) return table;
        return nullptr;
    };
    {
        std::lock_guard<std::mutex> lock(mutex);
        if (SharedTable found = find()) return remember(std::move(found));
    }
    // Built outside the lock, so no other call waits for it. validate() runs first here, and
    // throws what make_plan's would for an invalid configuration.
    std::optional<FrequencyTable> built = detail::reusable_frequency_table(config);
    SharedTable table = std::make_shared<const FrequencyTable>(std::move(*built));
    std::lock_guard<std::mutex> lock(mutex);
    if (SharedTable found = find()) return remember(std::move(found));  // Another thread was first.
    if (tables.size() < kCachedConfigs) {
        tables.emplace_back(key, table);
    } else {
        tables[next] = {key, table};
        next = (next + 1) % kCachedConfigs;
    }
    return remember(std::move(table));
}

}  // namespace

std::vector<BackendInfo> list_backends() {
    std::vector<BackendInfo> infos;
    for (const Entry& entry : registry()) infos.push_back(entry.info);
    return infos;
}

BackendInfo backend_info(std::string_view name) {
    for (const Entry& entry : registry())
        if (entry.info.name == name) return entry.info;
    fail("backend", std::string(name), "unknown; known backends: " + known_names());
}

std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options) {
    if (options.threads < 0) fail("threads", options.threads, "must be >= 0 (0 follows OMP_NUM_THREADS)");
    for (const Entry& entry : registry()) {
        if (entry.info.name != name) continue;
        if (!entry.info.available || !entry.create) fail("backend", std::string(name), "unavailable: " + entry.info.reason);
        return entry.create(options);
    }
    fail("backend", std::string(name), "unknown; known backends: " + known_names());
}

// The one check of whether @p backend can run @p plan, against the limits it declares.
void check_supported(const Backend& backend, const Plan& plan) {
    const BackendLimits limits = backend.limits();
    if (plan.rotary_dim > limits.max_rotary_dim)
        fail("rotary_dim", plan.rotary_dim,
             backend.name() + " accepts rotary_dim <= " + std::to_string(limits.max_rotary_dim));
}

void detail::run_plan(Backend& backend, const Plan& plan) {
    check_supported(backend, plan);
    if (plan.empty()) return;  // An empty tensor is a valid no-op.
    if (plan.rotary_offset == 0) return backend.run(plan);
    for (const Plan& part : detail::window_parts(plan)) backend.run(part);
}

void apply(Backend& backend, const RopeConfig& config, const RopeArgs& args) {
    const SharedTable frequencies = shared_frequency_table(config);
    detail::run_plan(backend, make_plan(config, args, backend.device(), frequencies.get()));
}

}  // namespace rope
