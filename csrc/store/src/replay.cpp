// See replay.hpp: the demand-fill replay loop. Each block names the Python routine it
// mirrors; any change there must change here (tests/test_native_policies.py compares).
#include "tierstore/store/replay.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>
#include <vector>

namespace tierstore {
namespace {

constexpr double kRenormExponent = 256.0;  // policies/heat.py _RENORM_EXPONENT

class Replayer {
 public:
  Replayer(PolicyView& p, const ReplayTrace& tr, int64_t slots, bool filter)
      : p_(p), tr_(tr), slots_(slots), filter_(filter), pinned_(p.n_keys, 0),
        order_(Colder{this}) {
    rebuild();
  }

  ReplayCounts run(bool* hit) {
    int64_t pending = 0;  // first access not yet given to the policy
    for (int64_t g = 0; g < tr_.n_groups; ++g) {
      const int64_t a = tr_.starts[g], b = tr_.starts[g + 1];
      bool all_hit = true;
      for (int64_t i = a; i < b; ++i) {
        const int64_t k = tr_.keys[i];
        if (k < 0 || k >= p_.n_keys) throw std::out_of_range("replay: key out of range");
        hit[i] = p_.resident[k];
        all_hit = all_hit && hit[i];
      }
      if (!all_hit) {
        access(pending, b);
        pending = b;
        demand(a, b, hit);
      }
      if (tr_.tick_end[g]) {
        if (pending < b) access(pending, b);
        pending = b;
        decay();
      }
    }
    return counts_;
  }

 private:
  bool lru() const { return p_.kind == PolicyKind::kLru; }
  bool hybrid() const { return p_.kind == PolicyKind::kHybrid; }

  // dense.py coldest(): ascending (primary, secondary, key).
  bool colder(int64_t x, int64_t y) const {
    if (lru()) return p_.last[x] != p_.last[y] ? p_.last[x] < p_.last[y] : x < y;
    if (p_.raw[x] != p_.raw[y]) return p_.raw[x] < p_.raw[y];
    if (hybrid() && p_.last[x] != p_.last[y]) return p_.last[x] < p_.last[y];
    return x < y;
  }

  // The resident keys in eviction order: a key's score may change only while it is out
  // of the set (erase, update, insert), so victims() walks from the coldest end in
  // O(victims + pinned) instead of scanning the resident set per miss.
  struct Colder {
    const Replayer* r;
    bool operator()(int64_t x, int64_t y) const { return r->colder(x, y); }
  };
  void rebuild() {
    order_.clear();
    for (int64_t k = 0; k < p_.n_keys; ++k) {
      if (p_.resident[k]) order_.insert(k);
    }
  }

  // lru.py / heat.py / hybrid.py on_access over keys[a:b].
  void access(int64_t a, int64_t b) {
    if (p_.kind != PolicyKind::kHeat) ++p_.clock;
    for (int64_t i = a; i < b; ++i) {
      const int64_t k = tr_.keys[i];
      const bool res = p_.resident[k];
      if (res) order_.erase(k);
      if (p_.kind != PolicyKind::kLru) {
        const double w = tr_.counts ? static_cast<double>(tr_.counts[i]) : 1.0;
        p_.raw[k] += w * p_.gain;
      }
      if (p_.kind != PolicyKind::kHeat) p_.last[k] = p_.clock;
      if (res) order_.insert(k);
    }
  }

  // heat.py decay(steps=1) -> _advance_to(t + 1); lru has no decay.
  void decay() {
    if (lru()) return;
    p_.t += 1.0;
    double exponent = (p_.t - p_.base) / p_.half_life;
    if (exponent > kRenormExponent) {
      const double scale = std::pow(2.0, -exponent);
      for (int64_t k = 0; k < p_.n_keys; ++k) p_.raw[k] *= scale;
      p_.base = p_.t;
      exponent = 0.0;
      rebuild();  // rounding may have merged two heats: their order is the tie-break's now
    }
    p_.gain = std::pow(2.0, exponent);
  }

