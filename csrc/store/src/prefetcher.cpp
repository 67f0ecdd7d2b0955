// See prefetcher.hpp: the prefetcher's rules and its co-routing model (prefetch.py,
// corouting.py have the why of each step).
#include "tierstore/store/prefetcher.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace tierstore {

double pairwise_sum(const double* a, int64_t n) {
  if (n < 8) {
    double res = 0.0;
    for (int64_t i = 0; i < n; ++i) res += a[i];
    return res;
  }
  if (n <= 128) {
    double r[8];
    for (int j = 0; j < 8; ++j) r[j] = a[j];
    int64_t i = 8;
    for (; i < n - (n % 8); i += 8)
      for (int j = 0; j < 8; ++j) r[j] += a[i + j];
    double res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]));
    for (; i < n; ++i) res += a[i];
    return res;
  }
  int64_t n2 = n / 2;
  n2 -= n2 % 8;
  return pairwise_sum(a, n2) + pairwise_sum(a + n2, n - n2);
}

namespace {
constexpr double kRenormExponent = 256.0;
}  // namespace

// -- CoRouting -------------------------------------------------------------------------------

CoRouting::CoRouting(int64_t L, int64_t E, int64_t d, double h, double pw)
    : n_layers(L), n_experts(E), distance(d), half_life(h), prior_weight(pw) {
  if (L <= 0 || E <= 0 || d < 0) throw std::invalid_argument("corouting: bad shape");
  const size_t cl = static_cast<size_t>(cross_layers()), l = static_cast<size_t>(L),
               e = static_cast<size_t>(E);
  cross.assign(cl * e * e, 0.0);
  cross_n.assign(cl * e, 0.0);
  temporal.assign(l * e * e, 0.0);
  temporal_n.assign(l * e, 0.0);
  marginal.assign(l * e, 0.0);
  marginal_n.assign(l, 0.0);
}

void CoRouting::tick() {
  t += 1.0;
  double exponent = t / half_life;
  if (exponent > kRenormExponent) {
    const double f = std::pow(2.0, -exponent);
    for (auto* arr : {&cross, &cross_n, &temporal, &temporal_n, &marginal, &marginal_n})
      for (double& x : *arr) x *= f;
    t = 0.0;
    exponent = 0.0;
  }
  gain = std::pow(2.0, exponent);
}

void CoRouting::observe(int64_t layer, const int64_t* experts, int64_t n, double weight) {
  const double w = gain * weight;
  double* row = marginal.data() + layer * n_experts;
  for (int64_t i = 0; i < n; ++i) row[experts[i]] += w;
  marginal_n[static_cast<size_t>(layer)] += w;
}

void CoRouting::learn(int64_t layer, const int64_t* src, int64_t ns, const int64_t* dst,
                      int64_t nd, bool temporal_, double weight) {
  if (ns == 0 || nd == 0) return;
  double* counts = (temporal_ ? temporal.data() : cross.data()) + layer * n_experts * n_experts;
  double* totals = (temporal_ ? temporal_n.data() : cross_n.data()) + layer * n_experts;
  const double w = gain * weight;
  for (int64_t i = 0; i < ns; ++i) {
    double* row = counts + src[i] * n_experts;
    for (int64_t j = 0; j < nd; ++j) row[dst[j]] += w;
    totals[src[i]] += w;
  }
}

