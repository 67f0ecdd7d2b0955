"""Test kits, not the product: random packs, helpers around the generated model
(which itself is product code, ``tierstore.compute.model``: the demo serves it), and a
replay of vLLM-Moet's runner call sequence. Tests, benchmarks and examples import
these; the library and its commands never do."""

from tierstore.testing.packs import RANDOM_QUANTIZER_ABI, make_random_pack, random_layer_rows

__all__ = ["make_random_pack", "random_layer_rows", "RANDOM_QUANTIZER_ABI"]
