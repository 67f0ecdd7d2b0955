// See blend_order.hpp.
#include "tierstore/store/blend_order.hpp"

#include <algorithm>

namespace tierstore {
namespace {

// Entries ordered by (heat, key): the heat is stored beside the key (it equals the
// policy's array while the key is held: erase before a change, insert after), so the
// searches read one contiguous array.
struct EntryLess {
  bool operator()(const BlendOrder::Entry& a, const BlendOrder::Entry& b) const {
    return a.h != b.h ? a.h < b.h : a.k < b.k;
  }
};

void sorted_insert(std::vector<BlendOrder::Entry>& v, int64_t k, const double* h,
                   const double* o) {
  const BlendOrder::Entry e{h[k], o[k], k};
  v.insert(std::lower_bound(v.begin(), v.end(), e, EntryLess{}), e);
}
void sorted_erase(std::vector<BlendOrder::Entry>& v, int64_t k, const double* h) {
  const BlendOrder::Entry e{h[k], 0.0, k};
  auto it = std::lower_bound(v.begin(), v.end(), e, EntryLess{});
  if (it != v.end() && it->k == k) v.erase(it);
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
  sorted_insert(bk.by1, k, p_.raw, p_.raw2);
  sorted_insert(bk.by2, k, p_.raw2, p_.raw);
  if (!bk.valid || !(p_.t == cached_t_)) {
    bk.valid = false;
    return;
  }
  // The head holds for this clock: the new key either becomes it or bounds the rates above
  // it (the rate as compute() takes it).
  const double r = PolicyOrder(p_).blend_rate(p_.raw[k], p_.raw2[k]);
  const int64_t* last = p_.last;
  const int64_t h = bk.head;
  if (h < 0) {
    bk.head = k;
    bk.rate = r;
    bk.next_rate = std::numeric_limits<double>::infinity();
  } else if (r < bk.rate) {
    bk.next_rate = bk.rate;  // every other key's rate is >= the old head's
    bk.head = k;
    bk.rate = r;
  } else if (r == bk.rate) {
    if (last[k] != last[h] ? last[k] < last[h] : k < h) bk.head = k;
  } else {
    bk.next_rate = std::min(bk.next_rate, r);
  }
  bk.inv_rate = 1.0 / std::max(bk.rate, 1e-12);
  bk.inv_next = 1.0 / std::max(bk.next_rate, 1e-12);
}

void BlendOrder::erase(int64_t k) {
  Bucket& bk = buckets_[bucket_of_[k]];
  sorted_erase(bk.by1, k, p_.raw);
  sorted_erase(bk.by2, k, p_.raw2);
  // Another key leaving keeps the head the coldest and next_rate a lower bound (looser:
  // at worst victims() orders the bucket exactly where it need not, same result).
  if (k == bk.head) bk.valid = false;
}

void BlendOrder::compute(Bucket& b, const uint8_t* pinned, const PolicyOrder& order) {
  const int64_t* last = p_.last;
  const double inf = std::numeric_limits<double>::infinity();
  int64_t best = -1;
  double best_rate = inf, above = inf;  // above: smallest seen rate > best_rate
  // A key met in both lists is visited twice: the second visit changes nothing (its rate
  // ties itself or is above the best), so no visited marks are kept. The rate is the
  // entry's (both heats stored), as order.rate(k) computes it.
  const auto visit = [&](int64_t k, double r1, double r2) {
    const double r = order.blend_rate(r1, r2);
    if (best < 0 || r < best_rate ||
        (r == best_rate && k != best && (last[k] != last[best] ? last[k] < last[best] : k < best))) {
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
    while (i1 < n && excluded(b.by1[i1].k, pinned)) { ++i1; skipped = true; }
    while (i2 < n && excluded(b.by2[i2].k, pinned)) { ++i2; skipped = true; }
    if (i1 >= n || i2 >= n) {  // one list walked through: every key seen
      threshold = inf;
      break;
    }
    // No unseen key has raw below by1[i1]'s nor raw2 below by2[i2]'s: its rate >= this.
    threshold = order.blend_rate(b.by1[i1].h, b.by2[i2].h);
    if (best >= 0 && best_rate < threshold) break;
    const Entry& e1 = b.by1[i1++];
    visit(e1.k, e1.h, e1.o);
    const Entry& e2 = b.by2[i2++];
    visit(e2.k, e2.o, e2.h);
  }
  b.head = best;
  b.rate = best_rate;
  b.next_rate = std::min(above, threshold);
  // primary_of's reciprocal, once per head instead of once per bucket per call.
  b.inv_rate = 1.0 / std::max(b.rate, 1e-12);
  b.inv_next = 1.0 / std::max(b.next_rate, 1e-12);
  b.valid = !skipped;  // a head found around exclusions holds for this call only
}

// One bucket's candidate in the current call: its coldest unexcluded key and that key's
// phase primary (k = -1: none).
void BlendOrder::candidate(size_t bi, const uint8_t* pinned, const PolicyOrder& order,
                           Cand& c) {
  Bucket& b = buckets_[bi];
  c.k = -1;
  if (b.by1.empty()) return;
  if (!b.valid || (b.head >= 0 && excluded(b.head, pinned))) compute(b, pinned, order);
  if (b.head < 0) return;
  const int64_t* last = p_.last;
  const double off = order.off_over_l(static_cast<int64_t>(bi));
  int64_t k = b.head;
  double pk = -(off + b.inv_rate);  // = primary_of(off, b.rate), bit for bit
  if (-(off + b.inv_next) == pk) {
    // A hotter rate may round to this primary: order the bucket exactly (rare).
    k = -1;
    for (const Entry& e : b.by1) {
      const int64_t x = e.k;
      if (excluded(x, pinned)) continue;
      const double px = order.primary(x);
      if (k < 0 || px < pk || (px == pk && (last[x] != last[k] ? last[x] < last[k] : x < k))) {
        k = x;
        pk = px;
      }
    }
  }
  c.k = k;
  c.primary = pk;
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
  // Each bucket's candidate depends only on its own keys, the clock and the exclusions
  // among its keys; taking a victim changes only the victim's bucket, so the others'
  // candidates hold for the whole call (evaluated once, not once per victim).
  cands_.resize(buckets_.size());
  for (size_t bi = 0; bi < buckets_.size(); ++bi) candidate(bi, pinned, order, cands_[bi]);
  while (static_cast<int64_t>(out.size()) < n) {
    int64_t best = -1;
    double best_p = 0.0;
    for (const Cand& c : cands_) {
      const int64_t k = c.k;
      if (k < 0) continue;
      const double pk = c.primary;
      if (best < 0 || pk < best_p ||
          (pk == best_p && (last[k] != last[best] ? last[k] < last[best] : k < best))) {
        best = k;
        best_p = pk;
      }
    }
    if (best < 0) break;
    out.push_back(best);
    taken_[best] = 1;
    const size_t bi = bucket_of_[best];
    buckets_[bi].valid = false;
    candidate(bi, pinned, order, cands_[bi]);
  }
  for (int64_t k : out) taken_[k] = 0;
}

}  // namespace tierstore
