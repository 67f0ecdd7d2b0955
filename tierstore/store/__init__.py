"""The store: RAM arena and VRAM pool bookkeeping, the routing recorder, the mover that
turns decisions into engine batches, and ``ExpertStore`` which composes them with a pack
and the policies."""

from tierstore.store.expert_store import ExpertStore, Ticket
from tierstore.store.sizing import fire_floor
from tierstore.store.stats import FireResult, StoreStats, TierStats

__all__ = ["ExpertStore", "Ticket", "FireResult", "StoreStats", "TierStats", "fire_floor"]
