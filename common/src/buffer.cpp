// Buffer and CudaStream: owning host or CUDA memory, an owned CUDA stream, and
// the CUDA status check. The only file of common/ that talks to the CUDA
// runtime, and only when the build has CUDA.
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "rope/buffer.hpp"
#include "rope/cuda_check.hpp"
#include "rope/device.hpp"
#include "rope/error.hpp"

#if ROPE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace rope {
#if !ROPE_HAVE_CUDA
namespace {
[[noreturn]] void no_cuda() { fail("device", "cuda", "this build of rope has no CUDA support"); }
}  // namespace
#endif

void check_cuda(int status, const char* call) {
    if (status == 0) return;
#if ROPE_HAVE_CUDA
    const auto error = static_cast<cudaError_t>(status);
    fail(call, cudaGetErrorName(error), cudaGetErrorString(error));
#else
    fail(call, status, "a CUDA error, in a build of rope without CUDA");
#endif
}

CudaStream::CudaStream() {
#if ROPE_HAVE_CUDA
    cudaStream_t stream = nullptr;
    check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    stream_ = stream;
#else
    no_cuda();
#endif
}

CudaStream::~CudaStream() {
#if ROPE_HAVE_CUDA
    // A destructor cannot throw; a failure here surfaces at the next checked call.
    if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
#endif
}

void CudaStream::synchronize() const {
#if ROPE_HAVE_CUDA
    check_cuda(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "cudaStreamSynchronize");
#endif
}

Buffer::Buffer(Device device, std::size_t bytes) : bytes_(bytes), device_(device) {
    if (bytes == 0) return;
    if (device == Device::host) {
        data_ = std::malloc(bytes);
        if (data_ == nullptr) fail("bytes", bytes, "host allocation failed");
        return;
    }
#if ROPE_HAVE_CUDA
    check_cuda(cudaMalloc(&data_, bytes), "cudaMalloc");
#else
    no_cuda();
#endif
}

Buffer::~Buffer() { release(); }

Buffer::Buffer(Buffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)), device_(other.device_) {}

Buffer& Buffer::operator=(Buffer&& other) noexcept {
    if (this != &other) {
        release();
        data_ = std::exchange(other.data_, nullptr);
        bytes_ = std::exchange(other.bytes_, 0);
        device_ = other.device_;
    }
    return *this;
}

void Buffer::release() noexcept {
    if (data_ == nullptr) return;
    if (device_ == Device::host) std::free(data_);
#if ROPE_HAVE_CUDA
    else cudaFree(data_);  // A destructor cannot throw; a failure here surfaces at the next checked call.
#endif
    data_ = nullptr;
}

void Buffer::copy_from_host(const void* source) {
    if (bytes_ == 0) return;
    if (device_ == Device::host) {
        std::memcpy(data_, source, bytes_);
        return;
    }
#if ROPE_HAVE_CUDA
    check_cuda(cudaMemcpy(data_, source, bytes_, cudaMemcpyHostToDevice), "cudaMemcpy(host to device)");
    // From pageable memory cudaMemcpy returns once the bytes are staged, not
    // once they have landed; a kernel on a non-blocking stream could then read
    // the old contents (seen on the H200). Wait for the copy itself.
    check_cuda(cudaStreamSynchronize(nullptr), "cudaStreamSynchronize(after host to device copy)");
#endif
}

void Buffer::copy_to_host(void* destination) const {
    if (bytes_ == 0) return;
    if (device_ == Device::host) {
        std::memcpy(destination, data_, bytes_);
        return;
    }
#if ROPE_HAVE_CUDA
    check_cuda(cudaMemcpy(destination, data_, bytes_, cudaMemcpyDeviceToHost), "cudaMemcpy(device to host)");
#endif
}

int cuda_device_count() {
#if ROPE_HAVE_CUDA
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        cudaGetLastError();  // Clear the sticky "no device" error so later calls start clean.
        return 0;
    }
    return count;
#else
    return 0;
#endif
}

std::string cuda_unavailable_reason() {
#if ROPE_HAVE_CUDA
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status != cudaSuccess) {
        cudaGetLastError();
        return std::string("no CUDA device (") + cudaGetErrorString(status) + ")";
    }
    if (count == 0) return "no CUDA device";
    return "";
#else
    return "built without CUDA (no nvcc at configure time, or ROPE_ENABLE_CUDA=OFF)";
#endif
}

void cuda_synchronize() {
#if ROPE_HAVE_CUDA
    if (cuda_device_count() == 0) return;  // A CUDA build on a machine without a GPU: nothing can be queued.
    check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#endif
}

}  // namespace rope
