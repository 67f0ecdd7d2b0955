"""Compute: the slot-aware fused-MoE (torch reference and the CUDA decode kernel of
csrc/kernels) and the uncertainty gate that decides when a decode step fires."""

from tierstore.compute.gate import UncertaintyGate, run_with_gate
from tierstore.compute.moe import BaseWeights, StaticPool, fused_moe, fused_moe_reference

__all__ = [
    "UncertaintyGate",
    "run_with_gate",
    "BaseWeights",
    "StaticPool",
    "fused_moe",
    "fused_moe_reference",
]
