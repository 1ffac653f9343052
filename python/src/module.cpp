// rope._rope: the C++ library, reached from Python.
//
// The module is thin on purpose: the C++ structs appear under their own names
// (RopeConfig, Scaling, BackendInfo), arrays cross through DLPack without a
// copy (dlpack_views.hpp), and one function, apply(), assembles rope::RopeArgs
// and calls rope::apply. What is Python's business (HuggingFace dicts, keyword
// defaults, streams of PyTorch and CuPy, bfloat16 NumPy arrays) lives in the
// pure-Python package rope/ on top of it.
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#if ROPE_PYTHON_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

#include <rope/rope.hpp>

#include "dlpack_views.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace rope_python {
namespace {

// --- Backends: one object per name, shared ---------------------------------------
// rope's built-in backend objects may be called from several threads at once
// (rope/backend.hpp), so one per name serves every Python thread; creating one
// per call would cost an allocation (and, for CUDA, more) on every call.
rope::Backend& backend_named(const std::string& name) {
    static std::mutex mutex;
    static std::map<std::string, std::unique_ptr<rope::Backend>> backends;
    std::lock_guard<std::mutex> lock(mutex);
    std::unique_ptr<rope::Backend>& backend = backends[name];
    if (!backend) backend = rope::make_backend(name);  // Throws rope::Error for unknown or unavailable names.
    return *backend;
}

// The default backend for a call whose tensors live on @p device.
std::string default_backend(rope::Device device) {
    if (device == rope::Device::cuda) return "cuda-optimized";
    return rope::backend_info("cpu-eigen").available ? "cpu-eigen" : "cpu-naive";
}

// --- The CUDA device of a call ------------------------------------------------------
// rope's CUDA backends run on the current CUDA device. A PyTorch tensor on
// cuda:1 carries its device with it; the call makes that device current for
// its duration (as PyTorch's own device guard does) and puts it back after.
class CudaDeviceGuard {
public:
    explicit CudaDeviceGuard(int device) {
#if ROPE_PYTHON_HAVE_CUDA
        if (device < 0) return;
        if (cudaGetDevice(&previous_) != cudaSuccess) rope::fail("cuda device", device, "cudaGetDevice failed");
        if (previous_ != device && cudaSetDevice(device) != cudaSuccess)
            rope::fail("cuda device", device, "cudaSetDevice failed");
        if (previous_ == device) previous_ = -1;
#else
        (void)device;
#endif
    }
    ~CudaDeviceGuard() {
#if ROPE_PYTHON_HAVE_CUDA
        if (previous_ >= 0) cudaSetDevice(previous_);
#endif
    }
    CudaDeviceGuard(const CudaDeviceGuard&) = delete;
    CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

private:
    int previous_ = -1;
};

// Every CUDA array of one call must be on one device: the first one met names it.
struct CallDevice {
    std::string first_name;
    int cuda_device = -1;
    void add(const std::string& name, const Placement& placement) {
        if (placement.device != rope::Device::cuda) return;
        if (cuda_device < 0) {
            cuda_device = placement.cuda_device;
            first_name = name;
        } else if (placement.cuda_device != cuda_device) {
            rope::fail(name + ".device", "cuda:" + std::to_string(placement.cuda_device),
                       "must be on the CUDA device of " + first_name + " (cuda:" + std::to_string(cuda_device) + ")");
        }
    }
};

Placement placement_of_array(const std::string& name, const InputArray& array) {
    return placement_of(name, array.device_type(), array.device_id());
}
Placement placement_of_array(const std::string& name, const OutputArray& array) {
    return placement_of(name, array.device_type(), array.device_id());
}

// --- Positions --------------------------------------------------------------------------
// The forms of rope::Positions, from what Python passed: an offset, an ids
// array ([seq], [batch, seq], [axes, seq] or [axes, batch, seq]), packed
// sequences (cu_seqlens, starts), and a context-parallel shard of either.
struct PositionArrays {
    std::optional<InputArray> ids, cu_seqlens, starts;  // Kept alive for the call.
};

rope::Positions positions_of(const rope::RopeConfig& config, int64_t offset, nb::handle ids, nb::handle cu_seqlens,
                             nb::handle starts, int64_t cp_size, int64_t cp_rank, int64_t max_position,
                             PositionArrays& arrays, CallDevice& call_device) {
    rope::Positions positions = rope::Positions::starting_at(offset);
    if (!ids.is_none()) {
        arrays.ids = import_input("positions", ids);
        const IndexArray index = index_array("positions", *arrays.ids, 3);
        const int64_t axes = config.multi_axis.axes();
        // [seq] | [batch, seq] for one axis; [axes, seq] | [axes, batch, seq] for several.
        int64_t id_axes = 1, rows = 1, length = index.shape[size_t(index.ndim - 1)];
        if (index.ndim == 2 && axes == 1) rows = index.shape[0];
        if (index.ndim == 2 && axes > 1) id_axes = index.shape[0];
        if (index.ndim == 3) {
            id_axes = index.shape[0];
            rows = index.shape[1];
        }
        positions = rope::Positions::multi_axis(index.data, id_axes, rows, length, index.placement.device);
        call_device.add("positions", index.placement);
    }
    if (!cu_seqlens.is_none()) {
        arrays.cu_seqlens = import_input("cu_seqlens", cu_seqlens);
        const IndexArray cu = index_array("cu_seqlens", *arrays.cu_seqlens, 1);
        const int64_t* first_positions = nullptr;
        if (!starts.is_none()) {
            arrays.starts = import_input("starts", starts);
            const IndexArray s = index_array("starts", *arrays.starts, 1);
            if (s.shape[0] != cu.shape[0] - 1)
                rope::fail("starts.shape[0]", s.shape[0],
                           "must be len(cu_seqlens) - 1 = " + std::to_string(cu.shape[0] - 1) + " (one per sequence)");
            if (s.placement.device != cu.placement.device)
                rope::fail("starts.device", rope::device_name(s.placement.device),
                           "must be where cu_seqlens is (" + std::string(rope::device_name(cu.placement.device)) + ")");
            first_positions = s.data;
            call_device.add("starts", s.placement);
        }
        const rope::Positions packed =
            rope::Positions::packed(cu.data, cu.shape[0] - 1, first_positions, cu.placement.device);
        positions.cu_seqlens = packed.cu_seqlens;
        positions.sequences = packed.sequences;
        positions.starts = packed.starts;
        if (ids.is_none()) positions.device = packed.device;
        call_device.add("cu_seqlens", cu.placement);
    } else if (!starts.is_none()) {
        rope::fail("starts", "set", "is only read with cu_seqlens (packed sequences)");
    }
    positions.max_position = max_position;
    return positions.sharded(cp_size, cp_rank);
}

// --- apply -------------------------------------------------------------------------------
// One rope::apply call. q_out/k_out None: in place. k None: rotate q only.
// bfloat16_bits: bit 0 q, 1 k, 2 q_out, 3 k_out hold bfloat16 as uint16.
void apply(const std::string& backend_name, const rope::RopeConfig& config, nb::handle q, nb::handle k,
           nb::handle q_out, nb::handle k_out, const std::string& layout_name, int64_t offset, nb::handle ids,
           nb::handle cu_seqlens, nb::handle starts, int64_t cp_size, int64_t cp_rank, int64_t max_position,
           nb::handle cos_sin_cache, bool inverse, uintptr_t stream, int bfloat16_bits) {
    const rope::Layout layout = rope::parse_layout(layout_name);
    const bool in_place = q_out.is_none();
    if (in_place && !k_out.is_none()) rope::fail("out", "(None, k_out)", "give both outputs or neither");
    auto bits = [&](int operand) { return (bfloat16_bits >> operand & 1) != 0; };
    CallDevice call_device;

    // Every array stays imported (and its producer referenced) until the call returns.
    std::optional<InputArray> q_in, k_in;
    std::optional<OutputArray> q_written, k_written;
    rope::RopeArgs args;
    if (in_place) {
        q_written = import_output("q", q);
        args.q = tensor_view("q", *q_written, layout, bits(0));
        call_device.add("q", placement_of_array("q", *q_written));
        args.q_out = args.q;
    } else {
        q_in = import_input("q", q);
        q_written = import_output("out[0]", q_out);
        args.q = tensor_view("q", *q_in, layout, bits(0));
        args.q_out = tensor_view("out[0]", *q_written, layout, bits(2));
        call_device.add("q", placement_of_array("q", *q_in));
        call_device.add("out[0]", placement_of_array("out[0]", *q_written));
    }
    if (k.is_none()) {
        // Rotate q only: a k with no heads (rope's convention), same device.
        if (!k_out.is_none()) rope::fail("out[1]", "set", "must be None when k is None");
        args.k = args.q;
        args.k.data = nullptr;
        args.k.shape[layout == rope::Layout::bshd ? 2 : 1] = 0;
        args.k_out = args.k;
    } else if (in_place) {
        k_written = import_output("k", k);
        args.k = tensor_view("k", *k_written, layout, bits(1));
        call_device.add("k", placement_of_array("k", *k_written));
        args.k_out = args.k;
    } else {
        if (k_out.is_none()) rope::fail("out[1]", "None", "k needs an output too (out=(q_out, k_out))");
        k_in = import_input("k", k);
        k_written = import_output("out[1]", k_out);
        args.k = tensor_view("k", *k_in, layout, bits(1));
        args.k_out = tensor_view("out[1]", *k_written, layout, bits(3));
        call_device.add("k", placement_of_array("k", *k_in));
        call_device.add("out[1]", placement_of_array("out[1]", *k_written));
    }

    PositionArrays position_arrays;
    args.positions = positions_of(config, offset, ids, cu_seqlens, starts, cp_size, cp_rank, max_position,
                                  position_arrays, call_device);
    std::optional<InputArray> table;
    if (!cos_sin_cache.is_none()) {
        table = import_input("cos_sin_cache", cos_sin_cache);
        Placement placement;
        args.cos_sin_cache = rope_python::cos_sin_cache(*table, placement);
        call_device.add("cos_sin_cache", placement);
    }
    args.direction = inverse ? rope::Direction::inverse : rope::Direction::forward;
    args.stream = reinterpret_cast<void*>(stream);

    rope::Backend& backend = backend_named(backend_name.empty() ? default_backend(args.q.device) : backend_name);
    CudaDeviceGuard device_guard(backend.device() == rope::Device::cuda ? call_device.cuda_device : -1);
    // Long CPU calls must not stall other Python threads: the arrays are held above.
    nb::gil_scoped_release no_gil;
    rope::apply(backend, config, args);
}

}  // namespace
}  // namespace rope_python

