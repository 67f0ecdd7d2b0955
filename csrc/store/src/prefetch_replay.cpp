// See prefetch_replay.hpp: sim/prefetching.py's loop over a native policy or auto's core.
#include "tierstore/store/prefetch_replay.hpp"

#include <algorithm>
#include <memory>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "tierstore/store/auto_replay.hpp"
#include "tierstore/store/lazy_replay.hpp"
#include "tierstore/store/resident_order.hpp"

namespace tierstore {
namespace {

// A plain policy's simulated tier (replay.hpp PolicyTier; its resident mask is the view's).
class PlainTier {
 public:
  PlainTier(PolicyView& p, int64_t slots) : p_(p), tier_(p, slots) {}
  const bool* resident() const { return p_.resident; }
  int64_t n_free() const { return tier_.n_free(); }
  void access(const int64_t* keys, int64_t n, const int64_t* counts) {
    tier_.access(keys, n, nullptr, counts);
  }
  void fill(std::vector<int64_t>& cand, const uint8_t* pinned, bool filter, ReplayCounts& c) {
    tier_.fill_masked(cand, pinned, filter, c);
  }
  const std::vector<int64_t>& evicted() const { return tier_.evicted(); }
  const std::vector<int64_t>& admitted() const { return tier_.admitted(); }
  void victims(int64_t n, const uint8_t* pinned, std::vector<int64_t>& out) {
    tier_.victims(n, pinned, out);
  }
  void decay() { tier_.decay(); }

 private:
  PolicyView& p_;
  PolicyTier tier_;
};

// Auto's real tier: the leader's decisions over the real resident set (auto_replay.cpp's,
// the group always protected, the prefetcher's pins too).
class AutoTier {
 public:
  AutoTier(AutoCore& core, bool* resident, int64_t& n_resident, int64_t slots)
      : core_(core), resident_(resident), n_resident_(n_resident), slots_(slots) {}
  const bool* resident() const { return resident_; }
  int64_t n_free() const { return std::max<int64_t>(slots_ - n_resident_, 0); }

  void access(const int64_t* keys, int64_t n, const int64_t* counts) {
    sorted_.sort(keys, counts, n);
    core_.access(keys, n, nullptr, counts, lead_.get(), lead_of_);
  }

  void fill(std::vector<int64_t>& cand, const uint8_t* pinned, bool filter, ReplayCounts& c) {
    vic_.clear();
    admit_.clear();
    const PolicyView& lead = core_.expert(static_cast<size_t>(core_.leader()));
    const int64_t n = static_cast<int64_t>(cand.size()), n_free = this->n_free();
    if (n > n_free && filter) policy_rank(lead, cand.data(), n);
    if (n <= n_free) {
      for (int64_t k : cand) add(k);
      return;
    }
    order().victims(n - n_free, pinned, got_);
    const int64_t nv = static_cast<int64_t>(got_.size());
    c.rejected += n - n_free - nv;
    for (int64_t j = 0; j < n_free; ++j) add(cand[static_cast<size_t>(j)]);
    for (int64_t j = 0; j < nv; ++j) {
      const int64_t k = cand[static_cast<size_t>(n_free + j)], v = got_[static_cast<size_t>(j)];
      if (filter && !policy_admit(lead, k, v)) {
        ++c.rejected;
        continue;
      }
      if (lead_) lead_->erase(v);
      resident_[v] = false;
      --n_resident_;
      vic_.push_back(v);
      add(k);
    }
  }
  const std::vector<int64_t>& evicted() const { return vic_; }
  const std::vector<int64_t>& admitted() const { return admit_; }
  void victims(int64_t n, const uint8_t* pinned, std::vector<int64_t>& out) {
    order().victims(n, pinned, out);
  }
  void decay() {
    if (core_.decay(1, lead_of_)) lead_->rebuild();
  }

