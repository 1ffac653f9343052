// Rotates one small q/k pair with cpu-naive through the installed rope package
// and checks one element against the formula by hand.
#include <cmath>
#include <cstdio>
#include <vector>

#include <rope/rope.hpp>

int main() {
    std::vector<float> q(1 * 1 * 3 * 4, 1.0f), k(1 * 1 * 3 * 4, 0.5f);
    rope::RopeConfig config;
    config.head_dim = 4;
    auto qv = rope::TensorView::contiguous(q.data(), rope::DType::f32, rope::Device::host, rope::Layout::bhsd, {1, 1, 3, 4});
    auto kv = rope::TensorView::contiguous(k.data(), rope::DType::f32, rope::Device::host, rope::Layout::bhsd, {1, 1, 3, 4});
    auto backend = rope::make_backend("cpu-naive");
    rope::apply(*backend, config, rope::RopeArgs::in_place(qv, kv));
    // Token 2, pair 0 (features 0 and 2): theta_0 = 1, angle 2: x' = cos 2 - sin 2.
    const double want = std::cos(2.0) - std::sin(2.0);
    const double got = q[2 * 4 + 0];
    std::printf("consumer: q[0,0,2,0] = %.7f, expected %.7f\n", got, want);
    return std::fabs(got - want) < 1e-6 ? 0 : 1;
}
