// Slot-aware fused-MoE decode kernel (T <= 16 tokens): a memory-bound grouped GEMV.
//
// For every routed (token t, k) pair with expert e = topk_ids[t*k + k]:
//   slot = slot_row[e];  weights = slot in [0, n_slots) ? pool + slot * pool_slot_bytes  (fp4 row)
//                                                       : base_rows + e * base_slot_bytes (2-bit row)
//   out[t] += topk_w[t*k+k] * W2 @ (silu(W13[:I] @ x_t) * (W13[I:] @ x_t))
// Row layouts are docs/INTERNALS.md "Expert rows" (linear nibble order). Ids outside
// [0, E) contribute nothing. Each distinct routed expert's bytes are read once for all
// the pairs that use it (up to 8 pairs per pass; more pairs re-read it, mostly from L2).
//
// Three kernels on `stream`: w13 + SiLU -> h [T*k, I] f32, w2 -> y [T*k, H] f32, then
// the weighted combine -> out [T, H] in x's dtype. No host sync, no allocation, so the
// call can be captured in a CUDA graph; it reads slot_row on the device at run time,
// so a replay sees slot-table changes made before it. Call it once outside capture
// first (module load). All pointers are device pointers on `device`; the caller keeps
// them alive until the stream has run the kernels.
#pragma once
#include <cstdint>

namespace tierstore {

enum class MoeActDtype : int { f32 = 0, bf16 = 1 };

struct MoeDecodeArgs {
  const void* x = nullptr;            // [T, H] f32 or bf16, row-major contiguous
  void* out = nullptr;                // [T, H] same dtype as x
  MoeActDtype dtype = MoeActDtype::f32;
  const int32_t* topk_ids = nullptr;  // [T, k]
  const float* topk_w = nullptr;      // [T, k]
  int T = 0, k = 0;
  const int32_t* slot_row = nullptr;  // slot_table + layer * E  ([E] int32, -1 = not resident)
  int E = 0;
  int64_t n_slots = 0;
  const uint8_t* pool = nullptr;      // [n_slots, pool_slot_bytes], fp4 rows
  int64_t pool_slot_bytes = 0;
  const uint8_t* base_rows = nullptr; // this layer's base rows [E, base_slot_bytes]
  int64_t base_slot_bytes = 0;
  int H = 0, I = 0;
  float* h = nullptr;                 // scratch [T*k, I]   (moe_decode only)
  float* y = nullptr;                 // scratch [T*k, H]   (moe_decode only)
  void* workspace = nullptr;          // moe_mma only: moe_mma_layout(...).total bytes, 256-aligned
  int64_t workspace_bytes = 0;
  int device = 0;
  uintptr_t stream = 0;               // cudaStream_t; 0 = legacy default stream
};

constexpr int kMoeDecodeMaxTokens = 16;
constexpr int kMoeDecodeMaxTopK = 16;

// Validates the arguments (std::invalid_argument naming the bad one) and launches the
// three kernels; a launch failure throws std::runtime_error with the CUDA error name.
// Defined only in CUDA builds (moe_decode.cu); bind_moe.cpp binds it only then.
void moe_decode(const MoeDecodeArgs& args);

// Forces the kernels' module to load (call outside graph capture). CUDA builds only.
void moe_decode_prepare(int device);

// ---- tensor-core grouped path (any T; moe_mma.cuh, moe_mma_launch.cu) -----------------
// Four kernels on `stream`, no host sync, every shape fixed by (T, k, E, H, I, dtype), so
// a call is CUDA-graph capturable at any T:
//   route  one block counts the pairs per expert, sorts pair ids by expert into a fixed
//          [P] array and writes one tile (expert, first sorted position, count <= nt) per
//          nt pairs of each expert into a worst-case table of tmax entries (+ the count);
//          the other blocks convert x to bf16 (3 terms hi+mid+lo for f32) in the K order
//          of the mma fragments;
//   w13    grid (I/16, tmax): tile blockIdx.y (blocks past the count exit) x 16 outputs;
//          mma.sync m16n8k16 bf16 -> f32, weights dequantised in registers with the scale
//          folded in (exact in bf16), K split over the 8 warps; SiLU(gate) * up ->
//          h in bf16 terms (2 for bf16 x, 3 for f32);
//   w2     grid (H/32, tmax) the same over h -> y [P, H] f32;
//   combine out[t] = sum_k w[t,k] * y[pos(t,k)] in a fixed order.
struct MoeMmaLayout {
  int nt8 = 1;           // tokens per tile / 8 (1, 2 or 4, from the mean pairs per expert)
  int tmax = 0;          // worst-case tile count: ceil(P / nt) + min(P, E)
  int ns1 = 1, ns2 = 2;  // bf16 terms of x and of h
  int64_t off_tiles = 0, off_sorted = 0, off_pos = 0, off_xb = 0, off_hb = 0, off_y = 0, total = 0;
};

inline MoeMmaLayout moe_mma_layout(int T, int k, int E, int H, int I, MoeActDtype dtype) {
  auto up = [](int64_t v) { return (v + 255) / 256 * 256; };
  MoeMmaLayout l;
  const int64_t P = static_cast<int64_t>(T) * k;
  const int64_t mean = (P + E - 1) / (E > 0 ? E : 1);
  l.nt8 = mean <= 8 ? 1 : mean <= 16 ? 2 : 4;
  const int64_t nt = 8LL * l.nt8;
  l.tmax = static_cast<int>((P + nt - 1) / nt + (P < E ? P : E));
  l.ns1 = dtype == MoeActDtype::f32 ? 3 : 1;
  l.ns2 = dtype == MoeActDtype::f32 ? 3 : 2;
  l.off_tiles = 0;                                            // int32 [3 * tmax + 1]
  l.off_sorted = up(l.off_tiles + (3LL * l.tmax + 1) * 4);    // int32 [P] pair ids by expert
  l.off_pos = up(l.off_sorted + P * 4);                       // int32 [P] sorted position of pair
  l.off_xb = up(l.off_pos + P * 4);                           // bf16 [T, ns1, H]
  l.off_hb = up(l.off_xb + static_cast<int64_t>(T) * l.ns1 * H * 2);   // bf16 [P, ns2, I]
  l.off_y = up(l.off_hb + P * l.ns2 * I * 2);                 // f32 [P, H]
  l.total = up(l.off_y + P * H * 4);
  return l;
}

constexpr int kMoeMmaMaxExperts = 4096;   // the route block counts experts in shared memory

// Validates (std::invalid_argument) and launches the four kernels; CUDA builds only.
void moe_mma(const MoeDecodeArgs& args);
void moe_mma_prepare(int device);

}  // namespace tierstore
