// rope-cuda-self-check: both CUDA backends against cpu-naive and a float64
// oracle, on fresh random inputs, for every feature a Plan expresses; plus a
// q tensor of more than 2^31 elements; plus (--bench) a small timing table.
//
//   rope-cuda-self-check [--cases N] [--seed S] [--quick] [--no-large] [--large-only]
//                        [--backend NAME] [--bench] [--tune]
//
// Exit status: 0 all passed, 1 a check failed, 77 no CUDA device (CTest: skipped).
//
// --tune times cuda-optimized's kernel under other launch settings than the
// backend's defaults (rows in flight, register cap, block size, rows per
// thread, unit order) on the benchmark shapes, next to cudaMemcpy and a plain
// 16-byte copy kernel; it is how the defaults in row_access.cuh and
// optimized_kernel.cuh were chosen.
//
// Each random case draws: style, dtype, layout, batch/heads/seq/head_dim,
// partial rotary_dim, grouped-query k (or no k at all), positions (default,
// offset, one shared id row, one id row per sequence; ids on the device),
// forward or inverse, in place or out of place, an attention factor, and for
// every tensor a memory layout: dense, padded rows, stride_dim = 2, a pointer
// off 16-byte alignment, or heads/seq transposed in memory. Inputs are random
// and never zero; every output byte starts as NaN, and every byte of the
// buffers outside the views must come back unchanged.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "check.hpp"
#include "optimized_kernel.cuh"
#include "rope/rope.hpp"

