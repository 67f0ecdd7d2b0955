"""``Closing``: the one way a tierstore object that holds file descriptors (or a native
engine) is a context manager and gives them back when it is garbage collected."""

from __future__ import annotations


class Closing:
    """Mixin for a class with an idempotent ``close()``: ``with obj:`` closes it on exit,
    and dropping it unclosed closes it too (quietly: ``__del__`` may run during interpreter
    shutdown or on a half-built object whose ``__init__`` raised)."""

    def close(self) -> None:  # pragma: no cover - every user defines its own
        raise NotImplementedError

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown, half-built object
            pass
