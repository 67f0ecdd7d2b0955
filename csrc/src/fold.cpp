// Routing fold (fold.hpp): counts per dense key, taken with the hit split once per step.
#include "tierstore/fold.hpp"

#include <stdexcept>

namespace tierstore {

RoutingFold::RoutingFold(int64_t n_layers, int64_t n_experts)
    : n_layers_(n_layers), n_experts_(n_experts) {
  if (n_layers <= 0 || n_experts <= 0)
    throw std::invalid_argument("RoutingFold: n_layers and n_experts must be > 0");
  counts_.assign(static_cast<size_t>(n_layers * n_experts), 0);
  keys_.resize(counts_.size());
  touched_.resize(counts_.size() + 1);  // +1: the branch-free write past the last key
  taken_.resize(counts_.size());
}

int64_t RoutingFold::n_pending() const {
  int64_t n = 0;
  for (int64_t c : counts_) n += c != 0;
  return n;
}

template <typename Id>
void RoutingFold::add(int64_t layer, const Id* ids, int64_t n) {
  int64_t* row = counts_.data() + layer * n_experts_;
  const uint64_t limit = static_cast<uint64_t>(n_experts_);
  n_ids_ += n;
  if (listing_ && n_ids_ > kTouchedIds) listing_ = false;
  if (listing_) {
    const int64_t key0 = layer * n_experts_;
    int64_t* touched = touched_.data();
    int64_t nt = n_touched_;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t id = static_cast<int64_t>(ids[i]);
      if (static_cast<uint64_t>(id) < limit) {  // one compare: a negative id is huge unsigned
        touched[nt] = key0 + id;                // branch-free: kept only on the first count
        nt += row[id]++ == 0;
      } else if (id >= 0) {
        drop(layer, id);
      }
    }
    n_touched_ = nt;
    return;
  }
  // Many ids: nothing but the increment, no dependency between ids (take scans).
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    if (static_cast<uint64_t>(id) < limit) {
      ++row[id];
    } else if (id >= 0) {  // >= n_experts: dropped (negative ids are padding)
      drop(layer, id);
    }
  }
}

template void RoutingFold::add<int8_t>(int64_t, const int8_t*, int64_t);
template void RoutingFold::add<int16_t>(int64_t, const int16_t*, int64_t);
template void RoutingFold::add<int32_t>(int64_t, const int32_t*, int64_t);
template void RoutingFold::add<int64_t>(int64_t, const int64_t*, int64_t);
template void RoutingFold::add<uint8_t>(int64_t, const uint8_t*, int64_t);
template void RoutingFold::add<uint16_t>(int64_t, const uint16_t*, int64_t);
template void RoutingFold::add<uint32_t>(int64_t, const uint32_t*, int64_t);

int64_t RoutingFold::take(uint8_t* seen, const int32_t* pool_slot, const int32_t* arena_slot,
                          FoldTally* tally) {
  const int64_t n_keys = this->n_keys();
  int64_t* counts = counts_.data();
  int64_t* keys_out = keys_.data();
  double* counts_out = taken_.data();
  int64_t out = 0;
  auto collect = [&](int64_t k, int64_t c) {
    counts[k] = 0;
    keys_out[out] = k;
    counts_out[out] = static_cast<double>(c);
    ++out;
    if (seen) seen[k] = 1;
    if (tally) {
      const int cat = (pool_slot && pool_slot[k] >= 0 ? 2 : 0) +
                      (arena_slot && arena_slot[k] >= 0 ? 1 : 0);
      tally->tokens[cat] += c;
      tally->keys[cat] += 1;
    }
  };
  const bool listed = listing_;
  const int64_t n_listed = n_touched_;
  listing_ = true;
  n_touched_ = n_ids_ = 0;
  if (listed) {
    for (int64_t i = 0; i < n_listed; ++i) collect(touched_[i], counts[touched_[i]]);
    return out;
  }
  // A linear scan of the counts gives the keys already sorted (a sort of the touched
  // keys would not be cheaper at batch 256); blocks of 8 all-zero counts are skipped
  // with one branch, so the scan of DS4's 11k keys is ~1-2 us.
  constexpr int64_t kBlock = 8;
  for (int64_t base = 0; base < n_keys; base += kBlock) {
    const int64_t end = base + kBlock < n_keys ? base + kBlock : n_keys;
    int64_t any = 0;
    for (int64_t k = base; k < end; ++k) any |= counts[k];
    if (any == 0) continue;
    for (int64_t k = base; k < end; ++k) {
      if (counts[k] != 0) collect(k, counts[k]);
    }
  }
  return out;
}

void RoutingFold::drop(int64_t layer, int64_t id) {
  if (dropped_ == 0) {
    first_bad_layer_ = layer;
    first_bad_id_ = id;
  }
  ++dropped_;
}

int64_t RoutingFold::take_dropped(int64_t* first_layer, int64_t* first_id) {
  const int64_t n = dropped_;
  *first_layer = first_bad_layer_;
  *first_id = first_bad_id_;
  dropped_ = 0;
  first_bad_layer_ = first_bad_id_ = -1;
  return n;
}

}  // namespace tierstore
