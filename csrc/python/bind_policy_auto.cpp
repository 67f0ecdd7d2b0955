// Binding of store/auto_core.hpp and store/auto_replay.hpp: tierstore._C.AutoCore (the
// self-tuning policy's rules behind tierstore/policies/auto.py, one call per read of the
// slot table) and tierstore._C.replay_auto (tierstore/sim/native_replay.py: the whole
// replay over the same core). The core works on its experts' PolicyCore views in place
// and keeps those cores alive; the scores are the face's numpy array.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <tuple>
#include <vector>

#include "tierstore/store/auto_core.hpp"
#include "tierstore/store/auto_replay.hpp"
#include "tierstore/store/prefetch_replay.hpp"

#include "flat_array.hpp"
#include "policy_core.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace tierstore::python {
namespace {

struct AutoHandle {
  AutoHandle(nb::list experts, int64_t capacity, Flat<double> scores_, double score_decay,
             double long_decay, bool meta)
      : scores(scores_) {
    std::vector<PolicyView*> views;
    for (nb::handle h : experts) {
      PolicyCore& c = nb::cast<PolicyCore&>(h);
      refs.push_back(nb::borrow(h));  // the views live in these cores
      views.push_back(&c.view);
    }
    if (scores.shape(0) != views.size()) throw nb::value_error("auto: one score per expert");
    try {
      core = std::make_unique<AutoCore>(std::move(views), capacity, scores.data(), score_decay,
                                      long_decay, meta);
    } catch (const std::invalid_argument& e) {
      throw nb::value_error(e.what());
    }
  }

  std::vector<nb::object> refs;
  Flat<double> scores;
  std::unique_ptr<AutoCore> core;
};

void access(AutoHandle& h, Flat<const int64_t> keys, std::optional<Flat<const double>> weights) {
  const int64_t n = static_cast<int64_t>(keys.shape(0));
  const int64_t* k = keys.data();
  for (int64_t i = 0; i < n; ++i) {
    if (k[i] < 0 || k[i] >= h.core->n_keys()) throw nb::index_error("auto: key out of range");
    // The shadows' fills need each key once, in the one order both callers use.
    if (i > 0 && k[i] <= k[i - 1]) throw nb::value_error("auto: keys must be distinct, ascending");
  }
  if (weights && static_cast<int64_t>(weights->shape(0)) != n)
    throw nb::value_error("auto: one weight per key");
  h.core->access(k, n, weights ? weights->data() : nullptr, nullptr);
}

using Counts = std::tuple<int64_t, int64_t, int64_t>;

std::tuple<int64_t, Counts> replay(AutoHandle& h, Flat<bool> resident, int64_t n_resident,
                                   Flat<const int64_t> keys, Flat<const int64_t> counts,
                                   bool single, Flat<const int64_t> starts,
                                   Flat<const bool> tick_end, int64_t slots, bool filter,
                                   Flat<bool> hit) {
  if (static_cast<int64_t>(resident.shape(0)) != h.core->n_keys())
    throw nb::value_error("replay_auto: the resident mask has one flag per key");
  const ReplayTrace tr = replay_trace(keys, counts, single, starts, tick_end, hit.shape(0));
  ReplayCounts c;
  {
    nb::gil_scoped_release unlocked;
    c = replay_auto(*h.core, resident.data(), n_resident, tr, slots, filter, hit.data());
  }
  return {n_resident, Counts{c.demand_reads, c.evictions, c.rejected}};
}

using PrefetchCounts = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;

std::tuple<int64_t, PrefetchCounts> replay_prefetch(
    AutoHandle& h, Flat<bool> resident, int64_t n_resident, Prefetcher& pf,
    Flat<const int64_t> keys, Flat<const int64_t> counts, bool single, Flat<const int64_t> starts,
    Flat<const bool> tick_end, int64_t slots, bool filter, bool demand_fill, Flat<bool> hit) {
  if (static_cast<int64_t>(resident.shape(0)) != h.core->n_keys())
    throw nb::value_error("replay_prefetch_auto: the resident mask has one flag per key");
  const ReplayTrace tr = replay_trace(keys, counts, single, starts, tick_end, hit.shape(0));
  PrefetchReplayCounts c;
  try {
    nb::gil_scoped_release unlocked;  // the whole loop is native: no Python callback
    c = replay_prefetch_auto(*h.core, resident.data(), n_resident, pf, tr, slots, filter,
                             demand_fill, hit.data());
  } catch (const std::invalid_argument& e) {
    throw nb::value_error(e.what());
  }
  return {n_resident, PrefetchCounts{c.demand_reads, c.evictions, c.rejected, c.prefetched,
                                     c.prefetch_hits, c.wasted, c.unserved}};
}

}  // namespace

void bind_policy_auto(nb::module_& m) {
  nb::class_<AutoHandle>(m, "AutoCore",
                         "The self-tuning policy's shadows, scores and leader over its experts' "
                         "PolicyCores (csrc/store/include/tierstore/store/auto_core.hpp).")
      .def(nb::init<nb::list, int64_t, Flat<double>, double, double, bool>(), "experts"_a,
           "capacity"_a, "scores"_a.noconvert(), "score_decay"_a, "long_decay"_a = 0.0,
           "meta"_a = false)
      .def("access", &access, "keys"_a, "weights"_a.none(),
           "One read of the slot table: keys distinct and ascending.")
      .def("decay", [](AutoHandle& h, int64_t steps) { h.core->decay(steps); }, "steps"_a,
           "A tick ends: every expert decays `steps` steps, scores too.")
      .def("reset", [](AutoHandle& h) { h.core->reset(); },
           "After the experts' state was reset: reorder the shadows, zero scores, prior leads.")
      .def_prop_ro("leader", [](const AutoHandle& h) { return h.core->leader(); })
      .def_prop_ro("capacity", [](const AutoHandle& h) { return h.core->capacity(); });
  m.def("replay_auto", &replay, "core"_a, "resident"_a.noconvert(), "n_resident"_a, "keys"_a,
        "counts"_a, "single"_a, "starts"_a, "tick_end"_a, "slots"_a, "filter"_a,
        "hit"_a.noconvert(),
        "Demand-fill replay through an AutoCore into the real resident mask (both updated "
        "in place); returns (n_resident, (demand_reads, evictions, rejected)).");
  m.def("replay_prefetch_auto", &replay_prefetch, "core"_a, "resident"_a.noconvert(),
        "n_resident"_a, "prefetcher"_a, "keys"_a, "counts"_a, "single"_a, "starts"_a,
        "tick_end"_a, "slots"_a, "filter"_a, "demand_fill"_a, "hit"_a.noconvert(),
        "sim/prefetching.py's replay through an AutoCore and a Prefetcher (all updated in "
        "place); returns (n_resident, (demand_reads, evictions, rejected, prefetched, "
        "prefetch_hits, wasted, unserved)).");
}

}  // namespace tierstore::python
