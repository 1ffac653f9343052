#pragma once
// Device-side helpers shared by the ladder's kernels (v1..v6 *.cu).
#include <cuda_runtime_api.h>

#include <rope/error.hpp>
#include <rope/rotation.hpp>

#include "ladder.hpp"

namespace ladder {

/// Throws rope::Error naming @p what if the last kernel launch was rejected.
//! [check_launch]
inline void check_launch(const char* what) {
    const cudaError_t status = cudaGetLastError();
    if (status != cudaSuccess) rope::fail(what, cudaGetErrorName(status), cudaGetErrorString(status));
}
//! [check_launch]

/// cos and sin of pair i at `position`: the library's float32 angle, accurate sincosf.
__device__ inline void angle_cos_sin(const Problem& p, int64_t position, int64_t i, float& c, float& s) {
    sincosf(rope::rope_angle(position, p.inv_freq[i]), &s, &c);
}

/// Rotates the 4 pairs (x.x, y.x) .. (x.w, y.w) by their cos/sin.
__device__ inline void rotate4(float4& x, float4& y, const float (&c)[4], const float (&s)[4]) {
    rope::rotate_pair(x.x, y.x, c[0], s[0]);
    rope::rotate_pair(x.y, y.y, c[1], s[1]);
    rope::rotate_pair(x.z, y.z, c[2], s[2]);
    rope::rotate_pair(x.w, y.w, c[3], s[3]);
}

/// Launchers of each version (v1_*.cu .. v6_*.cu).
void launch_v1(const Problem& p, const Grid& grid);
void launch_v2(const Problem& p, const Grid& grid);
void launch_v3(const Problem& p, const Grid& grid);
void launch_v4(const Problem& p, const Grid& grid);
/// v5's kernel, any number of heads per thread (v5: all of them; v6: grid_v6's choice).
void launch_cos_sin_per_token(const Problem& p, const Grid& grid);
void launch_v6(const Problem& p, const Device& device);

}  // namespace ladder
