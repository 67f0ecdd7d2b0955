// See min_replay.hpp: MIN's demand fill over a max-heap of (next use, key).
#include "tierstore/store/min_replay.hpp"

#include <algorithm>
#include <vector>

namespace tierstore {
namespace {

// A resident key's entry at the next use it was given. Entries go stale when the key is
// read again (a later next use) or evicted; they are skipped when they surface, so an
// access costs one push and no search.
struct Entry {
  int64_t next, k;
};
// Max-heap order: the coldest on top (farthest next use; equal ones, the smaller key).
struct Hotter {
  bool operator()(const Entry& a, const Entry& b) const {
    return a.next != b.next ? a.next < b.next : a.k > b.k;
  }
};

class MinReplayer {
 public:
  MinReplayer(const ReplayTrace& tr, const int64_t* next_use, int64_t n_keys, int64_t slots,
              bool skip, int64_t* next, bool* resident)
      : tr_(tr), next_use_(next_use), n_keys_(n_keys), slots_(slots), skip_(skip),
        next_(next), resident_(resident), pinned_(static_cast<size_t>(n_keys), 0) {
    for (int64_t k = 0; k < n_keys_; ++k)
      if (resident_[k]) push(k);
    n_resident_ = static_cast<int64_t>(heap_.size());
  }

  ReplayCounts run(bool* hit) {
    for (int64_t g = 0; g < tr_.n_groups; ++g) {
      const int64_t a = tr_.starts[g], b = tr_.starts[g + 1];
      split_group(tr_, a, b, resident_, hit, miss_);
      // The policy's on_access: each read key learns when it is read next. A resident
      // key's entry moves (a new one; the old goes stale).
      for (int64_t i = a; i < b; ++i) {
        const int64_t k = tr_.keys[i];
        next_[k] = next_use_[i];
        if (resident_[k]) push(k);
      }
      if (!miss_.empty()) demand(a, b);
      // Stale entries outnumber live ones: drop them (the heap stays within ~2x the set).
      if (heap_.size() > 2 * static_cast<size_t>(n_resident_) + 64) compact();
    }
    return counts_;
  }

 private:
  void push(int64_t k) {
    heap_.push_back(Entry{next_[k], k});
    std::push_heap(heap_.begin(), heap_.end(), Hotter{});
  }
  bool live(const Entry& e) const { return resident_[e.k] && next_[e.k] == e.next; }

  // sim/demand.py Filler.demand + policies/fill.py plan_fill.
  void demand(int64_t a, int64_t b) {
    const int64_t n = static_cast<int64_t>(miss_.size());
    counts_.demand_reads += n;
    const int64_t n_free = std::max<int64_t>(slots_ - n_resident_, 0);
    if (n <= n_free) {
      for (int64_t k : miss_) admit(k);
      return;
    }
    if (skip_) {  // BeladyPolicy.rank: soonest next use first, stable
      std::stable_sort(miss_.begin(), miss_.end(),
                       [this](int64_t x, int64_t y) { return next_[x] < next_[y]; });
    }
    const bool some_hit = n < b - a;  // a group that missed entirely protects nothing
    if (some_hit) for (int64_t i = a; i < b; ++i) pinned_[tr_.keys[i]] = 1;
    victims(n - n_free);
    if (some_hit) for (int64_t i = a; i < b; ++i) pinned_[tr_.keys[i]] = 0;
    const int64_t nv = static_cast<int64_t>(vic_.size());
    counts_.rejected += n - n_free - nv;
    for (int64_t j = 0; j < n_free; ++j) admit(miss_[j]);
    for (int64_t j = 0; j < nv; ++j) {
      const int64_t c = miss_[n_free + j], v = vic_[j];
      if (skip_ && !(next_[c] < next_[v])) {
        ++counts_.rejected;
        continue;
      }
      resident_[v] = false;  // its entry is now stale
      --n_resident_;
      ++counts_.evictions;
      admit(c);
    }
  }

  // The `want` coldest unpinned resident keys, coldest first, into vic_. The pinned ones
  // met on the way (and the victims themselves, still resident until the pairs decide)
  // go back on the heap.
  void victims(int64_t want) {
    vic_.clear();
    aside_.clear();
    while (static_cast<int64_t>(vic_.size()) < want && !heap_.empty()) {
      std::pop_heap(heap_.begin(), heap_.end(), Hotter{});
      const Entry e = heap_.back();
      heap_.pop_back();
      if (!live(e)) continue;
      if (!pinned_[e.k]) vic_.push_back(e.k);
      aside_.push_back(e);
    }
    for (const Entry& e : aside_) {
      heap_.push_back(e);
      std::push_heap(heap_.begin(), heap_.end(), Hotter{});
    }
  }

  void compact() {
    size_t w = 0;
    for (const Entry& e : heap_)
      if (live(e)) heap_[w++] = e;
    heap_.resize(w);
    std::make_heap(heap_.begin(), heap_.end(), Hotter{});
  }

  void admit(int64_t k) {
    resident_[k] = true;
    ++n_resident_;
    push(k);
  }

  const ReplayTrace& tr_;
  const int64_t* next_use_;
  const int64_t n_keys_, slots_;
  const bool skip_;
  int64_t* next_;
  bool* resident_;
  int64_t n_resident_ = 0;
  std::vector<uint8_t> pinned_;
  std::vector<Entry> heap_, aside_;
  std::vector<int64_t> miss_, vic_;
  ReplayCounts counts_;
};

}  // namespace

ReplayCounts replay_min(const ReplayTrace& tr, const int64_t* next_use, int64_t n_keys,
                        int64_t slots, bool skip, int64_t* next, bool* resident, bool* hit) {
  check_trace_keys(tr, n_keys);
  MinReplayer r(tr, next_use, n_keys, slots, skip, next, resident);
  return r.run(hit);
}

}  // namespace tierstore
