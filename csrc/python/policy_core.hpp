// tierstore._C.PolicyCore: one policy's state as store/policy.hpp sees it. The arrays are
// the Python face's own numpy arrays (tierstore/policies/native.py allocates them; held
// here, so they outlive every view), the scalars live in the view. Bound in
// bind_policy.cpp; the replays (bind_policy_replay.cpp) take cores directly.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>

#include "tierstore/store/policy.hpp"
#include "tierstore/store/replay.hpp"

#include "flat_array.hpp"

namespace tierstore::python {

struct PolicyCore {
  PolicyCore(int kind, Flat<int64_t> last_, Flat<double> raw_, Flat<int64_t> pos_,
             Flat<bool> resident_, double half_life, Flat<double> raw2_, double half_life2)
      : last(last_), raw(raw_), pos(pos_), resident(resident_), raw2(raw2_) {
    if (kind < 0 || kind >= kPolicyKinds) throw nanobind::value_error("policy kind out of range");
    view.kind = static_cast<PolicyKind>(kind);
    view.n_keys = static_cast<int64_t>(resident.shape(0));
    const auto sized = [this](size_t n) { return static_cast<int64_t>(n) == view.n_keys; };
    view.last = sized(last.shape(0)) ? last.data() : nullptr;
    view.raw = sized(raw.shape(0)) ? raw.data() : nullptr;
    view.pos = sized(pos.shape(0)) ? pos.data() : nullptr;
    view.resident = resident.data();
    view.half_life = half_life;
    view.raw2 = sized(raw2.shape(0)) ? raw2.data() : nullptr;
    view.half_life2 = half_life2;
    check_view(view);
  }

  Flat<int64_t> last;
  Flat<double> raw;
  Flat<int64_t> pos;
  Flat<bool> resident;
  Flat<double> raw2;
  PolicyView view;
};

// The prepared trace's arrays as a ReplayTrace (bind_policy_replay.cpp); value_error when
// their lengths disagree. Shared by both replays' bindings.
ReplayTrace replay_trace(Flat<const int64_t> keys, Flat<const int64_t> counts, bool single,
                         Flat<const int64_t> starts, Flat<const bool> tick_end, size_t n_hit);

}  // namespace tierstore::python
