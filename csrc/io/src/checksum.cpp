#include "tierstore/io/checksum.hpp"

#include <new>

#define XXH_INLINE_ALL
#include "xxhash.h"

namespace tierstore {

uint64_t xxh3_64(const void* data, size_t nbytes) noexcept { return XXH3_64bits(data, nbytes); }

Xxh3Stream::Xxh3Stream() : state_(XXH3_createState()) {
  if (state_ == nullptr) throw std::bad_alloc();
  (void)XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));  // seed 0, like xxh3_64()
}

Xxh3Stream::~Xxh3Stream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Xxh3Stream::update(const void* data, size_t nbytes) noexcept {
  (void)XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, nbytes);
}

uint64_t Xxh3Stream::digest() const noexcept {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

}  // namespace tierstore
