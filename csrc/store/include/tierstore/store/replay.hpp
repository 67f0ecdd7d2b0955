// Demand-fill replay of a routing trace through the lru / heat / hybrid policies, in one
// native loop (issue #14: the Python loop ran 0.02-0.35 M accesses/s). No I/O, no Python.
//
// The state is the Python policy's own arrays (tierstore/policies/{lru,heat,hybrid}.py),
// borrowed for the call and left as the Python path would leave them, so a policy object
// replayed natively is indistinguishable afterwards from one replayed in Python. Every
// rule below mirrors one Python routine exactly (tests/test_native_policies.py checks
// hits, reads, evictions, rejections and the final state on many traces):
//   order     coldest first by (raw heat | last tick, [last tick for hybrid], key id)
//                                                              (policies/dense.py coldest)
//   access    lru/hybrid: one clock tick per call; heat: raw += weight * gain, in order
//   decay     heat/hybrid: t += 1, gain = 2^((t-base)/h), renormalise past 2^256
//   fill      free slots first, then victims paired in order, hybrid admits a candidate
//             only when strictly hotter than its victim          (policies/fill.py)
//   replay    accesses reach the policy per run of groups up to a miss and at tick end
//                                                              (sim/demand.py)
#pragma once

#include <cstdint>

namespace tierstore {

enum class PolicyKind : int { kLru = 0, kHeat = 1, kHybrid = 2 };

// Views of the policy's arrays (n_keys each; `last` null for heat, `raw` null for lru)
// and its scalar clock state, written back on return.
struct PolicyView {
  PolicyKind kind = PolicyKind::kLru;
  int64_t n_keys = 0;
  int64_t* last = nullptr;
  double* raw = nullptr;
  bool* resident = nullptr;
  int64_t clock = 0;
  double t = 0.0, base = 0.0, gain = 1.0, half_life = 1.0;
  int64_t n_resident = 0;
};

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

struct ReplayCounts {
  int64_t demand_reads = 0, evictions = 0, rejected = 0;
};

// Replays `trace` into `policy` with `slots` slots; `filter`: the hybrid admission filter
// applies to demand fills. hit[i] = keys[i] was resident when its group read.
// Throws std::out_of_range on a key outside [0, n_keys).
ReplayCounts replay_demand(PolicyView& policy, const ReplayTrace& trace, int64_t slots,
                           bool filter, bool* hit);

}  // namespace tierstore