namespace {

using namespace rope;
using cuda_detail::check_cuda;
using cuda_detail::LaunchTuning;

// ---------------------------------------------------------------------------
// Host storage helpers
// ---------------------------------------------------------------------------

// A value of dtype @p dtype at element @p index of raw bytes, widened to double.
double read_value(DType dtype, const uint8_t* bytes, int64_t index) {
    return dispatch_dtype(dtype, [&](auto storage) -> double {
        using Storage = decltype(storage);
        Storage value;
        std::memcpy(&value, bytes + index * int64_t(sizeof(Storage)), sizeof(Storage));
        return to_float(value);
    });
}

void write_value(DType dtype, uint8_t* bytes, int64_t index, float value) {
    dispatch_dtype(dtype, [&](auto storage) {
        using Storage = decltype(storage);
        const Storage stored = from_float<Storage>(value);
        std::memcpy(bytes + index * int64_t(sizeof(Storage)), &stored, sizeof(Storage));
    });
}

bool same_bits(DType dtype, const uint8_t* a, const uint8_t* b, int64_t index) {
    const int64_t size = dtype_size(dtype);
    return std::memcmp(a + index * size, b + index * size, size_t(size)) == 0;
}

// How a tensor's memory is laid out around its view.
enum class Memory { dense, padded, dim_stride_2, misaligned, transposed, count };
const char* memory_name(Memory memory) {
    switch (memory) {
        case Memory::dense: return "dense";
        case Memory::padded: return "padded";
        case Memory::dim_stride_2: return "dim_stride_2";
        case Memory::misaligned: return "misaligned";
        case Memory::transposed: return "transposed";
        default: return "?";
    }
}

// A view's shape and strides (layout order), its first element's offset in
// the buffer, and the buffer's length in elements.
struct ViewSpec {
    std::array<int64_t, 4> shape{};
    std::array<int64_t, 4> strides{};
    int64_t offset = 0;
    int64_t span = 0;
};

ViewSpec make_spec(std::array<int64_t, 4> shape, Memory memory, std::mt19937_64& rng) {
    ViewSpec spec;
    spec.shape = shape;
    std::array<int, 4> order{0, 1, 2, 3};  // Memory order, outermost first.
    if (memory == Memory::transposed) std::swap(order[1], order[2]);
    const int64_t dim_step = memory == Memory::dim_stride_2 ? 2 : 1;
    // Padding in multiples of 8 elements keeps rows 16-byte aligned in every dtype.
    auto pad = [&] { return memory == Memory::padded ? int64_t(8 * (1 + rng() % 3)) : int64_t(0); };
    int64_t stride = dim_step;
    for (int position = 3; position >= 0; --position) {
        const int axis = order[position];
        spec.strides[axis] = stride;
        stride = stride * std::max<int64_t>(shape[axis], 1) + (position == 3 ? 0 : pad());
    }
    spec.offset = memory == Memory::misaligned ? 1 : 0;
    int64_t last = 0;
    for (int axis = 0; axis < 4; ++axis) last += (shape[axis] - 1) * spec.strides[axis];
    const bool empty = shape[0] * shape[1] * shape[2] * shape[3] == 0;
    spec.span = empty ? 0 : spec.offset + last + 1 + 8 * int64_t(rng() % 2);  // Sometimes a tail beyond the view.
    return spec;
}

// Every element offset (from the buffer start) that a view covers, in logical (b, h, s, d) order.
int64_t view_offset(const ViewSpec& spec, Layout layout, int64_t b, int64_t h, int64_t s, int64_t d) {
    const int64_t head_axis = layout == Layout::bhsd ? 1 : 2, seq_axis = layout == Layout::bhsd ? 2 : 1;
    return spec.offset + b * spec.strides[0] + h * spec.strides[size_t(head_axis)] +
           s * spec.strides[size_t(seq_axis)] + d * spec.strides[3];
}

// A host buffer and its device twin.
struct Tensor {
    ViewSpec spec;
    std::vector<uint8_t> host;
    Buffer device;
};

Tensor make_tensor(DType dtype, const ViewSpec& spec) {
    Tensor tensor{spec, std::vector<uint8_t>(size_t(spec.span * dtype_size(dtype))), Buffer{}};
    if (spec.span > 0) tensor.device = Buffer(Device::cuda, tensor.host.size());
    return tensor;
}

void fill_random(Tensor& tensor, DType dtype, std::mt19937_64& rng) {
    std::uniform_real_distribution<float> magnitude(0.05f, 2.0f);
    for (int64_t i = 0; i < tensor.spec.span; ++i)
        write_value(dtype, tensor.host.data(), i, (rng() & 1 ? 1.0f : -1.0f) * magnitude(rng));
}

void fill_nan(Tensor& tensor, DType dtype) {
    for (int64_t i = 0; i < tensor.spec.span; ++i)
        write_value(dtype, tensor.host.data(), i, std::numeric_limits<float>::quiet_NaN());
}

TensorView view_of(const Tensor& tensor, void* base, DType dtype, Device device, Layout layout) {
    TensorView view;
    view.data = tensor.spec.span > 0 ? static_cast<uint8_t*>(base) + tensor.spec.offset * dtype_size(dtype) : nullptr;
    view.dtype = dtype;
    view.device = device;
    view.layout = layout;
    view.shape = tensor.spec.shape;
    view.strides = tensor.spec.strides;
    return view;
}

// ---------------------------------------------------------------------------
// Random cases against cpu-naive and the float64 oracle
// ---------------------------------------------------------------------------

enum class PositionKind { start_zero, offset, shared_ids, per_sequence_ids };

struct Case {
    Style style;
    DType dtype;
    Layout layout;
    int64_t batch, q_heads, k_heads, seq, head_dim, rotary_dim;
    PositionKind positions;
    int64_t offset;
    Direction direction;
    bool in_place;
    float attention_factor;
    double base;
    bool precise;      // RopeConfig::precise_angles.
    Memory memory[4];  // q, k, q_out, k_out
};

std::string describe(const Case& c) {
    char text[512];
    std::snprintf(text, sizeof text,
                  "%s %s %s [b=%" PRId64 " hq=%" PRId64 " hk=%" PRId64 " s=%" PRId64 " d=%" PRId64 " r=%" PRId64
                  "] pos=%d off=%" PRId64 " %s %s attn=%g base=%g%s mem=%s/%s/%s/%s",
                  std::string(style_name(c.style)).c_str(), std::string(dtype_name(c.dtype)).c_str(),
                  std::string(layout_name(c.layout)).c_str(), c.batch, c.q_heads, c.k_heads, c.seq, c.head_dim,
                  c.rotary_dim, int(c.positions), c.offset, c.direction == Direction::forward ? "fwd" : "inv",
                  c.in_place ? "in-place" : "out-of-place", c.attention_factor, c.base, c.precise ? " precise" : "",
                  memory_name(c.memory[0]),
                  memory_name(c.memory[1]), memory_name(c.memory[2]), memory_name(c.memory[3]));
    return text;
}

Case random_case(std::mt19937_64& rng) {
    auto pick = [&](auto... values) {
        const std::array<std::common_type_t<decltype(values)...>, sizeof...(values)> options{values...};
        return options[rng() % options.size()];
    };
    Case c{};
    c.style = rng() % 2 ? Style::half_split : Style::interleaved;
    c.dtype = pick(DType::f32, DType::f16, DType::bf16);
    c.layout = rng() % 2 ? Layout::bhsd : Layout::bshd;
    c.batch = pick(1, 1, 2, 3);
    c.k_heads = pick(0, 1, 1, 2, 3);
    c.q_heads = std::max<int64_t>(c.k_heads, 1) * pick(1, 1, 2, 4);
    c.seq = pick(1, 1, 2, 7, 16, 33);
    c.head_dim = pick(2, 6, 8, 16, 32, 48, 64, 64, 80, 96, 128, 128, 256, 1030);
    // Full rotary most of the time; otherwise any even value, sometimes a multiple of 16.
    const int64_t r = rng() % 3 == 0 ? 2 * int64_t(1 + rng() % std::max<int64_t>(c.head_dim / 2, 1)) : c.head_dim;
    c.rotary_dim = std::min<int64_t>(rng() % 2 && r > 16 ? r / 16 * 16 : r, c.head_dim);
    if (c.rotary_dim > 1024) c.rotary_dim = 1024;
    if (c.head_dim == 1030 && c.seq > 7) c.seq = 7;  // Keep the CPU reference quick.
    c.positions = PositionKind(rng() % 4);
    c.offset = pick(0, 5, 4095, 100000);
    c.direction = rng() % 2 ? Direction::forward : Direction::inverse;
    c.in_place = rng() % 2;
    c.attention_factor = pick(1.0f, 1.0f, 0.75f, 1.3f);
    c.base = pick(10000.0, 500000.0, 100.0);
    c.precise = rng() % 4 == 0;
    for (Memory& memory : c.memory)
        memory = rng() % 2 ? Memory::dense : Memory(rng() % int(Memory::count));
    return c;
}

struct Stats {
    int cases = 0;
    int failures = 0;
};

// Runs one case on @p gpu and cpu-naive; returns an empty string or what went wrong.
std::string run_case(const Case& c, Backend& gpu, Backend& cpu, std::mt19937_64& rng, cudaStream_t stream) {
    RopeConfig config;
    config.head_dim = c.head_dim;
    config.rotary_dim = c.rotary_dim;
    config.base = c.base;
    config.style = c.style;
    config.precise_angles = c.precise;

    const auto shape = [&](int64_t heads) -> std::array<int64_t, 4> {
        return c.layout == Layout::bhsd ? std::array<int64_t, 4>{c.batch, heads, c.seq, c.head_dim}
                                        : std::array<int64_t, 4>{c.batch, c.seq, heads, c.head_dim};
    };
    Tensor q = make_tensor(c.dtype, make_spec(shape(c.q_heads), c.memory[0], rng));
    Tensor k = make_tensor(c.dtype, make_spec(shape(c.k_heads), c.memory[1], rng));
    Tensor q_out = c.in_place ? Tensor{} : make_tensor(c.dtype, make_spec(shape(c.q_heads), c.memory[2], rng));
    Tensor k_out = c.in_place ? Tensor{} : make_tensor(c.dtype, make_spec(shape(c.k_heads), c.memory[3], rng));
    fill_random(q, c.dtype, rng);
    fill_random(k, c.dtype, rng);
    fill_nan(q_out, c.dtype);
    fill_nan(k_out, c.dtype);
    for (Tensor* tensor : {&q, &k, &q_out, &k_out})
        if (tensor->spec.span > 0) tensor->device.copy_from_host(tensor->host.data());

    // Positions: the same ids on the host (for cpu-naive) and on the device.
    std::vector<int64_t> ids;
    int64_t id_rows = 0;
    if (c.positions == PositionKind::shared_ids || c.positions == PositionKind::per_sequence_ids) {
        id_rows = c.positions == PositionKind::shared_ids ? 1 : c.batch;
        ids.resize(size_t(id_rows * c.seq));
        for (int64_t& id : ids) id = int64_t(rng() % 200000);
    }
    Buffer device_ids(Device::cuda, ids.size() * sizeof(int64_t));
    if (!ids.empty()) device_ids.copy_from_host(ids.data());
    auto positions_on = [&](Device device) {
        if (ids.empty()) return Positions::starting_at(c.positions == PositionKind::offset ? c.offset : 0);
        const int64_t* data = device == Device::host ? ids.data() : static_cast<const int64_t*>(device_ids.data());
        return Positions::per_sequence(data, id_rows, c.seq, device);
    };

    // Host copies for cpu-naive (which works in place on them).
    Tensor cpu_q{q.spec, q.host, {}}, cpu_k{k.spec, k.host, {}};
    Tensor cpu_q_out{q_out.spec, q_out.host, {}}, cpu_k_out{k_out.spec, k_out.host, {}};
    auto args_for = [&](Device device, Tensor& tq, Tensor& tk, Tensor& tq_out, Tensor& tk_out) {
        auto base = [&](Tensor& tensor) -> void* {
            return device == Device::host ? static_cast<void*>(tensor.host.data()) : tensor.device.data();
        };
        const TensorView vq = view_of(tq, base(tq), c.dtype, device, c.layout);
        const TensorView vk = view_of(tk, base(tk), c.dtype, device, c.layout);
        RopeArgs args = c.in_place ? RopeArgs::in_place(vq, vk, positions_on(device), c.direction)
                                   : RopeArgs::out_of_place(vq, vk, view_of(tq_out, base(tq_out), c.dtype, device, c.layout),
                                                            view_of(tk_out, base(tk_out), c.dtype, device, c.layout),
                                                            positions_on(device), c.direction);
        return args;
    };
    RopeArgs cpu_args = args_for(Device::host, cpu_q, cpu_k, cpu_q_out, cpu_k_out);
    Plan cpu_plan = make_plan(config, cpu_args, Device::host);
    cpu_plan.frequencies.attention_factor = c.attention_factor;
    if (!cpu_plan.empty()) cpu.run(cpu_plan);

    RopeArgs gpu_args = args_for(Device::cuda, q, k, q_out, k_out);
    gpu_args.stream = stream;
    Plan gpu_plan = make_plan(config, gpu_args, Device::cuda);
    gpu_plan.frequencies.attention_factor = c.attention_factor;  // Exercises the cos/sin scale.
    if (!gpu_plan.empty()) gpu.run(gpu_plan);
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");

    // Compare one result buffer with cpu-naive's and the oracle.
    const double tolerance_rel = c.dtype == DType::f32 ? 2e-6 : c.dtype == DType::f16 ? 1.0 / 1024 : 1.0 / 128;
    const double oracle_limit = c.dtype == DType::f32 ? 1e-5 : c.dtype == DType::f16 ? 2e-3 : 1e-2;
    std::string problem;
    auto compare = [&](const char* name, const Tensor& input, const Tensor& result_spec, const Tensor& cpu_result,
                       int64_t heads) {
        if (result_spec.spec.span == 0 || heads == 0) return;
        std::vector<uint8_t> got(result_spec.host.size());
        result_spec.device.copy_to_host(got.data());
        std::vector<char> in_view(size_t(result_spec.spec.span), 0);
        double error2 = 0, norm2 = 0;
        const double sign = c.direction == Direction::forward ? 1.0 : -1.0;
        for (int64_t b = 0; b < c.batch && problem.empty(); ++b)
            for (int64_t h = 0; h < heads && problem.empty(); ++h)
                for (int64_t s = 0; s < c.seq && problem.empty(); ++s) {
                    const int64_t position = cpu_plan.positions.at(b, s);
                    for (int64_t d = 0; d < c.head_dim; ++d) {
                        const int64_t out_at = view_offset(result_spec.spec, c.layout, b, h, s, d);
                        in_view[size_t(out_at)] = 1;
                        const double g = read_value(c.dtype, got.data(), out_at);
                        const double want = read_value(c.dtype, cpu_result.host.data(), out_at);
                        char where[160];
                        std::snprintf(where, sizeof where, "%s[b=%" PRId64 ",h=%" PRId64 ",s=%" PRId64 ",d=%" PRId64 "]",
                                      name, b, h, s, d);
                        if (!std::isfinite(g)) {
                            problem = std::string(where) + " not written (NaN/inf)";
                            break;
                        }
                        if (d >= c.rotary_dim) {  // Pass-through: the input's bits exactly.
                            const int64_t in_at = view_offset(input.spec, c.layout, b, h, s, d);
                            if (std::memcmp(got.data() + out_at * dtype_size(c.dtype),
                                            input.host.data() + in_at * dtype_size(c.dtype), size_t(dtype_size(c.dtype)))) {
                                problem = std::string(where) + " pass-through changed";
                                break;
                            }
                            continue;
                        }
                        if (std::fabs(g - want) > tolerance_rel * std::fabs(want) + 1e-6) {
                            problem = std::string(where) + " = " + std::to_string(g) + ", cpu-naive " + std::to_string(want);
                            break;
                        }
                        // float64 oracle on the backends' float32 angle (pair_angle: default or
                        // precise). The pairing is derived here on its own (not through
                        // pair_elements) so that it checks that rule too.
                        const int64_t half = c.rotary_dim / 2;
                        int64_t i, partner;
                        bool is_x;
                        if (c.style == Style::half_split) {
                            is_x = d < half;
                            i = is_x ? d : d - half;
                            partner = is_x ? d + half : d - half;
                        } else {
                            is_x = d % 2 == 0;
                            i = d / 2;
                            partner = d ^ 1;
                        }
                        const double angle = pair_angle(c.precise, position, cpu_plan.frequencies.inv_freq[size_t(i)],
                                                        cpu_plan.frequencies.inv_freq_exact[size_t(i)]);
                        const double cos_angle = c.attention_factor * std::cos(angle);
                        const double sin_angle = sign * c.attention_factor * std::sin(angle);
                        const double self = read_value(c.dtype, input.host.data(), view_offset(input.spec, c.layout, b, h, s, d));
                        const double other = read_value(c.dtype, input.host.data(), view_offset(input.spec, c.layout, b, h, s, partner));
                        const double ref = is_x ? self * cos_angle - other * sin_angle : self * cos_angle + other * sin_angle;
                        error2 += (g - ref) * (g - ref);
                        norm2 += ref * ref;
                    }
                }
        if (problem.empty() && norm2 > 0 && std::sqrt(error2 / norm2) > oracle_limit)
            problem = std::string(name) + ": relative L2 error vs float64 " + std::to_string(std::sqrt(error2 / norm2));
        // Bytes outside the view: exactly as before the call.
        for (int64_t at = 0; at < result_spec.spec.span && problem.empty(); ++at)
            if (!in_view[size_t(at)] && !same_bits(c.dtype, got.data(), cpu_result.host.data(), at))
                problem = std::string(name) + ": element " + std::to_string(at) + " outside the view was written";
    };
    if (c.in_place) {
        // The original inputs are in q.host / k.host; cpu_q / cpu_k hold cpu-naive's result.
        compare("q", q, q, cpu_q, c.q_heads);
        compare("k", k, k, cpu_k, c.k_heads);
    } else {
        compare("q_out", q, q_out, cpu_q_out, c.q_heads);
        compare("k_out", k, k_out, cpu_k_out, c.k_heads);
        // Inputs of an out-of-place call stay untouched.
        for (const Tensor* input : {&q, &k}) {
            if (input->spec.span == 0 || !problem.empty()) continue;
            std::vector<uint8_t> got(input->host.size());
            input->device.copy_to_host(got.data());
            if (got != input->host) problem = "an input of an out-of-place call was modified";
        }
    }
    return problem;
}

// Rejections and edge cases that are not random.
int check_edges(Backend& gpu) {
    int failures = 0;
    auto expect_error = [&](const char* what, const char* needle, auto&& body) {
        try {
            body();
            std::printf("  FAIL %s: no error\n", what);
            ++failures;
        } catch (const Error& error) {
            if (std::strstr(error.what(), needle) == nullptr) {
                std::printf("  FAIL %s: message '%s' lacks '%s'\n", what, error.what(), needle);
                ++failures;
            }
        }
    };
    // The counterpart: a call that must run, and finish, without any error.
    auto expect_success = [&](const char* what, auto&& body) {
        try {
            body();
            check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        } catch (const std::exception& error) {
            std::printf("  FAIL %s: %s\n", what, error.what());
            ++failures;
        }
    };
    // rotary_dim beyond the kernel-parameter table: rejected, naming rotary_dim.
    {
        RopeConfig config;
        config.head_dim = 1040;
        config.rotary_dim = 1026;
        Buffer q(Device::cuda, 1040 * 4);
        const TensorView vq = TensorView::contiguous(q.data(), DType::f32, Device::cuda, Layout::bhsd, {1, 1, 1, 1040});
        const TensorView vk = TensorView::contiguous(nullptr, DType::f32, Device::cuda, Layout::bhsd, {1, 0, 1, 1040});
        expect_error("rotary_dim 1026", "rotary_dim", [&] { apply(gpu, config, RopeArgs::in_place(vq, vk)); });
    }
    // Host memory handed to a CUDA backend: rejected by make_plan.
    {
        RopeConfig config;
        config.head_dim = 8;
        std::vector<float> host(8, 1.0f);
        const TensorView vq = TensorView::contiguous(host.data(), DType::f32, Device::host, Layout::bhsd, {1, 1, 1, 8});
        expect_error("host tensor", "q.device", [&] { apply(gpu, config, RopeArgs::in_place(vq, vq)); });
    }
    // A stale error from an unrelated failed call is not blamed on the next launch.
    {
        void* huge = nullptr;
        if (cudaMalloc(&huge, size_t(1) << 50) == cudaSuccess) cudaFree(huge);  // Fails: 1 PiB.
        RopeConfig config;
        config.head_dim = 8;
        Buffer q(Device::cuda, 8 * sizeof(float));
        std::vector<float> ones(8, 1.0f);
        q.copy_from_host(ones.data());
        const TensorView vq = TensorView::contiguous(q.data(), DType::f32, Device::cuda, Layout::bhsd, {1, 1, 1, 8});
        const TensorView vk = TensorView::contiguous(nullptr, DType::f32, Device::cuda, Layout::bhsd, {1, 0, 1, 8});
        expect_success("launch after a failed cudaMalloc", [&] { apply(gpu, config, RopeArgs::in_place(vq, vk)); });
        cudaGetLastError();  // Leave the thread's error state clean for what follows.
    }
    // An empty call is a no-op.
    {
        RopeConfig config;
        config.head_dim = 8;
        const TensorView empty = TensorView::contiguous(nullptr, DType::f32, Device::cuda, Layout::bhsd, {0, 1, 1, 8});
        expect_success("empty call", [&] { apply(gpu, config, RopeArgs::in_place(empty, empty)); });
    }
    return failures;
}

// Host-side checks of the CUDA internals that have a host twin: the fast
// divisor against plain division, and the vector path's chunk layout
// (pair_of) against the shared pairing rule (pair_elements).
template <typename Storage, Style kStyle>
int check_vector_layout() {
    using Path = cuda_detail::VectorPath<Storage, kStyle>;
    constexpr int W = Path::kWidth;
    int failures = 0;
    for (int64_t rotary_dim = 2 * W; rotary_dim <= 1024; rotary_dim += 2 * W) {
        for (int64_t chunk = 0; chunk < rotary_dim / 2 / W; ++chunk) {
            for (int p = 0; p < Path::kPairs; ++p) {
                // Features rotate() pairs up in slot p: (x, y).
                int64_t x, y;
                if (kStyle == Style::half_split) {
                    x = chunk * W + p;
                    y = rotary_dim / 2 + chunk * W + p;
                } else {
                    const int64_t base = p < W / 2 ? chunk * W : rotary_dim / 2 + chunk * W;
                    x = base + 2 * (p % (W / 2));
                    y = x + 1;
                }
                const PairIndex want = pair_elements(kStyle, rotary_dim, Path::pair_of(chunk, p, rotary_dim));
                if (want.first != x || want.second != y) ++failures;
            }
        }
    }
    return failures;
}

int check_helpers() {
    int failures = 0;
    std::mt19937_64 rng(99);
    for (int trial = 0; trial < 200000; ++trial) {
        const int64_t d = trial < 64 ? trial + 1 : int64_t(1 + rng() % (trial % 3 == 0 ? 100 : (int64_t(1) << 31)));
        const cuda_detail::FastDivisor divisor(d);
        const int64_t limit = trial % 2 ? (int64_t(1) << 31) : (int64_t(1) << 40);
        for (int64_t n : {int64_t(0), d - 1, d, d + 1, (int64_t(1) << 31) - 1, int64_t(1) << 31, int64_t(rng() % limit)})
            if (n >= 0 && divisor.divide(n) != n / d) {
                if (failures < 5) std::printf("  FAIL FastDivisor(%" PRId64 ").divide(%" PRId64 ")\n", d, n);
                ++failures;
            }
    }
    failures += check_vector_layout<float, Style::half_split>() + check_vector_layout<float, Style::interleaved>() +
                check_vector_layout<bfloat16, Style::half_split>() + check_vector_layout<bfloat16, Style::interleaved>();
    std::printf("helpers (FastDivisor, vector chunk layout vs pair_elements): %s\n", failures ? "FAILED" : "passed");
    return failures;
}

// ---------------------------------------------------------------------------
// More than 2^31 elements
// ---------------------------------------------------------------------------

// Deterministic pseudo-random bf16 values in (-2, 2) from the element index (never zero).
__host__ __device__ inline float hashed_value(uint64_t index) {
    uint64_t x = index * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    const float unit = float(x >> 40) * (1.0f / 16777216.0f);  // [0, 1)
    return (unit < 0.5f ? -1.0f : 1.0f) * (0.05f + 3.9f * std::fabs(unit - 0.5f));
}

__global__ void fill_hashed(bfloat16* data, int64_t count) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
        data[i] = to_bfloat16(hashed_value(uint64_t(i)));
}

