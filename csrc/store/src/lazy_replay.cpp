// See lazy_replay.hpp.
#include "tierstore/store/lazy_replay.hpp"

#include <algorithm>
#include <utility>

namespace tierstore {

void hottest_nonresident(const PolicyView& p, int64_t n, std::vector<int64_t>& out) {
  out.clear();
  if (n <= 0) return;
  using Scored = std::pair<double, int64_t>;  // (score, key)
  // (score descending, key ascending): a total order, so the n first are one set.
  const auto hotter = [](const Scored& x, const Scored& y) {
    return x.first != y.first ? x.first > y.first : x.second < y.second;
  };
  thread_local std::vector<Scored> top;
  top.clear();
  if (n <= 64) {
    // A pass a tick over every key: the few best kept sorted, a key entering only when it
    // beats the worst of them (keys come ascending, so an equal score never does).
    const size_t m = static_cast<size_t>(n);
    for (int64_t k = 0; k < p.n_keys; ++k) {
      if (p.resident[k]) continue;
      const double s = policy_score(p, k);
      if (!(s > 0.0)) continue;
      if (top.size() == m) {
        if (!(s > top.back().first)) continue;
        top.pop_back();
      }
      const Scored x{s, k};
      top.insert(std::upper_bound(top.begin(), top.end(), x, hotter), x);
    }
  } else {
    for (int64_t k = 0; k < p.n_keys; ++k) {
      if (p.resident[k]) continue;
      const double s = policy_score(p, k);
      if (s > 0.0) top.emplace_back(s, k);
    }
    if (static_cast<int64_t>(top.size()) > n) {
      std::nth_element(top.begin(), top.begin() + (n - 1), top.end(), hotter);
      top.resize(static_cast<size_t>(n));
    }
  }
  out.reserve(top.size());
  for (const Scored& c : top) out.push_back(c.second);
  std::sort(out.begin(), out.end());
}

LazyReplayCounts replay_lazy(PolicyView& p, const ReplayTrace& tr, int64_t slots, int64_t cap,
                             bool hottest, bool* hit) {
  check_view(p);
  check_trace_keys(tr, p.n_keys);
  PolicyTier tier(p, slots);
  LazyReplayCounts c;
  ReplayCounts fills;
  std::vector<int64_t> miss, cand;
  std::vector<uint8_t> pinned(hottest ? static_cast<size_t>(p.n_keys) : 0, 0);
  for (int64_t g = 0; g < tr.n_groups; ++g) {
    const int64_t a = tr.starts[g], b = tr.starts[g + 1];
    split_group(tr, a, b, p.resident, hit, miss);
    for (int64_t i = a; i < b; ++i)
      if (!hit[i]) c.unserved += tr.counts ? tr.counts[i] : 1;
    tier.access(tr.keys + a, b - a, nullptr, tr.counts ? tr.counts + a : nullptr);
    if (!hottest) {
      tier.decay();  // the store's step(): fold, decay, then pick
      tier.lazy(miss, cap, nullptr, LazyAdmission::kHotter, true, fills);
    } else {
      for (int64_t i = a; i < b; ++i) pinned[static_cast<size_t>(tr.keys[i])] = 1;
      hottest_nonresident(p, cap, cand);
      tier.lazy(cand, cap, pinned.data(), LazyAdmission::kHotter, false, fills);
      for (int64_t i = a; i < b; ++i) pinned[static_cast<size_t>(tr.keys[i])] = 0;
      tier.decay();
    }
    c.demand_reads += static_cast<int64_t>(tier.admitted().size());
  }
  c.evictions = fills.evictions;
  c.rejected = fills.rejected;
  return c;
}

}  // namespace tierstore