  // dense.py victims(n, pinned): the n coldest resident, unpinned keys, coldest first.
  void victims(int64_t n, std::vector<int64_t>& out) {
    out.clear();
    for (auto it = order_.begin(); it != order_.end() && static_cast<int64_t>(out.size()) < n;
         ++it) {
      if (!pinned_[*it]) out.push_back(*it);
    }
  }

  // demand.py Filler.demand + place, fill.py plan_fill, Filler.evict / admit.
  void demand(int64_t a, int64_t b, const bool* hit) {
    miss_.clear();
    for (int64_t i = a; i < b; ++i) {
      if (!hit[i]) miss_.push_back(tr_.keys[i]);
    }
    const int64_t n = static_cast<int64_t>(miss_.size());
    const bool some_hit = n < b - a;
    counts_.demand_reads += n;
    const int64_t n_free = std::max<int64_t>(slots_ - p_.n_resident, 0);
    if (n > n_free && filter_) {
      // hottest_order(): descending (raw, last), stable.
      std::stable_sort(miss_.begin(), miss_.end(), [this](int64_t x, int64_t y) {
        if (p_.raw[x] != p_.raw[y]) return p_.raw[x] > p_.raw[y];
        return p_.last[x] > p_.last[y];
      });
    }
    admit_.clear();
    vic_.clear();
    if (n <= n_free) {
      admit_.assign(miss_.begin(), miss_.end());
    } else {
      // A group that missed entirely has no resident key to protect.
      if (some_hit) for (int64_t i = a; i < b; ++i) pinned_[tr_.keys[i]] = 1;
      victims(n - n_free, vic_);
      if (some_hit) for (int64_t i = a; i < b; ++i) pinned_[tr_.keys[i]] = 0;
      const int64_t nv = static_cast<int64_t>(vic_.size());
      counts_.rejected += n - n_free - nv;
      admit_.assign(miss_.begin(), miss_.begin() + n_free);
      size_t kept = 0;
      for (int64_t j = 0; j < nv; ++j) {
        const int64_t c = miss_[n_free + j], v = vic_[j];
        if (filter_ && !(p_.raw[c] > p_.raw[v])) {
          ++counts_.rejected;
          continue;
        }
        admit_.push_back(c);
        vic_[kept++] = v;
      }
      vic_.resize(kept);
    }
    if (!vic_.empty()) {
      for (int64_t k : vic_) {
        order_.erase(k);
        p_.resident[k] = false;
      }
      counts_.evictions += static_cast<int64_t>(vic_.size());
      p_.n_resident -= static_cast<int64_t>(vic_.size());
    }
    if (!admit_.empty()) {
      if (lru()) ++p_.clock;  // lru.py _touch_admitted
      for (int64_t k : admit_) {
        p_.resident[k] = true;
        if (lru()) p_.last[k] = p_.clock;
        order_.insert(k);
      }
      p_.n_resident += static_cast<int64_t>(admit_.size());
    }
  }

  PolicyView& p_;
  const ReplayTrace& tr_;
  const int64_t slots_;
  const bool filter_;
  std::vector<uint8_t> pinned_;
  std::vector<int64_t> miss_, vic_, admit_;
  std::set<int64_t, Colder> order_;
  ReplayCounts counts_;
};

}  // namespace

ReplayCounts replay_demand(PolicyView& policy, const ReplayTrace& trace, int64_t slots,
                           bool filter, bool* hit) {
  if (policy.kind != PolicyKind::kHeat && policy.last == nullptr)
    throw std::invalid_argument("replay: lru/hybrid need the last-use array");
  if (policy.kind != PolicyKind::kLru && policy.raw == nullptr)
    throw std::invalid_argument("replay: heat/hybrid need the heat array");
  if (filter && policy.kind != PolicyKind::kHybrid)
    throw std::invalid_argument("replay: only hybrid has an admission filter");
  Replayer r(policy, trace, slots, filter);
  return r.run(hit);
}

}  // namespace tierstore
