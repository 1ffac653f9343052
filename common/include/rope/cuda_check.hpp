#pragma once
/// @file cuda_check.hpp
/// @brief For code that calls the CUDA runtime beside rope (the CUDA backends, the benchmark,
/// the tests): a CUDA status as a rope::Error, and an owned CUDA stream.
///
/// Free of CUDA headers, like rope::RopeArgs (a stream is a `void*`, a status an `int`), so
/// plain C++ can include it in any build; in a build without CUDA, creating a stream throws.

namespace rope {

/// @brief Throws rope::Error if @p status is not cudaSuccess (0).
/// @param status what the CUDA runtime returned (a cudaError_t)
/// @param call the call as the user would recognise it, e.g. "cudaMalloc"
/// @throws rope::Error of rope's usual form, `call = cudaErrorName: CUDA's own text`,
/// e.g. `rope::Error: cudaMalloc = cudaErrorMemoryAllocation: out of memory`.
///
/// An unchecked status is a silent wrong answer later on: every CUDA call of the
/// library, the benchmark and the tests goes through this.
void check_cuda(int status, const char* call);

/// @brief An owned CUDA stream that does not wait for the legacy default stream
/// (cudaStreamNonBlocking), destroyed with the object (RAII).
///
/// Graph capture needs a stream other than the legacy default one, and a
/// non-blocking one stays independent of it.
class CudaStream {
public:
    /// @brief Creates the stream on the current device.
    /// @throws rope::Error if CUDA refuses, or in a build without CUDA.
    CudaStream();
    ~CudaStream();
    CudaStream(const CudaStream&) = delete;
    CudaStream& operator=(const CudaStream&) = delete;

    /// @brief The cudaStream_t, as rope::RopeArgs::stream takes it.
    /// @return the stream's handle.
    void* get() const { return stream_; }
    /// @brief Waits until the work issued on the stream has finished.
    /// @throws rope::Error with CUDA's text if that work failed.
    void synchronize() const;

private:
    void* stream_ = nullptr;
};

}  // namespace rope
