// Streaming verification of checksummed rows (a row may be larger than one stage):
// the segments of a row are hashed in file order as they land and completed one by
// one; the last one's digest decides whether the row failed. See detail/row_hash.hpp.
#include <cerrno>
#include <cstdio>
#include <mutex>

#include "tierstore/io/detail/batch_row.hpp"
#include "tierstore/io/detail/file_reader.hpp"
#include "tierstore/io/detail/row_hash.hpp"
#include "tierstore/io/engine.hpp"
#include "tierstore/io/error.hpp"

namespace tierstore {

void Engine::land_segment(Batch* batch, uint32_t k) {
  detail::RowHash& hash = *batch->rows_[k].hash;
  std::unique_lock<std::mutex> lock(hash.mutex);
  batch->rows_[k].landed = true;
  // Only the next segment in file order starts hashing; an earlier thread that
  // is draining the prefix picks this one up when it gets here.
  if (hash.draining || k != hash.first + hash.hashed) return;
  hash.draining = true;
  for (;;) {
    const uint32_t j = hash.first + hash.hashed;
    if (hash.hashed == hash.count || !batch->rows_[j].landed) {
      hash.draining = false;
      return;
    }
    Batch::Row& seg = batch->rows_[j];
    const bool last = hash.hashed + 1 == hash.count;
    if (seg.err.load(std::memory_order_acquire) != 0) hash.failed = true;
    const bool feed = !hash.failed;
    lock.unlock();
    // Only this thread touches the state now (draining), so no lock while hashing.
    if (feed) hash.state.update(seg.read_buf, seg.length);
    if (last && feed) check_digest(batch, seg, hash);
    lock.lock();
    ++hash.hashed;
    if (last) {
      // The row is done with its hash: completing its last segment may finish
      // (and free) the batch, so nothing of `hash` is touched after it.
      hash.draining = false;
      lock.unlock();
      complete_row(batch, j);
      return;
    }
    lock.unlock();
    // The row's last segment is not completed yet, so the batch stays alive.
    complete_row(batch, j);
    lock.lock();
  }
}

// Every byte of the row went through the state in order: compare with the sidecar.
void Engine::check_digest(Batch* batch, Batch::Row& last, detail::RowHash& hash) {
  const uint64_t found = hash.state.digest();
  verified_rows_.fetch_add(1, std::memory_order_relaxed);
  verified_bytes_.fetch_add(hash.length, std::memory_order_relaxed);
  if (found == hash.expected) return;
  checksum_failures_.fetch_add(1, std::memory_order_relaxed);
  char what[240];
  std::snprintf(what, sizeof what,
                ": row %lld (%llu B at %#llx, %u segment%s): xxh3_64 mismatch (expected %#018llx, "
                "found %#018llx) at offset %#llx: ",
                (long long)last.index, (unsigned long long)hash.length,
                (unsigned long long)last.row_offset, hash.count, hash.count == 1 ? "" : "s",
                (unsigned long long)hash.expected, (unsigned long long)found,
                (unsigned long long)last.row_offset);
  batch->fail_row(last, EBADMSG, last.row_offset,
                  reader_->path() + what + detail::errno_text(EBADMSG));
}

}  // namespace tierstore
