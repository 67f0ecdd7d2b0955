// One Python policy's native state, as the policy classes hand it over (native_state() in
// tierstore/policies/*.py): the kind, its live numpy arrays (an empty array where the kind
// keeps none) and its scalars, turned into a store/policy.hpp PolicyView and back.
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/tuple.h>

#include <cstdint>
#include <tuple>

#include "tierstore/store/policy.hpp"

#include "flat_array.hpp"

namespace tierstore::python {

// (clock, t, base, gain, n_resident, group, per_tick)
using PolicyScalars = std::tuple<int64_t, double, double, double, int64_t, int64_t, int64_t>;

inline PolicyView policy_view(int kind, Flat<int64_t> last, Flat<double> raw, Flat<int64_t> pos,
                              Flat<bool> resident, const PolicyScalars& s, double half_life) {
  if (kind < 0 || kind >= kPolicyKinds) throw nanobind::value_error("policy kind out of range");
  PolicyView p;
  p.kind = static_cast<PolicyKind>(kind);
  p.n_keys = static_cast<int64_t>(resident.shape(0));
  const auto sized = [&](size_t n) { return static_cast<int64_t>(n) == p.n_keys; };
  p.last = sized(last.shape(0)) ? last.data() : nullptr;
  p.raw = sized(raw.shape(0)) ? raw.data() : nullptr;
  p.pos = sized(pos.shape(0)) ? pos.data() : nullptr;
  p.resident = resident.data();
  std::tie(p.clock, p.t, p.base, p.gain, p.n_resident, p.group, p.per_tick) = s;
  p.half_life = half_life;
  check_view(p);
  return p;
}

inline PolicyScalars policy_scalars(const PolicyView& p) {
  return {p.clock, p.t, p.base, p.gain, p.n_resident, p.group, p.per_tick};
}

// A native_state() tuple (kind, last, raw, pos, resident, scalars, half_life) as a view.
inline PolicyView policy_view(nanobind::handle state) {
  nanobind::tuple t = nanobind::cast<nanobind::tuple>(state);
  if (t.size() != 7) throw nanobind::value_error("policy state: expected 7 fields");
  // No conversion for the arrays: a converted copy would take the writes.
  return policy_view(nanobind::cast<int>(t[0]), nanobind::cast<Flat<int64_t>>(t[1], false),
                     nanobind::cast<Flat<double>>(t[2], false),
                     nanobind::cast<Flat<int64_t>>(t[3], false),
                     nanobind::cast<Flat<bool>>(t[4], false), nanobind::cast<PolicyScalars>(t[5]),
                     nanobind::cast<double>(t[6]));
}

}  // namespace tierstore::python