void CoRouting::predict(int64_t layer, const int64_t* src, int64_t ns, bool temporal_,
                        double* out) const {
  const int64_t E = n_experts;
  const double* counts = (temporal_ ? temporal.data() : cross.data()) + layer * E * E;
  const double* totals = (temporal_ ? temporal_n.data() : cross_n.data()) + layer * E;
  const int64_t dst = temporal_ ? layer : layer + distance;
  double denom = 0.0;
  if (ns > 0) {
    std::vector<double> t(static_cast<size_t>(ns));
    for (int64_t i = 0; i < ns; ++i) t[static_cast<size_t>(i)] = totals[src[i]];
    denom = pairwise_sum(t.data(), ns);
  }
  const double mn = marginal_n[static_cast<size_t>(dst)];
  if (denom <= 0 || mn <= 0) {
    std::fill(out, out + E, 0.0);
    return;
  }
  // counts[src].sum(axis=0): the rows added in order.
  const double* r0 = counts + src[0] * E;
  std::copy(r0, r0 + E, out);
  for (int64_t i = 1; i < ns; ++i) {
    const double* r = counts + src[i] * E;
    for (int64_t e = 0; e < E; ++e) out[e] += r[e];
  }
  const double* marg = marginal.data() + dst * E;
  const double den = denom + prior_weight;
  for (int64_t e = 0; e < E; ++e) out[e] = (out[e] + prior_weight * (marg[e] / mn)) / den;
}

void CoRouting::mix(const double* pc, const double* pt, double* out) const {
  const double mx = std::max(loglik[0], loglik[1]);
  double w[2];
  for (int i = 0; i < 2; ++i) w[i] = std::exp(std::clamp(loglik[i] - mx, -700.0, 0.0));
  const double s = w[0] + w[1];
  w[0] /= s;
  w[1] /= s;
  for (int64_t e = 0; e < n_experts; ++e) out[e] = w[0] * pc[e] + w[1] * pt[e];
}

void CoRouting::score(const double* pc, const double* pt, const int64_t* actual, int64_t n,
                      int64_t per_token) {
  if (n == 0) return;
  const double decay = std::pow(2.0, -1.0 / half_life);
  std::vector<double> l(static_cast<size_t>(n));
  const double* ps[2] = {pc, pt};
  for (int i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < n; ++j)
      l[static_cast<size_t>(j)] = std::log(std::clamp(ps[i][actual[j]], 1e-6, 1.0));
    const double ll = pairwise_sum(l.data(), n) / static_cast<double>(std::max<int64_t>(per_token, 1));
    loglik[i] = loglik[i] * decay + ll;
  }
}

void CoRouting::present(const double* q, double tokens, double per_token, int64_t E, double* out) {
  for (int64_t e = 0; e < E; ++e) {
    double x = q ? q[e] : std::min(per_token / static_cast<double>(std::max<int64_t>(E, 1)), 1.0);
    x = std::clamp(x, 0.0, 1.0);
    out[e] = tokens <= 1.0 ? x : 1.0 - std::pow(1.0 - x, tokens);
  }
}

// -- Prefetcher ------------------------------------------------------------------------------

Prefetcher::Prefetcher(int64_t L, int64_t E, int64_t capacity_, const PrefetchParams& pp)
    : n_layers(L), n_experts(E), n_keys(L * E), capacity(capacity_), lead(pp.lead),
      model(L, E, pp.lead, pp.half_life), held_mask(new bool[static_cast<size_t>(L * E)]()),
      threshold(pp.threshold), hold_threshold(pp.threshold), read_ratio_(pp.read_ratio),
      max_per_read_(pp.max_per_read), top_k_(pp.top_k), use_cross_(pp.cross),
      use_temporal_(pp.temporal), decay_(std::pow(2.0, -1.0 / kPrecisionHalfLife)),
      held_(static_cast<size_t>(L)), fetched_(static_cast<size_t>(L)),
      fetched_p_(static_cast<size_t>(L)), scored_(static_cast<size_t>(L)),
      pending_(static_cast<size_t>(L)), this_(static_cast<size_t>(L)),
      prev_(static_cast<size_t>(L)), tok_this_(static_cast<size_t>(L), 0.0),
      tok_prev_(static_cast<size_t>(L), 0.0),
      shadow_last_(static_cast<size_t>(L * E), -1),
      shadow_resident_(new bool[static_cast<size_t>(L * E)]()),
      routed_(new bool[static_cast<size_t>(L * E)]()),
      blocked_(new bool[static_cast<size_t>(L * E)]()) {
  if (lead < 1 || lead > std::max<int64_t>(L - 1, 1) || capacity < 0)
    throw std::invalid_argument("prefetch: lead or capacity out of range");
  shadow_view_.kind = PolicyKind::kLru;
  shadow_view_.n_keys = n_keys;
  shadow_view_.last = shadow_last_.data();
  shadow_view_.resident = shadow_resident_.get();
  shadow_ = std::make_unique<PolicyTier>(shadow_view_, capacity);
}

