// The I/O engine: a persistent pool of native reader threads that fill
// caller-given (or staged) host memory from one file, and the read -> H2D copy
// pipeline on a dedicated CUDA copy stream.
//
// One submit() is one batch of rows. Each row is read in chunks by several
// threads; as each chunk lands its copy is issued at once by the thread that
// read it (H2D of that chunk's range on the copy stream, or memcpy into host
// memory), so the PCIe link starts within about one chunk of the submit and
// copies of early chunks overlap reads of later ones. A batch is done when every row is read and its
// copy issued; its CUDA event then marks the end of its copies on the stream.
// No Python, no policy.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tierstore/io/buffer_table.hpp"
#include "tierstore/io/detail/file_reader.hpp"
#include "tierstore/io/faulty_reader.hpp"
#include "tierstore/io/reader.hpp"

namespace tierstore {

namespace detail {
class CopyStream;
struct RowHash;
class StageRing;
struct Stage;
struct Task;
class TaskQueue;
}  // namespace detail

enum class Source : int { arena = 0, pagecache = 1, disk = 2 };
constexpr int kSourceCount = 3;
constexpr int kLatencyBuckets = 40;
// The longest row submit() accepts (64 GiB): a larger length is a caller bug
// (e.g. a negative length cast to unsigned), refused before anything is read.
constexpr uint64_t kMaxRowBytes = uint64_t(1) << 36;  // bucket b counts rows whose latency in us has bit length b

struct EngineOptions {
  int threads = 8;
  detail::DirectMode direct = detail::DirectMode::automatic;
  int device = -1;                       // CUDA device for H2D copies; -1: host only
  size_t chunk_bytes = size_t(4) << 20;  // read task size (multiple of 4 KiB)
  size_t stage_bytes = size_t(16) << 20; // one staging buffer; larger rows are split
  int stage_count = 8;                   // staging buffers (pinned) at most
  bool probe_cache = true;               // with O_DIRECT: serve page-cache hits from the cache
  // The first `threads` read tasks of a batch grow from chunk/threads to chunk,
  // so the readers finish staggered and the first H2D copy starts after a small
  // read instead of a whole chunk (and the fire's tail stays one chunk).
  bool chunk_ramp = true;
};

struct SourceStats {
  uint64_t rows = 0, bytes = 0;
  uint64_t latency_hist[kLatencyBuckets] = {};
};

struct EngineStats {
  SourceStats source[kSourceCount];
  uint64_t batches = 0, failed_rows = 0, h2d_bytes = 0, host_copy_bytes = 0;
  uint64_t verified_rows = 0, verified_bytes = 0, checksum_failures = 0;
};

class Engine;

// Completion of one submit(). Thread safe. Kept alive by its owner and by the
// engine until every row has finished.
class Batch {
 public:
  // Blocks up to timeout_s (< 0: forever); true when the batch is done.
  // A failed batch with H2D copies also waits for the copies already issued,
  // so nothing writes into caller memory once wait() reported the failure.
  bool wait(double timeout_s);
  bool done() const noexcept { return done_.load(std::memory_order_acquire); }
  // Rows not started yet fail with ECANCELED; rows being read finish.
  void cancel() noexcept { cancelled_.store(true); }

  // Valid once done(). err() == 0: every row succeeded.
  int err() const noexcept { return err_; }
  int64_t err_row() const noexcept { return err_row_; }
  int64_t err_row_offset() const noexcept { return err_row_offset_; }
  int64_t err_offset() const noexcept { return err_offset_; }
  const std::string& err_message() const noexcept { return err_message_; }
  std::vector<int64_t> failed_rows() const;
  const std::string& path() const noexcept { return path_; }

  // Consumer stream (raw cudaStream_t) waits on this batch's copies; waits on
  // the host for done() first. Returns 0 or a CUDA error code.
  int stream_wait(uintptr_t stream);
  // Host waits until the copies have completed. Returns 0 or a CUDA error code.
  int synchronize();
  ~Batch();

  struct Row;  // internal (detail/batch_row.hpp); public only so engine.cpp helpers can name it

 private:
  friend class Engine;
  void fail_row(Row& row, int err, int64_t at, const std::string& why);
  void finish(detail::CopyStream* stream);

