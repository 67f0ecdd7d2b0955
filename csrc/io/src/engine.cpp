#include "tierstore/io/engine.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>

#include "tierstore/io/checksum.hpp"
#include "tierstore/io/detail/batch_row.hpp"
#include "tierstore/io/detail/cuda_copy.hpp"
#include "tierstore/io/detail/row_hash.hpp"
#include "tierstore/io/detail/stage_ring.hpp"
#include "tierstore/io/detail/task_queue.hpp"
#include "tierstore/io/error.hpp"

namespace tierstore {

using detail::CopyStream;
using detail::kDirectAlign;
using detail::Task;

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

int latency_bucket(int64_t ns) {
  const uint64_t us = ns > 0 ? uint64_t(ns) / 1000 : 0;
  const int b = us == 0 ? 0 : 64 - __builtin_clzll(us);
  return b < kLatencyBuckets ? b : kLatencyBuckets - 1;
}

std::string describe(const std::string& path, const Batch::Row& row, const char* what,
                     int64_t at, int err) {
  char head[160];
  std::snprintf(head, sizeof head, ": row %lld (%llu B at %#llx): %s at offset %#llx: ",
                (long long)row.index, (unsigned long long)row.length,
                (unsigned long long)row.row_offset, what, (unsigned long long)at);
  return path + head + detail::errno_text(err);
}

}  // namespace

// Splits [0, length) of internal row `k` into read tasks. Every task of a file
// row ends on a page boundary of the file, so every later task starts aligned
// (the O_DIRECT middle stays aligned). With chunk_ramp the batch's first
// `threads` tasks grow linearly from chunk/threads to chunk: the readers then
// finish staggered, so the copy stream gets its first bytes after a short read
// and is fed evenly from then on.
void Engine::chunk_row(Batch* batch, uint32_t k, std::vector<Task>& out) {
  const Batch::Row& row = batch->rows_[k];
  const uint64_t chunk = options_.chunk_bytes;
  const uint32_t ramp = options_.chunk_ramp ? uint32_t(options_.threads) : 0;
  uint64_t begin = 0;
  while (begin < row.length) {
    uint64_t want = chunk;
    if (ramp > 1 && batch->ramp_next_.load(std::memory_order_relaxed) < ramp) {
      const uint32_t j = batch->ramp_next_.fetch_add(1, std::memory_order_relaxed);
      if (j < ramp) want = (chunk * (j + 1) / ramp + kDirectAlign - 1) / kDirectAlign * kDirectAlign;
    }
    uint64_t end = begin + want;
    if (row.file_offset >= 0) {  // round the end down to a page of the file (want >= 4 KiB: end > begin)
      const uint64_t at = uint64_t(row.file_offset) + end;
      end = at / kDirectAlign * kDirectAlign - uint64_t(row.file_offset);
    }
    end = std::min<uint64_t>(end, row.length);
    out.push_back(Task{batch, k, begin, end - begin});
    begin = end;
  }
}

Engine::Engine(const std::string& path, const EngineOptions& options)
    : Engine(std::make_unique<detail::FileReader>(path, options.direct, options.probe_cache),
             options) {}

Engine::Engine(std::unique_ptr<Reader> reader, const EngineOptions& options)
    : options_(options), reader_(std::move(reader)) {
  TS_EXPECT(reader_ != nullptr, "Engine: reader is null");
  active_.store(reader_.get());
  TS_EXPECT(options.threads >= 1 && options.threads <= 512, "Engine: threads must be in 1..512");
  TS_EXPECT(options.chunk_bytes >= kDirectAlign && options.chunk_bytes % kDirectAlign == 0,
            "Engine: chunk_bytes must be a positive multiple of 4096");
  TS_EXPECT(options.stage_bytes >= kDirectAlign && options.stage_bytes % kDirectAlign == 0,
            "Engine: stage_bytes must be a positive multiple of 4096");
  TS_EXPECT(options.stage_count >= 1, "Engine: stage_count must be >= 1");
  if (options.device >= 0) stream_ = std::make_unique<CopyStream>(options.device);
  stages_ = std::make_unique<detail::StageRing>(options.stage_bytes, options.stage_count,
                                                stream_.get());
  tasks_ = std::make_unique<detail::TaskQueue>();
  staged_rows_ = std::make_unique<detail::TaskQueue>();
  for (int i = 0; i < options.threads; ++i) workers_.emplace_back([this] { worker_loop(); });
  dispatcher_ = std::thread([this] { dispatcher_loop(); });
}

Engine::~Engine() { close(); }

