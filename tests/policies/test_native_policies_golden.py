"""The policies' rules, now written once in C++ (csrc/store/src/policy.cpp, behind the
faces of tierstore/policies/native.py), pinned to what the Python implementation they
replaced produced (tierstore at commit 6bca503, replay_demand_fill(native=False)): per
(trace, policy, slots, granularity) the hits, demand reads, evictions, rejections, a
digest of the per-access hit mask and one of the final state arrays. Both the Python
loop over the faces and the native replays must reproduce them exactly. The auto
entries are the nine-expert auto of policies/auto.py's EXPERTS (blend experts,
distinct-hit scores), regenerated for the 2026-12-03 expert list (phase(4) and
phase(128) in place of phase(16) and heat(128): a deliberate change of auto's
behaviour) from the one native AutoCore, native replay and the per-group
"python_loop" (as the live store drives it) equal. Those entries are the one-window
auto that now runs beside a prefetcher (``prefetching=True``, unchanged bit for bit);
GOLDEN_AUTO pins the two-window default (2026-12-06, the same two paths equal)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tierstore import policies
from tierstore.policies.blend import BlendPolicy
from tierstore.sim.counting import Prepared
from tierstore.sim.demand import replay_demand_fill
from tierstore.sim.synth import synthetic_trace
from tierstore.sim.traces import load_trace
from tierstore.testing.digests import digest as _digest
from tierstore.testing.digests import policy_state

pytest.importorskip("tierstore._C")

FLAME = Path(
    os.environ.get("TIERSTORE_FLAME_TRACE", "/work/shared/traces/flame_moe_290m_pretrain_2048tok.npy")
)

# (hits, demand_reads, evictions, rejected, hit digest, state digest)
GOLDEN = {
    "flame/lru/51/layer": (10379, 87925, 87874, 0, "e95474b868710282", "34ebdbfe4d2cefe0"),
    "flame/lru/205/layer": (38010, 60294, 60089, 0, "5fd168e460c0acd9", "80b7a789631bc8e9"),
    "flame/heat/51/layer": (11852, 86452, 86401, 0, "9a37e7ec86f21b1a", "539f035c19abcf7f"),
    "flame/heat/205/layer": (45389, 52915, 52710, 0, "8c6c595b10681d55", "882836ce43a9ecf4"),
    "flame/hybrid/51/layer": (13165, 85139, 2897, 82191, "a9cc810d43808426", "f95331f1cd4c174f"),
    "flame/hybrid/205/layer": (46146, 52158, 5944, 46009, "42a1813b963b0dfe", "3f343725703d1081"),
    "flame/phase/51/layer": (13312, 84992, 2527, 82414, "e1e947c59c312c49", "92e41f27f5c86167"),
    "flame/phase/205/layer": (46378, 51926, 5414, 46307, "38d87e314fe39ba3", "42d12382b96fea53"),
    "flame_head/auto/51/layer": (778, 3158, 589, 2518, "e9df81e2d8e9679d", "e556b4a3046b0758"),
    "flame_head/auto/205/layer": (2021, 1915, 879, 831, "2eefc964b35541ca", "bc22715f7a23c7d2"),
    "synth/lru/9/layer": (0, 6522, 5171, 1342, "67eaf3d4446ea497", "26a236b39de701d5"),
    "synth/lru/9/tick": (536, 5986, 319, 5658, "8aa91679e6a4175a", "e526ef77b60ff2a8"),
    "synth/lru/40/layer": (0, 6522, 6482, 0, "67eaf3d4446ea497", "1a0a8c0c864ab15a"),
    "synth/lru/40/tick": (2206, 4316, 1594, 2682, "fc181d25b6874d49", "ac40f900d66a82b2"),
    "synth/heat/9/layer": (0, 6522, 5171, 1342, "67eaf3d4446ea497", "7241a07789c368b4"),
    "synth/heat/9/tick": (536, 5986, 319, 5658, "8aa91679e6a4175a", "d16d899e3a62946c"),
    "synth/heat/40/layer": (1734, 4788, 4748, 0, "c9a7e413d520e634", "bd98ec356244aebe"),
    "synth/heat/40/tick": (2206, 4316, 1594, 2682, "fc181d25b6874d49", "f590330015926145"),
    "synth/hybrid/9/layer": (575, 5947, 97, 5841, "b97bb7727fd9882b", "ba65552f0dafc499"),
    "synth/hybrid/9/tick": (603, 5919, 28, 5882, "b5ede1310c3a4d80", "00d3caad8369ddf4"),
    "synth/hybrid/40/layer": (2125, 4397, 290, 4067, "4e799c4d2b6e5f2c", "7273d44000f75e84"),
    "synth/hybrid/40/tick": (2195, 4327, 120, 4167, "415a62728d065b8a", "a906f179272fa2a0"),
    "synth/phase/9/layer": (590, 5932, 67, 5856, "bad8ce12850a2f29", "a77a22b098a74c5c"),
    "synth/phase/9/tick": (603, 5919, 28, 5882, "b5ede1310c3a4d80", "55e3509247621800"),
    "synth/phase/40/layer": (2161, 4361, 232, 4089, "c60ee4b240bd7e13", "7646ef3b660898c5"),
    "synth/phase/40/tick": (2195, 4327, 120, 4167, "415a62728d065b8a", "315f0dc97d0e66f1"),
    "synth/auto/9/layer": (611, 5911, 307, 5595, "7ada80e4ba0dadde", "b09fa771dfda2c43"),
    "synth/auto/9/tick": (697, 5825, 122, 5694, "2aa2e6259ff5c515", "4b62fd88acd51fcf"),
    "synth/auto/40/layer": (2302, 4220, 1346, 2834, "5aa78b5babfba2a5", "6f5c3223e9a0517e"),
    "synth/auto/40/tick": (2471, 4051, 822, 3189, "6e5754cdd11d992b", "04881851d42b5ddc"),
}

# auto's default two score windows (SCORE_HALF_LIFE 16 + LONG_SCORE_HALF_LIFE 512)
GOLDEN_AUTO = {
    "flame_head/auto/51/layer": (778, 3158, 589, 2518, "e9df81e2d8e9679d", "aa2e93856126e022"),
    "flame_head/auto/205/layer": (2011, 1925, 1051, 669, "0a599e3d93c198ce", "4346a818a80bc1c0"),
    "synth/auto/9/layer": (606, 5916, 272, 5635, "38e22ff4c2851934", "7d704452fbb34fcd"),
    "synth/auto/9/tick": (697, 5825, 122, 5694, "2aa2e6259ff5c515", "db7650c6c925013a"),
    "synth/auto/40/layer": (2294, 4228, 1223, 2965, "ae2b80848099e786", "8e85ec301d3ac6dd"),
    "synth/auto/40/tick": (2472, 4050, 828, 3182, "b9f37e4afad232ae", "be3e4ec24d3224ae"),
}

# blend (BlendPolicy over the long heat), pinned to the tuning branch's Python
# implementation (tuning c015c34 and 916e67e give the same figures: phase's Python order
# with blend's rate, over heat.py's long HeatPolicy); state digest over _last, _raw,
# _pos, _resident, long raw.
GOLDEN_BLEND = {
    "flame/blend/2/51/layer": (10217, 88087, 79000, 9036, "cdceb65ad2f06ba3", "9b08bb9076f8d1a8"),
    "flame/blend/2/51/tick": (11245, 87059, 71723, 15285, "ac6553d3e2f6c09b", "22a1a098e4ba6612"),
    "flame/blend/2/205/layer": (41782, 56522, 56317, 0, "8b959312c7837911", "4f1fb1d77ec5b67a"),
    "flame/blend/2/205/tick": (42911, 55393, 55188, 0, "8b3d76d490269e06", "7cb71eb1f9b8945c"),
    "flame/blend/16/51/layer": (13246, 85058, 16556, 68451, "dd13a0a9f429e1db", "56a4b47f35d1aa34"),
    "flame/blend/16/51/tick": (13451, 84853, 15716, 69086, "1230d91ade7843e5", "3349ec7eef2b1b35"),
    "flame/blend/16/205/layer": (46504, 51800, 27722, 23873, "5ef240ae54057632", "e5a63b1cfddc3bc9"),
    "flame/blend/16/205/tick": (46613, 51691, 28090, 23396, "c69e57c77377c10d", "1af6dc99bc691e16"),
    "flame/blend/256/51/layer": (13264, 85040, 2552, 82437, "13d8a5ccd72acb23", "07ac71fdc60dec9a"),
    "flame/blend/256/51/tick": (13305, 84999, 2467, 82481, "077aa50e9a21f69c", "4013c5443938e9dd"),
    "flame/blend/256/205/layer": (46304, 52000, 5332, 46463, "ac6b092d6a6f74dd", "79e552dd8d9552ab"),
    "flame/blend/256/205/tick": (46374, 51930, 5254, 46471, "835042588a00eb9e", "7f26c305fbcebdf9"),
    "synth/blend/2/9/layer": (553, 5969, 622, 5338, "d3b1b6a33d08937a", "64bc40cabcf2a07c"),
    "synth/blend/2/9/tick": (698, 5824, 131, 5684, "3173e1b95f81d1ed", "a0fe05173c203ae6"),
    "synth/blend/2/40/layer": (2307, 4215, 1401, 2774, "12c7f06be1f53b12", "5c3b92f7d5e6c43c"),
    "synth/blend/2/40/tick": (2480, 4042, 831, 3171, "679547969a49b12d", "760af7e02448e29b"),
    "synth/blend/16/9/layer": (604, 5918, 122, 5787, "844571b868a11398", "67ade1f4471d0998"),
    "synth/blend/16/9/tick": (635, 5887, 55, 5823, "27e1c405d55f517a", "36bf2abdc22e411e"),
    "synth/blend/16/40/layer": (2256, 4266, 338, 3888, "306e3f193c010d02", "7c31f894796ee33c"),
    "synth/blend/16/40/tick": (2304, 4218, 198, 3980, "84b31022e0ddff24", "a78bf318b3d5bc07"),
    "synth/blend/256/9/layer": (585, 5937, 80, 5848, "75a448e832de58b4", "293b3d6ffed147c7"),
    "synth/blend/256/9/tick": (603, 5919, 28, 5882, "b5ede1310c3a4d80", "1524f4ea5f092e78"),
    "synth/blend/256/40/layer": (2145, 4377, 253, 4084, "cfaaed0d41047499", "9c7bf8fc55b61b0c"),
    "synth/blend/256/40/tick": (2195, 4327, 120, 4167, "415a62728d065b8a", "a61ad3645931da8c"),
}


# the arrays the golden digests were recorded over (before blend's long heat, _raw2)
GOLDEN_STATE = ("_last", "_raw", "_pos", "_resident")


@pytest.fixture(scope="module")
def preps():
    out = {
        "synth": Prepared(
            synthetic_trace(
                96, batch=2, prefill_tokens=32, prefill_every=40, n_layers=6, n_experts=32, seed=7
            )
        )
    }
    if FLAME.exists():
        trace = load_trace(FLAME)
        out["flame"] = Prepared(trace)
        out["flame_head"] = Prepared(trace.split(0.04)[0])
    return out


def _replayed(preps, case, native, prefetching):
    label, name, slots, granularity = case.split("/")
    if label not in preps:
        pytest.skip("FLAME trace not present")
    prep, slots = preps[label], int(slots)
    p = policies.make(name, prep.n_keys, slots, prefetching=prefetching)
    c = replay_demand_fill(prep, p, slots, granularity, native=native)
    return (
        int(c.hit.sum()),
        c.demand_reads,
        c.evictions,
        c.rejected,
        _digest(c.hit),
        _digest(*policy_state(p, GOLDEN_STATE)),
    )


@pytest.mark.parametrize("native", [True, False], ids=["native", "python_loop"])
@pytest.mark.parametrize("case", sorted(GOLDEN))
def test_matches_the_python_implementation(preps, case, native):
    # prefetching=True: auto's one window, as pinned; the fixed policies ignore it
    assert _replayed(preps, case, native, True) == GOLDEN[case], case


@pytest.mark.parametrize("native", [True, False], ids=["native", "python_loop"])
@pytest.mark.parametrize("case", sorted(GOLDEN_AUTO))
def test_auto_default_windows_are_pinned(preps, case, native):
    assert _replayed(preps, case, native, False) == GOLDEN_AUTO[case], case


@pytest.mark.parametrize("native", [True, False], ids=["native", "python_loop"])
@pytest.mark.parametrize("case", sorted(GOLDEN_BLEND))
def test_blend_matches_the_python_implementation(preps, case, native):
    label, _, half_life, slots, granularity = case.split("/")
    if label not in preps:
        pytest.skip("FLAME trace not present")
    prep, slots = preps[label], int(slots)
    p = BlendPolicy(prep.n_keys, slots, half_life=float(half_life))
    c = replay_demand_fill(prep, p, slots, granularity, native=native)
    got = (
        int(c.hit.sum()),
        c.demand_reads,
        c.evictions,
        c.rejected,
        _digest(c.hit),
        _digest(p._last, p._raw, p._pos, p._resident, p._raw2),
    )
    assert got == GOLDEN_BLEND[case], case
