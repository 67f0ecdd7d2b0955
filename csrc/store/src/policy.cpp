// See policy.hpp: the rules of lru / heat / hybrid / phase. Floating-point expressions are
// spelled in the order the Python reference evaluated them (tests compare bit for bit).
#include "tierstore/store/policy.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace tierstore {

namespace {
constexpr double kRenormExponent = 256.0;  // renormalise raw heat past 2^256

// 1 - 2^(-1/h), cached in the view (the replays build a PolicyOrder per decision and pow
// was 14% of auto's replay; the cache holds the value of the same pow, so bit-equal).
double keep_of(double h, double& cached_h, double& cached) {
  if (cached_h != h) {
    cached = 1.0 - std::pow(2.0, -1.0 / h);
    cached_h = h;
  }
  return cached;
}
}  // namespace

void check_view(const PolicyView& p) {
  const int kind = static_cast<int>(p.kind);
  if (kind < 0 || kind >= kPolicyKinds) throw std::invalid_argument("policy: unknown kind");
  if (p.resident == nullptr) throw std::invalid_argument("policy: no resident mask");
  if (p.stamps() && p.last == nullptr)
    throw std::invalid_argument("policy: lru/hybrid/phase need the last-use array");
  if (p.heats() && p.raw == nullptr)
    throw std::invalid_argument("policy: heat/hybrid/phase need the heat array");
  if (p.phased() && p.pos == nullptr) throw std::invalid_argument("policy: phase needs pos");
  if (p.blended() && (p.raw2 == nullptr || !(p.half_life2 > 0.0)))
    throw std::invalid_argument("policy: blend needs the long heat and its half-life");
  if (p.heats() && !(p.half_life > 0.0)) throw std::invalid_argument("policy: half-life <= 0");
  if (p.per_tick < 1) throw std::invalid_argument("policy: groups per tick < 1");
}

void policy_access(PolicyView& p, const int64_t* keys, int64_t n, const double* w,
                   const int64_t* counts) {
  if (p.stamps()) ++p.clock;  // one tick per call: keys of one call tie on recency
  if (p.heats()) {
    // raw += weight * gain, one key at a time in call order (repeats accumulate).
    for (int64_t i = 0; i < n; ++i) {
      const double wi = w ? w[i] : (counts ? static_cast<double>(counts[i]) : 1.0);
      p.raw[keys[i]] += wi * p.gain;
    }
  }
  if (p.blended()) {
    for (int64_t i = 0; i < n; ++i) {
      const double wi = w ? w[i] : (counts ? static_cast<double>(counts[i]) : 1.0);
      p.raw2[keys[i]] += wi * p.gain2;
    }
  }
  if (p.stamps()) {
    for (int64_t i = 0; i < n; ++i) p.last[keys[i]] = p.clock;
  }
  if (p.phased()) {
    for (int64_t i = 0; i < n; ++i) p.pos[keys[i]] = p.group;
    ++p.group;
    p.per_tick = std::max(p.per_tick, p.group);
  }
}

namespace {

// One heat's clock at time t: gain = 2^((t - base)/h); past 2^256 the raw heats are
// rescaled once and base moves to t. Returns true when they were rescaled.
bool advance_heat(double t, double* raw, int64_t n, double& base, double& gain, double h) {
  double exponent = (t - base) / h;
  bool rescaled = false;
  if (exponent > kRenormExponent) {
    const double scale = std::pow(2.0, -exponent);
    for (int64_t k = 0; k < n; ++k) raw[k] *= scale;
    base = t;
    exponent = 0.0;
    rescaled = true;
  }
  gain = std::pow(2.0, exponent);
  return rescaled;
}

}  // namespace

bool policy_advance_to(PolicyView& p, double t) {
  if (!p.heats() || t <= p.t) return false;  // time never goes backwards
  p.t = t;
  bool rescaled = advance_heat(t, p.raw, p.n_keys, p.base, p.gain, p.half_life);
  if (p.blended())  // the long heat: same clock, its own renormalisation
    rescaled = advance_heat(t, p.raw2, p.n_keys, p.base2, p.gain2, p.half_life2) || rescaled;
  return rescaled;
}

bool policy_decay_steps(PolicyView& p, int64_t steps) {
  return policy_decay_to(p, p.t + static_cast<double>(steps));
}

