// Page-aligned host memory, registered as pinned with CUDA when a device is
// present so H2D copies from it are DMA at full PCIe speed.
#pragma once
#include <cstddef>
#include <cstdint>

namespace tierstore {

// Owns one anonymous mapping. Alignment: 4 KiB always; 2 MiB (and huge pages
// where the kernel grants them) for buffers of 2 MiB or more. Pages are
// populated at allocation so the first read does not pay page faults.
// Move-only; not thread safe to move while others use data().
class HostBuffer {
 public:
  // nbytes > 0. pin: register with cudaHostRegister when the build has CUDA
  // and a device is visible (silently plain memory otherwise; pinned() says
  // which). Throws std::bad_alloc when the mapping fails, IoError when the
  // registration fails.
  explicit HostBuffer(size_t nbytes, bool pin = true);
  ~HostBuffer();
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  uint8_t* data() const noexcept { return data_; }
  size_t size() const noexcept { return size_; }  // bytes asked for
  bool pinned() const noexcept { return pinned_; }

 private:
  void release() noexcept;
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
  size_t mapped_ = 0;   // bytes mapped (rounded up, plus alignment slack)
  void* base_ = nullptr;
  bool pinned_ = false;
};

}  // namespace tierstore
