// See blend_order.hpp.
#include "tierstore/store/blend_order.hpp"

#include <algorithm>

namespace tierstore {
namespace {

struct By {
  const double* h;
  bool operator()(int64_t x, int64_t y) const { return h[x] != h[y] ? h[x] < h[y] : x < y; }
};

void sorted_insert(std::vector<int64_t>& v, int64_t k, const double* h) {
  v.insert(std::lower_bound(v.begin(), v.end(), k, By{h}), k);
}
void sorted_erase(std::vector<int64_t>& v, int64_t k, const double* h) {
  auto it = std::lower_bound(v.begin(), v.end(), k, By{h});
  if (it != v.end() && *it == k) v.erase(it);
}

}  // namespace

void BlendOrder::rebuild() {
  buckets_.clear();
  for (int64_t k = 0; k < p_.n_keys; ++k) {
    if (members_[k]) insert(k);
  }
}

void BlendOrder::insert(int64_t k) {
  const size_t b = static_cast<size_t>(p_.pos[k]);
  if (buckets_.size() <= b) buckets_.resize(b + 1);
  bucket_of_[k] = static_cast<uint32_t>(b);
  Bucket& bk = buckets_[b];
  sorted_insert(bk.by1, k, p_.raw);
  sorted_insert(bk.by2, k, p_.raw2);
  bk.valid = false;
}

void BlendOrder::erase(int64_t k) {
  Bucket& bk = buckets_[bucket_of_[k]];
  sorted_erase(bk.by1, k, p_.raw);
  sorted_erase(bk.by2, k, p_.raw2);
  bk.valid = false;
}

void BlendOrder::compute(Bucket& b, const uint8_t* pinned, const PolicyOrder& order) {
  const int64_t* last = p_.last;
  if (++stamp_ == 0) {  // stamps wrapped: clear the marks once
    std::fill(seen_.begin(), seen_.end(), 0);
    stamp_ = 1;
  }
  const double inf = std::numeric_limits<double>::infinity();
  int64_t best = -1;
  double best_rate = inf, above = inf;  // above: smallest seen rate > best_rate
  const auto visit = [&](int64_t k) {
    if (seen_[k] == stamp_) return;
    seen_[k] = stamp_;
    const double r = order.rate(k);
    if (best < 0 || r < best_rate ||
        (r == best_rate && (last[k] != last[best] ? last[k] < last[best] : k < best))) {
      if (best >= 0 && best_rate != r) above = std::min(above, best_rate);
      best = k;
      best_rate = r;
    } else if (r > best_rate) {
      above = std::min(above, r);
    }
  };
  size_t i1 = 0, i2 = 0;
  const size_t n = b.by1.size();
  double threshold = inf;
  bool skipped = false;
  for (;;) {
    while (i1 < n && excluded(b.by1[i1], pinned)) { ++i1; skipped = true; }
    while (i2 < n && excluded(b.by2[i2], pinned)) { ++i2; skipped = true; }
    if (i1 >= n || i2 >= n) {  // one list walked through: every key seen
      threshold = inf;
      break;
    }
    // No unseen key has raw below by1[i1]'s nor raw2 below by2[i2]'s: its rate >= this.
    threshold = order.blend_rate(p_.raw[b.by1[i1]], p_.raw2[b.by2[i2]]);
    if (best >= 0 && best_rate < threshold) break;
    visit(b.by1[i1++]);
    visit(b.by2[i2++]);
  }
  b.head = best;
  b.rate = best_rate;
  b.next_rate = std::min(above, threshold);
  b.valid = !skipped;  // a head found around exclusions holds for this call only
}

void BlendOrder::victims(int64_t n, const uint8_t* pinned, std::vector<int64_t>& out) {
  out.clear();
  if (n <= 0) return;
  if (!(p_.t == cached_t_)) {  // the clock moved: every rate changed
    for (Bucket& b : buckets_) b.valid = false;
    cached_t_ = p_.t;
  }
  const PolicyOrder order(p_);
  const int64_t* last = p_.last;
  while (static_cast<int64_t>(out.size()) < n) {
    int64_t best = -1;
    double best_p = 0.0;
    for (size_t bi = 0; bi < buckets_.size(); ++bi) {
      Bucket& b = buckets_[bi];
      if (b.by1.empty()) continue;
      if (!b.valid || (b.head >= 0 && excluded(b.head, pinned))) compute(b, pinned, order);
      if (b.head < 0) continue;
      const double off = order.off_over_l(static_cast<int64_t>(bi));
      int64_t k = b.head;
      double pk = PolicyOrder::primary_of(off, b.rate);
      if (PolicyOrder::primary_of(off, b.next_rate) == pk) {
        // A hotter rate may round to this primary: order the bucket exactly (rare).
        k = -1;
        for (int64_t x : b.by1) {
          if (excluded(x, pinned)) continue;
          const double px = order.primary(x);
          if (k < 0 || px < pk || (px == pk && (last[x] != last[k] ? last[x] < last[k] : x < k))) {
            k = x;
            pk = px;
          }
        }
        if (k < 0) continue;
      }
      if (best < 0 || pk < best_p ||
          (pk == best_p && (last[k] != last[best] ? last[k] < last[best] : k < best))) {
        best = k;
        best_p = pk;
      }
    }
    if (best < 0) break;
    out.push_back(best);
    taken_[best] = 1;
    buckets_[bucket_of_[best]].valid = false;
  }
  for (int64_t k : out) taken_[k] = 0;
}

}  // namespace tierstore
