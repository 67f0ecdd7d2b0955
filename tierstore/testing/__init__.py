"""Test kits, not the product: random packs, the generated quantised MoE model, and a
replay of vLLM-Moet's runner call sequence. Tests, benchmarks, examples and the demo
import these; the library itself never does."""
from tierstore.testing.packs import RANDOM_QUANTIZER_ABI, make_random_pack, random_layer_rows

__all__ = ["make_random_pack", "random_layer_rows", "RANDOM_QUANTIZER_ABI"]
