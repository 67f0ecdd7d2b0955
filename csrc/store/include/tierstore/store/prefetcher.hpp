// The prefetcher's rules (cross-layer and next-token prefetch, budgeted in reads,
// learned online), written once: tierstore/policies/prefetch.py (the live store's hook,
// tierstore/store/prefetch.py) and the simulator (tierstore/sim/prefetching.py) both drive
// this core, through csrc/python/bind_prefetch.cpp. The Python faces' module docs explain
// the model and the budget; the comments here say where the code departs from the obvious.
//
// It was a Python loop of ~60 numpy calls per read of the slot table (~100 us a layer at
// DeepSeek-V4-Flash's 43 x 256 keys, under the store lock on the forward path).
//
// CoRouting: decayed co-routing counts (cross-layer at distance d, next-token), a lazy global
// gain (a tick costs O(1)), pooled estimates shrunk toward the target layer's marginal, and
// Bayesian model averaging with forgetting between the two predictors.
//
// Sums over arrays are spelled as numpy's (pairwise_sum below) so the faces' documented
// figures keep their meaning; exp / log / pow are libm's (numpy's SIMD ones may differ in
// the last bit, so the figures measured with the former Python loop can move slightly).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "tierstore/store/policy.hpp"
#include "tierstore/store/replay.hpp"

namespace tierstore {

// numpy's float64 add.reduce over a contiguous array (loops_utils.h pairwise_sum): the
// same rounding as the face's np.sum, so a budget compares the same way.
double pairwise_sum(const double* a, int64_t n);

class CoRouting {
 public:
  CoRouting(int64_t n_layers, int64_t n_experts, int64_t distance = 1, double half_life = 512.0,
            double prior_weight = 4.0);

  void tick();
  // `layer` routed experts[0:n] (distinct); weight: 1 / the group's tokens.
  void observe(int64_t layer, const int64_t* experts, int64_t n, double weight = 1.0);
  // src (layer `layer`, or layer `layer` a tick earlier when temporal) was followed by dst
  // (layer `layer + distance`, or `layer` now).
  void learn(int64_t layer, const int64_t* src, int64_t ns, const int64_t* dst, int64_t nd,
             bool temporal, double weight = 1.0);
  bool seen(int64_t layer) const { return marginal_n[static_cast<size_t>(layer)] > 0; }
  // out[0:E] = P(each expert routed) at layer + distance (cross) or layer next tick
  // (temporal) given src at `layer`; zeros without evidence.
  void predict(int64_t layer, const int64_t* src, int64_t ns, bool temporal, double* out) const;
  // out = the BMA mix of two predictions (both given).
  void mix(const double* p_cross, const double* p_temp, double* out) const;
  // Each predictor's decayed log-likelihood of `actual` (both given, actual non-empty).
  void score(const double* p_cross, const double* p_temp, const int64_t* actual, int64_t n,
             int64_t per_token);
  // out = P(routed by any of `tokens` tokens) from the per-token q (null: uniform).
  static void present(const double* q, double tokens, double per_token, int64_t n_experts,
                      double* out);

  const int64_t n_layers, n_experts, distance;
  const double half_life, prior_weight;
  // Row-major: cross [n_layers - distance (>= 1)][E][E], cross_n [..][E], temporal [L][E][E],
  // temporal_n [L][E], marginal [L][E], marginal_n [L].
  std::vector<double> cross, cross_n, temporal, temporal_n, marginal, marginal_n;
  double t = 0.0, gain = 1.0;
  double loglik[2] = {0.0, 0.0};  // cross, next-token

 private:
  int64_t cross_layers() const { return n_layers - distance > 1 ? n_layers - distance : 1; }
};

// Prefetcher parameters (prefetch.py's documented defaults; the face checks the ranges).
struct PrefetchParams {
  double read_ratio = 1.0;
  int64_t lead = 1;
  double threshold = 0.2;
  double half_life = 512.0;
  int64_t max_per_read = -1;  // -1: no cap beyond the expected routed count
  int64_t top_k = -1;         // -1: the fewest routings a group had so far
  bool cross = true, temporal = true;
};

class Prefetcher {
 public:
  // victims(n, blocked) -> the keys n new rows would evict, in order (-1: a free slot).
  using Victims = std::function<std::vector<int64_t>(int64_t, const bool*)>;

