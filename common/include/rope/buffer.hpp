#pragma once
/// @file buffer.hpp
/// @brief An owning block of host or CUDA memory, for tests, tutorials and tools.

#include <cstddef>

#include "rope/tensor.hpp"

namespace rope {

/// @brief Owns @p bytes of memory on a device and frees it when destroyed (RAII).
///
/// On Device::cuda it uses cudaMalloc/cudaFree; every CUDA call is checked and
/// a failure becomes a rope::Error with CUDA's own error text. In a build
/// without CUDA, creating a CUDA buffer throws.
class Buffer {
public:
    /// @brief An empty buffer that owns nothing.
    Buffer() = default;
    /// @brief Allocates @p bytes on @p device (zero bytes allocates nothing).
    /// @param device where to allocate: host (malloc) or cuda (cudaMalloc).
    /// @param bytes size of the allocation in bytes.
    /// @throws rope::Error if the allocation fails, or for Device::cuda in a build without CUDA.
    Buffer(Device device, std::size_t bytes);
    ~Buffer();
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    /// @brief Takes ownership from @p other, leaving it empty.
    /// @param other the buffer to move from.
    Buffer(Buffer&& other) noexcept;
    /// @brief Frees this buffer's memory and takes ownership from @p other, leaving it empty.
    /// @param other the buffer to move from (self-assignment does nothing).
    /// @return `*this`.
    Buffer& operator=(Buffer&& other) noexcept;

    /// @brief Start of the memory.
    /// @return the allocation's address (null when empty).
    void* data() const { return data_; }
    /// @brief Size in bytes.
    /// @return the number of bytes allocated (0 when empty).
    std::size_t bytes() const { return bytes_; }
    /// @brief Where the memory lives.
    /// @return the device given at construction (Device::host for a default-constructed buffer).
    Device device() const { return device_; }

    /// @brief Copies bytes() bytes from host memory @p source into this buffer (synchronous).
    /// @param source host memory holding at least bytes() bytes.
    /// @throws rope::Error if the CUDA copy fails.
    void copy_from_host(const void* source);
    /// @brief Copies bytes() bytes from this buffer into host memory @p destination (synchronous).
    /// @param destination host memory with room for at least bytes() bytes.
    /// @throws rope::Error if the CUDA copy fails.
    void copy_to_host(void* destination) const;

private:
    void release() noexcept;
    void* data_ = nullptr;
    std::size_t bytes_ = 0;
    Device device_ = Device::host;
};

}  // namespace rope
