// The host spelling of the device-side residency decide and page-in (residency.hpp has
// the rule). A CPU pool runs these directly; the host-planned baseline of
// `tierstore bench decode` runs the decide on a host mirror; the CUDA kernels are
// checked against them decision for decision.
#include "tierstore/store/residency.hpp"

#include <climits>
#include <cstring>
#include <stdexcept>
#include <string>

namespace tierstore {

namespace {

// The CLOCK sweep of residency.hpp step 3: the victim slot, or -1 (hand unchanged).
int64_t sweep(const ResidencyView& v, uint32_t epoch) {
  const int64_t n = v.n_slots;
  if (n <= 0) return -1;
  const int64_t hand = v.ctrl[kCtrlHand];
  const int64_t limit = 2 * n + 32;
  for (int64_t k = 0; k < limit; ++k) {
    const int64_t s = (hand + k) % n;
    const uint32_t st = v.stamp[s];
    if (st == epoch || st == kResidencyLocked) continue;
    if (v.ref[s]) {
      v.ref[s] = 0;
      continue;
    }
    v.ctrl[kCtrlHand] = (s + 1) % n;
    return s;
  }
  return -1;
}

}  // namespace

void residency_check(const ResidencyView& v, int layer, int64_t n_ids) {
  auto fail = [](const std::string& what) { throw std::invalid_argument("residency: " + what); };
  if (!v.table || !v.owner || !v.stamp || !v.ref || !v.arena_row || !v.first || !v.ctrl || !v.plan)
    fail("a state array is null");
  if (v.n_layers <= 0 || v.n_experts <= 0) fail("n_layers and n_experts must be > 0");
  if (v.n_slots < 0 || v.slot_bytes <= 0) fail("n_slots must be >= 0 and slot_bytes > 0");
  if (v.n_slots > INT32_MAX) fail("n_slots must fit in int32 (the slot table's type)");
  if (v.n_slots > 0 && !v.pool) fail("pool is null");
  if (v.arena_rows > 0 && (!v.arena || v.arena_stride < v.slot_bytes))
    fail("arena is null or its stride is shorter than a row");
  if (layer < 0 || layer >= v.n_layers)
    fail("layer " + std::to_string(layer) + " out of range [0, " + std::to_string(v.n_layers) + ")");
  if (n_ids < 0 || n_ids > v.max_plan)
    fail(std::to_string(n_ids) + " ids, the state holds at most " + std::to_string(v.max_plan) +
         " per decide (max_ids)");
}

void residency_decide_host(const ResidencyView& v, int layer, const int32_t* ids, int64_t n) {
  residency_check(v, layer, n);
  int64_t* c = v.ctrl;
  c[kCtrlEpoch] = residency_next_epoch(c[kCtrlEpoch]);
  const uint32_t epoch = static_cast<uint32_t>(c[kCtrlEpoch]);
  const int32_t E = v.n_experts;
  const int64_t key0 = static_cast<int64_t>(layer) * E;
  int32_t* row = v.table + key0;
  for (int64_t i = 0; i < n; ++i)          // 1. first position of each id
    if (ids[i] >= 0 && ids[i] < E) v.first[ids[i]] = INT32_MAX;
  for (int64_t i = 0; i < n; ++i)
    if (ids[i] >= 0 && ids[i] < E && v.first[ids[i]] > i) v.first[ids[i]] = static_cast<int32_t>(i);
  ResidencyTally t;
  int64_t& plan_len = t.plan_len;
  for (int64_t i = 0; i < n; ++i) {        // 2. hits stamped, misses listed in order
    const int32_t e = ids[i];
    if (e < 0 || e >= E) continue;
    ++t.routed;
    if (v.heat) ++v.heat[key0 + e];
    if (v.first[e] != i) continue;
    const int32_t slot = row[e];
    if (slot >= 0 && slot < v.n_slots) {   // an entry past the pool counts as not resident
      v.stamp[slot] = epoch;
      v.ref[slot] = 1;
      ++t.hits;
    } else {
      v.plan[2 * plan_len] = static_cast<int32_t>(key0 + e);
      v.plan[2 * plan_len + 1] = -1;
      ++plan_len;
    }
  }
  for (int64_t j = 0; j < plan_len; ++j) {   // 3. a victim per miss
    const int32_t key = v.plan[2 * j];
    if (v.arena_row[key] < 0) {
      ++t.no_arena;
      continue;
    }
    const int64_t slot = sweep(v, epoch);
    if (slot < 0) {
      ++t.no_slot;
      continue;
    }
    const int32_t victim = v.owner[slot];
    if (victim >= 0) {
      v.table[victim] = -1;   // unpublished now; its bytes are overwritten by the page-in
      ++t.evicted;
    }
    v.owner[slot] = key;
    v.stamp[slot] = epoch;
    v.ref[slot] = 1;
    v.plan[2 * j + 1] = static_cast<int32_t>(slot);
    ++t.placed;
  }
  residency_count(c, t, v.slot_bytes);
}

void residency_gather_host(const ResidencyView& v) {
  const int64_t n = v.ctrl[kCtrlPlanLen];
  for (int64_t j = 0; j < n; ++j) {
    const int32_t slot = v.plan[2 * j + 1];
    if (slot < 0) continue;
    const int32_t row = v.arena_row[v.plan[2 * j]];
    std::memcpy(v.pool + slot * v.slot_bytes, v.arena + row * v.arena_stride,
                static_cast<size_t>(v.slot_bytes));
  }
  for (int64_t j = 0; j < n; ++j)            // publish after every byte is in place
    if (v.plan[2 * j + 1] >= 0) v.table[v.plan[2 * j]] = v.plan[2 * j + 1];
}

}  // namespace tierstore