  // The budget's constants (measured with the former Python loop, same rules).
  static constexpr double kPrecisionHalfLife = 64.0;  // ticks over which usefulness counts half
  static constexpr double kThresholdStep = 1.02;      // the price's multiplicative step
  static constexpr double kMinThreshold = 0.1, kMaxThreshold = 0.9;
  // Standard deviations of a proposal's cost kept in credit. A wide margin cuts short the
  // proposals of many uncertain candidates, so the price rises and the same reads go to
  // likelier ones (FLAME, 51 slots, auto+prefetch at LRU's reads: Z 2 / 5 / 8 / 20 close
  // 0.33 / 0.34 / 0.354 / 0.37 of the latency gap with the old auto experts, 0.3455 at Z 8
  // with the current ones; at 102 / 205 slots Z 8 gives 0.46 / 0.51 against 0.43 / 0.50;
  // synthetic seeds 0 / 1 and the batched setting unchanged within 0.01). Holding resident
  // keys by calibrated p, or not at all, moved FLAME 51 by < 0.002: not the lever.
  static constexpr double kZ = 8.0;
  // Credit charged per recently wasted prefetch (reads). The victim's own re-read is priced
  // at proposal time (harm), so a full read here counted it twice: FLAME 51 / 102 / 205
  // 0.3455 / 0.4629 / 0.5088 -> 0.3532 / 0.4628 / 0.5160 of the latency gap with the harm
  // term and 0.5 (reads <= LRU's), batched 1.29 / 1.15 / 1.00 -> 1.30 / 1.18 / 1.00,
  // synthetic seeds 0 / 1 within 0.003. No charge (0) spent past LRU's reads on FLAME 51;
  // the harm term at a full read cost the batched setting 0.04 at 410 slots.
  static constexpr double kWastedRead = 0.5;
  static constexpr int kBins = 20;           // calibration bins over the raw probability
  static constexpr double kCalPrior = 2.0;   // observations' weight of the raw estimate in a bin
  static constexpr double kCalFloor = 0.01;  // raw probability below which none is scored
  // Fetch only among the likeliest `expect` (a token routes a fixed count: a key outside
  // them competes with likelier ones; FLAME at 205 slots 0.41 of the gap fetching any
  // candidate, 0.51 only these).

  Prefetcher(int64_t n_layers, int64_t n_experts, int64_t capacity, const PrefetchParams& params);

  // Layer `layer` read experts[0:n] (distinct, ascending), hit[i] = resident; routings < 0:
  // one per expert. Returns the keys to unpin (what was held for this layer).
  std::vector<int64_t> on_read(int64_t layer, const int64_t* experts, int64_t n, const bool* hit,
                               int64_t routings);
  // The target of a proposal after `layer` reads: (m, wraps).
  std::pair<int64_t, bool> target(int64_t layer) const;
  // The model's probabilities for target m (out[0:E]); false: no prediction. Records the two
  // predictors' outputs for scoring when m reads (also when a caller overrides the answer).
  bool predict(int64_t layer, int64_t m, bool wraps, double* out);
  // The proposal after `layer` read, from probabilities p[0:E] of its target (null: none):
  // fetch (read now, likeliest first) and hold (fetch included, pinned until m reads).
  void propose(int64_t layer, const double* p, const bool* resident, const Victims* victims,
               std::vector<int64_t>& fetch, std::vector<int64_t>& hold);
  void end_tick();

