// Chapter 3: naive CUDA, the direct port.
//
// cuda-naive (cuda/naive_backend.cu) is chapter 1's loops on a GPU: each
// iteration of the innermost loop becomes one GPU thread. The arithmetic is
// the same code (rope_angle, pair_elements, rotate_pair are compiled for both
// sides); what is new is everything around it:
//   1. the launch configuration: how many threads, grouped into how many blocks;
//   2. host and device memory: the GPU computes on its own memory, so q and k
//      travel there and back (rope::Buffer);
//   3. error checking: every CUDA call returns a status; a <<<>>> launch
//      reports only through cudaGetLastError, so the library launches with
//      cudaLaunchKernelEx, which returns the status of that launch alone; a
//      fault inside a kernel surfaces later, at the next synchronising call.
// Without a GPU the chapter shows what it can (1 and 3) and reports SKIPPED.
#include <cstdio>
#include <string>
#include <vector>

#include <rope/rope.hpp>

#include "tutorial.hpp"

#if ROPE_TUTORIAL_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace {

// Chapter 2's layer: q [1, 32, 2048, 128], k [1, 8, 2048, 128], float32, base 500000.
const tutorial::Shape kQuery{.batch = 1, .heads = 32, .seq = 2048, .head_dim = 128};
const tutorial::Shape kKey{.batch = 1, .heads = 8, .seq = 2048, .head_dim = 128};

// The grid cuda-naive launches, worked out on the host exactly as its run()
// does (cuda/naive_backend.cu): one thread per rotated pair or pass-through
// feature of every head row of q and k, 256 threads per block.
struct Launch {
    int64_t threads_needed;  // Work items: one per thread.
    int64_t threads_per_block;
    int64_t blocks;
};

Launch naive_launch(const tutorial::Shape& q, const tutorial::Shape& k, int64_t rotary_dim) {
    const int64_t items_per_row = rotary_dim / 2 + (q.head_dim - rotary_dim);
    const int64_t rows = (q.heads + k.heads) * q.batch * q.seq;
    Launch launch{rows * items_per_row, 256, 0};
    launch.blocks = (launch.threads_needed + launch.threads_per_block - 1) / launch.threads_per_block;
    return launch;
}

// What the GPU can hold at once: its multiprocessors (SMs) and how many threads
// each keeps resident. Asked from the device when there is one; otherwise the
// published figures of an NVIDIA H200 (132 SMs, 2048 threads per SM).
struct DeviceShape {
    std::string name = "NVIDIA H200 (assumed: no GPU here)";
    int sms = 132;
    int threads_per_sm = 2048;
};

DeviceShape device_shape() {
    DeviceShape shape;
#if ROPE_TUTORIAL_HAVE_CUDA
    if (rope::cuda_device_count() > 0) {
        // Raw CUDA calls return a status; checking every one is the habit to form.
        cudaDeviceProp properties{};
        if (cudaGetDeviceProperties(&properties, 0) == cudaSuccess &&
            cudaDeviceGetAttribute(&shape.sms, cudaDevAttrMultiProcessorCount, 0) == cudaSuccess &&
            cudaDeviceGetAttribute(&shape.threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, 0) == cudaSuccess)
            shape.name = properties.name;
    }
#endif
    return shape;
}

// Runs `body` and prints the rope::Error it throws (what a user would see).
template <typename Body>
bool prints_error(const char* what, Body&& body) {
    try {
        body();
    } catch (const rope::Error& error) {
        std::printf("  %s\n    -> %s\n", what, error.what());
        return true;
    }
    std::printf("  %s\n    -> no error (unexpected)\n", what);
    return false;
}

}  // namespace

