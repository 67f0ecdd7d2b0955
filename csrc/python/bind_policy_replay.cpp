// Binding of store/replay.hpp: tierstore._C.replay_demand, called by
// tierstore/sim/demand.py with the Python policy's own arrays (mutated in place, so the
// policy object ends in the state the Python loop would leave) and the prepared trace.
// The GIL is released: the loop touches only these buffers, which the caller holds.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <stdexcept>
#include <tuple>

#include "tierstore/store/replay.hpp"

#include "flat_array.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace tierstore::python {
namespace {

using State = std::tuple<int64_t, double, double, double, int64_t>;
using Counts = std::tuple<int64_t, int64_t, int64_t>;

std::tuple<State, Counts> replay(int kind, Flat<int64_t> last, Flat<double> raw,
                                 Flat<bool> resident, State state, double half_life,
                                 Flat<const int64_t> keys, Flat<const int64_t> counts,
                                 bool single, Flat<const int64_t> starts,
                                 Flat<const bool> tick_end, int64_t slots, bool filter,
                                 Flat<bool> hit) {
  if (kind < 0 || kind > 2) throw nb::value_error("replay_demand: kind must be 0, 1 or 2");
  PolicyView p;
  p.kind = static_cast<PolicyKind>(kind);
  p.n_keys = static_cast<int64_t>(resident.shape(0));
  const auto sized = [&](size_t n) { return static_cast<int64_t>(n) == p.n_keys; };
  p.last = sized(last.shape(0)) ? last.data() : nullptr;
  p.raw = sized(raw.shape(0)) ? raw.data() : nullptr;
  p.resident = resident.data();
  std::tie(p.clock, p.t, p.base, p.gain, p.n_resident) = state;
  p.half_life = half_life;
  ReplayTrace tr;
  tr.keys = keys.data();
  tr.n = static_cast<int64_t>(keys.shape(0));
  tr.counts = single ? nullptr : counts.data();
  tr.starts = starts.data();
  tr.n_groups = static_cast<int64_t>(starts.shape(0)) - 1;
  tr.tick_end = tick_end.data();
  if (tr.n_groups < 0 || static_cast<int64_t>(tick_end.shape(0)) != tr.n_groups ||
      static_cast<int64_t>(hit.shape(0)) != tr.n ||
      (!single && static_cast<int64_t>(counts.shape(0)) != tr.n) ||
      (tr.n_groups >= 0 && (starts.data()[0] != 0 || starts.data()[tr.n_groups] != tr.n)))
    throw nb::value_error("replay_demand: trace arrays disagree in length");
  ReplayCounts c;
  {
    nb::gil_scoped_release unlocked;
    c = replay_demand(p, tr, slots, filter, hit.data());
  }
  return {State{p.clock, p.t, p.base, p.gain, p.n_resident},
          Counts{c.demand_reads, c.evictions, c.rejected}};
}

}  // namespace

void bind_policy_replay(nb::module_& m) {
  m.def("replay_demand", &replay, "kind"_a, "last"_a, "raw"_a, "resident"_a, "state"_a,
        "half_life"_a, "keys"_a, "counts"_a, "single"_a, "starts"_a, "tick_end"_a,
        "slots"_a, "filter"_a, "hit"_a,
        "Demand-fill replay of a prepared trace through lru (0) / heat (1) / hybrid (2) "
        "state arrays, in place; returns ((clock, t, base, gain, n_resident), "
        "(demand_reads, evictions, rejected)).");
}

}  // namespace tierstore::python
