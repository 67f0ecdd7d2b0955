// Binding of store/replay.hpp and store/min_replay.hpp: tierstore._C.replay_demand and
// replay_min (bind_policy_auto.cpp binds auto's), called by tierstore/sim/native_replay.py with the policies' cores (their
// faces' arrays, mutated in place: the policy object ends in the state the Python loop
// over the same faces would leave) and the prepared trace.
// The GIL is released: the loop touches only these buffers, which the caller holds.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <tuple>

#include "tierstore/store/lazy_replay.hpp"
#include "tierstore/store/min_replay.hpp"
#include "tierstore/store/replay.hpp"

#include "flat_array.hpp"
#include "policy_core.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace tierstore::python {

// The prepared trace's arrays as a ReplayTrace; value_error when their lengths disagree.
ReplayTrace replay_trace(Flat<const int64_t> keys, Flat<const int64_t> counts, bool single,
                         Flat<const int64_t> starts, Flat<const bool> tick_end, size_t n_hit) {
  ReplayTrace tr;
  tr.keys = keys.data();
  tr.n = static_cast<int64_t>(keys.shape(0));
  tr.counts = single ? nullptr : counts.data();
  tr.starts = starts.data();
  tr.n_groups = static_cast<int64_t>(starts.shape(0)) - 1;
  tr.tick_end = tick_end.data();
  if (tr.n_groups < 0 || static_cast<int64_t>(tick_end.shape(0)) != tr.n_groups ||
      static_cast<int64_t>(n_hit) != tr.n ||
      (!single && static_cast<int64_t>(counts.shape(0)) != tr.n) ||
      starts.data()[0] != 0 || starts.data()[tr.n_groups] != tr.n)
    throw nb::value_error("replay: trace arrays disagree in length");
  for (int64_t g = 0; g < tr.n_groups; ++g) {
    if (tr.starts[g + 1] < tr.starts[g]) throw nb::value_error("replay: group bounds decrease");
  }
  return tr;
}

namespace {

using Counts = std::tuple<int64_t, int64_t, int64_t>;

Counts replay(PolicyCore& core, Flat<const int64_t> keys, Flat<const int64_t> counts,
              bool single, Flat<const int64_t> starts, Flat<const bool> tick_end, int64_t slots,
              bool filter, Flat<bool> hit) {
  const ReplayTrace tr = replay_trace(keys, counts, single, starts, tick_end, hit.shape(0));
  ReplayCounts c;
  {
    nb::gil_scoped_release unlocked;
    c = replay_demand(core.view, tr, slots, filter, hit.data());
  }
  return Counts{c.demand_reads, c.evictions, c.rejected};
}

Counts replay_min_(Flat<const int64_t> keys, Flat<const int64_t> counts, bool single,
                   Flat<const int64_t> starts, Flat<const bool> tick_end,
                   Flat<const int64_t> next_use, int64_t slots, bool skip, Flat<int64_t> next,
                   Flat<bool> resident, Flat<bool> hit) {
  const ReplayTrace tr = replay_trace(keys, counts, single, starts, tick_end, hit.shape(0));
  if (static_cast<int64_t>(next_use.shape(0)) != tr.n)
    throw nb::value_error("replay_min: next_use and keys disagree in length");
  if (next.shape(0) != resident.shape(0))
    throw nb::value_error("replay_min: next and resident disagree in length");
  ReplayCounts c;
  {
    nb::gil_scoped_release unlocked;
    c = replay_min(tr, next_use.data(), static_cast<int64_t>(next.shape(0)), slots, skip,
                   next.data(), resident.data(), hit.data());
  }
  return Counts{c.demand_reads, c.evictions, c.rejected};
}

std::tuple<int64_t, int64_t, int64_t, int64_t> replay_lazy_(
    PolicyCore& core, Flat<const int64_t> keys, Flat<const int64_t> counts, bool single,
    Flat<const int64_t> starts, Flat<const bool> tick_end, int64_t slots, int64_t cap,
    bool hottest, Flat<bool> hit) {
  const ReplayTrace tr = replay_trace(keys, counts, single, starts, tick_end, hit.shape(0));
  LazyReplayCounts c;
  {
    nb::gil_scoped_release unlocked;
    c = replay_lazy(core.view, tr, slots, cap, hottest, hit.data());
  }
  return {c.demand_reads, c.evictions, c.rejected, c.unserved};
}

}  // namespace

void bind_policy_replay(nb::module_& m) {
  m.def("replay_demand", &replay, "core"_a, "keys"_a, "counts"_a, "single"_a, "starts"_a,
        "tick_end"_a, "slots"_a, "filter"_a, "hit"_a.noconvert(),
        "Demand-fill replay of a prepared trace through one PolicyCore (its n_resident "
        "set by the caller), in place; returns (demand_reads, evictions, rejected).");
  m.def("replay_min", &replay_min_, "keys"_a, "counts"_a, "single"_a, "starts"_a, "tick_end"_a,
        "next_use"_a, "slots"_a, "skip"_a, "next"_a.noconvert(), "resident"_a.noconvert(),
        "hit"_a.noconvert(),
        "Belady's MIN (skip: the variant that may skip caching a miss) replayed over a "
        "prepared trace and its per-access next uses; next / resident (the policy's arrays) "
        "updated in place; returns (demand_reads, evictions, rejected).");
  m.def("replay_lazy", &replay_lazy_, "core"_a, "keys"_a, "counts"_a, "single"_a, "starts"_a,
        "tick_end"_a, "slots"_a, "cap"_a, "hottest"_a, "hit"_a.noconvert(),
        "sim/demand.py replay_lazy (groups = ticks) through one PolicyCore, in place; returns "
        "(demand_reads, evictions, rejected, unserved).");
  m.def("hottest_nonresident", [](PolicyCore& core, int64_t n) {
    std::vector<int64_t> out;
    hottest_nonresident(core.view, n, out);
    return out;
  }, "core"_a, "n"_a, "sim/demand.py hottest_nonresident over the core's own state.");
}

}  // namespace tierstore::python
