// See blend_order.hpp.
#include "tierstore/store/blend_order.hpp"

#include <algorithm>

namespace tierstore {
namespace {

// Ascending (rate, last, key): a total order (keys are distinct).
struct EntryLess {
  bool operator()(const BlendOrder::Entry& a, const BlendOrder::Entry& b) const {
    if (a.rate != b.rate) return a.rate < b.rate;
    return a.last != b.last ? a.last < b.last : a.k < b.k;
  }
};

void set_rate(BlendOrder::Entry& e, double rate) {
  e.rate = rate;
  e.inv = 1.0 / std::max(rate, 1e-12);  // primary_of's reciprocal, bit for bit
}

}  // namespace

void BlendOrder::rebuild() {
  for (Bucket& b : buckets_) {
    b.v.clear();
    b.sorted = false;  // appended below, sorted once when first asked
  }
  for (int64_t k = 0; k < p_.n_keys; ++k) {
    if (members_[k]) insert(k);
  }
}

void BlendOrder::insert(int64_t k) {
  const size_t bi = static_cast<size_t>(p_.pos[k]);
  if (buckets_.size() <= bi) buckets_.resize(bi + 1);
  Bucket& b = buckets_[bi];
  Entry e = entry_of(k);
  if (!fresh(b)) {
    b.v.push_back(e);
    b.sorted = false;
    return;
  }
  set_rate(e, PolicyOrder(p_).rate_of(e.h1, e.h2));
  b.v.insert(std::lower_bound(b.v.begin(), b.v.end(), e, EntryLess{}), e);
}

void BlendOrder::erase(int64_t k) {
  Bucket& b = buckets_[static_cast<size_t>(p_.pos[k])];
  auto it = b.v.begin();
  if (fresh(b) && b.v.size() > 32) {
    // The key's state is what it was inserted with: its rate at this clock is the entry's.
    Entry e = entry_of(k);
    set_rate(e, PolicyOrder(p_).rate_of(e.h1, e.h2));
    it = std::lower_bound(b.v.begin(), b.v.end(), e, EntryLess{});
  } else {
    while (it != b.v.end() && it->k != k) ++it;
  }
  if (it != b.v.end() && it->k == k) b.v.erase(it);
}

void BlendOrder::refresh(Bucket& b) {
  const PolicyOrder order(p_);
  for (Entry& e : b.v) set_rate(e, order.rate_of(e.h1, e.h2));
  if (!b.sorted) {
    std::sort(b.v.begin(), b.v.end(), EntryLess{});
  } else {  // one clock step moves few keys past each other: insertion sort
    const EntryLess less;
    for (size_t i = 1; i < b.v.size(); ++i) {
      if (!less(b.v[i], b.v[i - 1])) continue;
      const Entry x = b.v[i];
      size_t j = i;
      for (; j > 0 && less(x, b.v[j - 1]); --j) b.v[j] = b.v[j - 1];
      b.v[j] = x;
    }
  }
  b.sorted = true;
  b.t = p_.t;
}

void BlendOrder::candidate(size_t bi, const uint8_t* pinned, double off, Cand& c) {
  Bucket& b = buckets_[bi];
  c.k = -1;
  if (b.v.empty()) return;
  if (!fresh(b)) refresh(b);
  const Entry* v = b.v.data();
  const size_t m = b.v.size();
  size_t i = 0;
  while (i < m && excluded(v[i].k, pinned)) ++i;
  if (i == m) return;
  // primary = -(off + inv) is non-decreasing along the bucket: the coldest is the least
  // (last, key) among the leading run of equal primaries.
  const double pk = -(off + v[i].inv);
  size_t best = i;
  for (size_t j = i + 1; j < m; ++j) {
    if (excluded(v[j].k, pinned)) continue;
    if (-(off + v[j].inv) != pk) break;
    if (v[j].last != v[best].last ? v[j].last < v[best].last : v[j].k < v[best].k) best = j;
  }
  c.k = v[best].k;
  c.last = v[best].last;
  c.primary = pk;
}

void BlendOrder::victims(int64_t n, const uint8_t* pinned, std::vector<int64_t>& out) {
  out.clear();
  if (n <= 0) return;
  const PolicyOrder order(p_);
  // Each bucket's candidate depends only on its own keys, the clock and the exclusions
  // among its keys; taking a victim changes only the victim's bucket, so the others'
  // candidates hold for the whole call (evaluated once, not once per victim).
  cands_.resize(buckets_.size());
  for (size_t bi = 0; bi < buckets_.size(); ++bi)
    candidate(bi, pinned, order.off_over_l(static_cast<int64_t>(bi)), cands_[bi]);
  while (static_cast<int64_t>(out.size()) < n) {
    const Cand* best = nullptr;
    for (const Cand& c : cands_) {
      if (c.k < 0) continue;
      if (best == nullptr || c.primary < best->primary ||
          (c.primary == best->primary &&
           (c.last != best->last ? c.last < best->last : c.k < best->k)))
        best = &c;
    }
    if (best == nullptr) break;
    const int64_t k = best->k;
    out.push_back(k);
    taken_[k] = 1;
    const size_t bi = static_cast<size_t>(best - cands_.data());
    candidate(bi, pinned, order.off_over_l(static_cast<int64_t>(bi)), cands_[bi]);
  }
  for (int64_t k : out) taken_[k] = 0;
}

}  // namespace tierstore