std::pair<int64_t, bool> Prefetcher::target(int64_t layer) const {
  int64_t m = layer + lead;
  const bool wraps = m >= n_layers;
  if (wraps) m -= n_layers;
  return {m, wraps};
}

std::vector<int64_t> Prefetcher::on_read(int64_t layer, const int64_t* experts, int64_t n,
                                         const bool* hit, int64_t routings) {
  const size_t l = static_cast<size_t>(layer);
  const int64_t base = layer * n_experts;
  std::vector<int64_t> release;
  release.swap(held_[l]);
  for (int64_t k : release) held_mask[k] = false;
  for (int64_t i = 0; i < n; ++i) routed_[base + experts[i]] = true;
  std::vector<int64_t>& fetched = fetched_[l];
  if (!fetched.empty()) {
    int64_t used = 0;
    for (int64_t k : fetched) used += routed_[k] ? 1 : 0;
    const int64_t size = static_cast<int64_t>(fetched.size());
    useful += used;
    useful_w_ += static_cast<double>(used);
    wasted_w_ += static_cast<double>(size - used);
    in_flight -= size;
    in_flight_p -= pairwise_sum(fetched_p_[l].data(), size);
    fetched.clear();
    fetched_p_[l].clear();
  }
  Scored& sc = scored_[l];
  if (sc.has) {
    // np.bincount per bin first (counts, then weights summed in order), then added.
    double cnt[kBins] = {}, hits[kBins] = {};
    for (size_t i = 0; i < sc.keys.size(); ++i) {
      cnt[sc.bins[i]] += 1.0;
      hits[sc.bins[i]] += routed_[sc.keys[i]] ? 1.0 : 0.0;
    }
    for (int b = 0; b < kBins; ++b) {
      cal_n_[sc.kind][b] += cnt[b];
      cal_hit_[sc.kind][b] += hits[b];
    }
    sc.has = false;
  }
  for (int64_t i = 0; i < n; ++i) routed_[base + experts[i]] = false;
  int64_t n_hit = 0;
  for (int64_t i = 0; i < n; ++i) n_hit += hit[i] ? 1 : 0;
  misses += n - n_hit;
  const int64_t r = routings < 0 ? n : routings;
  if (n > 0 && (k_seen_ == 0 || r < k_seen_)) k_seen_ = r;
  tok_this_[l] = n > 0 ? tokens(r) : 0.0;
  learn(layer, experts, n);
  rkeys_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) rkeys_[static_cast<size_t>(i)] = base + experts[i];
  shadow_read(rkeys_.data(), n);
  return release;
}

void Prefetcher::learn(int64_t layer, const int64_t* experts, int64_t n) {
  const size_t l = static_cast<size_t>(layer);
  Pending& pend = pending_[l];
  if (pend.has) {
    if (pend.has_cross && pend.has_temp)
      model.score(pend.cross.data(), pend.temp.data(), experts, n,
                  std::max<int64_t>(static_cast<int64_t>(std::nearbyint(per_token())), 1));
    pend.has = pend.has_cross = pend.has_temp = false;
  }
  const double tok = std::max(tok_this_[l], 1.0);
  const int64_t src = layer - lead;
  if (src >= 0 && this_[static_cast<size_t>(src)].has) {
    const Routed& s = this_[static_cast<size_t>(src)];
    model.learn(src, s.experts.data(), static_cast<int64_t>(s.experts.size()), experts, n, false,
                1.0 / std::max(tok, tok_this_[static_cast<size_t>(src)]));
  }
  if (prev_[l].has) {
    model.learn(layer, prev_[l].experts.data(), static_cast<int64_t>(prev_[l].experts.size()),
                experts, n, true, 1.0 / std::max(tok, tok_prev_[l]));
  }
  this_[l].has = true;
  this_[l].experts.assign(experts, experts + n);
  model.observe(layer, experts, n, 1.0 / tok);
}

