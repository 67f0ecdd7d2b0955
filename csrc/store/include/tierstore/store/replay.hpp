// Demand-fill replay of a routing trace through one policy (lru / heat / hybrid / phase),
// in one native loop (the Python loop ran 0.02-0.35 M accesses/s). No I/O.
//
// The state is the caller's policy arrays (policy.hpp PolicyView), left as the Python
// loop over the same policy would leave them (tests/test_native_policies.py compares
// hits, reads, evictions, rejections and the final state on many traces):
//   fill      free slots first, then victims paired in order; with the policy's filter
//             a candidate must pass policy_admit over its victim       (policies/fill.py)
//   replay    accesses reach the policy per run of groups up to a miss and at tick end;
//             phase (its order counts groups) gets one access per group (sim/demand.py)
#pragma once

#include <cstdint>
#include <vector>

#include "tierstore/store/policy.hpp"
#include "tierstore/store/resident_order.hpp"

namespace tierstore {

// The prepared trace (sim/counting.py Prepared): distinct keys per (tick, key) in read
// order, their token counts, group bounds (n_groups + 1) and a tick-end flag per group.
struct ReplayTrace {
  const int64_t* keys = nullptr;
  const int64_t* counts = nullptr;  // null: every count is 1
  int64_t n = 0;
  const int64_t* starts = nullptr;
  const bool* tick_end = nullptr;
  int64_t n_groups = 0;
};

// One group's read of the slot table: hit[i] for each access of [a, b) and the missed
// keys, in read order (both replays, demand and auto, start every group with it).
inline void split_group(const ReplayTrace& tr, int64_t a, int64_t b, const bool* resident,
                        bool* hit, std::vector<int64_t>& miss) {
  miss.clear();
  for (int64_t i = a; i < b; ++i) {
    hit[i] = resident[tr.keys[i]];
    if (!hit[i]) miss.push_back(tr.keys[i]);
  }
}

struct ReplayCounts {
  int64_t demand_reads = 0, evictions = 0, rejected = 0;
};

// A simulated tier of `slots` slots around one policy: its resident set in eviction order
// and the one fill routine (policies/fill.py plan_fill + sim/demand.py Filler.place).
class PolicyTier {
 public:
  PolicyTier(PolicyView& p, int64_t slots) : p_(p), slots_(slots), order_(p), pinned_(p.n_keys, 0) {}

  PolicyView& policy() { return p_; }
  int64_t n_free() const { return slots_ > p_.n_resident ? slots_ - p_.n_resident : 0; }
  // on_access over keys[0:n] (distinct; w / counts as policy_access), keeping the order
  // current, and `mirror` too (another order over this policy's state, e.g. of another key set).
  void access(const int64_t* keys, int64_t n, const double* w, const int64_t* counts,
              ResidentOrder* mirror = nullptr);
  // A tick ends (`steps` steps). Returns true when the heats were rescaled (a mirror must
  // rebuild).
  bool decay(int64_t steps = 1);
  // The policy's arrays changed from outside (a reset): order them again.
  void rebuild() {
    order_.rebuild();
    floor_ok_ = false;
  }
  // Fill `miss` (not resident, distinct); victims never among block[0:nb] (nb = 0: none
  // blocked). `filter`: the policy's admission filter applies, and when it may turn some
  // away (more misses than free slots) `miss` is ranked hottest first (policy_rank: the
  // order they win slots, sim/demand.py Filler.demand); otherwise taken in its order.
  void fill(std::vector<int64_t>& miss, const int64_t* block, int64_t nb, bool filter,
            ReplayCounts& counts, ResidentOrder* mirror = nullptr) {
    fill_impl(miss, block, nb, nullptr, filter, counts, mirror);
  }
  // As fill, the victims never keys with pinned[k] != 0 (the caller's whole mask: a
  // prefetcher's pins and the group being read).
  void fill_masked(std::vector<int64_t>& miss, const uint8_t* pinned, bool filter,
                   ReplayCounts& counts) {
    fill_impl(miss, nullptr, 0, pinned, filter, counts, nullptr);
  }
  // A lazy (background) pass, policy.hpp policy_plan_lazy over this tier's order (victims
  // never keys with pinned[k] != 0; null: none), then applied. counts.rejected grows by the
  // candidates turned away; `cand` is reordered.
  void lazy(std::vector<int64_t>& cand, int64_t cap, const uint8_t* pinned,
            LazyAdmission admission, bool coldest, ReplayCounts& counts);
  // The last fill's victims and the keys it admitted (free slots first, then over the
  // victims, in pairs).
  const std::vector<int64_t>& evicted() const { return vic_; }
  const std::vector<int64_t>& admitted() const { return admit_; }
  // The n coldest resident keys with pinned[k] == 0, coldest first (changes nothing).
  void victims(int64_t n, const uint8_t* pinned, std::vector<int64_t>& out) {
    order_.victims(n, pinned, out);
  }

 private:
  PolicyView& p_;
  const int64_t slots_;
  ResidentOrder order_;
  std::vector<uint8_t> pinned_;
  std::vector<int64_t> vic_, admit_;
  // The filter's floor: a lower bound on every resident key's raw heat. A candidate at or
  // below it fails policy_admit against any victim, so fill() takes victims only up to the
  // last candidate above it (victims come coldest first: the ones taken are the same).
  // Valid while raw heats only grow (an access without weights adds count * gain) and no
  // renormalisation rescaled them; an admission lowers it; rescanned once `slots`
  // evictions have loosened it.
  double floor_ = 0.0;
  bool floor_ok_ = false;
  int64_t floor_age_ = 0;
  double floor();
  void fill_impl(std::vector<int64_t>& miss, const int64_t* block, int64_t nb,
                 const uint8_t* mask, bool filter, ReplayCounts& counts, ResidentOrder* mirror);
  // Applies the decision in vic_ / admit_: evicts, admits, keeps the orders current.
  void apply(ReplayCounts& counts, ResidentOrder* mirror);
};

// Replays `trace` into `policy` with `slots` slots; `filter`: the policy's own admission
// filter applies to demand fills (false: every miss is admitted, the store's fire).
// hit[i] = keys[i] was resident when its group read. Throws std::out_of_range on a key
// outside [0, n_keys), std::invalid_argument on a view missing an array its kind needs.
ReplayCounts replay_demand(PolicyView& policy, const ReplayTrace& trace, int64_t slots,
                           bool filter, bool* hit);

// Throws std::out_of_range unless every key of the trace is in [0, n_keys).
void check_trace_keys(const ReplayTrace& trace, int64_t n_keys);

}  // namespace tierstore