 private:
  // The real resident set in the current leader's order (rebuilt when another leads).
  ResidentOrder& order() {
    const int64_t leader = core_.leader();
    if (lead_of_ != leader) {
      lead_ = std::make_unique<ResidentOrder>(core_.expert(static_cast<size_t>(leader)), resident_);
      lead_of_ = leader;
    }
    return *lead_;
  }
  void add(int64_t k) {
    resident_[k] = true;
    if (lead_) lead_->insert(k);
    ++n_resident_;
    admit_.push_back(k);
  }

  AutoCore& core_;
  bool* resident_;
  int64_t& n_resident_;
  const int64_t slots_;
  std::unique_ptr<ResidentOrder> lead_;
  int64_t lead_of_ = -1;
  std::vector<int64_t> vic_, admit_, got_;
  AscendingGroup sorted_;
};

template <class Tier>
PrefetchReplayCounts run(Tier& tier, Prefetcher& pf, const ReplayTrace& tr, bool filter,
                         bool demand_fill, bool* hit) {
  const int64_t E = pf.n_experts, K = pf.n_keys;
  if (pf.n_layers < 2)
    throw std::invalid_argument("replay_prefetch: one layer (a prefetch would target its own read)");
  check_trace_keys(tr, K);
  const bool* resident = tier.resident();
  std::vector<uint8_t> prefetched(static_cast<size_t>(K), 0), pinned(static_cast<size_t>(K), 0);
  std::unique_ptr<bool[]> r(new bool[1]);
  size_t r_cap = 1;
  std::vector<int64_t> experts, fetch, hold, miss, vtmp, released;
  std::vector<double> p(static_cast<size_t>(E));
  PrefetchReplayCounts c;
  ReplayCounts fills;
  const auto evicted = [&](const std::vector<int64_t>& v) {
    for (int64_t k : v) {
      if (prefetched[static_cast<size_t>(k)]) {
        ++c.wasted;
        prefetched[static_cast<size_t>(k)] = 0;
      }
    }
    c.evictions += static_cast<int64_t>(v.size());
  };
  // sim/demand.py Filler.would_evict: free slots first (-1), then the tier's victims.
  const Prefetcher::Victims would_evict = [&](int64_t n, const bool* blocked) {
    const int64_t nf = std::min(tier.n_free(), n);
    std::vector<int64_t> out(static_cast<size_t>(nf), -1);
    tier.victims(n - nf, reinterpret_cast<const uint8_t*>(blocked), vtmp);
    out.insert(out.end(), vtmp.begin(), vtmp.end());
    return out;
  };
  const bool* held = pf.held_mask.get();
  for (int64_t k = 0; k < K; ++k) pinned[static_cast<size_t>(k)] = held[k] ? 1 : 0;
  for (int64_t g = 0; g < tr.n_groups; ++g) {
    const int64_t a = tr.starts[g], b = tr.starts[g + 1], n = b - a;
    const int64_t* u = tr.keys + a;
    if (n > 0) {
      const int64_t layer = u[0] / E;
      if (static_cast<size_t>(n) > r_cap) {
        r.reset(new bool[static_cast<size_t>(n)]);
        r_cap = static_cast<size_t>(n);
      }
      int64_t n_miss = 0, routings = 0;
      experts.resize(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const int64_t k = u[i];
        r[i] = hit[a + i] = resident[k];
        n_miss += r[i] ? 0 : 1;
        if (prefetched[static_cast<size_t>(k)]) {
          ++c.prefetch_hits;
          prefetched[static_cast<size_t>(k)] = 0;
        }
        experts[static_cast<size_t>(i)] = k - layer * E;
        routings += tr.counts ? tr.counts[a + i] : 1;
      }
      tier.access(u, n, tr.counts ? tr.counts + a : nullptr);
      released = pf.on_read(layer, experts.data(), n, r.get(), routings);
      const auto [m, wraps] = pf.target(layer);
      const bool predicted = pf.predict(layer, m, wraps, p.data());
      pf.propose(layer, predicted ? p.data() : nullptr, resident, &would_evict, fetch, hold);
      // The held keys block eviction as the store's pins do, and the group its own. The
      // mask is the held one plus the group: kept in step with the held mask by the keys
      // that changed (those released at this read and those held by this proposal), not
      // copied per read.
      for (int64_t k : released) pinned[static_cast<size_t>(k)] = 0;
      for (int64_t k : hold) pinned[static_cast<size_t>(k)] = 1;
      if (!fetch.empty()) {
        for (int64_t i = 0; i < n; ++i) pinned[static_cast<size_t>(u[i])] = 1;
        ReplayCounts unused;  // a prefetch left out is not read
        tier.fill(fetch, pinned.data(), false, unused);
        for (int64_t i = 0; i < n; ++i) pinned[static_cast<size_t>(u[i])] = held[u[i]] ? 1 : 0;
        evicted(tier.evicted());
        for (int64_t k : tier.admitted()) prefetched[static_cast<size_t>(k)] = 1;
        c.prefetched += static_cast<int64_t>(tier.admitted().size());
      }
      if (n_miss > 0) {
        if (demand_fill) {
          miss.clear();
          for (int64_t i = 0; i < n; ++i)
            if (!r[i]) miss.push_back(u[i]);
          c.demand_reads += n_miss;
          for (int64_t i = 0; i < n; ++i) pinned[static_cast<size_t>(u[i])] = 1;
          tier.fill(miss, pinned.data(), filter, fills);
          for (int64_t i = 0; i < n; ++i) pinned[static_cast<size_t>(u[i])] = held[u[i]] ? 1 : 0;
          evicted(tier.evicted());
        } else {
          for (int64_t i = 0; i < n; ++i)
            if (!r[i]) c.unserved += tr.counts ? tr.counts[a + i] : 1;
        }
      }
    }
    if (tr.tick_end[g]) {
      tier.decay();
      pf.end_tick();
    }
  }
  for (uint8_t x : prefetched) c.wasted += x;
  c.rejected = fills.rejected;
  return c;
}

}  // namespace

PrefetchReplayCounts replay_predict(PolicyView& policy, CoRouting& model, const ReplayTrace& tr,
                                    int64_t slots, bool filter, const PredictParams& pp,
                                    bool* hit) {
  check_view(policy);
  const int64_t L = model.n_layers, E = model.n_experts, K = policy.n_keys;
  if (L * E != K || model.distance != 1)
    throw std::invalid_argument("replay_predict: the model's layers x experts are not the keys");
  if (filter && !policy.filters())
    throw std::invalid_argument("replay_predict: this kind has no admission filter");
  check_trace_keys(tr, K);
  PolicyTier tier(policy, slots);
  const bool* resident = policy.resident;
  std::vector<uint8_t> prefetched(static_cast<size_t>(K), 0), pinned(static_cast<size_t>(K), 0);
  std::vector<std::vector<int64_t>> prev(static_cast<size_t>(L)), cur(static_cast<size_t>(L));
  std::vector<uint8_t> has_prev(static_cast<size_t>(L), 0), has_cur(static_cast<size_t>(L), 0);
  std::vector<double> pc(static_cast<size_t>(E)), pt(static_cast<size_t>(E)), p(static_cast<size_t>(E));
  std::vector<int64_t> experts, miss, keys, want;
  PrefetchReplayCounts c;
  ReplayCounts fills;
  // The prediction made for the next group (sim/predict.py pending_pred).
  int64_t pending_layer = -1;
  bool pending_c = false, pending_t = false;
  std::vector<double> pend_c(static_cast<size_t>(E)), pend_t(static_cast<size_t>(E));
  const double per_layer = static_cast<double>(pp.budget) / static_cast<double>(std::max<int64_t>(L, 1));
  const double thr = std::max(pp.threshold, 1e-12);
  double allowance = 0.0;
  int64_t tick_reads = 0;
  const auto evicted = [&](const std::vector<int64_t>& v) {
    for (int64_t k : v) {
      if (prefetched[static_cast<size_t>(k)]) {
        ++c.wasted;
        prefetched[static_cast<size_t>(k)] = 0;
      }
    }
    c.evictions += static_cast<int64_t>(v.size());
  };
  int64_t tick_start = 0;  // the tick's first access (its keys: the lazy pass's pins)
  std::vector<int64_t> lazy_cand;
  for (int64_t g = 0; g < tr.n_groups; ++g) {
    const int64_t a = tr.starts[g], b = tr.starts[g + 1], n = b - a;
    const int64_t* u = tr.keys + a;
    if (n > 0) {
      const int64_t layer = u[0] / E;
      const size_t l = static_cast<size_t>(layer);
      int64_t n_miss = 0;
      experts.resize(static_cast<size_t>(n));
      miss.clear();
      for (int64_t i = 0; i < n; ++i) {
        const int64_t k = u[i];
        hit[a + i] = resident[k];
        if (!resident[k]) {
          ++n_miss;
          miss.push_back(k);
        }
        if (prefetched[static_cast<size_t>(k)]) {
          ++c.prefetch_hits;
          prefetched[static_cast<size_t>(k)] = 0;
        }
        experts[static_cast<size_t>(i)] = k - layer * E;
      }
      // 1. learn from what this layer routed, and score the prediction made for it
      if (pending_layer == layer && pending_c && pending_t)
        model.score(pend_c.data(), pend_t.data(), experts.data(), n, pp.top_k);
      if (layer > 0 && has_cur[l - 1])
        model.learn(layer - 1, cur[l - 1].data(), static_cast<int64_t>(cur[l - 1].size()),
                    experts.data(), n, false);
      if (has_prev[l])
        model.learn(layer, prev[l].data(), static_cast<int64_t>(prev[l].size()), experts.data(),
                    n, true);
      cur[l] = experts;
      has_cur[l] = 1;
      model.observe(layer, experts.data(), n);
      // 2. demand fill (sim/demand.py Filler.demand; a group that missed entirely protects nothing)
      tier.access(u, n, nullptr, tr.counts ? tr.counts + a : nullptr);
      if (!pp.demand_fill) {
        for (int64_t i = 0; i < n; ++i)
          if (!hit[a + i]) c.unserved += tr.counts ? tr.counts[a + i] : 1;
      } else if (n_miss > 0) {
        c.demand_reads += n_miss;
        tier.fill(miss, u, n_miss < n ? n : 0, filter, fills);
        evicted(tier.evicted());
      }
      // 3. predict layer + 1 at this tick and prefetch within the budget
      pending_layer = -1;
      allowance = std::min(allowance + per_layer, static_cast<double>(std::max<int64_t>(pp.budget, 0)));
      const int64_t nxt = layer + 1;
      if (nxt < L) {
        const bool cross = pp.cross;
        const bool temp = pp.temporal && has_prev[static_cast<size_t>(nxt)];
        if (cross) model.predict(layer, experts.data(), n, false, pc.data());
        if (temp) {
          const auto& src = prev[static_cast<size_t>(nxt)];
          model.predict(nxt, src.data(), static_cast<int64_t>(src.size()), true, pt.data());
        }
        if (cross || temp) {
          if (cross && temp) model.mix(pc.data(), pt.data(), p.data());
          else p = cross ? pc : pt;
          pending_layer = nxt;
          pending_c = cross;
          pending_t = temp;
          if (cross) pend_c = pc;
          if (temp) pend_t = pt;
          const int64_t n_take = std::min(static_cast<int64_t>(allowance), pp.budget - tick_reads);
          if (n_take > 0) {
            keys.clear();
            want.clear();
            for (int64_t e = 0; e < E; ++e) {
              if (!(p[static_cast<size_t>(e)] >= thr)) continue;
              keys.push_back(nxt * E + e);
              if (!resident[nxt * E + e]) want.push_back(nxt * E + e);
            }
            if (!want.empty()) {
              const double* pv = p.data() - nxt * E;  // p by key
              std::stable_sort(want.begin(), want.end(),
                               [pv](int64_t x, int64_t y) { return -pv[x] < -pv[y]; });
              if (static_cast<int64_t>(want.size()) > n_take) want.resize(static_cast<size_t>(n_take));
              for (int64_t k : keys) pinned[static_cast<size_t>(k)] = 1;  // the predicted keys stay
              for (int64_t i = 0; i < n; ++i) pinned[static_cast<size_t>(u[i])] = 1;
              ReplayCounts unused;  // a prefetch left out is not read
              tier.fill_masked(want, pinned.data(), false, unused);
              for (int64_t i = 0; i < n; ++i) pinned[static_cast<size_t>(u[i])] = 0;
              for (int64_t k : keys) pinned[static_cast<size_t>(k)] = 0;
              evicted(tier.evicted());
              const int64_t got = static_cast<int64_t>(tier.admitted().size());
              for (int64_t k : tier.admitted()) prefetched[static_cast<size_t>(k)] = 1;
              c.prefetched += got;
              tick_reads += got;
              allowance -= static_cast<double>(got);
            }
          }
        }
      }
    }
    if (tr.tick_end[g]) {
      if (!pp.demand_fill && pp.budget > tick_reads) {
        // The reference's lazy pass with the tick's unused budget (sim/predict.py
        // lazy_promote: counted as demand reads, they are not predictions).
        for (int64_t i = tick_start; i < b; ++i) pinned[static_cast<size_t>(tr.keys[i])] = 1;
        const int64_t n_lazy = std::min(pp.budget - tick_reads, kLazyPerTick);
        hottest_nonresident(policy, n_lazy, lazy_cand);
        ReplayCounts unused;  // a lazy candidate turned away is not read
        tier.lazy(lazy_cand, n_lazy, pinned.data(), LazyAdmission::kPolicy, false, unused);
        for (int64_t i = tick_start; i < b; ++i) pinned[static_cast<size_t>(tr.keys[i])] = 0;
        evicted(tier.evicted());
        c.demand_reads += static_cast<int64_t>(tier.admitted().size());
        allowance = 0.0;  // the lazy pass spent what the layers left
      }
      tick_start = b;
      tick_reads = 0;
      prev.swap(cur);
      has_prev.swap(has_cur);
      std::fill(has_cur.begin(), has_cur.end(), 0);
      tier.decay();
      model.tick();
    }
  }
  for (uint8_t x : prefetched) c.wasted += x;
  c.rejected = fills.rejected;
  return c;
}

PrefetchReplayCounts replay_prefetch(PolicyView& policy, Prefetcher& pf, const ReplayTrace& tr,
                                     int64_t slots, bool filter, bool demand_fill, bool* hit) {
  check_view(policy);
  if (policy.n_keys != pf.n_keys) throw std::invalid_argument("replay_prefetch: key spaces differ");
  if (filter && !policy.filters())
    throw std::invalid_argument("replay_prefetch: this kind has no admission filter");
  PlainTier tier(policy, slots);
  return run(tier, pf, tr, filter, demand_fill, hit);
}

PrefetchReplayCounts replay_prefetch_auto(AutoCore& core, bool* resident, int64_t& n_resident,
                                          Prefetcher& pf, const ReplayTrace& tr, int64_t slots,
                                          bool filter, bool demand_fill, bool* hit) {
  if (resident == nullptr) throw std::invalid_argument("replay_prefetch_auto: no resident mask");
  if (core.n_keys() != pf.n_keys) throw std::invalid_argument("replay_prefetch: key spaces differ");
  AutoTier tier(core, resident, n_resident, slots);
  return run(tier, pf, tr, filter, demand_fill, hit);
}

}  // namespace tierstore
