// The self-tuning policy's rules (tierstore/policies/auto.py describes the algorithm),
// written once: the live store's AutoPolicy.on_access / decay and the native
// replay (auto_replay.cpp) both call this class, so the two cannot drift apart.
//
// Follow the leader over shadow experts. The expert list is data: one PolicyView per
// expert (any kinds of policy.hpp, any half-lives, in index order; index 0 is the prior
// and ties go to the lower index). One access call = one read of the slot table:
//   for each expert, in index order:
//     score += its shadow's hits among the call's keys (each distinct key once: a hit
//              saves one read however many tokens it serves)
//     its on_access (with the call's weights)
//     its misses filled into its shadow (`capacity` slots, the call's keys blocked,
//              hottest first and its own admission filter when it has one: the one
//              fill of replay.hpp PolicyTier, so a shadow is that expert replayed alone)
//   leader = the first expert of highest score (with a long window: of the highest sum
//            of the two windows' per-step rates, see choose_leader)
// decay(steps): every expert decays, scores *= score_decay^steps.
// The decisions over the real tier (victims, rank, admit) are the leader's, made by the
// caller through the leader's own rules.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "tierstore/store/policy.hpp"
#include "tierstore/store/replay.hpp"
#include "tierstore/store/resident_order.hpp"

namespace tierstore {

class AutoCore {
 public:
  // experts: the views (owned by the caller, alive as long as this core), each of n_keys
  // keys and distinct; scores: one per expert (the caller's array, updated in place).
  // Throws std::invalid_argument on an empty list, views of another size or a repeat.
  AutoCore(std::vector<PolicyView*> experts, int64_t capacity, double* scores,
           double score_decay, double long_decay = 0.0, bool meta = false);
  AutoCore(const AutoCore&) = delete;
  AutoCore& operator=(const AutoCore&) = delete;

  size_t size() const { return views_.size(); }
  int64_t n_keys() const { return n_keys_; }
  int64_t capacity() const { return capacity_; }
  const PolicyView& expert(size_t e) const { return *views_[e]; }
  int64_t leader() const { return leader_; }

  // One read of keys[0:n]: distinct and ascending (the order breaks the shadows' ranking
  // ties; callers sort), in range (checked by the caller). w / counts as policy_access.
  // mirror: an order of another key set by expert mirror_of's rules (the replay's real
  // resident set in the leader's order), kept current as that expert's state changes.
  void access(const int64_t* keys, int64_t n, const double* w, const int64_t* counts,
              ResidentOrder* mirror = nullptr, int64_t mirror_of = -1);
  // A tick ends, `steps` steps of the step clock. Returns true when expert `watch`'s heats
  // were rescaled (an order over its state, e.g. a mirror, must rebuild).
  bool decay(int64_t steps, int64_t watch = -1);
  // The experts' arrays were changed from outside (a reset): rebuild the shadow orders,
  // scores to 0, the prior leads.
  void reset();

 private:
  std::vector<PolicyView*> views_;
  std::vector<std::unique_ptr<PolicyTier>> tiers_;
  int64_t n_keys_ = 0, capacity_ = 0;
  double* scores_;
  double score_decay_;
  int64_t leader_ = 0;
  std::vector<int64_t> miss_;
  // The leader's choice (choose_leader): each expert's hits over two windows, a short one
  // (scores_, score_decay_) that follows phase changes and a long one (long_, long_decay_;
  // 0: none) that keeps a long-memory expert leading through short noise; each window's
  // sum weighted by (1 - its decay), a per-step hit rate, and the two rates added; ties
  // to the lower index. long_decay 0: the short window alone (the scores, as before).
  double long_decay_ = 0.0;
  std::vector<double> long_;
  // meta (needs a long window): instead of adding the two rates, follow the window whose
  // own leader would have hit more (each window's leader's hits, decayed by long_decay_;
  // a regret choice between the two windows, ties to the long one).
  bool meta_ = false;
  int64_t lead_short_ = 0, lead_long_ = 0;
  double meta_short_ = 0.0, meta_long_ = 0.0;
  std::vector<double> hits_;
  void choose_leader();
};

}  // namespace tierstore
