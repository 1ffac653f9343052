#pragma once
/// @file backend.hpp
/// @brief The backend interface, the registry that creates backends by name, and rope::apply.

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "rope/args.hpp"
#include "rope/config.hpp"
#include "rope/kv_append.hpp"
#include "rope/tensor.hpp"

namespace rope {

struct Plan;  // A validated call (rope/detail/plan.hpp): what backends run, built by rope::apply().
struct QkNormPlan;  // A validated fused QK-norm + RoPE call (rope/detail/qk_norm_plan.hpp), built by apply_qk_norm().
struct KvAppendPlan;  // A validated RoPE + KV append (rope/detail/kv_append_plan.hpp), built by rope::append_kv().

/// @brief What a backend can run, declared once; rope::apply() checks every call against it.
struct BackendLimits {
    /// Largest rotary_dim the backend accepts (the CUDA backends carry the
    /// frequency table inside their kernel parameters, which have a fixed size).
    int64_t max_rotary_dim = std::numeric_limits<int64_t>::max();
};

/// @brief Options for creating a backend.
struct BackendOptions {
    /// Worker threads for multi-threaded CPU backends; 0 follows OMP_NUM_THREADS
    /// (or the OpenMP default). Ignored by single-threaded and GPU backends.
    int threads = 0;
};

/// @brief One implementation of RoPE. Create it with make_backend().
///
/// A backend only runs validated Plans; rope::apply() does the validation, so
/// all backends reject bad input in exactly the same way.
///
/// Concurrency: every built-in backend object may be called from several
/// threads at once (it keeps no state between calls that another call could
/// disturb); the registry functions may be called concurrently too. The rules,
/// and how they are tested: @ref api_guide_concurrency.
class Backend {
public:
    virtual ~Backend() = default;
    /// @brief Registry name, e.g. "cpu-naive".
    /// @return the name make_backend() knows this backend by.
    virtual std::string name() const = 0;
    /// @brief Where this backend expects q, k, outputs and position ids to live.
    /// @return Device::host for CPU backends, Device::cuda for CUDA backends.
    virtual Device device() const = 0;
    /// @brief What this backend can run; apply() refuses, naming the parameter, any call beyond it.
    /// @return the backend's limits (none, unless it overrides this).
    virtual BackendLimits limits() const { return {}; }
    /// @brief Executes @p plan. Device backends enqueue on plan.stream and return
    /// without synchronising.
    /// @param plan a validated, non-empty call, built by make_plan() for this backend's device().
    virtual void run(const Plan& plan) = 0;
    /// @brief Executes a fused QK-norm + RoPE call (rope/qk_norm.hpp); as run(), on plan.rope.stream.
    /// The built-in backends all override it; the default refuses (a rope::Error naming the backend).
    /// @param plan a validated, non-empty call, built by make_qk_norm_plan() for this backend's device().
    virtual void run_qk_norm(const QkNormPlan& plan);
    /// @brief Executes a RoPE + KV append (rope::append_kv). Device backends enqueue on
    /// plan.rope.stream and return without synchronising. Every built-in backend overrides it;
    /// the default refuses the call with a rope::Error naming the backend.
    /// @param plan a validated, non-empty call, built by make_kv_append_plan() for this backend's device().
    virtual void run_kv_append(const KvAppendPlan& plan);
    /// @brief Executes a re-rotation of cache rows (rope::rerotate_cache): for each entry t with
    /// plan.slot_of(t) >= 0, the rows of that slot in plan.k_cache turned by plan.rope's angle
    /// rule at token t (relative positions; plan.rope's q, k, v and v_cache are not read).
    /// Device backends enqueue on plan.rope.stream. Every built-in backend overrides it; the
    /// default refuses the call with a rope::Error naming the backend.
    /// @param plan a validated, non-empty call, built by rope::rerotate_cache for this backend's device().
    virtual void run_rerotate_cache(const KvAppendPlan& plan);
};

/// @brief What the registry knows about one backend.
struct BackendInfo {
    std::string name;         ///< Registry name, e.g. "cuda-optimized".
    std::string description;  ///< One line on what it is.
    Device device;            ///< Where its tensors live.
    bool available;           ///< Whether make_backend() can create it on this machine.
    std::string reason;       ///< Why it is unavailable (empty when available).
};

/// @brief Every backend rope knows, available on this machine or not, in teaching order.
/// @return one BackendInfo per backend: cpu-naive, cpu-eigen, cuda-naive, cuda-optimized.
std::vector<BackendInfo> list_backends();

/// @brief Information on the backend called @p name.
/// @param name registry name, e.g. "cuda-optimized".
/// @return its entry of list_backends(), including whether it is available here and why not.
/// @throws rope::Error if no backend has that name.
BackendInfo backend_info(std::string_view name);

/// @brief Creates the backend called @p name ("cpu-naive", "cpu-eigen", "cuda-naive", "cuda-optimized").
/// @param name registry name of the backend.
/// @param options creation options (worker threads); threads must be >= 0.
/// @return the new backend, owned by the caller.
/// @throws rope::Error if the name is unknown, the backend is unavailable here (with the reason),
/// or options.threads is negative.
std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options = {});

/// @brief Validates the call and runs it on @p backend: the library's main entry point.
///
/// An empty tensor is a valid no-op. On error nothing is written. The frequency table of
/// @p config is built on its first call and kept for the calls that follow (a bounded cache
/// shared by all threads; see the concurrency section of the API guide).
/// @param backend the backend that runs the call; its device() must be where the tensors live.
/// @param config the model's RoPE: pairing style, dimensions, base and scaling.
/// @param args the tensors, positions, direction and stream of this call.
/// @throws rope::Error naming the offending parameter and its value.
void apply(Backend& backend, const RopeConfig& config, const RopeArgs& args);

}  // namespace rope
