"""Routed keys from the caller's forms (pairs, an int [N, 2] array or tensor, or
{layer: ids}) to the store's dense ids ``layer * E + expert``: checked, deduplicated,
first-seen order, in one native pass (``_C.unique_dense_keys``)."""

from __future__ import annotations

import numpy as np
import torch

from tierstore._C import unique_dense_keys
from tierstore.errors import ConfigError

_EMPTY = np.empty(0, dtype=np.int64)


def dense_keys(keys, pack, n_layers: int, n_experts: int, layer_written: np.ndarray) -> np.ndarray:
    """Unique dense ids of (layer, expert) pairs, first-seen order; validated by the pack."""
    try:
        arr = _as_pairs(keys)
    except (TypeError, ValueError) as exc:
        raise ConfigError(
            f"{pack.path}: keys must be (layer, expert) pairs, an int [N, 2] "
            f"array or tensor, or {{layer: ids}}; found {type(keys).__name__} "
            f"({exc})"
        ) from None
    if arr.size == 0:
        return _EMPTY
    arr = arr.reshape(-1, 2) if arr.ndim == 1 and arr.size == 2 else arr
    dense = unique_dense_keys(arr, n_layers, n_experts, layer_written)  # one native pass
    if dense is not None:
        return dense
    # Not an int64 [N, 2] array, or a bad key: the pack's checks raise the error.
    dense = pack.check_keys(arr)
    if len(dense) <= 1:
        return dense
    order = np.argsort(dense, kind="stable")
    ranked = dense[order]
    first = np.empty(len(dense), dtype=bool)
    first[0] = True
    np.not_equal(ranked[1:], ranked[:-1], out=first[1:])
    return dense[np.sort(order[first])]  # unique, in first-seen order


def _as_pairs(keys) -> np.ndarray:
    if keys is None or isinstance(keys, (str, bytes)):
        raise TypeError("not a collection of keys")
    if isinstance(keys, dict):
        parts = [
            np.stack(
                np.broadcast_arrays(
                    int(l), np.asarray(v.cpu() if isinstance(v, torch.Tensor) else v).reshape(-1)
                ),
                axis=1,
            )
            for l, v in keys.items()
        ]
        arr = np.concatenate(parts) if parts else np.zeros((0, 2), np.int64)
    elif isinstance(keys, torch.Tensor):
        arr = keys.detach().cpu().numpy()
    else:
        arr = np.asarray(keys if isinstance(keys, (list, tuple, np.ndarray)) else list(keys))
    return arr
