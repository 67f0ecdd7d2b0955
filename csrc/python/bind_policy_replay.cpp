// Binding of store/replay.hpp and store/auto_replay.hpp: tierstore._C.replay_demand and
// replay_auto, called by tierstore/sim/native_replay.py with the policies' cores (their
// faces' arrays, mutated in place: the policy object ends in the state the Python loop
// over the same faces would leave) and the prepared trace.
// The GIL is released: the loop touches only these buffers, which the caller holds.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <tuple>
#include <vector>

#include "tierstore/store/auto_replay.hpp"
#include "tierstore/store/replay.hpp"

#include "flat_array.hpp"
#include "policy_core.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace tierstore::python {

using Counts = std::tuple<int64_t, int64_t, int64_t>;

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

using AutoScalars = std::tuple<int64_t, int64_t>;

std::tuple<AutoScalars, Counts> replay_auto_(std::vector<PolicyCore*> experts, Flat<bool> resident,
                                             int64_t n_resident, int64_t capacity,
                                             Flat<double> scores, int64_t leader,
                                             double score_decay, bool score_tokens,
                                             Flat<const int64_t> keys,
                                             Flat<const int64_t> counts, bool single,
                                             Flat<const int64_t> starts,
                                             Flat<const bool> tick_end, int64_t slots,
                                             bool filter, Flat<bool> hit) {
  AutoView a;
  // The experts' views are copied in and written back: a core may appear only once.
  for (PolicyCore* e : experts) a.experts.push_back(e->view);
  a.n_keys = static_cast<int64_t>(resident.shape(0));
  if (scores.shape(0) != a.experts.size() || leader < 0 ||
      leader >= static_cast<int64_t>(a.experts.size()))
    throw nb::value_error("replay_auto: one score per expert, leader among them");
  a.capacity = capacity;
  a.resident = resident.data();
  a.n_resident = n_resident;
  a.scores = scores.data();
  a.leader = leader;
  a.score_decay = score_decay;
  a.score_tokens = score_tokens;
  const ReplayTrace tr = replay_trace(keys, counts, single, starts, tick_end, hit.shape(0));
  ReplayCounts c;
  {
    nb::gil_scoped_release unlocked;
    c = replay_auto(a, tr, slots, filter, hit.data());
  }
  for (size_t i = 0; i < experts.size(); ++i) experts[i]->view = a.experts[i];
  return {AutoScalars{a.n_resident, a.leader},
          Counts{c.demand_reads, c.evictions, c.rejected}};
}

}  // namespace

void bind_policy_replay(nb::module_& m) {
  m.def("replay_demand", &replay, "core"_a, "keys"_a, "counts"_a, "single"_a, "starts"_a,
        "tick_end"_a, "slots"_a, "filter"_a, "hit"_a.noconvert(),
        "Demand-fill replay of a prepared trace through one PolicyCore (its n_resident "
        "set by the caller), in place; returns (demand_reads, evictions, rejected).");
  m.def("replay_auto", &replay_auto_, "experts"_a, "resident"_a.noconvert(), "n_resident"_a,
        "capacity"_a, "scores"_a.noconvert(), "leader"_a, "score_decay"_a,
        "score_tokens"_a, "keys"_a,
        "counts"_a, "single"_a, "starts"_a, "tick_end"_a, "slots"_a, "filter"_a,
        "hit"_a.noconvert(),
        "Demand-fill replay through the self-tuning policy: experts = PolicyCores (index "
        "order), they, the real resident mask and scores updated in place; returns "
        "((n_resident, leader), (demand_reads, evictions, rejected)).");
}

}  // namespace tierstore::python