uintptr_t Engine::copy_stream_handle() const noexcept { return stream_ ? stream_->handle() : 0; }

std::shared_ptr<Batch> Engine::submit(const int64_t* file_offsets, const uint64_t* lengths,
                                      const uint64_t* src, const uint64_t* dst, size_t n,
                                      bool dst_device, const uint64_t* checksums) {
  if (closing_.load()) throw std::runtime_error(reader_->path() + ": engine is closed");
  TS_EXPECT(!dst_device || stream_, "submit: dst_device=True on an engine without a CUDA device");
  // 1. Validate every row, then count internal rows: staged rows are split by
  //    stage size, and so are checksummed rows (hashed segment by segment as they
  //    land, so the hash overlaps the reads of the row's later segments).
  check_rows(file_offsets, lengths, src, dst, n, dst_device);
  const uint64_t stage = options_.stage_bytes;
  auto split = [&](size_t i) {
    const bool read = file_offsets[i] >= 0;
    return read && (checksums || (src[i] == 0 && (dst_device || dst[i] == 0)));
  };
  size_t n_rows = 0, n_hashed = 0;
  for (size_t i = 0; i < n; ++i) {
    n_rows += split(i) ? (lengths[i] + stage - 1) / stage : 1;
    n_hashed += checksums && file_offsets[i] >= 0;
  }
  auto batch = std::make_shared<Batch>();
  if (n_hashed) batch->hashes_.reset(new detail::RowHash[n_hashed]);
  batch->path_ = reader_->path();
  batch->t_submit_ns_ = now_ns();
  batch->rows_.reset(new Batch::Row[n_rows]);
  batch->n_rows_ = n_rows;
  batch->rows_left_.store(int64_t(n_rows));
  batches_.fetch_add(1, std::memory_order_relaxed);
  if (n_rows == 0) {
    batch->done_.store(true);
    return batch;
  }
  batch->has_h2d_ = dst_device;
  if (dst_device) batch->event_ = CopyStream::create_event();
  batch->self_ = batch;

  // 2. Build internal rows.
  size_t r = 0, h = 0;
  for (size_t i = 0; i < n; ++i) {
    const uint64_t piece = split(i) ? stage : lengths[i];
    detail::RowHash* hash = nullptr;
    if (checksums && file_offsets[i] >= 0) {
      hash = &batch->hashes_[h++];
      hash->expected = checksums[i];
      hash->length = lengths[i];
      hash->first = uint32_t(r);
      hash->count = uint32_t((lengths[i] + piece - 1) / piece);
    }
    for (uint64_t done = 0; done < lengths[i]; done += piece, ++r) {
      Batch::Row& row = batch->rows_[r];
      row.index = int64_t(i);
      row.row_offset = file_offsets[i];
      row.file_offset = file_offsets[i] < 0 ? -1 : file_offsets[i] + int64_t(done);
      row.length = std::min<uint64_t>(piece, lengths[i] - done);
      row.dst = dst[i] ? reinterpret_cast<uint8_t*>(dst[i]) + done : nullptr;
      row.dst_device = dst_device;
      row.hash = hash;
      // Host destination and no caller src: the read lands in dst directly.
      uint8_t* land = src[i] ? reinterpret_cast<uint8_t*>(src[i]) + done
                             : (!dst_device ? row.dst : nullptr);
      row.read_buf = land;
    }
  }

  // 3. Dispatch: arena rows to the device now; reads and host copies to the
  //    reader threads; rows needing a staging buffer to the dispatcher.
  std::vector<Task> tasks, staged;
  tasks.reserve(n_rows * 4);
  std::vector<uint32_t> ready_now;
  for (uint32_t k = 0; k < n_rows; ++k) {
    Batch::Row& row = batch->rows_[k];
    if (row.file_offset < 0 && (row.dst == nullptr || row.dst_device)) {
      ready_now.push_back(k);  // arena -> GPU (copied in finish_row) or nothing to do
    } else if (row.file_offset >= 0 && row.read_buf == nullptr) {
      staged.push_back(Task{batch.get(), k, 0, row.length});
    } else {
      const size_t before = tasks.size();
      chunk_row(batch.get(), k, tasks);
      row.chunks_left.store(int(tasks.size() - before), std::memory_order_relaxed);
    }
  }
  if (!ready_now.empty()) {
    // Arena copies are issued from this (caller's) thread: keep its device as found.
    const int previous = stream_ ? detail::cuda_get_device() : -1;
    if (stream_) stream_->bind_thread();
    for (uint32_t k : ready_now) finish_row(batch.get(), k);
    if (stream_ && previous >= 0 && previous != options_.device) detail::cuda_set_device(previous);
  }
  // A close() racing this submit refuses the queues: the tasks then run here,
  // where they see closing_ and cancel, so the batch still completes.
  if (!tasks_->push(tasks.data(), tasks.size()))
    for (const Task& t : tasks) run_task(t);
  if (!staged_rows_->push(staged.data(), staged.size())) {
    for (const Task& t : staged) {
      Batch::Row& row = batch->rows_[t.row];
      batch->fail_row(row, ECANCELED, row.file_offset,
                      describe(reader_->path(), row, "cancelled", row.file_offset, ECANCELED));
      finish_row(batch.get(), t.row);
    }
  }
  return batch;
}

