// Routing fold (fold.hpp): counts per dense key, taken with the hit split once per step.
#include "tierstore/store/fold.hpp"

#include <stdexcept>

namespace tierstore {

RoutingFold::RoutingFold(int64_t n_layers, int64_t n_experts)
    : n_layers_(n_layers), n_experts_(n_experts) {
  if (n_layers <= 0 || n_experts <= 0)
    throw std::invalid_argument("RoutingFold: n_layers and n_experts must be > 0");
  counts_.assign(static_cast<size_t>(n_layers * n_experts), 0);
  keys_.resize(counts_.size() + kKeysSkew);
  touched_.resize(counts_.size() + 1);  // +1: the branch-free write past the last key
  taken_.resize(counts_.size() + kCountsSkew);
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

void RoutingFold::add_counts(const int64_t* counts) {
  listing_ = false;  // the keys are not listed: take() scans (it resets to listing)
  const int64_t n = n_keys();
  for (int64_t k = 0; k < n; ++k)
    if (counts[k] > 0) counts_[k] += counts[k];
}

template void RoutingFold::add<int8_t>(int64_t, const int8_t*, int64_t);
template void RoutingFold::add<int16_t>(int64_t, const int16_t*, int64_t);
template void RoutingFold::add<int32_t>(int64_t, const int32_t*, int64_t);
template void RoutingFold::add<int64_t>(int64_t, const int64_t*, int64_t);
template void RoutingFold::add<uint8_t>(int64_t, const uint8_t*, int64_t);
template void RoutingFold::add<uint16_t>(int64_t, const uint16_t*, int64_t);
template void RoutingFold::add<uint32_t>(int64_t, const uint32_t*, int64_t);

namespace {

// One key into the outputs; the hit split is a second pass (split_hits) so neither loop
// has more live values than registers (one fused loop spilled its sums to the stack and
// ran at ~6 ns a key).
inline void collect(int64_t k, int64_t c, int64_t* __restrict counts, int64_t* __restrict keys_out,
                    double* __restrict counts_out, int64_t& out, uint8_t* __restrict seen) {
  counts[k] = 0;
  keys_out[out] = k;
  counts_out[out] = static_cast<double>(c);
  ++out;
  if (seen) seen[k] = 1;
}

void split_hits(const int64_t* __restrict keys, const double* __restrict counts, int64_t n,
                const int32_t* __restrict pool_slot, const int32_t* __restrict arena_slot,
                FoldTally* tally) {
  // Token sums in doubles (exact below 2^53, far above any step) live in SIMD registers.
  double tok_all = 0, tok_pool = 0, tok_arena = 0, tok_both = 0;
  int64_t n_pool = 0, n_arena = 0, n_both = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t k = keys[i];
    const double c = counts[i];
    const int in_pool = pool_slot ? pool_slot[k] >= 0 : 0;
    const int in_arena = arena_slot ? arena_slot[k] >= 0 : 0;
    const int both = in_pool & in_arena;
    tok_all += c;
    tok_pool += in_pool ? c : 0.0;
    tok_arena += in_arena ? c : 0.0;
    tok_both += both ? c : 0.0;
    n_pool += in_pool;
    n_arena += in_arena;
    n_both += both;
  }
  const auto t_all = static_cast<int64_t>(tok_all), t_pool = static_cast<int64_t>(tok_pool);
  const auto t_arena = static_cast<int64_t>(tok_arena), t_both = static_cast<int64_t>(tok_both);
  tally->tokens[3] = t_both;
  tally->tokens[2] = t_pool - t_both;
  tally->tokens[1] = t_arena - t_both;
  tally->tokens[0] = t_all - t_pool - t_arena + t_both;
  tally->keys[3] = n_both;
  tally->keys[2] = n_pool - n_both;
  tally->keys[1] = n_arena - n_both;
  tally->keys[0] = n - n_pool - n_arena + n_both;
}

}  // namespace

int64_t RoutingFold::take(uint8_t* seen, const int32_t* pool_slot, const int32_t* arena_slot,
                          FoldTally* tally) {
  const int64_t n_keys = this->n_keys();
  int64_t* __restrict counts = counts_.data();
  int64_t* __restrict keys_out = keys_.data() + kKeysSkew;
  double* __restrict counts_out = taken_.data() + kCountsSkew;
  int64_t out = 0;
  const bool listed = listing_;
  const int64_t n_listed = n_touched_;
  listing_ = true;
  n_touched_ = n_ids_ = 0;
  if (listed) {
    const int64_t* touched = touched_.data();
    for (int64_t i = 0; i < n_listed; ++i) {
      const int64_t k = touched[i];
      collect(k, counts[k], counts, keys_out, counts_out, out, seen);
    }
  } else {
    // A linear scan of the counts gives the keys already sorted (a sort of the touched
    // keys would not be cheaper at batch 256); blocks of 8 all-zero counts are skipped
    // with one branch.
    constexpr int64_t kBlock = 8;
    for (int64_t base = 0; base < n_keys; base += kBlock) {
      const int64_t end = base + kBlock < n_keys ? base + kBlock : n_keys;
      int64_t any = 0;
      for (int64_t k = base; k < end; ++k) any |= counts[k];
      if (any == 0) continue;
      for (int64_t k = base; k < end; ++k) {
        const int64_t c = counts[k];
        if (c != 0) collect(k, c, counts, keys_out, counts_out, out, seen);
      }
    }
  }
  if (tally) split_hits(keys_out, counts_out, out, pool_slot, arena_slot, tally);
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

int64_t unique_dense_keys(const int64_t* pairs, int64_t n, int64_t n_layers, int64_t n_experts,
                          const uint8_t* written, uint8_t* mark, int64_t* out) {
  int64_t m = 0;
  bool bad = false;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t layer = pairs[2 * i], expert = pairs[2 * i + 1];
    if (static_cast<uint64_t>(layer) >= static_cast<uint64_t>(n_layers) ||
        static_cast<uint64_t>(expert) >= static_cast<uint64_t>(n_experts) ||
        (written && !written[layer])) {
      bad = true;
      break;
    }
    const int64_t key = layer * n_experts + expert;
    out[m] = key;
    m += mark[key] == 0;  // branch-free: kept only the first time
    mark[key] = 1;
  }
  for (int64_t i = 0; i < m; ++i) mark[out[i]] = 0;
  return bad ? -1 : m;
}

}  // namespace tierstore