bool policy_decay_to(PolicyView& p, double t) {
  if (p.phased()) p.group = 0;
  return policy_advance_to(p, t);
}

void policy_admitted(PolicyView& p, const int64_t* keys, int64_t n) {
  if (p.kind != PolicyKind::kLru || n == 0) return;
  ++p.clock;
  for (int64_t i = 0; i < n; ++i) p.last[keys[i]] = p.clock;
}

PolicyOrder::PolicyOrder(const PolicyView& p) : p_(p) {
  if (p.phased()) {
    factor_ = keep_of(p.half_life, p.keep_h, p.keep) / p.gain;
    c_ = std::max<int64_t>(p.group - 1, 0);
    l_ = p.per_tick;
    l_double_ = static_cast<double>(l_);
  }
  if (p.blended()) {
    keep1_ = keep_of(p.half_life, p.keep_h, p.keep);
    keep2_ = keep_of(p.half_life2, p.keep_h2, p.keep2);
  }
}

void policy_coldest(const PolicyView& p, const int64_t* cand, int64_t m, int64_t n,
                    std::vector<int64_t>& out) {
  out.clear();
  if (n <= 0 || m == 0) return;
  n = std::min(n, m);
  if (!p.phased()) {
    out.assign(cand, cand + m);
    const auto less = [&p](int64_t x, int64_t y) { return PolicyOrder::static_colder(p, x, y); };
    if (n < m) std::nth_element(out.begin(), out.begin() + (n - 1), out.end(), less);
    std::sort(out.begin(), out.begin() + n, less);
    out.resize(n);
    return;
  }
  // Phase: each primary costs a division, so compute them once per candidate.
  struct Item {
    double primary;
    int64_t last, key;
    bool operator<(const Item& o) const {
      if (primary != o.primary) return primary < o.primary;
      return last != o.last ? last < o.last : key < o.key;
    }
  };
  const PolicyOrder order(p);
  std::vector<Item> items(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) items[i] = Item{order.primary(cand[i]), p.last[cand[i]], cand[i]};
  if (n < m) std::nth_element(items.begin(), items.begin() + (n - 1), items.end());
  std::sort(items.begin(), items.begin() + n);
  out.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[i] = items[i].key;
}

void policy_victims(const PolicyView& p, int64_t n, const bool* pinned, std::vector<int64_t>& out) {
  std::vector<int64_t> cand;
  cand.reserve(static_cast<size_t>(p.n_resident > 0 ? p.n_resident : 0));
  for (int64_t k = 0; k < p.n_keys; ++k) {
    if (p.resident[k] && (pinned == nullptr || !pinned[k])) cand.push_back(k);
  }
  policy_coldest(p, cand.data(), static_cast<int64_t>(cand.size()), n, out);
}

void policy_rank(const PolicyView& p, int64_t* keys, int64_t n) {
  if (n <= 1) return;
  if (p.kind == PolicyKind::kLru) {
    const int64_t* last = p.last;
    std::stable_sort(keys, keys + n, [last](int64_t x, int64_t y) { return last[x] > last[y]; });
    return;
  }
  // Descending (primary, secondary), stable: primaries computed once per key. The replays
  // rank a few misses per call: a reused buffer and, for short runs, an insertion sort
  // (a stable sort's result is unique, so the same order as std::stable_sort's).
  struct Item {
    double primary;
    int64_t last, key;
  };
  const auto hotter = [](const Item& x, const Item& y) {
    return x.primary != y.primary ? x.primary > y.primary : x.last > y.last;
  };
  const PolicyOrder order(p);
  // A group's few misses fit a stack buffer; a larger call takes the reused vector.
  Item small[64];
  thread_local std::vector<Item> big;
  Item* items = small;
  if (n > 64) {
    big.resize(static_cast<size_t>(n));
    items = big.data();
  }
  for (int64_t i = 0; i < n; ++i)
    items[i] = Item{order.primary(keys[i]), p.stamps() ? p.last[keys[i]] : 0, keys[i]};
  if (n <= 16) {
    for (int64_t i = 1; i < n; ++i) {
      const Item x = items[i];
      int64_t j = i;
      for (; j > 0 && hotter(x, items[j - 1]); --j) items[j] = items[j - 1];
      items[j] = x;
    }
  } else {
    std::stable_sort(items, items + n, hotter);
  }
  for (int64_t i = 0; i < n; ++i) keys[i] = items[i].key;
}

}  // namespace tierstore
