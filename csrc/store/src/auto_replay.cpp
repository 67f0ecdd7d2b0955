// See auto_replay.hpp: the self-tuning policy's replay over the rules of policy.hpp and
// the shadow tiers of replay.hpp.
#include "tierstore/store/auto_replay.hpp"

#include <algorithm>
#include <memory>
#include <numeric>
#include <stdexcept>

namespace tierstore {
namespace {

class AutoReplayer {
 public:
  AutoReplayer(AutoView& a, const ReplayTrace& tr, int64_t slots, bool filter)
      : a_(a), tr_(tr), slots_(slots), filter_(filter), pinned_(a.n_keys, 0) {
    for (PolicyView& e : a_.experts) shadows_.push_back(std::make_unique<PolicyTier>(e, a.capacity));
  }

  ReplayCounts run(bool* hit) {
    for (int64_t g = 0; g < tr_.n_groups; ++g) {
      const int64_t a = tr_.starts[g], b = tr_.starts[g + 1];
      split_group(tr_, a, b, a_.resident, hit, miss_);
      if (b > a) shadows(a, b);
      if (!miss_.empty()) demand(a, b);
      if (tr_.tick_end[g]) {
        for (size_t e = 0; e < shadows_.size(); ++e) {
          if (shadows_[e]->decay() && static_cast<int64_t>(e) == lead_of_) lead_->rebuild();
        }
        for (size_t e = 0; e < shadows_.size(); ++e) a_.scores[e] *= a_.score_decay;
      }
    }
    return counts_;
  }

 private:
  // auto.py on_access: the group's keys in ascending order (the callers' common order,
  // which breaks the shadows' ranking ties), then every shadow reads, scores and fills.
  void shadows(int64_t a, int64_t b) {
    const int64_t n = b - a;
    const int64_t* keys = tr_.keys + a;
    const int64_t* counts = tr_.counts ? tr_.counts + a : nullptr;
    if (!std::is_sorted(keys, keys + n)) {
      idx_.resize(static_cast<size_t>(n));
      std::iota(idx_.begin(), idx_.end(), 0);
      std::stable_sort(idx_.begin(), idx_.end(),
                       [keys](int64_t x, int64_t y) { return keys[x] < keys[y]; });
      skeys_.resize(idx_.size());
      scounts_.resize(idx_.size());
      for (size_t i = 0; i < idx_.size(); ++i) {
        skeys_[i] = keys[idx_[i]];
        scounts_[i] = counts ? counts[idx_[i]] : 1;
      }
      keys = skeys_.data();
      counts = counts ? scounts_.data() : nullptr;
    }
    ReplayCounts unused;
    for (size_t e = 0; e < shadows_.size(); ++e) {
      PolicyTier& s = *shadows_[e];
      PolicyView& p = s.policy();
      smiss_.clear();
      int64_t hits = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (p.resident[keys[i]]) {
          hits += counts && a_.score_tokens ? counts[i] : 1;
        } else {
          smiss_.push_back(keys[i]);
        }
      }
      a_.scores[e] += static_cast<double>(hits);
      // The real set's order by this expert follows its state changes.
      ResidentOrder* mirror = static_cast<int64_t>(e) == lead_of_ ? lead_.get() : nullptr;
      s.access(keys, n, counts, mirror);
      if (smiss_.empty() || a_.capacity == 0) continue;
      const int64_t m = static_cast<int64_t>(smiss_.size());
      if (m > s.n_free() && p.filters()) policy_rank(p, smiss_.data(), m);
      s.fill(smiss_, keys, n, p.filters(), unused, mirror);
    }
    int64_t best = 0;
    for (size_t e = 1; e < shadows_.size(); ++e) {
      if (a_.scores[e] > a_.scores[best]) best = static_cast<int64_t>(e);
    }
    a_.leader = best;
  }

  // sim/demand.py Filler.demand + plan_fill with auto's decisions (the leader's).
  void demand(int64_t a, int64_t b) {
    const PolicyView& lead = a_.experts[static_cast<size_t>(a_.leader)];
    const int64_t n = static_cast<int64_t>(miss_.size());
    counts_.demand_reads += n;
    const int64_t n_free = std::max<int64_t>(slots_ - a_.n_resident, 0);
    if (n > n_free && filter_) policy_rank(lead, miss_.data(), n);
    if (n <= n_free) {
      for (int64_t k : miss_) add_resident(k);
      return;
    }
    if (lead_of_ != a_.leader) {
      // The real resident set in the new leader's order, kept until another leads.
      lead_ = std::make_unique<ResidentOrder>(lead, a_.resident);
      lead_of_ = a_.leader;
    }
    const bool some_hit = n < b - a;  // a group that missed entirely protects nothing
    if (some_hit) for (int64_t i = a; i < b; ++i) pinned_[tr_.keys[i]] = 1;
    lead_->victims(n - n_free, pinned_.data(), vic_);
    if (some_hit) for (int64_t i = a; i < b; ++i) pinned_[tr_.keys[i]] = 0;
    const int64_t nv = static_cast<int64_t>(vic_.size());
    counts_.rejected += n - n_free - nv;
    for (int64_t j = 0; j < n_free; ++j) add_resident(miss_[j]);
    for (int64_t j = 0; j < nv; ++j) {
      const int64_t c = miss_[n_free + j], v = vic_[j];
      if (filter_ && !policy_admit(lead, c, v)) {
        ++counts_.rejected;
        continue;
      }
      drop_resident(v);
      ++counts_.evictions;
      add_resident(c);
    }
  }

  // The real resident set, and its order by the expert lead_ follows.
  void add_resident(int64_t k) {
    a_.resident[k] = true;
    if (lead_) lead_->insert(k);
    ++a_.n_resident;
  }
  void drop_resident(int64_t k) {
    if (lead_) lead_->erase(k);
    a_.resident[k] = false;
    --a_.n_resident;
  }

  AutoView& a_;
  const ReplayTrace& tr_;
  const int64_t slots_;
  const bool filter_;
  std::vector<std::unique_ptr<PolicyTier>> shadows_;
  std::unique_ptr<ResidentOrder> lead_;  // the real resident keys in expert lead_of_'s order
  int64_t lead_of_ = -1;
  std::vector<uint8_t> pinned_;
  std::vector<int64_t> miss_, smiss_, vic_, idx_, skeys_, scounts_;
  ReplayCounts counts_;
};

}  // namespace

ReplayCounts replay_auto(AutoView& a, const ReplayTrace& tr, int64_t slots, bool filter,
                         bool* hit) {
  if (a.experts.empty()) throw std::invalid_argument("replay_auto: no experts");
  for (const PolicyView& e : a.experts) {
    check_view(e);
    if (e.n_keys != a.n_keys) throw std::invalid_argument("replay_auto: expert of another size");
  }
  if (a.resident == nullptr || a.scores == nullptr)
    throw std::invalid_argument("replay_auto: no resident mask or scores");
  check_trace_keys(tr, a.n_keys);
  AutoReplayer r(a, tr, slots, filter);
  return r.run(hit);
}

}  // namespace tierstore