// q = bf16 [1, 16, 2^20 + 8, 128] (2^31 + 16384 elements, 4.3 GB), rotated in
// place; the rows around element 2^31 and the last rows are compared with a
// float64 rotation of their inputs. Run once with an aligned q (the 16-byte
// path) and once shifted by one element (the generic path).
int check_large(Backend& gpu) {
    const int64_t heads = 16, seq = (int64_t(1) << 20) + 8, head_dim = 128;
    const int64_t numel = heads * seq * head_dim;
    int failures = 0;
    Buffer memory(Device::cuda, size_t(numel + 8) * sizeof(bfloat16));
    for (int shift = 0; shift < 2; ++shift) {
        auto* base = static_cast<bfloat16*>(memory.data());
        cuda_detail::launch_kernel("fill_hashed", cuda_detail::launch_config(4096, 256, nullptr), fill_hashed, base, numel + 8);
        bfloat16* q_data = base + shift;
        // Rows to check: the one holding element 2^31, its neighbours, and the last three.
        const int64_t boundary_row = (int64_t(1) << 31) / head_dim;
        const int64_t total_rows = heads * seq;
        const std::vector<int64_t> rows{boundary_row - 1, boundary_row, boundary_row + 1, total_rows - 3,
                                        total_rows - 2, total_rows - 1};
        RopeConfig config;
        config.head_dim = head_dim;
        config.style = shift == 0 ? Style::half_split : Style::interleaved;
        const TensorView q = TensorView::contiguous(q_data, DType::bf16, Device::cuda, Layout::bhsd, {1, heads, seq, head_dim});
        const TensorView k = TensorView::contiguous(nullptr, DType::bf16, Device::cuda, Layout::bhsd, {1, 0, seq, head_dim});
        const auto start = std::chrono::steady_clock::now();
        apply(gpu, config, RopeArgs::in_place(q, k));
        check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
        const FrequencyTable table = make_frequency_table(config, seq);
        double worst = 0;
        for (int64_t row : rows) {
            std::vector<bfloat16> got(static_cast<size_t>(head_dim));
            check_cuda(cudaMemcpy(got.data(), q_data + row * head_dim, size_t(head_dim) * sizeof(bfloat16),
                                  cudaMemcpyDeviceToHost), "cudaMemcpy(device to host)");
            const int64_t position = row % seq;
            for (int64_t i = 0; i < head_dim / 2; ++i) {
                const PairIndex pair = pair_elements(config.style, head_dim, i);
                const uint64_t first = uint64_t(shift + row * head_dim + pair.first);
                const uint64_t second = uint64_t(shift + row * head_dim + pair.second);
                const double x = to_float(to_bfloat16(hashed_value(first)));
                const double y = to_float(to_bfloat16(hashed_value(second)));
                const double angle = rope_angle(position, table.inv_freq[size_t(i)]);
                const double rx = x * std::cos(angle) - y * std::sin(angle);
                const double ry = y * std::cos(angle) + x * std::sin(angle);
                const double tolerance = std::ldexp(1.0, -8) * (std::fabs(x) + std::fabs(y)) + 1e-6;
                const double ex = std::fabs(to_float(got[size_t(pair.first)]) - rx);
                const double ey = std::fabs(to_float(got[size_t(pair.second)]) - ry);
                worst = std::max({worst, ex / tolerance, ey / tolerance});
                if (ex > tolerance || ey > tolerance) {
                    if (failures < 5)
                        std::printf("  FAIL large (%s): row %" PRId64 " pair %" PRId64 ": got (%g, %g), float64 (%g, %g)\n",
                                    shift ? "generic" : "vector", row, i, double(to_float(got[size_t(pair.first)])),
                                    double(to_float(got[size_t(pair.second)])), rx, ry);
                    ++failures;
                }
            }
        }
        std::printf("  %s, %s path: q bf16 [1, %" PRId64 ", %" PRId64 ", %" PRId64 "] = %" PRId64
                    " elements, %.1f ms, worst error %.2f of tolerance\n",
                    gpu.name().c_str(), shift ? "generic" : "16-byte", heads, seq, head_dim, numel, ms, worst);
    }
    return failures;
}

