// The per-access rules of the replacement policies lru / heat / hybrid / phase, written once
// for the store and the simulator alike: the state update of an access, the decay of time,
// the eviction order, the promotion order and the admission filter. Callers: the demand replay (replay.cpp), the
// self-tuning policy's shadow experts (auto_core.cpp) and the Python policy classes
// (tierstore/policies/*.py, through csrc/python/bind_policy*.cpp).
//
// Every order is exact and deterministic: coldest first by (primary, secondary, key id)
// ascending; promotion order by (primary, secondary) descending, stable on ties.
//   lru     primary = last-use clock tick
//   heat    primary = raw heat (heat * 2^((t - base)/h): orders like heat, no decay work)
//   hybrid  primary = raw heat, secondary = last-use tick; admits a candidate only when
//           its raw heat is strictly above its victim's
//   phase   hybrid, but primary = -(off/L + 1/max(lam, 1e-12)): minus the expected
//           next-use distance in ticks, off = groups until the key's layer reads again
//           within the tick, lam = per-tick use rate (policies/phase.py has the why)
//   blend   phase, but lam = the mean of its rate and that of a second heat of a
//           LONG_RATIO times longer half-life (raw2; policies/blend.py has the why)
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

namespace tierstore {

enum class PolicyKind : int { kLru = 0, kHeat = 1, kHybrid = 2, kPhase = 3, kBlend = 4 };
constexpr int kPolicyKinds = 5;

// Views of one policy's arrays (n_keys each; `last` null for heat, `raw` null for lru,
// `pos` null unless phase) and its scalar state. The arrays belong to the caller.
struct PolicyView {
  PolicyKind kind = PolicyKind::kLru;
  int64_t n_keys = 0;
  int64_t* last = nullptr;   // last-use clock tick (-1 = never)
  double* raw = nullptr;     // raw heat
  int64_t* pos = nullptr;    // phase: group index within the tick of the last read
  bool* resident = nullptr;  // the tier's resident mask
  int64_t clock = 0;         // lru / hybrid / phase: one tick per access call
  double t = 0.0, base = 0.0, gain = 1.0, half_life = 1.0;
  int64_t n_resident = 0;
  int64_t group = 0;     // phase: groups seen this tick
  int64_t per_tick = 1;  // phase: L, most groups seen in one tick
  double* raw2 = nullptr;  // blend: the long heat (same clock t, its own base and gain)
  double base2 = 0.0, gain2 = 1.0, half_life2 = 1.0;
  // 1 - 2^(-1/h) of half_life / half_life2, remembered with the half-life they were
  // computed for (PolicyOrder's; the same pow each time, so bit-equal).
  mutable double keep_h = 0.0, keep = 0.0, keep_h2 = 0.0, keep2 = 0.0;

