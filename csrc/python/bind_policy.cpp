// Binding of store/policy.hpp: tierstore._C.PolicyCore, the rules of lru / heat / hybrid /
// phase / blend behind the Python policy classes (tierstore/policies/native.py and its faces).
// One call per batch of keys; the GIL is kept (calls are short and touch only the core).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <cstring>
#include <optional>
#include <tuple>
#include <vector>

#include "tierstore/store/policy.hpp"

#include "flat_array.hpp"
#include "policy_core.hpp"

namespace nb = nanobind;
using namespace nb::literals;

namespace tierstore::python {
namespace {

using Keys = Flat<const int64_t>;
using IdArray = nb::ndarray<nb::numpy, int64_t, nb::ndim<1>>;
using MaskArray = nb::ndarray<nb::numpy, bool, nb::ndim<1>>;

// Keys outside [0, n_keys) raise IndexError (the face turns it into its ConfigError).
void check_keys(const PolicyCore& c, const Keys& keys) {
  const int64_t n = c.view.n_keys;
  const int64_t* k = keys.data();
  for (size_t i = 0; i < keys.shape(0); ++i) {
    if (k[i] < 0 || k[i] >= n) throw nb::index_error("policy: key out of range");
  }
}

void access(PolicyCore& c, Keys keys, std::optional<Flat<const double>> weights) {
  check_keys(c, keys);
  const int64_t n = static_cast<int64_t>(keys.shape(0));
  if (weights && static_cast<int64_t>(weights->shape(0)) != n)
    throw nb::value_error("policy: one weight per key");
  policy_access(c.view, keys.data(), n, weights ? weights->data() : nullptr);
}

void admitted(PolicyCore& c, Keys keys) {
  check_keys(c, keys);
  policy_admitted(c.view, keys.data(), static_cast<int64_t>(keys.shape(0)));
}

MaskArray admit(const PolicyCore& c, Keys cand, Keys victims) {
  if (cand.shape(0) != victims.shape(0)) throw nb::value_error("policy: one victim per candidate");
  check_keys(c, cand);
  check_keys(c, victims);
  std::vector<uint8_t> ok(cand.shape(0));
  for (size_t i = 0; i < ok.size(); ++i) ok[i] = policy_admit(c.view, cand.data()[i], victims.data()[i]);
  return to_numpy(reinterpret_cast<const bool*>(ok.data()), ok.size());
}

IdArray coldest(const PolicyCore& c, Keys cand, int64_t n) {
  check_keys(c, cand);
  std::vector<int64_t> out;
  policy_coldest(c.view, cand.data(), static_cast<int64_t>(cand.shape(0)), n, out);
  return to_numpy(out.data(), out.size());
}

IdArray victims(const PolicyCore& c, int64_t n, std::optional<Flat<const bool>> pinned) {
  if (pinned && static_cast<int64_t>(pinned->shape(0)) != c.view.n_keys)
    throw nb::value_error("policy: the pinned mask has one flag per key");
  std::vector<int64_t> out;
  policy_victims(c.view, n, pinned ? pinned->data() : nullptr, out);
  return to_numpy(out.data(), out.size());
}

IdArray rank(const PolicyCore& c, Keys keys) {
  check_keys(c, keys);
  std::vector<int64_t> out(keys.data(), keys.data() + keys.shape(0));
  policy_rank(c.view, out.data(), static_cast<int64_t>(out.size()));
  return to_numpy(out.data(), out.size());
}

// policy_plan_lazy over the face's state (victims: the resident mask's scan, policy_victims):
// (keys, victims, rejected). `hotter`: HotterThanVictim, else PolicyFilter.
std::tuple<IdArray, IdArray, int64_t> plan_lazy(const PolicyCore& c, Keys cand, int64_t cap,
                                                int64_t n_free, std::optional<Flat<const bool>> pinned,
                                                bool hotter, bool coldest) {
  check_keys(c, cand);
  if (pinned && static_cast<int64_t>(pinned->shape(0)) != c.view.n_keys)
    throw nb::value_error("policy: the pinned mask has one flag per key");
  const bool* mask = pinned ? pinned->data() : nullptr;
  std::vector<int64_t> ranked(cand.data(), cand.data() + cand.shape(0)), keys, vic;
  const int64_t rejected = policy_plan_lazy(
      c.view, ranked, cap, n_free, hotter ? LazyAdmission::kHotter : LazyAdmission::kPolicy,
      coldest, [&](int64_t m, std::vector<int64_t>& out) { policy_victims(c.view, m, mask, out); },
      keys, vic);
  return {to_numpy(keys.data(), keys.size()), to_numpy(vic.data(), vic.size()), rejected};
}

}  // namespace

void bind_policy(nb::module_& m) {
  nb::class_<PolicyCore>(m, "PolicyCore",
                         "One policy's rules over its face's arrays: kind 0 lru, 1 heat, "
                         "2 hybrid, 3 phase, 4 blend "
                         "(csrc/store/include/tierstore/store/policy.hpp).")
      .def(nb::init<int, Flat<int64_t>, Flat<double>, Flat<int64_t>, Flat<bool>, double,
                    Flat<double>, double>(),
           "kind"_a, "last"_a.noconvert(), "raw"_a.noconvert(), "pos"_a.noconvert(),
           "resident"_a.noconvert(), "half_life"_a, "raw2"_a.noconvert(), "half_life2"_a)
      .def("access", &access, "keys"_a, "weights"_a.none(),
           "on_access: one clock tick, heat += weight * gain, phase positions.")
      .def("advance_to", [](PolicyCore& c, double t) { return policy_advance_to(c.view, t); },
           "t"_a, "Move the heat clock to t (never back); True when heats were rescaled.")
      .def("decay", [](PolicyCore& c, int64_t steps) { return policy_decay_steps(c.view, steps); },
           "steps"_a, "decay(steps) on the step clock (phase starts a new tick).")
      .def("decay_to", [](PolicyCore& c, double t) { return policy_decay_to(c.view, t); },
           "t"_a, "decay to time t on the wall clock (phase starts a new tick).")
      .def("admitted", &admitted, "keys"_a, "Admission stamp (lru: the most-recent end).")
      .def("admit", &admit, "candidates"_a, "victims"_a, "The admission filter, per pair.")
      .def("coldest", &coldest, "cand"_a, "n"_a, "The n coldest of cand, coldest first.")
      .def("victims", &victims, "n"_a, "pinned"_a.none(),
           "The n coldest resident keys not pinned, coldest first.")
      .def("rank", &rank, "keys"_a, "keys reordered hottest first (stable).")
      .def("plan_lazy", &plan_lazy, "cand"_a, "cap"_a, "n_free"_a, "pinned"_a.none(), "hotter"_a,
           "coldest"_a = false,
           "policies/fill.py plan_lazy decided by the core: (keys, victims, rejected).")
      .def_prop_ro("kind", [](const PolicyCore& c) { return static_cast<int>(c.view.kind); })
      .def_prop_ro("half_life", [](const PolicyCore& c) { return c.view.half_life; })
      .def_prop_rw("clock", [](const PolicyCore& c) { return c.view.clock; },
                   [](PolicyCore& c, int64_t v) { c.view.clock = v; })
      .def_prop_rw("t", [](const PolicyCore& c) { return c.view.t; },
                   [](PolicyCore& c, double v) { c.view.t = v; })
      .def_prop_rw("base", [](const PolicyCore& c) { return c.view.base; },
                   [](PolicyCore& c, double v) { c.view.base = v; })
      .def_prop_rw("gain", [](const PolicyCore& c) { return c.view.gain; },
                   [](PolicyCore& c, double v) { c.view.gain = v; })
      .def_prop_rw("base2", [](const PolicyCore& c) { return c.view.base2; },
                   [](PolicyCore& c, double v) { c.view.base2 = v; })
      .def_prop_rw("gain2", [](const PolicyCore& c) { return c.view.gain2; },
                   [](PolicyCore& c, double v) { c.view.gain2 = v; })
      .def_prop_rw("n_resident", [](const PolicyCore& c) { return c.view.n_resident; },
                   [](PolicyCore& c, int64_t v) { c.view.n_resident = v; })
      .def_prop_rw("group", [](const PolicyCore& c) { return c.view.group; },
                   [](PolicyCore& c, int64_t v) { c.view.group = v; })
      .def_prop_rw("per_tick", [](const PolicyCore& c) { return c.view.per_tick; },
                   [](PolicyCore& c, int64_t v) {
                     if (v < 1) throw nb::value_error("policy: groups per tick < 1");
                     c.view.per_tick = v;
                   });
}

}  // namespace tierstore::python
