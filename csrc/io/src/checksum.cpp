#include "tierstore/io/checksum.hpp"

#define XXH_INLINE_ALL
#include "xxhash.h"

namespace tierstore {

uint64_t xxh3_64(const void* data, size_t nbytes) noexcept { return XXH3_64bits(data, nbytes); }

}  // namespace tierstore
