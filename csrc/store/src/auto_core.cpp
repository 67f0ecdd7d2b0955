// See auto_core.hpp: the self-tuning policy's access and decay over policy.hpp's rules and
// replay.hpp's shadow tiers.
#include "tierstore/store/auto_core.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace tierstore {

AutoCore::AutoCore(std::vector<PolicyView*> experts, int64_t capacity, double* scores,
                   double score_decay, double long_decay, bool meta)
    : views_(std::move(experts)), capacity_(capacity), scores_(scores),
      score_decay_(score_decay), long_decay_(long_decay), meta_(meta) {
  if (meta_ && !(long_decay_ > 0)) throw std::invalid_argument("auto: meta needs a long window");
  if (views_.empty()) throw std::invalid_argument("auto: no experts");
  if (scores_ == nullptr) throw std::invalid_argument("auto: no scores");
  if (capacity_ < 0) throw std::invalid_argument("auto: capacity < 0");
  n_keys_ = views_[0]->n_keys;
  for (size_t e = 0; e < views_.size(); ++e) {
    check_view(*views_[e]);
    if (views_[e]->n_keys != n_keys_) throw std::invalid_argument("auto: expert of another size");
    // Two shadows over one state would each think they own it.
    for (size_t f = 0; f < e; ++f) {
      if (views_[f] == views_[e] || views_[f]->resident == views_[e]->resident)
        throw std::invalid_argument("auto: an expert appears twice");
    }
    tiers_.push_back(std::make_unique<PolicyTier>(*views_[e], capacity_));
  }
  long_.assign(views_.size(), 0.0);
  hits_.assign(views_.size(), 0.0);
}

void AutoCore::access(const int64_t* keys, int64_t n, const double* w, const int64_t* counts,
                      ResidentOrder* mirror, int64_t mirror_of) {
  if (n <= 0) return;
  ReplayCounts unused;  // a shadow's reads count nowhere
  for (size_t e = 0; e < tiers_.size(); ++e) {
    PolicyTier& s = *tiers_[e];
    PolicyView& p = s.policy();
    miss_.clear();
    for (int64_t i = 0; i < n; ++i) {
      if (!p.resident[keys[i]]) miss_.push_back(keys[i]);
    }
    const double h = static_cast<double>(n - static_cast<int64_t>(miss_.size()));
    scores_[e] += h;
    long_[e] += h;
    hits_[e] = h;
    ResidentOrder* m = static_cast<int64_t>(e) == mirror_of ? mirror : nullptr;
    s.access(keys, n, w, counts, m);
    if (miss_.empty() || capacity_ == 0) continue;
    s.fill(miss_, keys, n, p.filters(), unused, m);
  }
  if (meta_) {  // the windows' leaders of this read (chosen before it) score its hits
    meta_short_ += hits_[lead_short_];
    meta_long_ += hits_[lead_long_];
  }
  choose_leader();
}

void AutoCore::choose_leader() {
  // Off, the scores alone compare unscaled (the same leader, bit for bit, as before).
  const bool two = long_decay_ > 0;
  const double w1 = two ? 1.0 - score_decay_ : 1.0, w2 = two ? 1.0 - long_decay_ : 0.0;
  auto sc = [&](size_t e) { return two ? w1 * scores_[e] + w2 * long_[e] : scores_[e]; };
  if (meta_) {
    int64_t bs = 0, bl = 0;
    for (size_t e = 1; e < tiers_.size(); ++e) {
      if (scores_[e] > scores_[bs]) bs = static_cast<int64_t>(e);
      if (long_[e] > long_[bl]) bl = static_cast<int64_t>(e);
    }
    lead_short_ = bs;
    lead_long_ = bl;
    leader_ = meta_short_ > meta_long_ ? bs : bl;
    return;
  }
  int64_t best = 0;
  for (size_t e = 1; e < tiers_.size(); ++e) {
    if (sc(e) > sc(best)) best = static_cast<int64_t>(e);
  }
  leader_ = best;
}

bool AutoCore::decay(int64_t steps, int64_t watch) {
  bool watched = false;
  for (size_t e = 0; e < tiers_.size(); ++e) {
    if (tiers_[e]->decay(steps) && static_cast<int64_t>(e) == watch) watched = true;
  }
  // As auto.py spelled it: score_decay ** steps, then one multiply.
  const double f = steps == 1 ? score_decay_ : std::pow(score_decay_, static_cast<double>(steps));
  for (size_t e = 0; e < tiers_.size(); ++e) scores_[e] *= f;
  if (long_decay_ > 0) {
    const double f2 = std::pow(long_decay_, static_cast<double>(steps));
    for (double& x : long_) x *= f2;
    meta_short_ *= f2;
    meta_long_ *= f2;
  }
  return watched;
}

void AutoCore::reset() {
  for (auto& t : tiers_) t->rebuild();
  std::fill(scores_, scores_ + tiers_.size(), 0.0);
  std::fill(long_.begin(), long_.end(), 0.0);
  lead_short_ = lead_long_ = 0;
  meta_short_ = meta_long_ = 0.0;
  leader_ = 0;
}

}  // namespace tierstore