  std::string path_;
  std::unique_ptr<Row[]> rows_;
  size_t n_rows_ = 0;
  std::unique_ptr<detail::RowHash[]> hashes_;  // one per checksummed file row
  std::atomic<int64_t> rows_left_{0};
  std::atomic<bool> cancelled_{false};
  std::atomic<bool> done_{false};
  void* event_ = nullptr;  // recorded on the copy stream when the batch has H2D copies
  bool has_h2d_ = false;
  int64_t t_submit_ns_ = 0;
  std::atomic<uint32_t> ramp_next_{0};  // read tasks cut so far (EngineOptions::chunk_ramp)
  std::shared_ptr<Batch> self_;  // keeps the batch alive while rows are in flight

  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  int err_ = 0;
  int64_t err_row_ = -1, err_row_offset_ = -1, err_offset_ = -1;
  std::string err_message_;
  std::vector<int64_t> failed_;
};

// Thread safe: submit() may be called from many threads at once.
class Engine {
 public:
  // Opens `path` with the production reader (detail::FileReader).
  Engine(const std::string& path, const EngineOptions& options);
  // Reads through `reader` (C++ tests: a FaultyReader around a FileReader);
  // options.direct and options.probe_cache are the reader's business then.
  Engine(std::unique_ptr<Reader> reader, const EngineOptions& options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Row i: file_offsets[i] >= 0 reads lengths[i] bytes there into src[i]
  // (0: into dst[i] when it is host memory, else a staging buffer);
  // file_offsets[i] == -1: src[i] already holds the bytes. dst[i] != 0: copy
  // there (H2D when dst_device). Raw addresses; the caller keeps the memory
  // alive until the batch is done (device copies: until its event fired).
  //
  // checksums (may be null): the expected XXH3-64 (seed 0) of each row's bytes.
  // A row read from the file (file_offset >= 0), of any length, is cut into
  // segments of at most stage_bytes and hashed by a streaming XXH3 state in the
  // reader threads as its segments land, in file order (a segment that lands
  // early is held, with its stage, until the ones before it are hashed;
  // detail/row_hash.hpp), on the host bytes (caller src, host dst or the
  // staging buffer), while the copy pipeline runs. The row counts as done only
  // after its final digest was compared; a mismatch fails the row with EBADMSG
  // at its offset (its H2D chunks may already be in dst: the caller publishes
  // nothing for a failed row). Rows with file_offset == -1 are not hashed.
  //
  // Every row is checked first (offset >= -1; 0 < length <= kMaxRowBytes; no
  // overflow of offset + length, src + length, dst + length; a src for
  // offset -1): std::invalid_argument naming the row, nothing submitted.
  // Then every src (host) and dst (device when dst_device, else host) range
  // must lie inside one buffer of buffers(): BoundsError naming the row, its
  // offset and length, and the buffer. std::runtime_error when closed.
  std::shared_ptr<Batch> submit(const int64_t* file_offsets, const uint64_t* lengths,
                                const uint64_t* src, const uint64_t* dst, size_t n,
                                bool dst_device, const uint64_t* checksums = nullptr);
  // Cancels queued rows, lets in-flight syscalls finish, joins every thread,
  // drains the copy stream. Idempotent.
  void close();
  bool closed() const noexcept { return closing_.load(); }

  bool direct_active() const noexcept { return reader_->direct_active(); }
  const std::string& fallback_reason() const noexcept { return reader_->fallback_reason(); }
  const std::string& path() const noexcept { return reader_->path(); }
  int device() const noexcept { return options_.device; }
  uintptr_t copy_stream_handle() const noexcept;
  EngineStats stats() const;
  // The memory submit() accepts (register every src/dst buffer here first).
  BufferTable& buffers() noexcept { return buffers_; }
  // Seconds one submit() spends checking these rows (every check, the buffer
  // table included), the best of `reps` runs; the rows must pass. For the cost
  // test and benchmarks: nothing is submitted.
  double time_row_checks(const int64_t* file_offsets, const uint64_t* lengths, const uint64_t* src,
                         const uint64_t* dst, size_t n, bool dst_device, int reps) const;
  // Test seam: from now on read through a FaultyReader wrapping the engine's
  // reader with `plan` (an empty plan switches back to the plain reader).
  // Reads in flight finish with the reader they started on.
  void set_faults(const FaultPlan& plan);

 private:
  void worker_loop();
  void dispatcher_loop();
  void run_task(const detail::Task& task);
  void push_row_tasks(Batch* batch, uint32_t row);
  void finish_row(Batch* batch, uint32_t row);    // every chunk of internal row `row` landed
  void complete_row(Batch* batch, uint32_t row);  // stage back, stats, batch count (row_hash.cpp: after hashing)
  void land_segment(Batch* batch, uint32_t row);  // a checksummed segment landed (row_hash.cpp)
  void check_digest(Batch* batch, Batch::Row& last, detail::RowHash& hash);
  void copy_chunk_h2d(Batch* batch, Batch::Row& row, uint64_t begin, uint64_t length);
  void chunk_row(Batch* batch, uint32_t row, std::vector<detail::Task>& out);
  void record_row(Batch* batch, const Batch::Row& row, Source source);
  void check_rows(const int64_t* file_offsets, const uint64_t* lengths, const uint64_t* src,
                  const uint64_t* dst, size_t n, bool dst_device) const;

  EngineOptions options_;
  BufferTable buffers_;
  std::unique_ptr<Reader> reader_;
  std::unique_ptr<FaultyReader> faulty_;  // made on the first set_faults, kept until ~Engine
  std::atomic<Reader*> active_{nullptr};  // reader_ or faulty_
  std::mutex faults_mutex_;
  std::unique_ptr<detail::CopyStream> stream_;
  std::unique_ptr<detail::StageRing> stages_;
  std::unique_ptr<detail::TaskQueue> tasks_;
  std::unique_ptr<detail::TaskQueue> staged_rows_;  // rows waiting for a staging buffer
  std::vector<std::thread> workers_;
  std::thread dispatcher_;
  std::atomic<bool> closing_{false};
  std::mutex close_mutex_;

  struct AtomicSource {
    std::atomic<uint64_t> rows{0}, bytes{0};
    std::atomic<uint64_t> hist[kLatencyBuckets] = {};
  };
  AtomicSource source_stats_[kSourceCount];
  std::atomic<uint64_t> batches_{0}, failed_rows_{0}, h2d_bytes_{0}, host_copy_bytes_{0};
  std::atomic<uint64_t> verified_rows_{0}, verified_bytes_{0}, checksum_failures_{0};
};

}  // namespace tierstore