int main() {
    tutorial::print_title(3, "Naive CUDA: the direct port",
                          "one GPU thread per pair; q and k must live in GPU memory; check every CUDA call");
    tutorial::Checks checks;
    rope::RopeConfig config;
    config.head_dim = kQuery.head_dim;
    config.base = 500000.0;

    tutorial::print_section("1. The launch configuration");
    const Launch launch = naive_launch(kQuery, kKey, config.effective_rotary_dim());
    const DeviceShape device = device_shape();
    const int64_t resident_blocks = int64_t(device.sms) * (device.threads_per_sm / launch.threads_per_block);
    std::printf("q [1, %ld, %ld, %ld] and k [1, %ld, %ld, %ld]: %ld head rows of %ld pairs\n", long(kQuery.heads),
                long(kQuery.seq), long(kQuery.head_dim), long(kKey.heads), long(kKey.seq), long(kKey.head_dim),
                long((kQuery.heads + kKey.heads) * kQuery.seq), long(kQuery.head_dim / 2));
    std::printf("cuda-naive: one thread per pair -> %ld threads = %ld blocks x %ld threads per block\n",
                long(launch.threads_needed), long(launch.blocks), long(launch.threads_per_block));
    std::printf("device: %s, %d SMs x %d resident threads = %ld blocks at once -> %.1f waves of blocks\n",
                device.name.c_str(), device.sms, device.threads_per_sm, long(resident_blocks),
                double(launch.blocks) / double(resident_blocks));
    std::printf("Neighbouring threads take neighbouring pairs of one row, so a warp (32 threads) reads\n"
                "32 consecutive floats of each half of the row: coalesced, one 128-byte transaction each.\n");

    tutorial::print_section("2. Is there a GPU?");
    const std::string reason = rope::cuda_unavailable_reason();
    std::printf("rope::cuda_device_count() = %d%s%s\n", rope::cuda_device_count(), reason.empty() ? "" : ": ",
                reason.c_str());

    tutorial::print_section("3. Errors are exceptions that name the problem");
    if (reason.empty()) {
        auto backend = rope::make_backend("cuda-naive");
        std::vector<float> host(size_t(kKey.numel()));
        auto host_view = rope::TensorView::contiguous(host.data(), rope::DType::f32, rope::Device::host,
                                                      rope::Layout::bhsd, kKey.in(rope::Layout::bhsd));
        auto no_k = rope::TensorView::contiguous(nullptr, rope::DType::f32, rope::Device::host, rope::Layout::bhsd,
                                                 {1, 0, kKey.seq, kKey.head_dim});
        checks.expect(prints_error("host memory handed to a CUDA backend:",
                                   [&] { rope::apply(*backend, config, rope::RopeArgs::in_place(host_view, no_k)); }),
                      "rope::apply rejects host memory on a CUDA backend before launching anything");
        checks.expect(prints_error("cudaMalloc of 1 PiB:", [] { rope::Buffer(rope::Device::cuda, size_t(1) << 50); }),
                      "a failed CUDA call becomes a rope::Error with CUDA's own text");
#if ROPE_TUTORIAL_HAVE_CUDA
        // A failed call also stays recorded as the thread's "last error", which the
        // next cudaGetLastError returns: the check after the next kernel launch would
        // blame that kernel for this allocation. Reading it clears it.
        cudaGetLastError();
#endif
    } else {
        prints_error("asking for cuda-naive:", [] { rope::make_backend("cuda-naive"); });
        prints_error("allocating GPU memory:", [] { rope::Buffer(rope::Device::cuda, 1024); });
    }

    if (!reason.empty())
        return tutorial::skip("cuda-naive would launch " + std::to_string(launch.blocks) + " blocks x " +
                                  std::to_string(launch.threads_per_block) + " threads (no GPU here)",
                              "no GPU here (" + reason + "); sections 4-5 need one");

    tutorial::print_section("4. Host to device, rotate, device to host");
    const std::vector<float> q_input = tutorial::random_values(size_t(kQuery.numel()), 21);
    const std::vector<float> k_input = tutorial::random_values(size_t(kKey.numel()), 22);
    // The GPU computes on its own memory: allocate there, copy in, describe
    // that memory with Device::cuda views, rotate, copy back.
    //! [host to device and back]
    rope::Buffer q_device(rope::Device::cuda, q_input.size() * sizeof(float));
    rope::Buffer k_device(rope::Device::cuda, k_input.size() * sizeof(float));
    q_device.copy_from_host(q_input.data());
    k_device.copy_from_host(k_input.data());
    auto q_view = rope::TensorView::contiguous(q_device.data(), rope::DType::f32, rope::Device::cuda,
                                               rope::Layout::bhsd, kQuery.in(rope::Layout::bhsd));
    auto k_view = rope::TensorView::contiguous(k_device.data(), rope::DType::f32, rope::Device::cuda,
                                               rope::Layout::bhsd, kKey.in(rope::Layout::bhsd));
    auto cuda_naive = rope::make_backend("cuda-naive");
    rope::apply(*cuda_naive, config, rope::RopeArgs::in_place(q_view, k_view));  // Returns before the GPU is done.
    rope::cuda_synchronize();  // Waits, and reports any fault that happened inside the kernel.
    std::vector<float> q_gpu(q_input.size()), k_gpu(k_input.size());
    q_device.copy_to_host(q_gpu.data());
    k_device.copy_to_host(k_gpu.data());
    //! [host to device and back]

    std::vector<float> q_cpu = q_input, k_cpu = k_input;
    auto cpu_naive = rope::make_backend("cpu-naive");
    auto q_host = rope::TensorView::contiguous(q_cpu.data(), rope::DType::f32, rope::Device::host, rope::Layout::bhsd,
                                               kQuery.in(rope::Layout::bhsd));
    auto k_host = rope::TensorView::contiguous(k_cpu.data(), rope::DType::f32, rope::Device::host, rope::Layout::bhsd,
                                               kKey.in(rope::Layout::bhsd));
    rope::apply(*cpu_naive, config, rope::RopeArgs::in_place(q_host, k_host));
    const double agreement = std::max(tutorial::max_abs_difference(q_gpu, q_cpu),
                                      tutorial::max_abs_difference(k_gpu, k_cpu));
    tutorial::Formula formula;
    formula.base = config.base;
    const double error = tutorial::relative_l2(q_gpu, tutorial::rope_float64(q_input, kQuery, formula));
    std::printf("largest |cuda-naive - cpu-naive| = %.2e; relative L2 against float64 = %.2e\n", agreement, error);
    std::printf("(not 0 as in chapter 2: the GPU's sincosf and the CPU's cosf/sinf may differ in the last\n"
                " bit, and nvcc fuses x*c - y*s into one fused multiply-add)\n");
    checks.expect(agreement <= 1e-5, "cuda-naive agrees with cpu-naive to float32 rounding (<= 1e-5)");
    checks.expect(error < 2e-5, "cuda-naive matches the float64 formula (relative L2 < 2e-5)");

    tutorial::print_section("5. How long it takes");
    // A launch is asynchronous: time it up to cuda_synchronize, or you time the launch only.
    const double seconds = tutorial::median_seconds(21, [&] {
        rope::apply(*cuda_naive, config, rope::RopeArgs::in_place(q_view, k_view));
        rope::cuda_synchronize();
    });
    const double bytes = 2.0 * double(q_input.size() + k_input.size()) * sizeof(float);
    std::printf("median of 21 calls, each up to cuda_synchronize: %.1f us = %.0f GB/s for %.0f MB moved\n",
                1e6 * seconds, bytes / seconds / 1e9, bytes / 1e6);
    std::printf("(includes launch and synchronisation overheads; chapter 4 times kernels with CUDA events)\n");

    return checks.finish("cuda-naive: " + tutorial::fixed(1e6 * seconds, 1) + " us per call, " +
                         tutorial::fixed(bytes / seconds / 1e9, 0) + " GB/s on " + device.name);
}
