"""The latency view's timed lead-time model (tierstore.sim.leadtime): one FIFO
read queue, rows land after their queue time plus latency, demand reads wait."""

from __future__ import annotations

import numpy as np
import pytest

from tierstore.errors import ConfigError
from tierstore.sim.leadtime import Clock, LeadTime


def test_reads_queue_first_in_first_out_and_demand_waits():
    clock = Clock(LeadTime(1, row_seconds=2.0, latency_seconds=0.5, layer_seconds=1.0), 8)
    clock.issue(np.array([3, 4]))  # prefetches at t=0: queue 0-2, 2-4
    assert clock.lands[[3, 4]].tolist() == [2.5, 4.5]
    clock.demand(np.array([5]))  # behind them: 4-6, usable at 6.5, waited for
    assert clock.now == 6.5 and clock.lands[5] == 6.5
    clock.compute()
    assert clock.now == 7.5
    clock.issue(np.array([6]))  # the queue is free again: starts now
    assert clock.lands[6] == 10.0
    clock.compute()  # 8.5: key 6 not landed yet, key 3 landed
    got = clock.landed(np.array([3, 6, 7]), np.array([True, True, False]))
    assert got.tolist() == [True, False, False]
    assert clock.now == 10.0  # the layer stalls until key 6 is in


def test_measured_model_and_its_bad_settings():
    lt = LeadTime.measured(2, row_bytes=12_582_912, read_gbps=54.5, layer_us=100.0)
    assert lt.timed and lt.lead == 2
    assert lt.row_seconds == pytest.approx(12_582_912 / 54.5e9)
    assert "timed: one FIFO read queue, 230.9 us per row" in lt.describe()
    assert not LeadTime.measured(1).timed and "untimed" in LeadTime().describe()
    for kw in ({"lead": 0}, {"row_seconds": -1.0}, {"row_seconds": 1.0}):
        with pytest.raises(ConfigError, match="lead time"):
            LeadTime(**kw)
    with pytest.raises(ConfigError, match="needs row bytes > 0"):
        LeadTime.measured(1, row_bytes=0, read_gbps=1.0, layer_us=1.0)
