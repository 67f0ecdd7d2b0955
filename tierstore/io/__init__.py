"""I/O engine: the Python face of the native reader pool and read -> H2D copy pipeline
(csrc/io). Reads caller-given byte ranges into caller-given memory; knows nothing of
experts, policies or the store."""

from tierstore.io.engine import SOURCES, Completion, Engine

__all__ = ["Engine", "Completion", "SOURCES"]
