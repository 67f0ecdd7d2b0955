// Device-side residency: the state a GPU needs to keep a slot pool by itself, and the
// one decision rule it runs (a CLOCK sweep), spelled here once for the host. The CUDA
// kernels (csrc/kernels/src/residency.cu) run the same rule with one warp and are
// checked against this host version decision for decision (tests/test_residency*.py).
//
// Why CLOCK: a victim must be chosen on the device inside a captured CUDA graph, with
// no host sync and in bounded time; CLOCK needs one reference bit per slot and a hand,
// sweeps 32 slots per warp step, and never sorts. The host keeps every richer policy
// (heat, admission, the arena's contents): it refills the arena from the pack ahead of
// need and folds the heat the device counts. Nothing else of the store's policies is
// known here.
//
// One decide (one MoE layer of one token: `ids` [P] routed expert ids of `layer`):
//  1. epoch += 1. Each distinct valid id (0 <= id < n_experts) is taken once, at its first
//     position in `ids`; its heat counter (optional) gets one per occurrence.
//  2. Hits (slot_table[layer, e] >= 0): the slot's stamp = epoch, ref bit = 1.
//  3. Misses, in first-position order: the key's arena row is looked up (`arena_row`);
//     none -> counted `no_arena`, not placed. Else the hand sweeps: a slot stamped with
//     this epoch (routed in this decide) or locked is skipped untouched; a slot with its
//     ref bit set has it cleared and is passed; the first other slot is the victim
//     (a free slot has owner -1 and ref 0). After 2 * n_slots + 32 positions without
//     one: `no_slot`, not placed. A placed key takes the slot (owner, stamp = epoch,
//     ref = 1), the victim's slot-table entry becomes -1 at once, and the plan gets
//     (key, slot); the hand moves past the slot.
//  4. The page-in then copies each planned row arena -> pool and only after that writes
//     slot_table[key] = slot (the publish), on the same stream as the consumer.
// Victims are never keys routed in the same decide. Ids outside [0, n_experts) are
// ignored (vLLM's -1 "skip").
#pragma once

#include <cstdint>

namespace tierstore {

constexpr uint32_t kResidencyLocked = 0xFFFFFFFFu;   // stamp of a slot never chosen as victim

// ctrl words (int64): the hand, the epoch, the last plan's length, the page-in's
// finished-block ticket, then cumulative counters.
enum ResidencyCtrl : int {
  kCtrlHand = 0,
  kCtrlEpoch = 1,
  kCtrlPlanLen = 2,
  kCtrlTicket = 3,
  kCtrlDecides = 4,
  kCtrlRouted = 5,     // valid routed ids (every occurrence)
  kCtrlHits = 6,       // distinct keys per decide found resident
  kCtrlMisses = 7,     // distinct keys per decide not resident
  kCtrlPlaced = 8,     // misses given a slot (rows copied arena -> pool)
  kCtrlNoArena = 9,    // misses whose key has no arena row (not placed)
  kCtrlNoSlot = 10,    // misses for which no victim could be found (not placed)
  kCtrlEvicted = 11,   // placements that displaced a resident key
  kCtrlBytes = 12,     // bytes copied arena -> pool
  kCtrlWords = 16,
};

// Pointers into one memory space: all device memory (the CUDA kernels; `arena` is the
// device-visible address of the pinned arena), or all host memory (the host functions
// below: a CPU pool, or the host-planned baseline's mirror). Sizes in elements.
struct ResidencyView {
  int32_t* table = nullptr;         // [n_layers * n_experts] the store's slot table
  uint8_t* pool = nullptr;          // [n_slots, slot_bytes]
  int64_t n_slots = 0, slot_bytes = 0;
  int32_t n_layers = 0, n_experts = 0;
  int32_t* owner = nullptr;         // [n_slots] dense key held, -1 = free
  uint32_t* stamp = nullptr;        // [n_slots] epoch of the last decide that routed it
  uint8_t* ref = nullptr;           // [n_slots] CLOCK reference bits
  const int32_t* arena_row = nullptr;   // [n_layers * n_experts] arena row of a key, -1 = none
  int32_t* first = nullptr;         // [n_experts] scratch: first position of an id
  int32_t* heat = nullptr;          // [n_layers * n_experts] routed counts, or null
  int64_t* ctrl = nullptr;          // [kCtrlWords]
  int32_t* plan = nullptr;          // [2 * max_plan] (key, slot) per miss; slot -1 = not placed
  int64_t max_plan = 0;             // most ids one decide takes
  const uint8_t* arena = nullptr;   // arena row 0 (device-visible for the kernels)
  int64_t arena_rows = 0, arena_stride = 0;
};

#if defined(__CUDACC__)
#define TS_RESIDENCY_HD __host__ __device__
#else
#define TS_RESIDENCY_HD
#endif

// The epoch after `epoch` (never the lock mark), for both spellings of the decide.
TS_RESIDENCY_HD inline int64_t residency_next_epoch(int64_t epoch) {
  ++epoch;
  if (static_cast<uint32_t>(epoch) == kResidencyLocked) ++epoch;
  return epoch;
}

// What one decide adds to the counters (both spellings end with this).
struct ResidencyTally {
  int64_t plan_len = 0, routed = 0, hits = 0, placed = 0, no_arena = 0, no_slot = 0, evicted = 0;
};

TS_RESIDENCY_HD inline void residency_count(int64_t* c, const ResidencyTally& t, int64_t slot_bytes) {
  c[kCtrlPlanLen] = t.plan_len;
  c[kCtrlDecides] += 1;
  c[kCtrlRouted] += t.routed;
  c[kCtrlHits] += t.hits;
  c[kCtrlMisses] += t.plan_len;
  c[kCtrlPlaced] += t.placed;
  c[kCtrlNoArena] += t.no_arena;
  c[kCtrlNoSlot] += t.no_slot;
  c[kCtrlEvicted] += t.evicted;
  c[kCtrlBytes] += t.placed * slot_bytes;
}

// Validates the view and the call (std::invalid_argument naming what is wrong).
void residency_check(const ResidencyView& v, int layer, int64_t n_ids);

// The decide above, on host memory. Writes the plan (ctrl[kCtrlPlanLen] entries).
void residency_decide_host(const ResidencyView& v, int layer, const int32_t* ids, int64_t n_ids);

// The page-in of the last plan on host memory: memcpy arena -> pool, then publish.
void residency_gather_host(const ResidencyView& v);

}  // namespace tierstore
