// See replay.hpp: the demand-fill replay loop over the rules of policy.hpp.
#include "tierstore/store/replay.hpp"

#include <limits>

#include <stdexcept>

namespace tierstore {

void PolicyTier::access(const int64_t* keys, int64_t n, const double* w,
                        const int64_t* counts, ResidentOrder* mirror) {
  // A resident key leaves the order while its state changes (resident_order.hpp).
  for (int64_t i = 0; i < n; ++i) {
    if (p_.resident[keys[i]]) order_.detach(keys[i]);
    if (mirror && mirror->holds(keys[i])) mirror->detach(keys[i]);
  }
  policy_access(p_, keys, n, w, counts);
  // The floor stays a lower bound while heats only grow: only a negative (or NaN) weight
  // can lower one. (Dropping it for every weighted call cost the live face, whose calls
  // carry token counts as weights, a scan of every key per shadow per call.)
  if (w != nullptr) {
    for (int64_t i = 0; i < n && floor_ok_; ++i)
      if (!(w[i] >= 0.0)) floor_ok_ = false;
  }
  for (int64_t i = 0; i < n; ++i) {
    if (p_.resident[keys[i]]) order_.insert(keys[i]);
    if (mirror && mirror->holds(keys[i])) mirror->insert(keys[i]);
  }
}

bool PolicyTier::decay(int64_t steps) {
  // Rounding may merge two rescaled heats: their order is the tie-break's then.
  if (!policy_decay_steps(p_, steps)) return false;
  order_.rebuild();
  floor_ok_ = false;
  return true;
}

double PolicyTier::floor() {
  if (!floor_ok_ || floor_age_ > slots_) {
    double m = std::numeric_limits<double>::infinity();
    for (int64_t k = 0; k < p_.n_keys; ++k)
      if (p_.resident[k] && p_.raw[k] < m) m = p_.raw[k];
    floor_ = m;
    floor_ok_ = true;
    floor_age_ = 0;
  }
  return floor_;
}

void PolicyTier::fill_impl(std::vector<int64_t>& miss, const int64_t* block, int64_t nb,
                           const uint8_t* mask, bool filter, ReplayCounts& counts,
                           ResidentOrder* mirror) {
  const int64_t n = static_cast<int64_t>(miss.size());
  const int64_t n_free = this->n_free();
  admit_.clear();
  vic_.clear();
  if (n > n_free && filter && p_.filters()) {
    // A full tier admits a candidate only over a victim hotter than the floor: when no
    // miss is above it, every one is refused whatever their order (no ranking, no search).
    if (n_free == 0) {
      const double f = floor();
      bool any = false;
      for (int64_t k : miss) any = any || p_.raw[k] > f;
      if (!any) {
        counts.rejected += n;
        return;
      }
    }
    policy_rank(p_, miss.data(), n);  // the hottest misses win the free slots and victims
  }
  if (n <= n_free) {
    admit_.assign(miss.begin(), miss.end());
  } else {
    // With the filter, candidates past the last one above the floor are refused whatever
    // their victims: those victims need not be found (the shadows' main cost). The count
    // of rejections below is the same: n - n_free - (victims taken).
    int64_t want = n - n_free;
    if (filter && p_.filters()) {
      const double f = floor();
      while (want > 0 && !(p_.raw[miss[n_free + want - 1]] > f)) --want;
    }
    if (mask != nullptr) {
      if (want > 0) order_.victims(want, mask, vic_);
    } else {
      for (int64_t i = 0; i < nb; ++i) pinned_[block[i]] = 1;
      if (want > 0) order_.victims(want, pinned_.data(), vic_);
      for (int64_t i = 0; i < nb; ++i) pinned_[block[i]] = 0;
    }
    const int64_t nv = static_cast<int64_t>(vic_.size());
    counts.rejected += n - n_free - nv;
    admit_.assign(miss.begin(), miss.begin() + n_free);
    size_t kept = 0;
    for (int64_t j = 0; j < nv; ++j) {
      const int64_t c = miss[n_free + j], v = vic_[j];
      if (filter && !policy_admit(p_, c, v)) {
        ++counts.rejected;
        continue;
      }
      admit_.push_back(c);
      vic_[kept++] = v;
    }
    vic_.resize(kept);
  }
  apply(counts, mirror);
}

void PolicyTier::lazy(std::vector<int64_t>& cand, int64_t cap, const uint8_t* pinned,
                      LazyAdmission admission, bool coldest, ReplayCounts& counts) {
  counts.rejected += policy_plan_lazy(
      p_, cand, cap, n_free(), admission, coldest,
      [&](int64_t m, std::vector<int64_t>& out) { order_.victims(m, pinned, out); }, admit_, vic_);
  apply(counts, nullptr);
}

void PolicyTier::apply(ReplayCounts& counts, ResidentOrder* mirror) {
  for (int64_t k : vic_) {
    order_.erase(k);
    p_.resident[k] = false;
  }
  counts.evictions += static_cast<int64_t>(vic_.size());
  floor_age_ += static_cast<int64_t>(vic_.size());
  p_.n_resident -= static_cast<int64_t>(vic_.size());
  for (int64_t k : admit_) {
    p_.resident[k] = true;
    if (p_.raw && p_.raw[k] < floor_) floor_ = p_.raw[k];
  }
  // lru stamps what it admits: a mirror's copy of those keys moves with the stamp.
  const bool stamped = p_.kind == PolicyKind::kLru && mirror != nullptr;
  if (stamped) for (int64_t k : admit_) if (mirror->holds(k)) mirror->erase(k);
  policy_admitted(p_, admit_.data(), static_cast<int64_t>(admit_.size()));
  if (stamped) for (int64_t k : admit_) if (mirror->holds(k)) mirror->insert(k);
  for (int64_t k : admit_) order_.insert(k);
  p_.n_resident += static_cast<int64_t>(admit_.size());
}

void check_trace_keys(const ReplayTrace& tr, int64_t n_keys) {
  for (int64_t i = 0; i < tr.n; ++i) {
    if (tr.keys[i] < 0 || tr.keys[i] >= n_keys) throw std::out_of_range("replay: key out of range");
  }
}

ReplayCounts replay_demand(PolicyView& p, const ReplayTrace& tr, int64_t slots, bool filter,
                           bool* hit) {
  check_view(p);
  if (filter && !p.filters()) throw std::invalid_argument("replay: this kind has no admission filter");
  check_trace_keys(tr, p.n_keys);
  PolicyTier tier(p, slots);
  ReplayCounts counts;
  std::vector<int64_t> miss;
  const bool merge = !p.phased();  // phase.py groups_accesses = False
  int64_t pending = 0;             // first access not yet given to the policy
  for (int64_t g = 0; g < tr.n_groups; ++g) {
    const int64_t a = tr.starts[g], b = tr.starts[g + 1];
    split_group(tr, a, b, p.resident, hit, miss);
    if (!merge || !miss.empty()) {
      tier.access(tr.keys + pending, b - pending, nullptr,
                  tr.counts ? tr.counts + pending : nullptr);
      pending = b;
    }
    if (!miss.empty()) {
      // sim/demand.py Filler.demand: the hottest misses take the free slots when the
      // filter may turn some away; a group that missed entirely protects nothing.
      counts.demand_reads += static_cast<int64_t>(miss.size());
      const bool some_hit = static_cast<int64_t>(miss.size()) < b - a;
      tier.fill(miss, tr.keys + a, some_hit ? b - a : 0, filter, counts);
    }
    if (tr.tick_end[g]) {
      if (pending < b) tier.access(tr.keys + pending, b - pending, nullptr,
                                   tr.counts ? tr.counts + pending : nullptr);
      pending = b;
      tier.decay();
    }
  }
  return counts;
}

}  // namespace tierstore
