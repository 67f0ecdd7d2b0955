// See blend_order.hpp.
#include "tierstore/store/blend_order.hpp"

#include <algorithm>
#include <cmath>

namespace tierstore {
namespace {

// Ascending (rate, last, key): a total order (keys are distinct).
struct EntryLess {
  bool operator()(const BlendOrder::Entry& a, const BlendOrder::Entry& b) const {
    if (a.rate != b.rate) return a.rate < b.rate;
    return a.last != b.last ? a.last < b.last : a.k < b.k;
  }
};

// primary_of's reciprocal, bit for bit.
inline double inv_of(double rate) { return 1.0 / std::max(rate, 1e-12); }

// Two inverse rates a < b farther apart than this give -(off + a) > -(off + b) for every
// offset off in [0, 1]: each sum rounds by at most half an ulp of 1 + b (margin 4x).
inline double merge_gap(double b) { return (1.0 + b) * 0x1p-51; }

}  // namespace

void BlendOrder::keeps() {
  // PolicyOrder's 1 - 2^(-1/h) (policy.cpp keep_of): the same pow, so bit-equal.
  keep1_ = 1.0 - std::pow(2.0, -1.0 / p_.half_life);
  keep2_ = p_.blended() ? 1.0 - std::pow(2.0, -1.0 / p_.half_life2) : 0.0;
}

void BlendOrder::rebuild() {
  keeps();
  for (Bucket& b : buckets_) {
    b.v.clear();
    b.sorted = false;  // appended below, sorted once when first asked
    b.detached = 0;
    b.memo = false;
    b.g1 = p_.gain;
    b.g2 = p_.gain2;
  }
  for (int64_t k = 0; k < p_.n_keys; ++k) {
    if (members_[k]) insert(k);
  }
}

void BlendOrder::insert(int64_t k) {
  const size_t bi = static_cast<size_t>(p_.pos[k]);
  const int64_t was = det_b_[k];
  if (was >= 0) {
    det_b_[k] = -1;
    Bucket& o = buckets_[static_cast<size_t>(was)];
    --o.detached;
    auto i = o.v.end();
    if (static_cast<size_t>(was) == bi && o.sorted) {
      if (o.v.size() > 128) {
        i = std::lower_bound(o.v.begin(), o.v.end(), det_e_[k], EntryLess{});
      } else {  // as erase_entry: a short scan finds the key's own entry
        i = o.v.begin();
        while (i != o.v.end() && i->k != k) ++i;
      }
    }
    if (i != o.v.end() && i->k == k) {
      // Read again at its position: one rotate carries the old entry to the new one's
      // place (the other entries keep their order, as erase + insert leaves them).
      o.memo = false;
      Entry e = entry_of(k);
      e.rate = key_rate(k, o.g1, o.g2);
      const EntryLess less;
      auto j = std::lower_bound(o.v.begin(), o.v.end(), e, less);
      if (j > i) {  // after the old entry: lands just before j once the old one is out
        std::rotate(i, i + 1, j);
        *(j - 1) = e;
      } else {
        std::rotate(j, i, i + 1);
        *j = e;
      }
      return;
    }
    erase_entry(o, det_e_[k]);
  }
  if (buckets_.size() <= bi) {
    if (buckets_.empty()) keeps();
    buckets_.resize(bi + 1);
  }
  Bucket& b = buckets_[bi];
  b.memo = false;
  if (b.v.empty()) {  // an empty bucket takes the current gains as its reference
    b.g1 = p_.gain;
    b.g2 = p_.gain2;
    b.sorted = true;
  }
  Entry e = entry_of(k);
  e.rate = key_rate(k, b.g1, b.g2);
  if (!b.sorted) {
    b.v.push_back(e);
    return;
  }
  b.v.insert(std::lower_bound(b.v.begin(), b.v.end(), e, EntryLess{}), e);
}

void BlendOrder::erase(int64_t k) {
  Bucket& b = buckets_[static_cast<size_t>(p_.pos[k])];
  b.memo = false;
  // The key's state is what it was inserted with: its reference rate is the entry's.
  Entry e = entry_of(k);
  e.rate = key_rate(k, b.g1, b.g2);
  erase_entry(b, e);
}

void BlendOrder::erase_entry(Bucket& b, const Entry& e) {
  // A linear scan of <= 128 entries (contiguous, predictable) beats a binary search's
  // dependent, mispredicted loads; longer sorted buckets are searched.
  auto it = b.v.begin();
  if (b.sorted && b.v.size() > 128) {
    it = std::lower_bound(b.v.begin(), b.v.end(), e, EntryLess{});
  } else {
    while (it != b.v.end() && it->k != e.k) ++it;
  }
  if (it != b.v.end() && it->k == e.k) b.v.erase(it);
}

void BlendOrder::detach(int64_t k) {
  const int64_t bi = p_.pos[k];
  Bucket& b = buckets_[static_cast<size_t>(bi)];
  b.memo = false;
  Entry e = entry_of(k);
  e.rate = key_rate(k, b.g1, b.g2);
  if (++b.detached < b.v.size()) {
    det_b_[k] = static_cast<int32_t>(bi);
    det_e_[k] = e;
    return;
  }
  // Every key of the bucket detached: erase would have emptied it, so empty it now (the
  // first insert then takes the current gains as its reference, as after erase).
  for (const Entry& x : b.v) det_b_[x.k] = -1;
  b.v.clear();
  b.detached = 0;
}

void BlendOrder::resort(Bucket& b) {
  b.g1 = p_.gain;
  b.g2 = p_.gain2;
  for (Entry& e : b.v) e.rate = key_rate(e.k, b.g1, b.g2);
  if (!b.sorted) {
    std::sort(b.v.begin(), b.v.end(), EntryLess{});
  } else {  // the clock moves few keys past each other: insertion sort
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
}

void BlendOrder::candidate(size_t bi, const uint8_t* pinned, double off, Cand& c) {
  Bucket& b = buckets_[bi];
  c.k = -1;
  if (b.v.empty()) return;
  if (b.memo && b.memo_t == p_.t && !excluded(b.memo_k, pinned)) {
    c.k = b.memo_k;
    c.last = b.memo_last;
    c.primary = -(off + b.memo_inv);
    return;
  }
  const double g1 = p_.gain, g2 = p_.gain2;
  bool moved = b.g1 != g1 || (p_.blended() && b.g2 != g2);
  // A small bucket costs less to order at the new clock once than to bound on every scan.
  if (!b.sorted || (moved && b.v.size() <= 64)) {
    resort(b);
    moved = false;
  }
  // A key's current rate is at least rho times its reference rate (less a margin far
  // above the rounding of either rate): the bound that ends the scan.
  double rho = 1.0;
  if (moved) rho = (p_.blended() ? std::min(b.g1 / g1, b.g2 / g2) : b.g1 / g1) * (1.0 - 1e-12);
  const Entry* v = b.v.data();
  const size_t m = b.v.size();
  // Pass 1: the greatest inverse rate (ties: least (last, key)) and the greatest other.
  size_t best = m;
  double ib = 0.0, i2 = -1.0;
  bool skipped = false;
  size_t i = 0;
  for (; i < m; ++i) {
    if (best < m) {
      // No later key's inverse exceeds this one's bound (inv_of is monotone).
      const double ub = moved ? inv_of(v[i].rate * rho) : inv_of(v[i].rate);
      if (ub < ib - merge_gap(ib)) break;
    }
    if (excluded(v[i].k, pinned)) {
      skipped = true;
      continue;
    }
    const double inv = moved ? inv_of(key_rate(v[i].k, g1, g2)) : inv_of(v[i].rate);
    if (best == m || inv > ib) {
      if (best < m) i2 = std::max(i2, ib);
      best = i;
      ib = inv;
    } else if (inv == ib) {
      if (v[i].last != v[best].last ? v[i].last < v[best].last : v[i].k < v[best].k) best = i;
    } else {
      i2 = std::max(i2, inv);
    }
  }
  if (best == m) return;
  const int64_t bk = v[best].k, blast = v[best].last;
  const size_t scanned = i;
  if (i2 < ib - merge_gap(ib)) {
    // No distinct inverse within rounding of the best: the coldest at every offset,
    // remembered while the bucket and the clock stay (unless an exclusion shaped it).
    c.k = bk;
    c.last = blast;
    c.primary = -(off + ib);
    if (!skipped) {
      b.memo = true;
      b.memo_t = p_.t;
      b.memo_inv = ib;
      b.memo_k = bk;
      b.memo_last = blast;
    }
  } else {
    // Distinct inverses within rounding: this offset decides which primaries merge.
    // The exact order at this offset, the scan ended by the same bound on primaries.
    double pb = 0.0;
    size_t bj = m;
    for (size_t j = 0; j < m; ++j) {
      if (bj < m) {
        const double ub = moved ? inv_of(v[j].rate * rho) : inv_of(v[j].rate);
        if (-(off + ub) > pb) break;
      }
      if (excluded(v[j].k, pinned)) continue;
      const double inv = moved ? inv_of(key_rate(v[j].k, g1, g2)) : inv_of(v[j].rate);
      const double pk = -(off + inv);
      if (bj == m || pk < pb ||
          (pk == pb && (v[j].last != v[bj].last ? v[j].last < v[bj].last : v[j].k < v[bj].k))) {
        bj = j;
        pb = pk;
      }
    }
    c.k = v[bj].k;
    c.last = v[bj].last;
    c.primary = pb;
  }
  // The clock has moved far enough that scans grow: order the bucket at it again.
  if (moved && scanned > 8) resort(b);
}

void BlendOrder::victims(int64_t n, const uint8_t* pinned, std::vector<int64_t>& out) {
  out.clear();
  if (n <= 0) return;
  // PolicyOrder::off_over_l of every bucket (off / L for off in 1..L: the same divisions).
  const int64_t L = p_.per_tick, c0 = std::max<int64_t>(p_.group - 1, 0);
  if (static_cast<int64_t>(off_l_.size()) != L + 1) {
    off_l_.resize(static_cast<size_t>(L + 1));
    const double ld = static_cast<double>(L);
    for (int64_t o = 0; o <= L; ++o) off_l_[o] = static_cast<double>(o) / ld;
  }
  const auto off_of = [&](size_t bi) {
    int64_t o = static_cast<int64_t>(bi) - c0;
    if (o <= 0) o += L;
    return off_l_[static_cast<size_t>(o)];
  };
  // Each bucket's candidate depends only on its own keys, the clock and the exclusions
  // among its keys; taking a victim changes only the victim's bucket, so the others'
  // candidates hold for the whole call (evaluated once, not once per victim).
  cands_.resize(buckets_.size());
  for (size_t bi = 0; bi < buckets_.size(); ++bi)
    candidate(bi, pinned, off_of(bi), cands_[bi]);
  const size_t nb = cands_.size();
  while (static_cast<int64_t>(out.size()) < n) {
    // The least (primary, last, key) over the candidates; an empty one (k = -1) never
    // wins. Selects instead of branches: which bucket wins is data, not a pattern.
    size_t bi = nb;
    for (size_t j = 0; j < nb; ++j) {
      const Cand& c = cands_[j];
      const Cand& w = cands_[bi < nb ? bi : j];
      const bool better = c.k >= 0 &&
          (bi == nb || c.primary < w.primary ||
           (c.primary == w.primary && (c.last != w.last ? c.last < w.last : c.k < w.k)));
      bi = better ? j : bi;
    }
    if (bi == nb) break;
    const int64_t k = cands_[bi].k;
    out.push_back(k);
    taken_[k] = 1;
    // The victim's bucket needs a new candidate only if another victim is wanted.
    if (static_cast<int64_t>(out.size()) < n) candidate(bi, pinned, off_of(bi), cands_[bi]);
  }
  for (int64_t k : out) taken_[k] = 0;
}

}  // namespace tierstore