  bool stamps() const { return kind != PolicyKind::kHeat; }
  bool heats() const { return kind != PolicyKind::kLru; }
  bool phased() const { return kind == PolicyKind::kPhase || kind == PolicyKind::kBlend; }
  bool blended() const { return kind == PolicyKind::kBlend; }
  bool filters() const { return kind >= PolicyKind::kHybrid; }
};

// Throws std::invalid_argument when an array the kind needs is missing.
void check_view(const PolicyView& p);

// on_access over keys[0:n] (repeats allowed; in range, checked by the caller); `w` null
// means every weight is 1, `counts` (used when `w` is null) gives integer weights.
void policy_access(PolicyView& p, const int64_t* keys, int64_t n, const double* w,
                   const int64_t* counts = nullptr);
// Move the heat clock forward to t (never back; a wall-clock access), renormalising past
// 2^256. Returns true when the raw heats were rescaled (incremental orders must rebuild).
bool policy_advance_to(PolicyView& p, double t);
// decay: a tick ends (phase starts counting groups again) and the clock moves `steps`
// steps on (the step clock) or to `t` (the wall clock). Returns as advance_to.
bool policy_decay_steps(PolicyView& p, int64_t steps);
bool policy_decay_to(PolicyView& p, double t);
// Admission stamps the clock for lru (a prefetched key enters at the most-recent end).
void policy_admitted(PolicyView& p, const int64_t* keys, int64_t n);
// hybrid / phase: admit candidate iff raw(candidate) > raw(victim); others admit all.
inline bool policy_admit(const PolicyView& p, int64_t cand, int64_t victim) {
  return !p.filters() || p.raw[cand] > p.raw[victim];
}
// Policy.scores() of key k, as the faces spell it (lru.py: the last-use tick as a double;
// heat.py and the kinds built on it: raw / gain, the same IEEE division as numpy's).
inline double policy_score(const PolicyView& p, int64_t k) {
  return p.kind == PolicyKind::kLru ? static_cast<double>(p.last[k]) : p.raw[k] / p.gain;
}

// Who may displace a victim in a lazy pass (policies/admission.py): the policy's own filter
// (PolicyFilter), or that and a score strictly above the victim's (HotterThanVictim).
enum class LazyAdmission { kPolicy, kHotter };

// A lazy (background) promotion pass, policies/fill.py plan_lazy, decided once for the live
// store's step() (through its policy's face) and the simulator's replays (replay.hpp
// PolicyTier::lazy): `cand` (distinct, not resident) ranked hottest first (policy_rank,
// stable) and cut to its first `cap`; the first `n_free` take free slots, the rest ask
// victims(m, out) for the m coldest resident keys that may go and pair with them in order,
// each kept where `admission` agrees. `coldest`: the admitted then take the coldest victims
// in order rather than their pairs' (the store's SlotStates.take after its plan). Fills
// `keys` (free slots first, then the paired ones) and `vic`; returns the candidates turned
// away. Changes nothing but `cand`, `keys` and `vic`.
template <class Victims>
int64_t policy_plan_lazy(const PolicyView& p, std::vector<int64_t>& cand, int64_t cap,
                         int64_t n_free, LazyAdmission admission, bool coldest, Victims&& victims,
                         std::vector<int64_t>& keys, std::vector<int64_t>& vic);

// The order of one decision (phase's primary depends on the tick's progress and the gain,
// so it is computed against a snapshot of them). Inline: the replays compare millions.
class PolicyOrder {
 public:
  explicit PolicyOrder(const PolicyView& p);
  // Larger = hotter (lru: the last-use tick as a double).
  double primary(int64_t k) const {
    if (p_.phased()) return primary_of(off_over_l(p_.pos[k]), rate(k));
    return p_.kind == PolicyKind::kLru ? static_cast<double>(p_.last[k]) : p_.raw[k];
  }
  // Phase's per-tick use rate of k (blend: the mean of the short and the long one).
  double rate(int64_t k) const {
    if (!p_.blended()) return p_.raw[k] * factor_;
    return blend_rate(p_.raw[k], p_.raw2[k]);
  }
  // The rate of a key whose raw heats are (r1, r2) (r2 read only by blend): rate(k) spelled
  // over the heats (blend_order.hpp keeps them beside the key).
  double rate_of(double r1, double r2) const {
    return p_.blended() ? blend_rate(r1, r2) : r1 * factor_;
  }
  // Blend's rate of raw heats (r1, r2): monotone in each (every step is).
  double blend_rate(double r1, double r2) const {
    // As blend.py spells it: the mean of heat * (1 - 2^(-1/h)) over both heats.
    return 0.5 * (r1 / p_.gain * keep1_ + r2 / p_.gain2 * keep2_);
  }
  // Phase's primary from a rate and the offset term off/L (primary() spelled in two parts).
  static double primary_of(double off_over_l, double rate) {
    return -(off_over_l + 1.0 / std::max(rate, 1e-12));
  }
  double off_over_l(int64_t pos) const {
    int64_t off = pos - c_;  // in (-L, L): pos < L and 0 <= c < L; (pos - c) mod L, 0 -> L
    if (off <= 0) off += l_;
    return static_cast<double>(off) / l_double_;
  }
  // Ascending (primary, secondary, key): true when x is evicted before y.
  bool colder(int64_t x, int64_t y) const {
    if (!p_.phased()) return static_colder(p_, x, y);
    const double px = primary(x), py = primary(y);
    if (px != py) return px < py;
    return p_.last[x] != p_.last[y] ? p_.last[x] < p_.last[y] : x < y;
  }
  // The order within one phase bucket (same pos) and of the other kinds: does not depend
  // on the tick's progress or the gain, only on the arrays (see resident_order.hpp; not
  // blend's: two heats decaying apart have no static order).
  static bool static_colder(const PolicyView& p, int64_t x, int64_t y) {
    if (p.kind == PolicyKind::kLru) return p.last[x] != p.last[y] ? p.last[x] < p.last[y] : x < y;
    if (p.raw[x] != p.raw[y]) return p.raw[x] < p.raw[y];
    if (p.kind != PolicyKind::kHeat && p.last[x] != p.last[y]) return p.last[x] < p.last[y];
    return x < y;
  }

