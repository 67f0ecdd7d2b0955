// Routing fold of the ExpertStore: token counts per dense key (layer * n_experts + expert),
// added one MoE layer at a time and taken, with the hit split, once per step.
//
// Why native: a DeepSeek-V4-Flash decode step records 43 layers x top-6 x batch ids
// (66k at batch 256); folding them with numpy costs 10-30 array calls per step, each a
// few microseconds on a small CPU. One pass here costs about a nanosecond per id.
//
// Thread safety: none. The Python binding keeps the GIL for every call (they are
// short and never wait), which serialises add and take.
#pragma once

#include <cstdint>
#include <vector>

namespace tierstore {

// What one take() found, besides the keys and counts it wrote out.
struct FoldTally {
  // Index = residency category of a key: 0 in neither tier, 1 arena only, 2 pool only,
  // 3 both. tokens: summed counts, keys: distinct keys.
  int64_t tokens[4] = {0, 0, 0, 0};
  int64_t keys[4] = {0, 0, 0, 0};
};

class RoutingFold {
 public:
  RoutingFold(int64_t n_layers, int64_t n_experts);

  int64_t n_layers() const { return n_layers_; }
  int64_t n_experts() const { return n_experts_; }
  int64_t n_keys() const { return n_layers_ * n_experts_; }
  // Keys with a non-zero count since the last take (a scan: tests and introspection).
  int64_t n_pending() const;

  // Count ``n`` expert ids of ``layer`` (0 <= layer < n_layers, checked by the caller).
  // Ids < 0 are padding; ids >= n_experts are dropped and counted (first one remembered).
  template <typename Id>
  void add(int64_t layer, const Id* ids, int64_t n);
  // Add dense per-key counts (n_keys of them, e.g. a CUDA store's device counter
  // copied to the host): take() then scans every key. Counts <= 0 are ignored.
  void add_counts(const int64_t* counts);

  // Collect the touched keys (first-counted order while listing, else ascending) and their counts into keys() / counts(), mark
  // seen[key] = 1, split the counts by residency (resident_slot >= 0; either array may
  // be null = no such tier) and reset to empty. Returns how many keys were collected;
  // keys() / counts() hold them until the next take.
  int64_t take(uint8_t* seen, const int32_t* pool_slot, const int32_t* arena_slot,
               FoldTally* tally);
  const int64_t* keys() const { return keys_.data() + kKeysSkew; }
  const double* counts() const { return taken_.data() + kCountsSkew; }

  // Dropped ids since the last call, and the first one's (layer, id); resets them.
  int64_t take_dropped(int64_t* first_layer, int64_t* first_id);

 private:
  void drop(int64_t layer, int64_t id);
  int64_t n_layers_, n_experts_;
  // The output buffers start at different offsets mod 4 KiB from counts_ (all three are
  // page-aligned mmaps of the same size): otherwise the store to keys[i] and the load of
  // counts[k ~ i] alias mod 4 KiB and take stalls (measured 6 ns a key instead of ~1).
  static constexpr int64_t kKeysSkew = 72, kCountsSkew = 144;
  std::vector<int64_t> counts_;  // per key since the last take
  std::vector<int64_t> keys_;    // what the last take collected (room for every key)
  // Few ids since the last take (a batch-1 decode step): add() also lists each key on its
  // first count, and take() visits only those. Past kTouchedIds ids it stops listing
  // (that would cost a dependent store per id) and take() scans every count instead.
  static constexpr int64_t kTouchedIds = 2048;
  std::vector<int64_t> touched_;
  int64_t n_touched_ = 0, n_ids_ = 0;
  bool listing_ = true;
  std::vector<double> taken_;
  int64_t dropped_ = 0, first_bad_layer_ = -1, first_bad_id_ = -1;
};

// (layer, expert) pairs -> dense ids, unique, in first-seen order (a fire's routed keys).
// ``pairs`` holds n rows of two int64; ``written`` one flag per layer (null: all written);
// ``mark`` is n_keys bytes of zeros, left zeroed. Returns how many ids went to ``out``
// (room for n), or -1 when a pair is out of range or in an unwritten layer (the caller
// then reports it with the pack's own checks).
int64_t unique_dense_keys(const int64_t* pairs, int64_t n, int64_t n_layers, int64_t n_experts,
                          const uint8_t* written, uint8_t* mark, int64_t* out);

}  // namespace tierstore