NB_MODULE(_rope, m) {
    m.doc() = "rope's C++ library, reached through DLPack. Use the package rope, not this module.";

    // At interpreter exit PyTorch's operator registry still holds rope.ops (and
    // through its cache, RopeConfig objects): nanobind would report them as
    // leaks, which they are not.
    nb::set_leak_warnings(false);

    // rope::Error becomes rope.Error, a ValueError carrying the C++ message.
    nb::exception<rope::Error>(m, "Error", PyExc_ValueError);

    nb::enum_<rope::Style>(m, "Style", "Which two features of a head form one rotated pair.")
        .value("half_split", rope::Style::half_split, "feature i with i + rotary_dim/2 (NeoX, HF rotate_half)")
        .value("interleaved", rope::Style::interleaved, "feature 2i with 2i+1 (GPT-J)");
    nb::enum_<rope::ScalingType>(m, "ScalingType", "HuggingFace rope_type of the frequency scaling.")
        .value("none", rope::ScalingType::none)
        .value("linear", rope::ScalingType::linear)
        .value("dynamic", rope::ScalingType::dynamic)
        .value("yarn", rope::ScalingType::yarn)
        .value("llama3", rope::ScalingType::llama3)
        .value("longrope", rope::ScalingType::longrope);
    nb::enum_<rope::AxisAssignment>(m, "AxisAssignment", "How rotated pairs are shared among position axes.")
        .value("single", rope::AxisAssignment::single)
        .value("mrope_contiguous", rope::AxisAssignment::mrope_contiguous)
        .value("mrope_interleaved", rope::AxisAssignment::mrope_interleaved)
        .value("axial", rope::AxisAssignment::axial);

    m.def("parse_style", [](const std::string& name) { return rope::parse_style(name); }, "name"_a,
          "Style of a name: neox / half_split / half-split, or gptj / interleaved.");
    m.def("parse_scaling_type", [](const std::string& name) { return rope::parse_scaling_type(name); }, "rope_type"_a,
          "ScalingType of a HuggingFace rope_type.");
    m.def("scaling_type_name", [](rope::ScalingType type) { return std::string(rope::scaling_type_name(type)); },
          "type"_a, "HuggingFace's rope_type string of a ScalingType.");

    nb::class_<rope::Scaling>(m, "Scaling", "rope::Scaling: frequency scaling, HuggingFace's field names.")
        .def(nb::init<>())
        .def_rw("type", &rope::Scaling::type)
        .def_rw("factor", &rope::Scaling::factor)
        .def_rw("original_max_position_embeddings", &rope::Scaling::original_max_position_embeddings)
        .def_rw("attention_factor", &rope::Scaling::attention_factor)
        .def_rw("beta_fast", &rope::Scaling::beta_fast)
        .def_rw("beta_slow", &rope::Scaling::beta_slow)
        .def_rw("truncate", &rope::Scaling::truncate)
        .def_rw("mscale", &rope::Scaling::mscale)
        .def_rw("mscale_all_dim", &rope::Scaling::mscale_all_dim)
        .def_rw("low_freq_factor", &rope::Scaling::low_freq_factor)
        .def_rw("high_freq_factor", &rope::Scaling::high_freq_factor)
        .def_rw("short_factor", &rope::Scaling::short_factor)
        .def_rw("long_factor", &rope::Scaling::long_factor);

    nb::class_<rope::RopeConfig>(m, "RopeConfig", "rope::RopeConfig: what a model's RoPE is.")
        .def(nb::init<>())
        .def_rw("head_dim", &rope::RopeConfig::head_dim)
        .def_rw("rotary_dim", &rope::RopeConfig::rotary_dim)
        .def_rw("base", &rope::RopeConfig::base)
        .def_rw("style", &rope::RopeConfig::style)
        .def_rw("scaling", &rope::RopeConfig::scaling)
        .def_rw("precise_angles", &rope::RopeConfig::precise_angles)
        .def_prop_rw(
            "assignment", [](const rope::RopeConfig& c) { return c.multi_axis.assignment; },
            [](rope::RopeConfig& c, rope::AxisAssignment a) { c.multi_axis.assignment = a; })
        .def_prop_rw(
            "sections", [](const rope::RopeConfig& c) { return c.multi_axis.sections; },
            [](rope::RopeConfig& c, std::vector<int64_t> s) { c.multi_axis.sections = std::move(s); })
        .def("effective_rotary_dim", &rope::RopeConfig::effective_rotary_dim)
        .def("validate", [](const rope::RopeConfig& c) { rope::validate(c); },
             "Raises rope.Error naming the first field out of range.");

    m.def(
        "frequency_table",
        [](const rope::RopeConfig& config, int64_t max_position) {
            const rope::FrequencyTable table = rope::make_frequency_table(config, max_position);
            return nb::make_tuple(std::vector<float>(table.inv_freq.begin(), table.inv_freq.end()),
                                  table.attention_factor);
        },
        "config"_a, "max_position"_a,
        "(inv_freq, attention_factor): theta_i in float32 and the factor on cos and sin, as every backend uses them.");

    nb::class_<rope::BackendInfo>(m, "BackendInfo", "What the registry knows about one backend.")
        .def_ro("name", &rope::BackendInfo::name)
        .def_ro("description", &rope::BackendInfo::description)
        .def_prop_ro("device", [](const rope::BackendInfo& info) { return std::string(rope::device_name(info.device)); })
        .def_ro("available", &rope::BackendInfo::available)
        .def_ro("reason", &rope::BackendInfo::reason)
        .def("__repr__", [](const rope::BackendInfo& info) {
            return "BackendInfo(name='" + info.name + "', device='" + std::string(rope::device_name(info.device)) +
                   "', available=" + (info.available ? "True" : "False") +
                   (info.available ? "" : ", reason='" + info.reason + "'") + ")";
        });
    m.def("list_backends", &rope::list_backends, "Every backend rope knows, available here or not.");

    m.def("apply", &rope_python::apply, "backend"_a, "config"_a, "q"_a.none(), "k"_a.none(), "q_out"_a.none(),
          "k_out"_a.none(), "layout"_a, "offset"_a, "ids"_a.none(), "cu_seqlens"_a.none(), "starts"_a.none(),
          "cp_size"_a, "cp_rank"_a, "max_position"_a, "cos_sin_cache"_a.none(), "inverse"_a, "stream"_a,
          "bfloat16_bits"_a,
          "One rope::apply call on DLPack arrays (all positional; rope.apply is the documented entry point).");
}
