"""The exception family is public: every error class a user can meet is reachable as
``tierstore.<Name>`` and derives from ``TierstoreError`` (so one ``except`` catches them)."""

from __future__ import annotations

import pytest

import tierstore as ts

PUBLIC_ERRORS = (
    "FormatError",
    "ConfigError",
    "CapacityError",
    "BufferBoundsError",
    "TierIOError",
    "PackBusyError",
    "PackReplacedError",
    "ClosedError",
)


@pytest.mark.parametrize("name", PUBLIC_ERRORS)
def test_every_error_is_public_and_one_family(name):
    cls = getattr(ts, name)
    assert issubclass(cls, ts.TierstoreError)
    assert name in ts.__all__ or name in dir(ts)


def test_writer_errors_are_the_ones_the_format_package_raises():
    from tierstore.format import PackBusyError, PackReplacedError

    assert ts.PackBusyError is PackBusyError and ts.PackReplacedError is PackReplacedError
    assert issubclass(ts.PackBusyError, ts.TierIOError)  # carries path, offset, errno