 private:
  const PolicyView& p_;
  double factor_ = 0.0, l_double_ = 1.0;  // phase: (1 - 2^(-1/h)) / gain, L
  double keep1_ = 0.0, keep2_ = 0.0;      // blend: 1 - 2^(-1/h), 1 - 2^(-1/h2)
  int64_t c_ = 0, l_ = 1;
};

// The n coldest of cand[0:m] (distinct keys), coldest first, into out.
void policy_coldest(const PolicyView& p, const int64_t* cand, int64_t m, int64_t n,
                    std::vector<int64_t>& out);
// The n coldest resident keys with pinned[k] == 0 (pinned may be null), coldest first:
// a scan of the resident mask (the replays keep a ResidentOrder instead).
void policy_victims(const PolicyView& p, int64_t n, const bool* pinned, std::vector<int64_t>& out);
// Promotion order: keys reordered hottest first, stable.
void policy_rank(const PolicyView& p, int64_t* keys, int64_t n);

template <class Victims>
int64_t policy_plan_lazy(const PolicyView& p, std::vector<int64_t>& cand, int64_t cap,
                         int64_t n_free, LazyAdmission admission, bool coldest, Victims&& victims,
                         std::vector<int64_t>& keys, std::vector<int64_t>& vic) {
  keys.clear();
  vic.clear();
  if (cand.empty() || cap <= 0) return 0;
  policy_rank(p, cand.data(), static_cast<int64_t>(cand.size()));
  if (static_cast<int64_t>(cand.size()) > cap) cand.resize(static_cast<size_t>(cap));
  const int64_t n = static_cast<int64_t>(cand.size());
  n_free = std::max<int64_t>(n_free, 0);
  if (n <= n_free) {
    keys.assign(cand.begin(), cand.end());
    return 0;
  }
  victims(n - n_free, vic);
  const int64_t nv = static_cast<int64_t>(vic.size());
  int64_t rejected = n - n_free - nv;
  keys.assign(cand.begin(), cand.begin() + n_free);
  int64_t kept = 0;
  for (int64_t j = 0; j < nv; ++j) {
    const int64_t c = cand[static_cast<size_t>(n_free + j)], v = vic[static_cast<size_t>(j)];
    const bool ok = (admission != LazyAdmission::kHotter || policy_score(p, c) > policy_score(p, v)) &&
                    policy_admit(p, c, v);
    if (!ok) {
      ++rejected;
      continue;
    }
    keys.push_back(c);
    if (!coldest) vic[static_cast<size_t>(kept)] = v;
    ++kept;
  }
  vic.resize(static_cast<size_t>(kept));  // coldest: the first `kept` victims, in order
  return rejected;
}

}  // namespace tierstore
