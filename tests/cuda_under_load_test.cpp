// CUDA under load: what a serving engine does with rope that a single call
// does not show.
//  - Four host threads, each with its own non-blocking stream, call apply on
//    one shared backend object at the same moment, over and over, with
//    different inputs, dtypes and forms of positions; every result is checked.
//  - apply is captured into a CUDA graph in the strictest capture mode (a
//    device allocation, a copy or a synchronisation would fail the capture),
//    the graph holds nothing but kernel launches, capturing runs nothing, and
//    replays compute the rotation of whatever the inputs and position ids
//    hold at replay time.
// Both run once per CUDA backend and are reported Skipped without a GPU.
#include <doctest/doctest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "backend_tags.hpp"
#include "cuda_helpers.hpp"
#include "support.hpp"

using testing::Call;
using testing::make_call;

namespace {

// Checks `result` (the call once run) against the oracle for `before` (the
// same call before running) and against cpu-naive, and that it wrote nothing
// outside its outputs' views.
void check_result(const Call& before, const Call& result, int64_t max_position) {
    const testing::Expected want = testing::oracle_for(before);
    const testing::Tolerance tolerance = testing::oracle_tolerance(before.q.view.dtype, max_position);
    testing::check_close(result.q_result().values(), want.q, tolerance.rel_l2, tolerance.max_abs, "q vs oracle");
    testing::check_close(result.k_result().values(), want.k, tolerance.rel_l2, tolerance.max_abs, "k vs oracle");
    const std::string writes = testing::unexpected_writes(before, result);
    CHECK_MESSAGE(writes.empty(), writes);
    Call reference = before;
    auto naive = rope::make_backend("cpu-naive");
    testing::run(*naive, reference);
    const testing::Tolerance agree = testing::naive_agreement(before.q.view.dtype);
    testing::check_close(result.q_result().values(), reference.q_result().values(), agree.rel_l2, agree.max_abs,
                         "q vs cpu-naive");
    testing::check_close(result.k_result().values(), reference.k_result().values(), agree.rel_l2, agree.max_abs,
                         "k vs cpu-naive");
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("CUDA under load: four threads on four non-blocking streams share one backend", B,
                          streams) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    CAPTURE(testing::seed());
    constexpr int lanes = 4;
    constexpr int calls_per_lane = 25;  // Out of place, so repeating a call changes nothing but the load.
    rope::RopeConfig config;
    config.head_dim = 128;
    config.base = 500000.0;
    // Each lane: its own inputs (a few MB, so kernels of different lanes overlap), dtype, style and positions.
    const rope::DType dtypes[lanes] = {rope::DType::f32, rope::DType::bf16, rope::DType::f32, rope::DType::f16};
    std::vector<Call> calls;
    std::vector<int64_t> max_positions;
    for (int lane = 0; lane < lanes; ++lane) {
        config.style = lane % 2 == 0 ? rope::Style::half_split : rope::Style::interleaved;
        const int64_t seq = 256 + 64 * lane;
        Call call = make_call(config, dtypes[lane], rope::Layout::bshd, {2, seq, 16, 128}, {2, seq, 4, 128});
        int64_t max_position = seq;
        if (lane == 1) {  // A decode-like offset.
            call.offset = 70000;
            max_position = call.offset + seq;
        } else if (lane >= 2) {  // Shared ids (lane 2), one row per sequence (lane 3), on the device.
            call.id_rows = lane == 2 ? 1 : 2;
            std::uniform_int_distribution<int64_t> id(0, 32767);
            for (int64_t i = 0; i < call.id_rows * seq; ++i) call.ids.push_back(id(testing::rng()));
            max_position = 32768;
        }
        calls.push_back(call);
        max_positions.push_back(max_position);
    }
    // Staged before any thread starts, so the lanes' applies overlap only each other.
    std::vector<std::unique_ptr<testing::DeviceCall>> staged;
    std::vector<std::unique_ptr<rope::CudaStream>> streams;
    for (int lane = 0; lane < lanes; ++lane) {
        staged.push_back(std::make_unique<testing::DeviceCall>(calls[size_t(lane)]));
        streams.push_back(std::make_unique<rope::CudaStream>());
        staged.back()->args.stream = streams.back()->get();
    }
    std::atomic<int> ready{0};
    std::vector<std::string> errors(lanes);
    std::vector<std::thread> threads;
    for (int lane = 0; lane < lanes; ++lane) {
        threads.emplace_back([&, lane] {
            ++ready;
            while (ready.load() < lanes) std::this_thread::yield();  // Start together.
            try {
                for (int i = 0; i < calls_per_lane; ++i)
                    rope::apply(*backend, calls[size_t(lane)].config, staged[size_t(lane)]->args);
                streams[size_t(lane)]->synchronize();
            } catch (const std::exception& error) {
                errors[size_t(lane)] = error.what();
            }
        });
    }
    for (std::thread& thread : threads) thread.join();
    for (int lane = 0; lane < lanes; ++lane) {
        CAPTURE(lane);
        CHECK_MESSAGE(errors[size_t(lane)].empty(), errors[size_t(lane)]);
        Call result = calls[size_t(lane)];
        staged[size_t(lane)]->copy_back(result);
        check_result(calls[size_t(lane)], result, max_positions[size_t(lane)]);
    }
}
TEST_CASE_TEMPLATE_APPLY(streams, CudaBackends);

TEST_CASE_TEMPLATE_DEFINE("CUDA under load: apply captured into a CUDA graph and replayed", B, graph) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    CAPTURE(testing::seed());
    rope::RopeConfig config;
    config.head_dim = 128;
    config.rotary_dim = 64;
    Call call = make_call(config, rope::DType::bf16, rope::Layout::bshd, {2, 40, 8, 128}, {2, 40, 2, 128});
    std::uniform_int_distribution<int64_t> id(0, 4095);
    call.id_rows = 2;  // Device-resident ids, one row per sequence: the graph must read them at replay.
    for (int64_t i = 0; i < 2 * 40; ++i) call.ids.push_back(id(testing::rng()));
    testing::DeviceCall device(call);
    rope::CudaStream stream;
    device.args.stream = stream.get();
    // One call outside capture first, as before capturing any CUDA library:
    // the first launch of a kernel may load its code.
    rope::apply(*backend, config, device.args);
    stream.synchronize();
    device.q_out.buffer.copy_from_host(call.q_out.storage.data());  // Outputs back to poison.
    device.k_out.buffer.copy_from_host(call.k_out.storage.data());