void Prefetcher::shadow_read(const int64_t* keys, int64_t n) {
  miss_.clear();
  for (int64_t i = 0; i < n; ++i)
    if (!shadow_resident_[keys[i]]) miss_.push_back(keys[i]);
  shadow_->access(keys, n, nullptr, nullptr);
  lru_reads += static_cast<int64_t>(miss_.size());
  if (miss_.empty() || capacity == 0) return;
  ReplayCounts unused;
  shadow_->fill(miss_, keys, n, false, unused);  // the read's keys are never victims
}

bool Prefetcher::predict(int64_t layer, int64_t m, bool wraps, double* out) {
  const int64_t E = n_experts;
  const size_t ml = static_cast<size_t>(m);
  Pending& pend = pending_[ml];
  pend.has = true;
  pend.has_cross = pend.has_temp = false;
  const Routed* src_c = wraps || !use_cross_ || !this_[static_cast<size_t>(layer)].has
                            ? nullptr : &this_[static_cast<size_t>(layer)];
  if (src_c) {
    pend.cross.resize(static_cast<size_t>(E));
    model.predict(layer, src_c->experts.data(), static_cast<int64_t>(src_c->experts.size()), false,
                  pend.cross.data());
    pend.has_cross = true;
  }
  const Routed* src_t = nullptr;
  if (use_temporal_) {
    const Routed& s = wraps ? this_[ml] : prev_[ml];
    if (s.has) src_t = &s;
  }
  if (src_t) {
    pend.temp.resize(static_cast<size_t>(E));
    model.predict(m, src_t->experts.data(), static_cast<int64_t>(src_t->experts.size()), true,
                  pend.temp.data());
    pend.has_temp = true;
  }
  if (!pend.has_cross && !pend.has_temp && (wraps || !use_cross_)) return false;
  const double* q = nullptr;
  if (model.seen(m)) {
    if (pend.has_cross && pend.has_temp) {
      q_.resize(static_cast<size_t>(E));
      model.mix(pend.cross.data(), pend.temp.data(), q_.data());
      q = q_.data();
    } else {
      q = pend.has_cross ? pend.cross.data() : (pend.has_temp ? pend.temp.data() : nullptr);
    }
  }
  const double tok = wraps ? std::min(tok_this_[ml], tok_prev_[ml])
                           : tok_this_[static_cast<size_t>(layer)];
  CoRouting::present(q, std::max(tok, 1.0), per_token(), E, out);
  return true;
}

