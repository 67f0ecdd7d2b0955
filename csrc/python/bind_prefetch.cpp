// Binding of store/prefetcher.hpp: tierstore._C.CoRouting (the co-routing model, also the
// simulator's `predict` model) and tierstore._C.Prefetcher (the rules behind
// tierstore/policies/prefetch.py, one on_read and one propose per read of the slot table).
// The GIL is kept: calls are short, and propose may call the tier's victims back.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "tierstore/store/prefetch_replay.hpp"
#include "tierstore/store/prefetcher.hpp"

#include "flat_array.hpp"
#include "policy_core.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace tierstore::python {
namespace {

using Ids = Flat<const int64_t>;
using Probs = Flat<const double>;
using IdArray = nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>;
using ProbArray = nb::ndarray<nb::numpy, double, nb::ndim<1>>;

void check_layer(int64_t layer, int64_t n_layers, const char* what) {
  if (layer < 0 || layer >= n_layers)
    throw nb::index_error((std::string(what) + ": layer out of range").c_str());
}

void check_experts(const Ids& ids, int64_t n_experts, const char* what) {
  const int64_t* e = ids.data();
  for (size_t i = 0; i < ids.shape(0); ++i) {
    if (e[i] < 0 || e[i] >= n_experts)
      throw nb::index_error((std::string(what) + ": expert out of range").c_str());
  }
}

// Counts add once per expert (as numpy's fancy +=): a repeated id would count twice.
void check_distinct(const Ids& ids, const char* what) {
  const int64_t* e = ids.data();
  for (size_t i = 1; i < ids.shape(0); ++i) {
    if (e[i] <= e[i - 1])
      throw nb::value_error((std::string(what) + ": experts must be distinct and ascending").c_str());
  }
}

void check_probs(const Probs& p, int64_t n_experts, const char* what) {
  if (static_cast<int64_t>(p.shape(0)) != n_experts)
    throw nb::value_error((std::string(what) + ": one probability per expert").c_str());
}

int64_t size(const Ids& a) { return static_cast<int64_t>(a.shape(0)); }

// A view of one of the model's arrays, alive while the object is (reference_internal).
template <size_t N>
nb::ndarray<nb::numpy, double, nb::ndim<N>> view(std::vector<double>& v,
                                                 std::initializer_list<size_t> shape) {
  return nb::ndarray<nb::numpy, double, nb::ndim<N>>(v.data(), N, shape.begin(), nb::handle());
}

// -- CoRouting -------------------------------------------------------------------------------

void co_observe(CoRouting& c, int64_t layer, Ids experts, double weight) {
  check_layer(layer, c.n_layers, "corouting");
  check_experts(experts, c.n_experts, "corouting");
  check_distinct(experts, "corouting");
  c.observe(layer, experts.data(), size(experts), weight);
}

void co_learn(CoRouting& c, int64_t layer, Ids src, Ids dst, bool temporal, double weight) {
  check_layer(layer, temporal ? c.n_layers : c.n_layers - c.distance, "corouting");
  check_experts(src, c.n_experts, "corouting");
  check_experts(dst, c.n_experts, "corouting");
  check_distinct(src, "corouting");
  check_distinct(dst, "corouting");
  c.learn(layer, src.data(), size(src), dst.data(), size(dst), temporal, weight);
}

ProbArray co_predict(const CoRouting& c, int64_t layer, Ids src, bool temporal) {
  check_layer(layer, temporal ? c.n_layers : c.n_layers - c.distance, "corouting");
  check_experts(src, c.n_experts, "corouting");
  std::vector<double> out(static_cast<size_t>(c.n_experts));
  c.predict(layer, src.data(), size(src), temporal, out.data());
  return to_numpy(out.data(), out.size());
}

std::optional<ProbArray> co_mix(const CoRouting& c, std::optional<Probs> pc, std::optional<Probs> pt) {
  if (!pc && !pt) return std::nullopt;
  if (!pc || !pt) {
    const Probs& p = pc ? *pc : *pt;
    check_probs(p, c.n_experts, "corouting");
    return to_numpy(p.data(), p.shape(0));
  }
  check_probs(*pc, c.n_experts, "corouting");
  check_probs(*pt, c.n_experts, "corouting");
  std::vector<double> out(static_cast<size_t>(c.n_experts));
  c.mix(pc->data(), pt->data(), out.data());
  return to_numpy(out.data(), out.size());
}

void co_score(CoRouting& c, std::optional<Probs> pc, std::optional<Probs> pt, Ids actual,
              int64_t per_token) {
  if (!pc || !pt || size(actual) == 0) return;  // both scored on the same reads, or neither
  check_probs(*pc, c.n_experts, "corouting");
  check_probs(*pt, c.n_experts, "corouting");
  check_experts(actual, c.n_experts, "corouting");
  c.score(pc->data(), pt->data(), actual.data(), size(actual), per_token);
}

// -- Prefetcher ------------------------------------------------------------------------------

IdArray pf_on_read(Prefetcher& pf, int64_t layer, Ids experts, Flat<const bool> hit,
                   int64_t routings) {
  check_layer(layer, pf.n_layers, "prefetch");
  check_experts(experts, pf.n_experts, "prefetch");
  check_distinct(experts, "prefetch");
  if (hit.shape(0) != experts.shape(0)) throw nb::value_error("prefetch: one hit flag per expert");
  const std::vector<int64_t> release =
      pf.on_read(layer, experts.data(), size(experts), hit.data(), routings);
  return to_numpy(release.data(), release.size());
}

std::optional<ProbArray> pf_predict(Prefetcher& pf, int64_t layer, int64_t m, bool wraps) {
  check_layer(layer, pf.n_layers, "prefetch");
  check_layer(m, pf.n_layers, "prefetch");
  std::vector<double> out(static_cast<size_t>(pf.n_experts));
  if (!pf.predict(layer, m, wraps, out.data())) return std::nullopt;
  return to_numpy(out.data(), out.size());
}

std::tuple<IdArray, IdArray> pf_propose(Prefetcher& pf, int64_t layer, std::optional<Probs> p,
                                        Flat<const bool> resident, nb::object victims) {
  check_layer(layer, pf.n_layers, "prefetch");
  if (p) check_probs(*p, pf.n_experts, "prefetch");
  if (static_cast<int64_t>(resident.shape(0)) != pf.n_keys)
    throw nb::value_error("prefetch: the resident mask has one flag per key");
  // The tier's victims: called with a copy of the blocked mask, answering int64 keys.
  Prefetcher::Victims fn = [&](int64_t n, const bool* blocked) {
    nb::object got = victims(n, to_numpy(blocked, static_cast<size_t>(pf.n_keys)));
    const Ids v = nb::cast<Ids>(got);
    return std::vector<int64_t>(v.data(), v.data() + v.shape(0));
  };
  std::vector<int64_t> fetch, hold;
  pf.propose(layer, p ? p->data() : nullptr, resident.data(), victims.is_none() ? nullptr : &fn,
             fetch, hold);
  return {to_numpy(fetch.data(), fetch.size()), to_numpy(hold.data(), hold.size())};
}

ProbArray pf_calibrated(const Prefetcher& pf, Probs p, int kind) {
  if (kind < 0 || kind > 1) throw nb::value_error("prefetch: kind is 0 (same tick) or 1 (next)");
  std::vector<double> out(p.shape(0));
  for (size_t i = 0; i < out.size(); ++i) out[i] = pf.calibrated(p.data()[i], kind);
  return to_numpy(out.data(), out.size());
}

using PrefetchCounts = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t>;

PrefetchCounts replay(PolicyCore& core, Prefetcher& pf, Flat<const int64_t> keys,
                      Flat<const int64_t> counts, bool single, Flat<const int64_t> starts,
                      Flat<const bool> tick_end, int64_t slots, bool filter, bool demand_fill,
                      Flat<bool> hit) {
  const ReplayTrace tr = replay_trace(keys, counts, single, starts, tick_end, hit.shape(0));
  PrefetchReplayCounts c;
  try {
    nb::gil_scoped_release unlocked;  // the whole loop is native: no Python callback
    c = replay_prefetch(core.view, pf, tr, slots, filter, demand_fill, hit.data());
  } catch (const std::invalid_argument& e) {
    throw nb::value_error(e.what());
  }
  return PrefetchCounts{c.demand_reads, c.evictions, c.rejected, c.prefetched, c.prefetch_hits,
                        c.wasted, c.unserved};
}

PrefetchCounts predict_replay(PolicyCore& core, CoRouting& model, Flat<const int64_t> keys,
                              Flat<const int64_t> counts, bool single, Flat<const int64_t> starts,
                              Flat<const bool> tick_end, int64_t slots, bool filter,
                              int64_t budget, double threshold, bool cross, bool temporal,
                              int64_t top_k, bool demand_fill, Flat<bool> hit) {
  const ReplayTrace tr = replay_trace(keys, counts, single, starts, tick_end, hit.shape(0));
  PredictParams pp;
  pp.budget = budget;
  pp.threshold = threshold;
  pp.cross = cross;
  pp.temporal = temporal;
  pp.top_k = top_k;
  pp.demand_fill = demand_fill;
  PrefetchReplayCounts c;
  try {
    nb::gil_scoped_release unlocked;
    c = replay_predict(core.view, model, tr, slots, filter, pp, hit.data());
  } catch (const std::invalid_argument& e) {
    throw nb::value_error(e.what());
  }
  return PrefetchCounts{c.demand_reads, c.evictions, c.rejected, c.prefetched, c.prefetch_hits,
                        c.wasted, c.unserved};
}

}  // namespace