    testing::cuda::Graph graph(stream, [&] { rope::apply(*backend, config, device.args); });
    CHECK(graph.nodes() >= 1);
    CHECK(graph.kernel_nodes() == graph.nodes());  // No copy, memset, allocation or host node.
    {
        // Capturing records; it runs nothing: the outputs still hold their poison.
        Call after_capture = call;
        device.copy_back(after_capture);
        CHECK(after_capture.q_out.storage == call.q_out.storage);
        CHECK(after_capture.k_out.storage == call.k_out.storage);
    }
    // Replay three times (out of place: the same result each time).
    for (int replay = 0; replay < 3; ++replay) graph.launch(stream);
    stream.synchronize();
    Call result = call;
    device.copy_back(result);
    check_result(call, result, 4096);

    // New inputs and new ids in the same device memory, outputs poisoned again:
    // a replay rotates what is there now.
    Call second = call;
    second.q.fill_random();
    second.k.fill_random();
    for (int64_t& position : second.ids) position = id(testing::rng());
    device.q.buffer.copy_from_host(second.q.storage.data());
    device.k.buffer.copy_from_host(second.k.storage.data());
    device.q_out.buffer.copy_from_host(second.q_out.storage.data());
    device.k_out.buffer.copy_from_host(second.k_out.storage.data());
    device.ids.copy_from_host(second.ids.data());
    graph.launch(stream);
    stream.synchronize();
    Call second_result = second;
    device.copy_back(second_result);
    check_result(second, second_result, 4096);
}
TEST_CASE_TEMPLATE_APPLY(graph, CudaBackends);
