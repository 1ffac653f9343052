// rope::rerotate on every backend: keys rotated at positions `from` turned to
// positions `to` in one rotation by the angle difference. Checked against the
// float64 oracle's own re-rotation (oracle::rerotate), against raw keys rotated
// at the new positions, against many small successive shifts (the drift), as the
// inverse (to = 0), and on bad input (a rope::Error naming the parameter, nothing written).
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "backend_tags.hpp"
#include "oracle.hpp"
#include "rope/detail/pair_step.hpp"
#include "rope/detail/plan.hpp"
#include "rope/rerotate.hpp"
#include "support.hpp"

namespace {

using testing::Call;
using testing::HostTensor;

// The accuracy of one rotation in the precise mode, fp32 storage, at any position:
// the angle, reduced to [-pi, pi] in double, is rounded once to float32 (2.4e-7
// radians at most), cos and sin are within 2 float32 ulps, and the products and
// the stored result round once more; over pairs of norm up to 2*sqrt(2) that is
// below 2e-6 per element. A float32 angle (the default mode) would instead be
// wrong by position * 6e-8 radians: 0.06 at the positions near 1e6 used below.
constexpr double kOneRotationRel = 1e-6;
constexpr double kOneRotationAbs = 4e-6;

// A re-rotation on host data: keys, their output, and two calls whose position
// fields (offset, ids, cu_seqlens, starts, cp) give `from` and `to`.
struct Rerotation {
    rope::RopeConfig config;
    HostTensor k, k_out;
    Call from, to;
    bool in_place = false;
    const HostTensor& result() const { return in_place ? k : k_out; }
};

Rerotation make_rerotation(const rope::RopeConfig& config, rope::DType dtype, rope::Layout layout,
                           std::array<int64_t, 4> shape, int64_t pad = 0) {
    Rerotation r;
    r.config = config;
    r.k = HostTensor::make(dtype, layout, shape, pad);
    r.k.fill_random();
    r.k_out = HostTensor::make(dtype, layout, shape, pad);
    r.k_out.poison();
    return r;
}

// Runs the re-rotation on `backend`; CUDA backends get device copies of the keys and
// of both positions' arrays (testing::DeviceCall), and the results come back.
void run(rope::Backend& backend, Rerotation& r) {
    if (backend.device() == rope::Device::host) {
        const rope::RerotateArgs args =
            r.in_place ? rope::RerotateArgs::in_place(r.k.view, r.from.positions(), r.to.positions())
                       : rope::RerotateArgs::out_of_place(r.k.view, r.k_out.view, r.from.positions(), r.to.positions());
        rope::rerotate(backend, r.config, args);
        return;
    }
    Call keys = r.to;  // The keys travel with `to`'s position arrays.
    keys.k = r.k;
    keys.k_out = r.k_out;
    keys.in_place = r.in_place;
    const testing::DeviceCall staged(keys);
    const testing::DeviceCall from(r.from);
    rope::rerotate(backend, r.config,
                   rope::RerotateArgs{staged.args.k, staged.args.k_out, from.args.positions, staged.args.positions});
    staged.copy_back(keys);
    r.k = keys.k;
    r.k_out = keys.k_out;
}

// Keys as a model leaves them: `raw` rotated at `positions` by rope::apply on cpu-naive.
HostTensor rotated(const rope::RopeConfig& config, const HostTensor& raw, const Call& positions) {
    HostTensor keys = raw;
    auto naive = rope::make_backend("cpu-naive");
    rope::TensorView no_q = keys.view;
    no_q.shape[keys.view.layout == rope::Layout::bshd ? 2 : 1] = 0;
    rope::apply(*naive, config, rope::RopeArgs::in_place(no_q, keys.view, positions.positions()));
    return keys;
}

// Sets r's keys to `raw` rotated at r.from by `config` (rotated), and a poisoned
// k_out of raw's geometry: the start of a re-rotation of keys a model left.
void rotate_keys(Rerotation& r, const rope::RopeConfig& config, const HostTensor& raw) {
    r.k = rotated(config, raw, r.from);
    r.k_out = raw;
    r.k_out.poison();
}

// Runs `r` on the backend and checks its result against the float64 oracle's
// re-rotation of its keys as they were before the run.
void check_oracle(rope::Backend& backend, Rerotation& r, double rel_tol = kOneRotationRel,
                  double abs_tol = kOneRotationAbs) {
    const auto want = oracle::rerotate(r.config, r.k.view, r.from.positions(), r.to.positions());
    run(backend, r);
    testing::check_close(r.result().values(), want, rel_tol, abs_tol, "k vs oracle");
}

std::vector<int64_t> random_ids(size_t count, int64_t low, int64_t high) {
    std::uniform_int_distribution<int64_t> id(low, high);
    std::vector<int64_t> ids(count);
    for (int64_t& value : ids) value = id(testing::rng());
    return ids;
}

void set_ids(Call& call, std::vector<int64_t> ids, int64_t rows, int64_t axes = 1) {
    call.ids = std::move(ids);
    call.id_rows = rows;
    call.id_axes = axes;
}

}  // namespace