void Prefetcher::propose(int64_t layer, const double* p, const bool* resident,
                         const Victims* victims, std::vector<int64_t>& fetch,
                         std::vector<int64_t>& hold) {
  fetch.clear();
  hold.clear();
  last_cost = 0.0;
  const auto [m, wraps] = target(layer);
  if (p == nullptr) return;
  const int64_t E = n_experts, base = m * E;
  const int kind = wraps ? 1 : 0;
  const int64_t expect = std::min<int64_t>(
      std::max<int64_t>(static_cast<int64_t>(std::ceil(pairwise_sum(p, E))), 1), E);
  const int64_t cap = max_per_read_ < 0 ? expect : std::min(expect, max_per_read_);
  // The likeliest `expect` experts, as argsort(-p, "stable")[:expect]: ties by index make
  // the order total, so selecting the first `expect` and sorting them gives that prefix.
  const auto likelier = [p](int64_t a, int64_t b) {
    return p[a] > p[b] || (p[a] == p[b] && a < b);  // -p ascending, ties by index
  };
  if (expect <= 32) {
    // A decode read expects a few experts: one pass keeps the best `expect` in order (a key
    // enters only when likelier than the worst kept, so most cost one comparison).
    // Indices rise, so a later key is likelier than the worst kept only if strictly above.
    order_.clear();
    double worst = -1.0;
    for (int64_t e = 0; e < E; ++e) {
      const bool full = static_cast<int64_t>(order_.size()) == expect;
      if (full && !(p[e] > worst)) continue;
      if (full) order_.pop_back();
      order_.insert(std::upper_bound(order_.begin(), order_.end(), e, likelier), e);
      if (static_cast<int64_t>(order_.size()) == expect) worst = p[order_.back()];
    }
  } else {
    order_.resize(static_cast<size_t>(E));
    std::iota(order_.begin(), order_.end(), 0);
    if (expect < E) std::nth_element(order_.begin(), order_.begin() + expect, order_.end(), likelier);
    order_.resize(static_cast<size_t>(expect));
    std::sort(order_.begin(), order_.end(), likelier);
  }
  top_.assign(static_cast<size_t>(E), 0);
  keep_.clear();
  for (int64_t e : order_) {
    top_[static_cast<size_t>(e)] = 1;
    const int64_t k = base + e;
    if (!held_mask[k] && resident[k] && p[e] >= hold_threshold) keep_.push_back(k);
  }
  // Scored: free, non-resident, p >= the floor (ascending); candidates: those among the top.
  Scored& sc = scored_[static_cast<size_t>(m)];
  bool any_scored = false;
  cand_.clear();
  for (int64_t e = 0; e < E; ++e) {
    const int64_t k = base + e;
    if (held_mask[k] || resident[k] || !(p[e] >= kCalFloor)) continue;
    if (!any_scored) {
      sc.keys.clear();
      sc.bins.clear();
      any_scored = true;
    }
    sc.keys.push_back(k);
    sc.bins.push_back(bin(p[e]));
    if (top_[static_cast<size_t>(e)]) cand_.push_back(e);
  }
  if (any_scored) {
    sc.has = true;
    sc.kind = kind;
  }
  std::vector<double> fp;
  if (!cand_.empty()) {
    const size_t nc = cand_.size();
    pc_.resize(nc);
    for (size_t i = 0; i < nc; ++i) pc_[i] = calibrated(p[cand_[i]], kind);
    idx_.resize(nc);
    std::iota(idx_.begin(), idx_.end(), 0);
    std::stable_sort(idx_.begin(), idx_.end(), [this](int64_t a, int64_t b) { return -pc_[a] < -pc_[b]; });
    // Sorted by calibrated p, those at the price, at most cap.
    std::vector<int64_t> c2;
    std::vector<double> p2;
    for (int64_t i : idx_) {
      if (static_cast<int64_t>(c2.size()) >= cap) break;
      if (pc_[static_cast<size_t>(i)] >= threshold) {
        c2.push_back(cand_[static_cast<size_t>(i)]);
        p2.push_back(pc_[static_cast<size_t>(i)]);
      }
    }
    const int64_t nn = static_cast<int64_t>(c2.size());
    const double cr = credit();
    harm_.assign(static_cast<size_t>(nn), 0.0);
    if (victims != nullptr && nn > 0) harm(layer, m, p, keep_, nn, *victims, harm_);
    cost_.resize(static_cast<size_t>(nn));
    const double limit = std::max(cr, 0.0);
    double cum = 0.0, cum_var = 0.0, need_last = 0.0;
    int64_t n_take = nn;
    bool found = false;
    for (int64_t i = 0; i < nn; ++i) {
      const double pi = p2[static_cast<size_t>(i)];
      cost_[static_cast<size_t>(i)] = (1.0 - pi) * (1.0 + harm_[static_cast<size_t>(i)]);
      cum += cost_[static_cast<size_t>(i)];
      cum_var += pi * (1.0 - pi);
      const double need = cum + kZ * std::sqrt(cum_var);
      if (!found && need > limit) {
        n_take = i;
        found = true;
      }
      if (!found) need_last = need;
    }
    if (!(read_ratio_ > 0)) n_take = 0;
    tune(n_take < nn, cr - (n_take > 0 ? need_last : 0.0));
    for (int64_t i = 0; i < n_take; ++i) {
      fetch.push_back(base + c2[static_cast<size_t>(i)]);
      fp.push_back(p2[static_cast<size_t>(i)]);
    }
    last_cost = pairwise_sum(cost_.data(), n_take);
  } else {
    tune(false, credit());
  }
  hold = keep_;
  hold.insert(hold.end(), fetch.begin(), fetch.end());
  if (!hold.empty()) {
    for (int64_t k : hold) held_mask[k] = true;
    auto& h = held_[static_cast<size_t>(m)];
    h.insert(h.end(), hold.begin(), hold.end());
  }
  if (!fetch.empty()) {
    auto& f = fetched_[static_cast<size_t>(m)];
    f.insert(f.end(), fetch.begin(), fetch.end());
    auto& fpl = fetched_p_[static_cast<size_t>(m)];
    fpl.insert(fpl.end(), fp.begin(), fp.end());
    const int64_t nf = static_cast<int64_t>(fetch.size());
    issued += nf;
    issued_w_ += static_cast<double>(nf);
    in_flight += nf;
    in_flight_p += pairwise_sum(fp.data(), nf);
  }
  held_resident += static_cast<int64_t>(keep_.size());
}