void Engine::worker_loop() {
  if (stream_) stream_->bind_thread();
  Task task;
  while (tasks_->pop(task)) run_task(task);
}

void Engine::dispatcher_loop() {
  if (stream_) stream_->bind_thread();
  Task task;
  std::vector<Task> chunks;
  while (staged_rows_->pop(task)) {
    Batch::Row& row = task.batch->rows_[task.row];
    detail::Stage* stage = nullptr;
    std::string why = "cancelled";
    if (!closing_.load() && !task.batch->cancelled_.load()) {
      try {
        stage = stages_->acquire(closing_);
      } catch (const std::exception& e) {
        why = e.what();
      }
    }
    if (!stage) {
      const int err = why == "cancelled" ? ECANCELED : ENOMEM;
      task.batch->fail_row(row, err, row.file_offset,
                           describe(reader_->path(), row, why.c_str(), row.file_offset, err));
      finish_row(task.batch, task.row);
      continue;
    }
    row.stage = stage;
    row.read_buf = stage->buffer.data();
    chunks.clear();
    chunk_row(task.batch, task.row, chunks);
    row.chunks_left.store(int(chunks.size()), std::memory_order_relaxed);
    tasks_->push(chunks.data(), chunks.size());  // open until this thread is joined
  }
}

void Engine::run_task(const Task& task) {
  Batch* batch = task.batch;
  Batch::Row& row = batch->rows_[task.row];
  if (closing_.load(std::memory_order_relaxed) || batch->cancelled_.load(std::memory_order_relaxed)) {
    const int64_t at = row.file_offset >= 0 ? row.file_offset + int64_t(task.begin) : -1;
    batch->fail_row(row, ECANCELED, at, describe(reader_->path(), row, "cancelled", at, ECANCELED));
  } else if (row.err.load(std::memory_order_relaxed) == 0) {  // a failed row reads no further
    if (row.file_offset >= 0) {
      int64_t at = -1;
      bool cached = true;
      const int64_t offset = row.file_offset + int64_t(task.begin);
      Reader* reader = active_.load(std::memory_order_acquire);
      int rc = reader->read_exact(row.read_buf + task.begin, task.length, offset, &at, &cached);
      if (rc != 0) {
        batch->fail_row(row, rc, at, describe(reader_->path(), row,
                        rc == ENODATA ? "unexpected end of file" : "read", at, rc));
      } else {
        if (!cached) row.all_cached.store(false, std::memory_order_relaxed);
        if (row.dst && row.dst_device) {
          copy_chunk_h2d(batch, row, task.begin, task.length);
        } else if (row.dst && row.dst != row.read_buf) {
          std::memcpy(row.dst + task.begin, row.read_buf + task.begin, task.length);
          host_copy_bytes_.fetch_add(task.length, std::memory_order_relaxed);
        }
      }
    } else {  // arena row into host memory
      std::memcpy(row.dst + task.begin, row.read_buf + task.begin, task.length);
      host_copy_bytes_.fetch_add(task.length, std::memory_order_relaxed);
    }
  }
  if (row.chunks_left.fetch_sub(1, std::memory_order_acq_rel) == 1) finish_row(batch, task.row);
}

// The H2D copy of one chunk that just landed, issued by the reader thread
// (the runtime serialises submissions to the stream; each is a few us). A
// failed row copies no further chunks; chunks already copied stay in its slot,
// which the caller must not publish.
void Engine::copy_chunk_h2d(Batch* batch, Batch::Row& row, uint64_t begin, uint64_t length) {
  if (row.err.load(std::memory_order_acquire) != 0) return;
  const int code = stream_->memcpy_h2d(row.dst + begin, row.read_buf + begin, length);
  if (code != 0) {
    const int64_t at = row.file_offset + int64_t(begin);
    batch->fail_row(row, EIO, at, describe(reader_->path(), row,
                    ("H2D copy: " + CopyStream::error_string(code)).c_str(), at, EIO));
    return;
  }
  row.copy_issued.store(true, std::memory_order_relaxed);  // published by chunks_left's acq_rel
  h2d_bytes_.fetch_add(length, std::memory_order_relaxed);
}

