// See auto_replay.hpp: the self-tuning policy's replay, AutoCore's rules over a real tier.
#include "tierstore/store/auto_replay.hpp"

#include <algorithm>
#include <memory>
#include <numeric>
#include <stdexcept>

namespace tierstore {
namespace {

class AutoReplayer {
 public:
  AutoReplayer(AutoCore& core, bool* resident, int64_t& n_resident, const ReplayTrace& tr,
               int64_t slots, bool filter)
      : core_(core), resident_(resident), n_resident_(n_resident), tr_(tr), slots_(slots),
        filter_(filter), pinned_(core.n_keys(), 0) {}

  ReplayCounts run(bool* hit) {
    for (int64_t g = 0; g < tr_.n_groups; ++g) {
      const int64_t a = tr_.starts[g], b = tr_.starts[g + 1];
      split_group(tr_, a, b, resident_, hit, miss_);
      if (b > a) access(a, b);
      if (!miss_.empty()) demand(a, b);
      if (tr_.tick_end[g] && core_.decay(1, lead_of_)) lead_->rebuild();
    }
    return counts_;
  }

 private:
  // One AutoCore access of the group, its keys ascending.
  void access(int64_t a, int64_t b) {
    const int64_t* keys = tr_.keys + a;
    const int64_t* counts = tr_.counts ? tr_.counts + a : nullptr;
    sorted_.sort(keys, counts, b - a);
    // The real set's order by the leader follows the leader's state changes.
    core_.access(keys, b - a, nullptr, counts, lead_.get(), lead_of_);
  }

  // sim/demand.py Filler.demand + plan_fill with auto's decisions (the leader's).
  void demand(int64_t a, int64_t b) {
    const int64_t leader = core_.leader();
    const PolicyView& lead = core_.expert(static_cast<size_t>(leader));
    const int64_t n = static_cast<int64_t>(miss_.size());
    counts_.demand_reads += n;
    const int64_t n_free = std::max<int64_t>(slots_ - n_resident_, 0);
    if (n > n_free && filter_) policy_rank(lead, miss_.data(), n);
    if (n <= n_free) {
      for (int64_t k : miss_) add_resident(k);
      return;
    }
    if (lead_of_ != leader) {
      // The real resident set in the new leader's order, kept until another leads.
      lead_ = std::make_unique<ResidentOrder>(lead, resident_);
      lead_of_ = leader;
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
    resident_[k] = true;
    if (lead_) lead_->insert(k);
    ++n_resident_;
  }
  void drop_resident(int64_t k) {
    if (lead_) lead_->erase(k);
    resident_[k] = false;
    --n_resident_;
  }

  AutoCore& core_;
  bool* resident_;
  int64_t& n_resident_;
  const ReplayTrace& tr_;
  const int64_t slots_;
  const bool filter_;
  std::unique_ptr<ResidentOrder> lead_;  // the real resident keys in expert lead_of_'s order
  int64_t lead_of_ = -1;
  std::vector<uint8_t> pinned_;
  std::vector<int64_t> miss_, vic_;
  AscendingGroup sorted_;
  ReplayCounts counts_;
};

}  // namespace

void AscendingGroup::sort(const int64_t*& keys, const int64_t*& counts, int64_t n) {
  if (std::is_sorted(keys, keys + n)) return;
  idx_.resize(static_cast<size_t>(n));
  std::iota(idx_.begin(), idx_.end(), 0);
  const int64_t* k = keys;
  std::stable_sort(idx_.begin(), idx_.end(), [k](int64_t x, int64_t y) { return k[x] < k[y]; });
  keys_.resize(idx_.size());
  counts_.resize(idx_.size());
  for (size_t i = 0; i < idx_.size(); ++i) {
    keys_[i] = keys[idx_[i]];
    counts_[i] = counts ? counts[idx_[i]] : 1;
  }
  keys = keys_.data();
  counts = counts ? counts_.data() : nullptr;
}

ReplayCounts replay_auto(AutoCore& core, bool* resident, int64_t& n_resident,
                         const ReplayTrace& tr, int64_t slots, bool filter, bool* hit) {
  if (resident == nullptr) throw std::invalid_argument("replay_auto: no resident mask");
  check_trace_keys(tr, core.n_keys());
  AutoReplayer r(core, resident, n_resident, tr, slots, filter);
  return r.run(hit);
}

}  // namespace tierstore