TEST_CASE_TEMPLATE_DEFINE("rerotate matches the float64 oracle in every position form", B, rerotate_oracle) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    CAPTURE(testing::seed());
    rope::RopeConfig config{.head_dim = 64};

    SUBCASE("offsets, far back (eviction), bhsd fp32, in place") {
        Rerotation r = make_rerotation(config, rope::DType::f32, rope::Layout::bhsd, {2, 3, 40, 64});
        r.from.offset = 1'000'000;
        r.to.offset = 4;
        r.in_place = true;
        check_oracle(*backend, r);
    }
    SUBCASE("per-sequence ids to shared ids, interleaved, partial rotary, bshd padded, out of place") {
        config.rotary_dim = 48;
        config.style = rope::Style::interleaved;
        Rerotation r = make_rerotation(config, rope::DType::f32, rope::Layout::bshd, {2, 17, 4, 64}, 3);
        set_ids(r.from, random_ids(2 * 17, 0, 200'000), 2);
        set_ids(r.to, random_ids(17, 0, 200'000), 1);
        const HostTensor input = r.k;
        check_oracle(*backend, r);
        CHECK(std::memcmp(r.k.storage.data(), input.storage.data(), input.bytes()) == 0);  // Input untouched.
    }
    SUBCASE("packed sequences with starts to an offset, thd, linear scaling") {
        config.scaling = rope::Scaling{.type = rope::ScalingType::linear, .factor = 4.0};
        Rerotation r;
        r.config = config;
        r.k = testing::make_packed(rope::DType::f32, {23, 2, 64});
        r.k.fill_random();
        r.k_out = testing::make_packed(rope::DType::f32, {23, 2, 64});
        r.k_out.poison();
        r.from.cu_seqlens = {0, 5, 5, 23};
        r.from.starts = {70'000, 3, 12};
        r.to.offset = 9;
        check_oracle(*backend, r);
    }
    SUBCASE("M-RoPE ids with distinct temporal, height and width rows") {
        config.rotary_dim = 64;
        config.multi_axis = rope::MultiAxis{rope::AxisAssignment::mrope_contiguous, {8, 12, 12}};
        Rerotation r = make_rerotation(config, rope::DType::f32, rope::Layout::bhsd, {1, 2, 21, 64});
        set_ids(r.from, random_ids(3 * 21, 0, 5000), 1, 3);
        set_ids(r.to, random_ids(3 * 21, 0, 5000), 1, 3);
        check_oracle(*backend, r);
    }
    SUBCASE("fp16 and bf16 storage: one rotation, then one rounding to the storage type") {
        for (const rope::DType dtype : {rope::DType::f16, rope::DType::bf16}) {
            CAPTURE(rope::dtype_name(dtype));
            Rerotation r = make_rerotation(config, dtype, rope::Layout::bshd, {1, 31, 2, 64});
            r.from.offset = 300'000;
            r.to.offset = 17;
            const testing::Tolerance tolerance = testing::oracle_tolerance(dtype, 1);
            check_oracle(*backend, r, tolerance.rel_l2, tolerance.max_abs);
        }
    }
}
TEST_CASE_TEMPLATE_APPLY(rerotate_oracle, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("re-rotating rotated keys equals rotating the raw keys at the new positions", B,
                          rerotate_raw) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    CAPTURE(testing::seed());
    const rope::RopeConfig config{.head_dim = 128, .rotary_dim = 96};
    // Positions near 3000: the keys were rotated by rope::apply in the default
    // (float32 angle) mode, as models do, whose error there is fp32_tolerance(3100).
    const int64_t reach = 3100;
    for (const rope::DType dtype : {rope::DType::f32, rope::DType::f16, rope::DType::bf16}) {
        CAPTURE(rope::dtype_name(dtype));
        HostTensor raw = HostTensor::make(dtype, rope::Layout::bshd, {2, 24, 3, 128});
        raw.fill_random();
        Rerotation r;
        r.config = config;
        set_ids(r.from, random_ids(2 * 24, 2900, reach - 1), 2);
        set_ids(r.to, random_ids(24, 0, 50), 1);
        rotate_keys(r, config, raw);
        run(*backend, r);
        // Two roundings to the storage type (the rotated keys, then the re-rotated
        // ones) instead of one: twice the tolerance of one call.
        const testing::Tolerance one = testing::oracle_tolerance(dtype, reach);
        const auto want = oracle::rotate(config, raw.view, r.to.positions(), rope::Direction::forward);
        testing::check_close(r.result().values(), want, 2 * one.rel_l2, 2 * one.max_abs, "re-rotated vs raw at to");
    }
}
TEST_CASE_TEMPLATE_APPLY(rerotate_raw, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("re-rotation keeps the attention factor the keys carry (yarn, longrope)", B,
                          rerotate_attention) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    CAPTURE(testing::seed());
    // The oracle has no yarn or longrope: rope::apply at `to` on the raw keys is the
    // reference (a re-rotation that scaled by the attention factor again, about 1.2
    // for yarn factor 8, or used other frequencies, would miss it by far more).
    rope::RopeConfig yarn{.head_dim = 64};
    yarn.scaling = rope::Scaling{.type = rope::ScalingType::yarn, .factor = 8.0, .original_max_position_embeddings = 2048};
    rope::RopeConfig longrope{.head_dim = 64};
    longrope.scaling.type = rope::ScalingType::longrope;
    longrope.scaling.factor = 4.0;
    longrope.scaling.original_max_position_embeddings = 4096;
    longrope.scaling.short_factor = std::vector<double>(32, 1.5);
    longrope.scaling.long_factor = std::vector<double>(32, 6.0);
    for (const rope::RopeConfig& config : {yarn, longrope}) {
        CAPTURE(rope::scaling_type_name(config.scaling.type));
        HostTensor raw = HostTensor::make(rope::DType::f32, rope::Layout::bhsd, {1, 2, 16, 64});
        raw.fill_random();
        Rerotation r;
        r.config = config;
        r.from.offset = 1000;  // Both within 4096: longrope's short factors on both sides.
        r.to.offset = 10;
        rotate_keys(r, config, raw);
        run(*backend, r);
        const HostTensor want = rotated(config, raw, r.to);
        testing::check_close(r.result().values(), want.values(), testing::fp32_tolerance(1016),
                             testing::fp32_max_abs(1016), "re-rotated vs raw rotated at to");
    }
}
TEST_CASE_TEMPLATE_APPLY(rerotate_attention, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("one direct re-rotation against ten successive small shifts (drift)", B, rerotate_drift) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    CAPTURE(testing::seed());
    const rope::RopeConfig config{.head_dim = 128};
    Rerotation start = make_rerotation(config, rope::DType::f32, rope::Layout::bhsd, {1, 8, 64, 128});
    start.from.offset = 40'000;
    // Ten shifts back of 1 to 3 positions each, as an engine evicting a few tokens per step.
    const std::vector<int64_t> shifts = random_ids(10, 1, 3);
    const int64_t total = std::accumulate(shifts.begin(), shifts.end(), int64_t(0));
    Call end;
    end.offset = start.from.offset - total;
    const auto want = oracle::rerotate(config, start.k.view, start.from.positions(), end.positions());

    Rerotation direct = start;
    direct.to = end;
    run(*backend, direct);

    Rerotation step = start;  // Ten in-place corrections, each by its own shift.
    step.in_place = true;
    for (const int64_t shift : shifts) {
        step.to.offset = step.from.offset - shift;
        run(*backend, step);
        step.from.offset = step.to.offset;
    }
    const oracle::ErrorStats one = oracle::compare(direct.result().values(), want);
    const oracle::ErrorStats ten = oracle::compare(step.result().values(), want);
    INFO("direct: rel_l2 " << one.rel_l2 << ", max_abs " << one.max_abs << "; ten shifts: rel_l2 " << ten.rel_l2
                           << ", max_abs " << ten.max_abs);
    // The bound: the direct re-rotation is one rotation (its angle difference formed
    // before rounding), so it meets one rotation's bound, whatever the distance and
    // however many moves it replaces. Each successive shift adds its own rounding of
    // the angle and of the stored keys, independent of the others: the ten drift as
    // a random walk, about sqrt(10) times one rotation's error (with float32 angles,
    // as engines form them, each step's angle is also off by position * 6e-8).
    CHECK(one.non_finite == 0);
    CHECK(one.rel_l2 <= kOneRotationRel);
    CHECK(one.max_abs <= kOneRotationAbs);
    CHECK(ten.rel_l2 > 2 * one.rel_l2);  // sqrt(10) expected.
}
TEST_CASE_TEMPLATE_APPLY(rerotate_drift, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("to = 0 inverts: the exact transpose, pass-through bits untouched", B, rerotate_inverse) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    CAPTURE(testing::seed());
    // Partial rotary: the rotated window [0, 64), the trailing 32 features pass through.
    const rope::RopeConfig config{.head_dim = 96, .rotary_dim = 64};
    rope::RopeConfig precise = config;
    precise.precise_angles = true;
    for (const bool in_place : {true, false}) {
        CAPTURE(in_place);
        HostTensor raw = HostTensor::make(rope::DType::f32, rope::Layout::bshd, {2, 19, 2, 96}, 5);
        raw.fill_random();
        Rerotation r;
        r.config = config;
        r.in_place = in_place;
        set_ids(r.from, random_ids(2 * 19, 0, 500'000), 2);
        set_ids(r.to, std::vector<int64_t>(19, 0), 1);
        rotate_keys(r, precise, raw);
        const HostTensor keys = r.k;
        run(*backend, r);
        // Back to the raw keys, within one rotation of each of the two precise rotations.
        testing::check_close(r.result().values(), raw.values(), 2 * kOneRotationRel, 2 * kOneRotationAbs,
                             "k back at position 0 vs raw k");
        // Bit for bit the transpose rope::apply's inverse applies on the same backend: the
        // angle of -p is exactly minus that of p, so cos is the same and sin its negation.
        HostTensor transposed = keys;
        if (backend->device() == rope::Device::host) {
            rope::TensorView no_q = transposed.view;
            no_q.shape[2] = 0;
            rope::apply(*backend, precise,
                        rope::RopeArgs::in_place(no_q, transposed.view, r.from.positions(), rope::Direction::inverse));
        } else {
            Call inverse = r.from;
            inverse.config = precise;
            inverse.k = transposed;
            inverse.q = transposed;  // No query heads: keys only.
            inverse.q.view.shape[2] = 0;
            inverse.q_out = inverse.q;
            inverse.in_place = true;
            inverse.direction = rope::Direction::inverse;
            testing::run(*backend, inverse);
            transposed = inverse.k;
        }
        const rope::TensorView& got = r.result().view;
        int64_t differing = 0, pass_changed = 0;
        for (int64_t b = 0; b < 2; ++b)
            for (int64_t h = 0; h < 2; ++h)
                for (int64_t s = 0; s < 19; ++s)
                    for (int64_t d = 0; d < 96; ++d) {
                        const double value = oracle::read(got, b, h, s, d);
                        if (value != oracle::read(transposed.view, b, h, s, d)) ++differing;
                        if (d >= 64 && value != oracle::read(keys.view, b, h, s, d)) ++pass_changed;
                    }
        CHECK(differing == 0);
        CHECK(pass_changed == 0);
    }
}
TEST_CASE_TEMPLATE_APPLY(rerotate_inverse, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("length-dependent scaling: one frequency table, or a clear refusal", B, rerotate_dynamic) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    CAPTURE(testing::seed());
    rope::RopeConfig config{.head_dim = 64};
    config.scaling = rope::Scaling{.type = rope::ScalingType::dynamic, .factor = 2.0,
                                   .original_max_position_embeddings = 1024};
    HostTensor raw = HostTensor::make(rope::DType::f32, rope::Layout::bhsd, {1, 2, 8, 64});
    raw.fill_random();
    SUBCASE("both within the original length: the unscaled frequencies") {
        Rerotation r;
        r.config = config;
        r.from.offset = 900;
        r.to.offset = 3;
        rotate_keys(r, config, raw);
        run(*backend, r);
        testing::check_close(r.result().values(), rotated(config, raw, r.to).values(), testing::fp32_tolerance(910),
                             testing::fp32_max_abs(910), "re-rotated vs raw rotated at to");
    }
    SUBCASE("to all 0 takes from's (scaled) frequencies: the inverse") {
        Rerotation r;
        r.config = config;
        r.from.offset = 5000;
        set_ids(r.to, std::vector<int64_t>(8, 0), 1);
        rotate_keys(r, config, raw);
        run(*backend, r);
        testing::check_close(r.result().values(), raw.values(), testing::fp32_tolerance(5010),
                             testing::fp32_max_abs(5010), "k back at 0 vs raw k");
    }
    SUBCASE("frequencies that differ are refused, naming scaling.type, nothing written") {
        Rerotation r;
        r.config = config;
        r.from.offset = 5000;
        r.to.offset = 3;
        rotate_keys(r, config, raw);
        const Rerotation before = r;
        CHECK_THROWS_WITH_AS(run(*backend, r), doctest::Contains("scaling.type = dynamic"), rope::Error);
        CHECK(r.k_out.storage == before.k_out.storage);
    }
}
TEST_CASE_TEMPLATE_APPLY(rerotate_dynamic, AllBackends);

TEST_CASE_TEMPLATE_DEFINE("rerotate: bad input names the parameter and writes nothing", B, rerotate_bad_input) {
    auto backend = testing::backend_or_skip(B::name);
    if (!backend) return;
    const rope::RopeConfig config{.head_dim = 64};
    struct Case {
        const char* message;
        std::function<void(Rerotation&)> spoil;
        bool host_values = false;  // Found in the ids' values, which only host arrays let rope read.
    };
    const std::vector<Case> cases{
        {"k head_dim = 64", [](Rerotation& r) { r.config.head_dim = 32; }},
        {"k_out seq = 9", [](Rerotation& r) { r.k_out = HostTensor::make(rope::DType::f32, rope::Layout::bhsd, {1, 2, 9, 64}); }},
        {"k_out.dtype = bf16", [](Rerotation& r) { r.k_out = HostTensor::make(rope::DType::bf16, rope::Layout::bhsd, {1, 2, 10, 64}); }},
        {"from.length = 9", [](Rerotation& r) { set_ids(r.from, std::vector<int64_t>(9, 1), 1); }},
        {"to.length = 11", [](Rerotation& r) { set_ids(r.to, std::vector<int64_t>(11, 1), 1); }},
        {"from.ids[3] = -2", [](Rerotation& r) { set_ids(r.from, {0, 1, 2, -2, 4, 5, 6, 7, 8, 9}, 1); }, true},
        {"to.ids[7] = -1", [](Rerotation& r) { std::vector<int64_t> ids(10, 5); ids[7] = -1; set_ids(r.to, ids, 1); }, true},
        {"from.rows = 3", [](Rerotation& r) { set_ids(r.from, std::vector<int64_t>(30, 1), 3); }},
        {"from.axes = 3", [](Rerotation& r) { set_ids(r.from, std::vector<int64_t>(30, 1), 1, 3); }},
        {"from.offset = -5", [](Rerotation& r) { r.from.offset = -5; }},
        {"to.offset = -1", [](Rerotation& r) { r.to.offset = -1; }},
        {"from.cp_rank = 2", [](Rerotation& r) { r.from.cp_size = 2; r.from.cp_rank = 2; }},
        {"batch = 2", [](Rerotation& r) { r.from.cu_seqlens = {0, 10}; r.k = HostTensor::make(rope::DType::f32, rope::Layout::bhsd, {2, 2, 10, 64}); r.k_out = r.k; }},
        {"from.cu_seqlens[1] = 4", [](Rerotation& r) { r.from.cu_seqlens = {0, 4}; }, true},
    };
    for (const Case& bad : cases) {
        if (bad.host_values && backend->device() != rope::Device::host) continue;
        CAPTURE(bad.message);
        Rerotation r = make_rerotation(config, rope::DType::f32, rope::Layout::bhsd, {1, 2, 10, 64});
        bad.spoil(r);
        r.k.fill_random();
        r.k_out.poison();
        const Rerotation before = r;
        CHECK_THROWS_WITH_AS(run(*backend, r), doctest::Contains(bad.message), rope::Error);
        CHECK(r.k.storage == before.k.storage);
        CHECK(r.k_out.storage == before.k_out.storage);
    }
    SUBCASE("from's ids on the wrong device") {
        if (backend->device() != rope::Device::host) return;
        Rerotation r = make_rerotation(config, rope::DType::f32, rope::Layout::bhsd, {1, 2, 10, 64});
        std::vector<int64_t> ids(10, 1);
        rope::Positions from = rope::Positions::shared(ids.data(), 10, rope::Device::cuda);
        CHECK_THROWS_WITH_AS(rope::rerotate(*backend, config, rope::RerotateArgs::out_of_place(r.k.view, r.k_out.view, from, {})),
                             doctest::Contains("from.device = cuda"), rope::Error);
    }
    SUBCASE("k_out partly overlapping k") {
        if (backend->device() != rope::Device::host) return;
        Rerotation r = make_rerotation(config, rope::DType::f32, rope::Layout::bhsd, {1, 2, 10, 64});
        rope::TensorView shifted = r.k.view;
        shifted.data = static_cast<float*>(r.k.view.data) + 64;
        shifted.shape[2] = 9;
        rope::TensorView k = r.k.view;
        k.shape[2] = 9;
        CHECK_THROWS_WITH_AS(rope::rerotate(*backend, config, rope::RerotateArgs::out_of_place(k, shifted, {}, {})),
                             doctest::Contains("k_out.data"), rope::Error);
    }
}
TEST_CASE_TEMPLATE_APPLY(rerotate_bad_input, AllBackends);

namespace {
// A backend that only records the plan it is handed.
class PlanRecorder final : public rope::Backend {
public:
    std::string name() const override { return "plan-recorder"; }
    rope::Device device() const override { return rope::Device::host; }
    void run(const rope::Plan& plan) override { plans.push_back(plan); }
    std::vector<rope::Plan> plans;
};
}  // namespace

TEST_CASE("a re-rotation's plan: relative positions, the precise angle path, no scale; apply's plans are not relative") {
    PlanRecorder recorder;
    rope::RopeConfig config{.head_dim = 64};
    config.scaling = rope::Scaling{.type = rope::ScalingType::yarn, .factor = 4.0, .original_max_position_embeddings = 512};
    Rerotation r = make_rerotation(config, rope::DType::f32, rope::Layout::bhsd, {1, 2, 6, 64});
    r.from.offset = 100;
    set_ids(r.to, {5, 4, 3, 2, 1, 0}, 1);
    run(recorder, r);
    rope::TensorView no_q = r.k.view;
    no_q.shape[1] = 0;
    rope::RopeArgs call = rope::RopeArgs::in_place(no_q, r.k.view, r.to.positions());
    rope::apply(recorder, config, call);
    REQUIRE(recorder.plans.size() == 2);
    const rope::Plan& moved = recorder.plans[0];
    CHECK(moved.positions.relative);
    CHECK(moved.angles.precise);
    // cuda-optimized's default-angle kernel, which never reads `from`, is chosen only where this holds.
    CHECK_FALSE(rope::default_angle_only(moved.angles));
    CHECK(moved.angles.cos_scale == 1.0f);  // yarn's attention factor is not applied again.
    CHECK(moved.angles.sin_scale == 1.0f);
    CHECK(moved.q.in_geometry.heads == 0);
    for (int64_t s = 0; s < 6; ++s) CHECK(moved.positions.at(0, s) == (5 - s) - (100 + s));
    const rope::Plan& applied = recorder.plans[1];
    CHECK_FALSE(applied.positions.relative);
    CHECK(rope::default_angle_only(applied.angles));
    CHECK(applied.angles.cos_scale != 1.0f);
}
