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
  float* h = nullptr;                 // scratch [T*k, I]
  float* y = nullptr;                 // scratch [T*k, H]
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

}  // namespace tierstore