void Prefetcher::harm(int64_t layer, int64_t m, const double* p, const std::vector<int64_t>& keep,
                      int64_t n, const Victims& victims, std::vector<double>& h) {
  const int64_t E = n_experts;
  std::copy(held_mask.get(), held_mask.get() + n_keys, blocked_.get());
  for (int64_t k : keep) blocked_[k] = true;
  const Routed& cur = this_[static_cast<size_t>(layer)];
  if (cur.has)
    for (int64_t e : cur.experts) blocked_[layer * E + e] = true;
  const std::vector<int64_t> v = victims(n, blocked_.get());
  const int64_t nv = std::min<int64_t>(static_cast<int64_t>(v.size()), n);
  for (int64_t i = 0; i < nv; ++i) {
    const int64_t k = v[static_cast<size_t>(i)];
    if (k < 0) continue;
    if (k >= n_keys) throw std::out_of_range("prefetch: a victim outside the key space");
    const int64_t lv = k / E, ev = k % E;
    if (lv == m) {
      h[static_cast<size_t>(i)] = p[ev];  // the target layer: its own prediction
      continue;
    }
    const double q = std::clamp(model.marginal[static_cast<size_t>(k)] /
                                    std::max(model.marginal_n[static_cast<size_t>(lv)], 1e-300),
                                0.0, 1.0);
    const size_t l = static_cast<size_t>(lv);
    const double tok = lv > layer ? tok_this_[static_cast<size_t>(layer)]
                                  : std::min(tok_this_[l], tok_prev_[l]);
    h[static_cast<size_t>(i)] = 1.0 - std::pow(1.0 - q, std::max(tok, 1.0));
  }
}

void Prefetcher::tune(bool short_, double spare) {
  if (short_) {
    threshold = std::min(threshold * kThresholdStep, kMaxThreshold);
  } else if (spare >= 1.0) {
    threshold = std::max(threshold / kThresholdStep, kMinThreshold);
  }
}

void Prefetcher::end_tick() {
  model.tick();
  prev_.swap(this_);
  for (Routed& r : this_) {
    r.has = false;
    r.experts.clear();
  }
  tok_prev_.swap(tok_this_);
  std::fill(tok_this_.begin(), tok_this_.end(), 0.0);
  useful_w_ *= decay_;
  issued_w_ *= decay_;
  wasted_w_ *= decay_;
  for (int k = 0; k < 2; ++k)
    for (int b = 0; b < kBins; ++b) {
      cal_n_[k][b] *= decay_;
      cal_hit_[k][b] *= decay_;
    }
}

}  // namespace tierstore
