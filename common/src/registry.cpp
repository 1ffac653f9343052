// The backend registry: one table of every backend, whether or not this build
// or this machine can run it, so users always see the full picture and why a
// backend is missing.
#include <functional>
#include <string>

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
    detail::run_plan(backend, make_plan(config, args, backend.device()));
}

}  // namespace rope