  double credit() const {
    return read_ratio_ * static_cast<double>(lru_reads) - static_cast<double>(reads()) +
           in_flight_p - kWastedRead * wasted_w_;
  }
  double precision() const { return (useful_w_ + 0.5) / (issued_w_ + 1.0); }
  double calibrated(double p, int kind) const {
    const int b = bin(p);
    return (cal_hit_[kind][b] + kCalPrior * p) / (cal_n_[kind][b] + kCalPrior);
  }
  int64_t reads() const { return misses + issued; }

  const int64_t n_layers, n_experts, n_keys, capacity, lead;
  CoRouting model;
  std::unique_ptr<bool[]> held_mask;  // [n_keys]: pinned by a proposal until its layer reads
  int64_t lru_reads = 0, misses = 0, issued = 0, useful = 0, held_resident = 0, in_flight = 0;
  double in_flight_p = 0.0, last_cost = 0.0, threshold, hold_threshold;

  // Per layer: the keys held for it, and the experts it read this tick / last tick (has_*).
  const std::vector<int64_t>& held(int64_t layer) const { return held_[static_cast<size_t>(layer)]; }
  bool has_this(int64_t layer) const { return this_[static_cast<size_t>(layer)].has; }
  const std::vector<int64_t>& this_experts(int64_t layer) const {
    return this_[static_cast<size_t>(layer)].experts;
  }

 private:
  struct Routed {  // a layer's experts in one tick (has = false: the layer did not read)
    bool has = false;
    std::vector<int64_t> experts;
  };
  struct Pending {  // the two predictors' outputs for a target, scored when it reads
    bool has = false, has_cross = false, has_temp = false;
    std::vector<double> cross, temp;
  };
  struct Scored {  // non-resident candidates scored for calibration, checked when m reads
    bool has = false;
    int kind = 0;
    std::vector<int64_t> keys, bins;
  };

  static int bin(double p) {
    const int64_t b = static_cast<int64_t>(p * kBins);
    return static_cast<int>(b < kBins - 1 ? b : kBins - 1);
  }
  double per_token() const {
    return static_cast<double>(top_k_ > 0 ? top_k_ : (k_seen_ > 1 ? k_seen_ : 1));
  }
  double tokens(int64_t routings) const {
    const double t = static_cast<double>(routings) / per_token();
    return t > 1.0 ? t : 1.0;
  }
  void learn(int64_t layer, const int64_t* experts, int64_t n);
  void shadow_read(const int64_t* keys, int64_t n);
  void tune(bool short_, double spare);
  // h[0:n]: P(the victim of the i-th fetch is routed at its layer's next read).
  void harm(int64_t layer, int64_t m, const double* p, const std::vector<int64_t>& keep,
            int64_t n, const Victims& victims, std::vector<double>& h);

  const double read_ratio_;
  const int64_t max_per_read_, top_k_;
  const bool use_cross_, use_temporal_;
  const double decay_;
  std::vector<std::vector<int64_t>> held_, fetched_;
  std::vector<std::vector<double>> fetched_p_;
  std::vector<Scored> scored_;
  std::vector<Pending> pending_;
  std::vector<Routed> this_, prev_;
  std::vector<double> tok_this_, tok_prev_;
  double useful_w_ = 0.0, issued_w_ = 0.0, wasted_w_ = 0.0;
  double cal_n_[2][kBins] = {}, cal_hit_[2][kBins] = {};
  int64_t k_seen_ = 0;
  // The budget's reference: plain LRU demand fill of the same reads (keys only).
  std::vector<int64_t> shadow_last_;
  std::unique_ptr<bool[]> shadow_resident_;
  PolicyView shadow_view_;
  std::unique_ptr<PolicyTier> shadow_;
  std::unique_ptr<bool[]> routed_;  // scratch: the keys of the read
  // Scratch of a proposal.
  std::vector<double> pbuf_, q_, pc_, cost_, harm_;
  std::vector<int64_t> order_, keep_, cand_, idx_, miss_, rkeys_;
  std::vector<uint8_t> top_;
  std::unique_ptr<bool[]> blocked_;
};

}  // namespace tierstore