void Engine::finish_row(Batch* batch, uint32_t k) {
  // Every chunk has landed (chunks_left's acq_rel). A checksummed segment is
  // hashed first, in row order, before its stage is recycled (row_hash.cpp).
  if (batch->rows_[k].hash) return land_segment(batch, k);
  complete_row(batch, k);
}

void Engine::complete_row(Batch* batch, uint32_t k) {
  Batch::Row& row = batch->rows_[k];
  bool copy_issued = row.copy_issued.load(std::memory_order_relaxed);
  // Arena rows (no read) are copied whole; read rows were copied chunk by chunk.
  if (row.file_offset < 0 && row.err.load(std::memory_order_acquire) == 0 && row.dst &&
      row.dst_device) {
    const int code = stream_->memcpy_h2d(row.dst, row.read_buf, row.length);
    if (code != 0) {
      batch->fail_row(row, EIO, row.file_offset,
                      describe(reader_->path(), row, ("H2D copy: " + CopyStream::error_string(code)).c_str(),
                               row.file_offset, EIO));
    } else {
      copy_issued = true;
      h2d_bytes_.fetch_add(row.length, std::memory_order_relaxed);
    }
  }
  if (row.stage) {
    if (copy_issued) stages_->release_after_copy(row.stage); else stages_->release_now(row.stage);
    row.stage = nullptr;
  }
  if (row.err.load(std::memory_order_acquire) == 0) {
    const Source source = row.file_offset < 0 ? Source::arena
                          : row.all_cached.load(std::memory_order_relaxed) ? Source::pagecache
                                                                           : Source::disk;
    record_row(batch, row, source);
  } else {
    failed_rows_.fetch_add(1, std::memory_order_relaxed);
  }
  if (batch->rows_left_.fetch_sub(1, std::memory_order_acq_rel) == 1) batch->finish(stream_.get());
}

void Engine::record_row(Batch* batch, const Batch::Row& row, Source source) {
  AtomicSource& s = source_stats_[int(source)];
  s.rows.fetch_add(1, std::memory_order_relaxed);
  s.bytes.fetch_add(row.length, std::memory_order_relaxed);
  s.hist[latency_bucket(now_ns() - batch->t_submit_ns_)].fetch_add(1, std::memory_order_relaxed);
}

EngineStats Engine::stats() const {
  EngineStats out;
  for (int i = 0; i < kSourceCount; ++i) {
    out.source[i].rows = source_stats_[i].rows.load();
    out.source[i].bytes = source_stats_[i].bytes.load();
    for (int b = 0; b < kLatencyBuckets; ++b) out.source[i].latency_hist[b] = source_stats_[i].hist[b].load();
  }
  out.batches = batches_.load();
  out.failed_rows = failed_rows_.load();
  out.h2d_bytes = h2d_bytes_.load();
  out.host_copy_bytes = host_copy_bytes_.load();
  out.verified_rows = verified_rows_.load();
  out.verified_bytes = verified_bytes_.load();
  out.checksum_failures = checksum_failures_.load();
  return out;
}

void Engine::set_faults(const FaultPlan& plan) {
  std::lock_guard<std::mutex> lock(faults_mutex_);
  if (!faulty_) faulty_ = std::make_unique<FaultyReader>(*reader_);
  faulty_->set_plan(plan);
  active_.store(plan.any() ? static_cast<Reader*>(faulty_.get()) : reader_.get(),
                std::memory_order_release);
}

void Engine::close() {
  std::lock_guard<std::mutex> lock(close_mutex_);
  if (closing_.exchange(true)) return;
  // The dispatcher first (it fails its rows and pushes nothing more), then the
  // readers (they fail what is queued; syscalls in flight finish), then the
  // copies already on the stream.
  staged_rows_->close();
  stages_->wake_all();
  if (dispatcher_.joinable()) dispatcher_.join();
  tasks_->close();
  for (auto& t : workers_) if (t.joinable()) t.join();
  workers_.clear();
  if (stream_) stream_->synchronize();
  reader_->release_files();   // nothing reads any more: a closed engine holds no fd
}

}  // namespace tierstore