// ---------------------------------------------------------------------------
// --bench: a small timing table (rope-bench is the project's real benchmark)
// ---------------------------------------------------------------------------

struct Events {
    cudaEvent_t start, stop;
    Events() {
        check_cuda(cudaEventCreate(&start), "cudaEventCreate");
        check_cuda(cudaEventCreate(&stop), "cudaEventCreate");
    }
    ~Events() {
        cudaEventDestroy(start);
        cudaEventDestroy(stop);
    }
};

// Median over @p reps of the mean time of @p calls back-to-back calls of @p body (microseconds).
template <typename Body>
double median_us(cudaStream_t stream, int reps, int calls, Body&& body) {
    Events events;
    for (int i = 0; i < 3; ++i) body();
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    std::vector<double> times;
    for (int r = 0; r < reps; ++r) {
        check_cuda(cudaEventRecord(events.start, stream), "cudaEventRecord");
        for (int i = 0; i < calls; ++i) body();
        check_cuda(cudaEventRecord(events.stop, stream), "cudaEventRecord");
        check_cuda(cudaEventSynchronize(events.stop), "cudaEventSynchronize");
        float ms = 0;
        check_cuda(cudaEventElapsedTime(&ms, events.start, events.stop), "cudaEventElapsedTime");
        times.push_back(1000.0 * ms / calls);
    }
    std::sort(times.begin(), times.end());
    return times[times.size() / 2];
}