void bind_prefetch(nb::module_& m) {
  nb::class_<CoRouting>(m, "CoRouting",
                        "Online co-routing counts (tierstore/policies/corouting.py has the model).")
      .def(nb::init<int64_t, int64_t, int64_t, double, double>(), "n_layers"_a, "n_experts"_a,
           "distance"_a = 1, "half_life"_a = 512.0, "prior_weight"_a = 4.0)
      .def("tick", &CoRouting::tick)
      .def("observe", &co_observe, "layer"_a, "experts"_a, "weight"_a = 1.0)
      .def("learn", &co_learn, "layer"_a, "src"_a, "dst"_a, nb::kw_only(), "temporal"_a,
           "weight"_a = 1.0)
      .def("seen", [](const CoRouting& c, int64_t layer) {
        check_layer(layer, c.n_layers, "corouting");
        return c.seen(layer);
      })
      .def("predict", &co_predict, "layer"_a, "src"_a, nb::kw_only(), "temporal"_a)
      .def("mix", &co_mix, "p_cross"_a.none(), "p_temp"_a.none())
      .def("score", &co_score, "p_cross"_a.none(), "p_temp"_a.none(), "actual"_a, "per_token"_a)
      .def_ro("n_layers", &CoRouting::n_layers)
      .def_ro("n_experts", &CoRouting::n_experts)
      .def_ro("distance", &CoRouting::distance)
      .def_ro("half_life", &CoRouting::half_life)
      .def_ro("prior_weight", &CoRouting::prior_weight)
      .def_prop_ro("loglik", [](const CoRouting& c) { return to_numpy(c.loglik, 2); })
      .def_prop_ro("marginal", [](CoRouting& c) {
        return view<2>(c.marginal, {static_cast<size_t>(c.n_layers), static_cast<size_t>(c.n_experts)});
      }, nb::rv_policy::reference_internal)
      .def_prop_ro("marginal_n", [](CoRouting& c) {
        return view<1>(c.marginal_n, {static_cast<size_t>(c.n_layers)});
      }, nb::rv_policy::reference_internal);

  nb::class_<Prefetcher>(m, "Prefetcher",
                         "The prefetcher's rules (tierstore/policies/prefetch.py is its face).")
      .def("__init__", [](Prefetcher* self, int64_t n_layers, int64_t n_experts, int64_t capacity,
                          double read_ratio, int64_t lead, double threshold, double half_life,
                          int64_t max_per_read, int64_t top_k, bool cross, bool temporal) {
             PrefetchParams pp;
             pp.read_ratio = read_ratio;
             pp.lead = lead;
             pp.threshold = threshold;
             pp.half_life = half_life;
             pp.max_per_read = max_per_read;
             pp.top_k = top_k;
             pp.cross = cross;
             pp.temporal = temporal;
             try {
               new (self) Prefetcher(n_layers, n_experts, capacity, pp);
             } catch (const std::invalid_argument& e) {
               throw nb::value_error(e.what());
             }
           }, "n_layers"_a, "n_experts"_a, "capacity"_a, "read_ratio"_a, "lead"_a, "threshold"_a,
           "half_life"_a, "max_per_read"_a, "top_k"_a, "cross"_a, "temporal"_a)
      .def("on_read", &pf_on_read, "layer"_a, "experts"_a, "hit"_a, "routings"_a)
      .def("target", [](const Prefetcher& pf, int64_t layer) {
        check_layer(layer, pf.n_layers, "prefetch");
        return pf.target(layer);
      })
      .def("predict", &pf_predict, "layer"_a, "m"_a, "wraps"_a)
      .def("propose", &pf_propose, "layer"_a, "p"_a.none(), "resident"_a, "victims"_a.none())
      .def("end_tick", &Prefetcher::end_tick)
      .def("credit", &Prefetcher::credit)
      .def("calibrated", &pf_calibrated, "p"_a, "kind"_a = 0)
      .def("held", [](const Prefetcher& pf, int64_t layer) {
        check_layer(layer, pf.n_layers, "prefetch");
        return to_numpy(pf.held(layer).data(), pf.held(layer).size());
      })
      .def("this_experts", [](const Prefetcher& pf, int64_t layer) -> std::optional<IdArray> {
        check_layer(layer, pf.n_layers, "prefetch");
        if (!pf.has_this(layer)) return std::nullopt;
        return to_numpy(pf.this_experts(layer).data(), pf.this_experts(layer).size());
      })
      .def_prop_ro("held_mask", [](Prefetcher& pf) {
        const size_t shape[1] = {static_cast<size_t>(pf.n_keys)};
        return nb::ndarray<nb::numpy, bool, nb::ndim<1>>(pf.held_mask.get(), 1, shape, nb::handle());
      }, nb::rv_policy::reference_internal)
      .def_prop_ro("model", [](Prefetcher& pf) -> CoRouting& { return pf.model; },
                   nb::rv_policy::reference_internal)
      .def_ro("n_layers", &Prefetcher::n_layers)
      .def_ro("n_experts", &Prefetcher::n_experts)
      .def_ro("n_keys", &Prefetcher::n_keys)
      .def_ro("capacity", &Prefetcher::capacity)
      .def_ro("lead", &Prefetcher::lead)
      .def_rw("lru_reads", &Prefetcher::lru_reads)
      .def_rw("misses", &Prefetcher::misses)
      .def_rw("issued", &Prefetcher::issued)
      .def_rw("useful", &Prefetcher::useful)
      .def_rw("held_resident", &Prefetcher::held_resident)
      .def_rw("in_flight", &Prefetcher::in_flight)
      .def_rw("in_flight_p", &Prefetcher::in_flight_p)
      .def_rw("last_cost", &Prefetcher::last_cost)
      .def_rw("threshold", &Prefetcher::threshold)
      .def_rw("hold_threshold", &Prefetcher::hold_threshold)
      .def_prop_ro("precision", &Prefetcher::precision)
      .def_prop_ro("reads", &Prefetcher::reads);
  m.def("replay_prefetch", &replay, "core"_a, "prefetcher"_a, "keys"_a, "counts"_a, "single"_a,
        "starts"_a, "tick_end"_a, "slots"_a, "filter"_a, "demand_fill"_a, "hit"_a.noconvert(),
        "sim/prefetching.py's replay through one PolicyCore and a Prefetcher (both updated in "
        "place); returns (demand_reads, evictions, rejected, prefetched, prefetch_hits, "
        "wasted, unserved).");
  m.def("replay_predict", &predict_replay, "core"_a, "model"_a, "keys"_a, "counts"_a,
        "single"_a, "starts"_a, "tick_end"_a, "slots"_a, "filter"_a, "budget"_a, "threshold"_a,
        "cross"_a, "temporal"_a, "top_k"_a, "demand_fill"_a, "hit"_a.noconvert(),
        "sim/predict.py's `predict` model (demand_fill) or its `prefetch` model through one "
        "PolicyCore and a CoRouting (both updated in place); returns the counts as "
        "replay_prefetch.");
}

}  // namespace tierstore::python
