"""Phase: hybrid (decayed frequency + admit-if-hotter) whose victims are the keys
with the latest *expected next use*, counting where in the tick each key is read.

A decode tick reads the layers in order, one ``on_access`` group each (the
simulator's per-group calls; the live store folds once per step, so there every
key has phase 0 and this reduces to hybrid). For key ``k`` last read at group
``pos[k]`` of a tick, while group ``c`` is being filled (``c`` = groups seen so
far this tick, minus one), its next chance to be read is ``off = (pos[k] - c) mod
L`` groups away (``L`` = groups per tick, the largest count seen; ``off = L`` for
``pos[k] == c``), and at a per-tick use rate ``lam = heat * (1 - 2^(-1/h))`` it is
expected ``1/lam - 1`` ticks later still. Order (larger = hotter):

    primary[k] = -(off[k] / L + 1 / max(lam[k], 1e-12))

so among equally popular keys, those of layers still to come this tick are kept
over those just read (a stationary estimate of Belady's next-use distance).
Admission is hybrid's (heat of candidate > heat of victim). State: hybrid's
arrays plus ``pos`` (int64 [n_keys]), the group counter ``c`` and ``L``. The
rules run natively (policies/native.py, csrc/store/src/policy.cpp).
"""

from __future__ import annotations

from tierstore.policies.hybrid import HybridPolicy


class PhasePolicy(HybridPolicy):
    name = "phase"
    kind = 3
    phased = True
    groups_accesses = False  # the phase is the group index: one on_access per group