// Time per call when @p calls calls are captured into one CUDA graph and replayed.
template <typename Body>
double graph_us(cudaStream_t stream, int reps, int calls, Body&& body) {
    cudaGraph_t graph;
    check_cuda(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "cudaStreamBeginCapture");
    for (int i = 0; i < calls; ++i) body();
    check_cuda(cudaStreamEndCapture(stream, &graph), "cudaStreamEndCapture");
    cudaGraphExec_t exec;
    check_cuda(cudaGraphInstantiate(&exec, graph, 0), "cudaGraphInstantiate");
    const double us = median_us(stream, reps, 1, [&] { check_cuda(cudaGraphLaunch(exec, stream), "cudaGraphLaunch"); }) / calls;
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    return us;
}

int run_bench(const std::vector<std::string>& backends) {
    cudaStream_t stream;
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    cudaDeviceProp properties{};
    check_cuda(cudaGetDeviceProperties(&properties, 0), "cudaGetDeviceProperties");
    std::printf("bench: %s, %d SMs, L2 %d MB; in-place q and k of the same shape (bhsd), default positions\n",
                properties.name, properties.multiProcessorCount, properties.l2CacheSize >> 20);
    std::printf("BENCH,backend,dtype,style,shape,bytes,us_per_call,graph_us_per_call,GB_per_s,copy_GB_per_s,ratio\n");
    struct Shape {
        std::array<int64_t, 4> dims;
        bool small;
    };
    const Shape shapes[] = {{{8, 32, 4096, 128}, false}, {{4, 32, 2048, 128}, false}, {{4, 8, 256, 64}, true},
                            {{1, 32, 1, 128}, true}};
    std::mt19937_64 rng(12345);
    for (const Shape& shape : shapes) {
        for (DType dtype : {DType::f32, DType::bf16}) {
            const int64_t numel = shape.dims[0] * shape.dims[1] * shape.dims[2] * shape.dims[3];
            const size_t bytes = size_t(numel * dtype_size(dtype));
            Buffer q(Device::cuda, bytes), k(Device::cuda, bytes), copy_target(Device::cuda, 2 * bytes);
            std::vector<uint8_t> host(bytes);
            for (int64_t i = 0; i < numel; ++i) write_value(dtype, host.data(), i, float(int64_t(rng() % 2001) - 1000) / 512.0f + 0.001f);
            q.copy_from_host(host.data());
            k.copy_from_host(host.data());
            // The ceiling: a device-to-device copy of the same bytes (q and k: 2 x bytes read, 2 x written).
            const double copy_us = median_us(stream, 21, shape.small ? 200 : 10, [&] {
                check_cuda(cudaMemcpyAsync(copy_target.data(), q.data(), bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
                check_cuda(cudaMemcpyAsync(static_cast<uint8_t*>(copy_target.data()) + bytes, k.data(), bytes,
                                           cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
            });
            const double moved = 4.0 * double(bytes);  // Read and write q and k.
            for (const std::string& name : backends) {
                auto backend = make_backend(name);
                for (Style style : {Style::half_split, Style::interleaved}) {
                    RopeConfig config;
                    config.head_dim = shape.dims[3];
                    config.style = style;
                    const auto vq = TensorView::contiguous(q.data(), dtype, Device::cuda, Layout::bhsd, shape.dims);
                    const auto vk = TensorView::contiguous(k.data(), dtype, Device::cuda, Layout::bhsd, shape.dims);
                    RopeArgs args = RopeArgs::in_place(vq, vk);
                    args.stream = stream;
                    const Plan plan = make_plan(config, args, Device::cuda);
                    const int calls = shape.small ? 1000 : 20;
                    const double us = median_us(stream, 21, calls, [&] { backend->run(plan); });
                    const double replay = shape.small ? graph_us(stream, 21, calls, [&] { backend->run(plan); }) : 0.0;
                    const double best = shape.small ? std::min(us, replay) : us;
                    std::printf("BENCH,%s,%s,%s,[%" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 "],%zu,%.3f,%.3f,%.1f,%.1f,%.4f\n",
                                name.c_str(), std::string(dtype_name(dtype)).c_str(), std::string(style_name(style)).c_str(),
                                shape.dims[0], shape.dims[1], shape.dims[2], shape.dims[3], 2 * bytes, us, replay,
                                moved / best / 1e3, moved / copy_us / 1e3, copy_us / best);
                }
            }
        }
    }
    check_cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
    return 0;
}

// ---------------------------------------------------------------------------
// --tune: cuda-optimized's kernel under other launch settings
// ---------------------------------------------------------------------------

// A plain copy with 16-byte accesses and a grid-stride loop: what a kernel
// that only moves the bytes reaches, next to cudaMemcpy.
__global__ void copy16(const uint4* source, uint4* target, int64_t count) {
    for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += int64_t(gridDim.x) * blockDim.x)
        target[i] = source[i];
}

struct Variant {
    int rows_in_flight;
    int min_blocks;
    LaunchTuning tuning;
    double us;
};

// An experiment, not used by the backend: the 16-byte bf16 path with the
// hardware's paired float->bf16 conversion (cvt.rn.bf16x2.f32, round to
// nearest even like rope::to_bfloat16; NaN payloads differ) instead of
// rope::from_float's integer arithmetic, to measure what the conversion costs.
template <Style kStyle>
struct HardwareConvertPath : cuda_detail::VectorPath<bfloat16, kStyle> {
    using Base = cuda_detail::VectorPath<bfloat16, kStyle>;
    using typename Base::Pairs;
    __device__ static uint32_t pack(float low, float high) {
        uint32_t packed;
        asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(packed) : "f"(high), "f"(low));
        return packed;
    }
    __device__ static void rotate(Pairs& pairs, const float (&cos_angle)[Base::kPairs], const float (&sin_angle)[Base::kPairs]) {
        float first[8], second[8];
#pragma unroll
        for (int i = 0; i < 8; ++i) {
            first[i] = to_float(pairs.first.value[i]);
            second[i] = to_float(pairs.second.value[i]);
        }
#pragma unroll
        for (int p = 0; p < 8; ++p) {
            if (kStyle == Style::half_split) {
                rotate_pair(first[p], second[p], cos_angle[p], sin_angle[p]);
            } else {
                float* v = p < 4 ? first : second;
                rotate_pair(v[2 * (p % 4)], v[2 * (p % 4) + 1], cos_angle[p], sin_angle[p]);
            }
        }
        uint32_t words[8];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            words[i] = pack(first[2 * i], first[2 * i + 1]);
            words[4 + i] = pack(second[2 * i], second[2 * i + 1]);
        }
        memcpy(&pairs.first, words, 16);
        memcpy(&pairs.second, words + 4, 16);
    }
};

// Times one compiled variant of a path under several launch settings.
template <typename Storage, typename Path, int RowsInFlight, int MinBlocks>
void time_compiled_variant(const Plan& plan, const cuda_detail::DeviceInfo& device, cudaStream_t stream, bool small,
                           std::vector<Variant>& results, int tag = 0) {
    std::vector<LaunchTuning> tunings;
    for (int threads : {64, 128, 256})
        for (int64_t rows : {1, 2, 4, 8, 16, 32})
            for (bool programmatic : {true, false}) {
                if (small ? (threads == 256 || rows > 4) : (threads == 64 || rows < 4 || !programmatic)) continue;
                LaunchTuning tuning;
                tuning.block_threads = tuning.small_block_threads = threads;
                tuning.force_rows_per_slice = rows;
                tuning.programmatic_launch = programmatic;
                tunings.push_back(tuning);
            }
    for (const LaunchTuning& tuning : tunings) {
        auto launch = [&] { cuda_detail::launch_optimized<Storage, Path, RowsInFlight, 64, MinBlocks>(plan, device, tuning); };
        const double us = small ? graph_us(stream, 9, 200, launch) : median_us(stream, 7, 10, launch);
        results.push_back({RowsInFlight, MinBlocks + tag, tuning, us});
    }
}

__global__ void empty_kernel() {}

int run_tune() {
    cudaStream_t stream;
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    const cuda_detail::DeviceInfo device = cuda_detail::device_info(0);
    struct Shape {
        std::array<int64_t, 4> dims;
        bool small;
    };
    const Shape shapes[] = {{{8, 32, 4096, 128}, false}, {{4, 32, 2048, 128}, false}, {{4, 8, 256, 64}, true},
                            {{1, 32, 1, 128}, true}};
    std::mt19937_64 rng(777);
    // Floors of a graph-replayed launch on this machine: an empty kernel, and a
    // 16-byte copy of decode's q and k (2 x 32 KB).
    {
        Buffer source(Device::cuda, 65536), target(Device::cuda, 65536);
        check_cuda(cudaMemset(source.data(), 1, 65536), "cudaMemset");
        const double empty = graph_us(stream, 9, 200, [&] {
            cuda_detail::launch_kernel("empty_kernel", cuda_detail::launch_config(1, 32, stream), empty_kernel);
        });
        const double copy = graph_us(stream, 9, 200, [&] {
            cuda_detail::launch_kernel("copy16", cuda_detail::launch_config(16, 256, stream), copy16,
                                       static_cast<const uint4*>(source.data()), static_cast<uint4*>(target.data()),
                                       int64_t(65536 / 16));
        });
        std::printf("FLOOR,graph-replayed empty kernel %.3f us, 64 KB copy kernel %.3f us\n", empty, copy);
    }
    std::printf("TUNE,shape,dtype,style,memcpy_us,copy16_us,default_us,default_ratio,best_us,best_ratio,"
                "best_rif,best_variant,best_block,best_rows,best_programmatic\n");
    for (const Shape& shape : shapes) {
        const auto& dims = shape.dims;
        for (DType dtype : {DType::f32, DType::bf16}) {
            if (shape.small && dtype != DType::f32) continue;
            const int64_t numel = dims[0] * dims[1] * dims[2] * dims[3];
            const size_t bytes = size_t(numel * dtype_size(dtype));
            Buffer q(Device::cuda, bytes), k(Device::cuda, bytes), target(Device::cuda, 2 * bytes);
            std::vector<uint8_t> host(bytes);
            for (int64_t i = 0; i < numel; ++i)
                write_value(dtype, host.data(), i, float(int64_t(rng() % 2001) - 1000) / 512.0f + 0.001f);
            q.copy_from_host(host.data());
            k.copy_from_host(host.data());
            auto memcpy_both = [&] {
                check_cuda(cudaMemcpyAsync(target.data(), q.data(), bytes, cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
                check_cuda(cudaMemcpyAsync(static_cast<uint8_t*>(target.data()) + bytes, k.data(), bytes,
                                           cudaMemcpyDeviceToDevice, stream), "cudaMemcpyAsync");
            };
            auto copy16_both = [&] {
                for (int half = 0; half < 2; ++half) {
                    cuda_detail::launch_kernel("copy16", cuda_detail::launch_config(device.multiprocessors * 16, 256, stream), copy16,
                                               static_cast<const uint4*>(half ? k.data() : q.data()),
                                               static_cast<uint4*>(target.data()) + half * (bytes / 16), int64_t(bytes / 16));
                }
            };
            const double memcpy_us = shape.small ? graph_us(stream, 9, 100, memcpy_both) : median_us(stream, 7, 10, memcpy_both);
            const double copy_us = shape.small ? graph_us(stream, 9, 100, copy16_both) : median_us(stream, 7, 10, copy16_both);
            for (Style style : {Style::half_split, Style::interleaved}) {
                RopeConfig config;
                config.head_dim = dims[3];
                config.style = style;
                RopeArgs args = RopeArgs::in_place(TensorView::contiguous(q.data(), dtype, Device::cuda, Layout::bhsd, dims),
                                                   TensorView::contiguous(k.data(), dtype, Device::cuda, Layout::bhsd, dims));
                args.stream = stream;
                const Plan plan = make_plan(config, args, Device::cuda);
                auto backend = make_backend("cuda-optimized");
                auto run_default = [&] { backend->run(plan); };
                const double default_us = shape.small ? graph_us(stream, 9, 200, run_default) : median_us(stream, 7, 10, run_default);
                std::vector<Variant> results;
                dispatch_dtype(dtype, [&](auto storage) {
                    using Storage = decltype(storage);
                    if constexpr (!std::is_same_v<Storage, float16>) {
                        // The "minblocks" column encodes the compiled variant: register cap
                        // (1 = none) + 10 x access (0 plain, 1 cached, 2 streaming)
                        // + 100 for the hardware-conversion experiment + 1000 when not pipelined
                        // + 2000 for the generic (one pair per thread) path.
                        auto all = [&]<Style kStyle>() {
                            using Plain = cuda_detail::VectorPath<Storage, kStyle, cuda_detail::PlainAccess>;
                            using Cached = cuda_detail::VectorPath<Storage, kStyle, cuda_detail::CachedAccess>;
                            using Streaming = cuda_detail::VectorPath<Storage, kStyle, cuda_detail::StreamingAccess>;
                            using StreamingPipelined = cuda_detail::VectorPath<Storage, kStyle, cuda_detail::StreamingAccess, true>;
                            using StreamingUnpipelined = cuda_detail::VectorPath<Storage, kStyle, cuda_detail::StreamingAccess, false>;
                            const bool small = shape.small;
                            // + 1000: not pipelined.
                            time_compiled_variant<Storage, Cached, Cached::kRowsInFlight, 1>(plan, device, stream, small, results, 10);
                            time_compiled_variant<Storage, Plain, Plain::kRowsInFlight, 1>(plan, device, stream, small, results, 0);
                            time_compiled_variant<Storage, StreamingPipelined, 2, 1>(plan, device, stream, small, results, 20);
                            time_compiled_variant<Storage, StreamingUnpipelined, 4, 1>(plan, device, stream, small, results, 1020);
                            if (small) {
                                // + 2000: the generic path, one pair per thread: more, shorter threads
                                // (one sincosf each) for the latency regime.
                                using Generic = cuda_detail::GenericPath<Storage>;
                                time_compiled_variant<Storage, Generic, Generic::kRowsInFlight, 1>(plan, device, stream, true, results, 2000);
                            } else {
                                time_compiled_variant<Storage, StreamingUnpipelined, 2, 1>(plan, device, stream, false, results, 1020);
                                // Register caps: 2 or 3 blocks of 256 threads per SM (at most 128 or 80
                                // registers a thread) buy occupancy, i.e. bytes in flight, if nothing spills.
                                time_compiled_variant<Storage, StreamingPipelined, 2, 2>(plan, device, stream, false, results, 20);
                                time_compiled_variant<Storage, StreamingPipelined, 2, 3>(plan, device, stream, false, results, 20);
                                time_compiled_variant<Storage, StreamingUnpipelined, 4, 2>(plan, device, stream, false, results, 1020);
                                time_compiled_variant<Storage, StreamingUnpipelined, 4, 3>(plan, device, stream, false, results, 1020);
                                if constexpr (std::is_same_v<Storage, bfloat16>)
                                    time_compiled_variant<Storage, HardwareConvertPath<kStyle>, 2, 1>(plan, device, stream, false, results, 100);
                            }
                            (void)sizeof(Streaming);
                        };
                        if (style == Style::half_split) all.template operator()<Style::half_split>();
                        else all.template operator()<Style::interleaved>();
                    }
                });
                std::sort(results.begin(), results.end(), [](const Variant& a, const Variant& b) { return a.us < b.us; });
                const char* dtype_text = dtype == DType::f32 ? "fp32" : "bf16";
                const char* style_text = style == Style::half_split ? "neox" : "gptj";
                for (const Variant& v : results)
                    std::printf("VARIANT,[%" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 "],%s,%s,rif=%d,minblocks=%d,block=%d,"
                                "rows=%" PRId64 ",programmatic=%d,%.3f,%.4f\n",
                                dims[0], dims[1], dims[2], dims[3], dtype_text, style_text, v.rows_in_flight, v.min_blocks,
                                v.tuning.block_threads, v.tuning.force_rows_per_slice, int(v.tuning.programmatic_launch), v.us,
                                memcpy_us / v.us);
                const Variant& best = results.front();
                std::printf("TUNE,[%" PRId64 " %" PRId64 " %" PRId64 " %" PRId64 "],%s,%s,%.3f,%.3f,%.3f,%.4f,%.3f,%.4f,%d,%d,%d,%" PRId64 ",%d\n",
                            dims[0], dims[1], dims[2], dims[3], dtype_text, style_text, memcpy_us, copy_us, default_us,
                            memcpy_us / default_us, best.us, memcpy_us / best.us, best.rows_in_flight, best.min_blocks,
                            best.tuning.block_threads, best.tuning.force_rows_per_slice,
                            int(best.tuning.programmatic_launch));
            }
        }
    }
    check_cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    int cases = 400;
    uint64_t seed = std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32);
    bool large = true, random = true, bench = false, tune = false;
    std::vector<std::string> backends{"cuda-naive", "cuda-optimized"};
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        auto next = [&] {
            if (i + 1 >= argc) {
                std::fprintf(stderr, "%s needs a value\n", arg.c_str());
                std::exit(2);
            }
            return std::string(argv[++i]);
        };
        if (arg == "--cases") cases = std::stoi(next());
        else if (arg == "--seed") seed = std::stoull(next());
        else if (arg == "--quick") { cases = 150; large = false; }
        else if (arg == "--no-large") large = false;
        else if (arg == "--large-only") random = false;
        else if (arg == "--backend") backends = {next()};
        else if (arg == "--bench") { bench = true; random = false; large = false; }
        else if (arg == "--tune") { tune = true; random = false; large = false; }
        else {
            std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
            return 2;
        }
    }
    const std::string reason = cuda_unavailable_reason();
    if (!reason.empty()) {
        std::printf("rope-cuda-self-check: skipped: %s\n", reason.c_str());
        return 77;
    }
    try {
        if (bench) return run_bench(backends);
        if (tune) return run_tune();
        std::printf("rope-cuda-self-check: seed %" PRIu64 " (--seed to repeat), %d random cases per backend\n", seed, cases);
        int failures = 0, passed = 0;
        (check_helpers() ? failures : passed) += 1;
        auto cpu = make_backend("cpu-naive");
        cudaStream_t stream;
        check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
        for (const std::string& name : backends) {
            auto gpu = make_backend(name);
            int backend_failures = check_edges(*gpu);
            std::mt19937_64 rng(seed);
            for (int i = 0; random && i < cases; ++i) {
                const Case c = random_case(rng);
                const std::string problem = run_case(c, *gpu, *cpu, rng, stream);
                if (!problem.empty()) {
                    if (backend_failures < 10) std::printf("  FAIL %s case %d: %s\n    %s\n", name.c_str(), i, describe(c).c_str(), problem.c_str());
                    ++backend_failures;
                }
            }
            if (large) backend_failures += check_large(*gpu);
            std::printf("%s: %s (%d random cases%s, %d failures)\n", name.c_str(), backend_failures ? "FAILED" : "passed",
                        random ? cases : 0, large ? " + 2^31-element check" : "", backend_failures);
            (backend_failures ? failures : passed) += 1;
        }
        check_cuda(cudaStreamDestroy(stream), "cudaStreamDestroy");
        std::printf("%d passed, %d failed\n", passed, failures);  // Helper checks and backends.
        return failures ? 1 : 0;
    } catch (const std::exception& error) {
        std::printf("rope-cuda-self-check: error: %s\n", error.what());
        return 1;
    }
}
