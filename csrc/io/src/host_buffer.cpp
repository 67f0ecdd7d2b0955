#include "tierstore/io/host_buffer.hpp"

#include <sys/mman.h>

#include <new>
#include <utility>

#include "tierstore/io/detail/cuda_copy.hpp"
#include "tierstore/io/error.hpp"
#include "tierstore/io/runtime.hpp"

namespace tierstore {

namespace {
constexpr size_t kPage = 4096;
constexpr size_t kHuge = size_t(2) << 20;
size_t round_up(size_t n, size_t a) { return (n + a - 1) / a * a; }
}  // namespace

HostBuffer::HostBuffer(size_t nbytes, bool pin) {
  TS_EXPECT(nbytes > 0, "HostBuffer: nbytes must be > 0");
  const size_t align = nbytes >= kHuge ? kHuge : kPage;
  const size_t body = round_up(nbytes, align);
  // Over-map by `align` so an aligned start always exists inside the mapping.
  mapped_ = body + (align > kPage ? align : 0);
  base_ = mmap(nullptr, mapped_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base_ == MAP_FAILED) {
    base_ = nullptr;
    throw std::bad_alloc();
  }
  auto addr = reinterpret_cast<uintptr_t>(base_);
  data_ = reinterpret_cast<uint8_t*>(round_up(addr, align));
  size_ = nbytes;
  // Huge pages halve TLB misses of the page-cache copy; a hint, not a need.
  if (align == kHuge) (void)madvise(data_, body, MADV_HUGEPAGE);
  // Populate now (MADV_POPULATE_WRITE, Linux 5.14+); fall back to touching.
  if (madvise(data_, body, 23 /* MADV_POPULATE_WRITE */) != 0) {
    for (size_t off = 0; off < body; off += kPage) data_[off] = 0;
  }
  if (pin && cuda_device_count() > 0) {
    try {
      detail::cuda_host_register(data_, body);
      pinned_ = true;
    } catch (...) {
      munmap(base_, mapped_);
      base_ = nullptr;
      throw;
    }
  }
}

HostBuffer::~HostBuffer() { release(); }

HostBuffer::HostBuffer(HostBuffer&& other) noexcept { *this = std::move(other); }

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    release();
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
    std::swap(mapped_, other.mapped_);
    std::swap(base_, other.base_);
    std::swap(pinned_, other.pinned_);
  }
  return *this;
}

void HostBuffer::release() noexcept {
  if (!base_) return;
  if (pinned_) detail::cuda_host_unregister(data_);
  munmap(base_, mapped_);
  base_ = nullptr;
  data_ = nullptr;
  size_ = mapped_ = 0;
  pinned_ = false;
}

}  // namespace tierstore
