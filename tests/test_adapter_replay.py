"""Replay of vLLM-Moet's runner call sequence against MoetTier (CPU; CUDA graphs on GPU).

Per step: wait_manager_idle -> step_begin -> forward (mark_seen + moe_w2_forward per
layer) -> gate -> on a fire force_promote + replay (<= max_rounds) -> step_end.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from adapter_helpers import E, L, make_tier, model_and_dir, one_torch_thread  # noqa: F401
from tierstore.testing.moet_runner import EngineReplay, TinyDecoder
from tierstore.compute.gate import UncertaintyGate
from tierstore.compute.moe import BaseWeights, StaticPool, fused_moe_reference

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TOP_K = 2


class ReferenceTier:
    """The tier surface over a StaticPool holding EVERY expert's FP4 row and the
    float64 torch reference: the output a fully promoted model gives."""

    def __init__(self, model, device="cpu", slot_state=None):
        self.base = BaseWeights(model.base_rows, model.H, model.I, device=device)
        self.pool = StaticPool(model.fp4_rows, n_slots=model.n_layers * model.n_experts, device=device)
        if slot_state is None:
            self.pool.promote(np.stack(np.meshgrid(range(model.n_layers), range(model.n_experts),
                                                   indexing="ij"), -1).reshape(-1, 2))
        else:  # mirror a live tier's pool bytes and slot table (same slots, same rows)
            table, pool = slot_state
            self.pool.pool = pool.to(device).clone()
            self.pool.slot_table = table.to(device).clone()

    def mark_seen(self, layer, ids):
        pass

    def ensure_resident(self, layer, ids):
        pass

    def moe_w2_forward(self, x, w, ids, layer):
        return fused_moe_reference(x.double(), w, ids, layer, self.pool, self.base,
                                   dtype=torch.float64).to(x.dtype)


@pytest.fixture
def model():
    return model_and_dir()[0]


def make_replay(device="cpu", slots=L * E, tau=1.0, max_rounds=8, graph=False, **env):
    model, d = model_and_dir()
    tier = make_tier(d, slots=slots, device=device, **env)
    decoder = TinyDecoder(model, TOP_K, device=device)
    return tier, decoder, EngineReplay(tier, decoder, UncertaintyGate(tau=tau),
                                       max_rounds=max_rounds, graph=graph)


def pins_held(tier) -> int:
    return int(tier.store._pool.key_pins.sum())


def test_each_fire_ends_with_the_fully_promoted_output(model):
    # tau=1 fires on every step; with room for every expert the loop stops when the
    # last run promoted nothing new, i.e. every expert it routed was FP4 already,
    # so its logits are exactly those of the fully promoted model.
    tier, decoder, replay = make_replay(tau=1.0)
    reference = TinyDecoder(model, TOP_K)
    full = ReferenceTier(model)
    with tier:
        for step in range(4):
            x = model.tokens(2, seed=10 + step)
            logits = replay.decode(x)
            h = replay.history[-1]
            assert h.fired and h.rounds < replay.max_rounds
            want = reference.forward(full, x)
            torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-4)
            assert pins_held(tier) == 0 and int(tier.seen.sum()) == 0
            tier.store.check_invariants()


def test_a_confident_gate_never_promotes_synchronously(model):
    tier, _d, replay = make_replay(tau=0.0)
    with tier:
        for step in range(3):
            replay.decode(model.tokens(2, seed=step))
        assert replay.gate.stats().fires == 0 and tier.store.stats().fires == 0
        assert all(h.rounds == 0 and len(h.confidence) == 1 for h in replay.history)


def test_gate_off_in_the_environment_disables_fires(model):
    tier, _d, replay = make_replay(tau=1.0, GATE=0)
    with tier:
        replay.decode(model.tokens(2))
        assert tier.store.stats().fires == 0 and replay.history[-1].rounds == 0


def test_rounds_are_capped_and_counters_add_up(model):
    tier, _d, replay = make_replay(tau=1.0, max_rounds=1)
    with tier:
        for step in range(5):
            replay.decode(model.tokens(3, seed=step))
        s = replay.gate.stats()
        hist = replay.history
        assert s.steps == 5 and s.fires == sum(h.fired for h in hist) == 5
        assert all(h.rounds <= 1 and len(h.confidence) == h.rounds + 1 for h in hist)
        assert s.rounds == sum(h.rounds for h in hist)
        assert s.promoted == sum(h.promoted for h in hist) == tier.store.stats().fire_promoted


def test_fire_promotions_are_capped_by_gate_max_promote(model):
    tier, _d, replay = make_replay(tau=1.0, max_rounds=1, GATE_MAX_PROMOTE=2)
    with tier:
        replay.decode(model.tokens(4, seed=7))
        assert replay.history[-1].promoted <= 2


def test_prefill_makes_its_experts_resident_then_decode_follows(model):
    tier, _d, replay = make_replay(tau=0.0)
    with tier:
        x = model.tokens(24, seed=5)
        replay.prefill(x)
        # the first layer's routing does not depend on earlier layers: check it exactly
        _w, ids = TinyDecoder(model, TOP_K).route(x, 0)
        for e in torch.unique(ids).tolist():
            assert int(tier.slot_table[0, e]) >= 0
        assert pins_held(tier) == 0 and tier.store.step_count == 1
        replay.decode(model.tokens(1, seed=6))
        assert tier.store.step_count == 2


def test_eager_output_matches_the_reference_at_the_tiers_slot_state(model):
    tier, decoder, replay = make_replay(slots=10, tau=1.0, max_rounds=2)
    with tier:
        for step in range(3):
            x = model.tokens(2, seed=20 + step)
            tier.wait_manager_idle(10.0)
            tier.step_begin()
            got = decoder.forward(tier, x)
            mirror = ReferenceTier(model, slot_state=(tier.slot_table, tier.pool))
            want = TinyDecoder(model, TOP_K).forward(mirror, x)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            tier.force_promote()
            tier.step_end()


# -- the same sequence under CUDA-graph capture ---------------------------------------
def _kernel_ready() -> bool:
    from tierstore.compute import moe
    return moe._kernel_available()


@pytest.mark.gpu
def test_graph_replay_with_promotions_between_replays_matches_eager(model):
    if not _kernel_ready():
        pytest.skip("tierstore._C was built without the CUDA MoE decode kernel")
    tier, decoder, replay = make_replay(device="cuda", slots=12, tau=1.0, max_rounds=3,
                                        graph=True)
    with tier:
        changed = 0
        for step in range(6):
            x = model.tokens(2, seed=30 + step).cuda()
            tier.wait_manager_idle(10.0)             # lazy promotions settle first
            tier.step_begin()
            for _round in range(3):
                graph_out = replay._forward(x)       # captured once, replayed after
                eager_out = decoder.forward(tier, x)
                torch.testing.assert_close(graph_out, eager_out, rtol=1e-5, atol=1e-5)
                mirror = ReferenceTier(model, device="cpu",
                                       slot_state=(tier.slot_table.cpu(), tier.pool.cpu()))
                want = TinyDecoder(model, TOP_K).forward(mirror, x.cpu())
                torch.testing.assert_close(graph_out.cpu(), want, rtol=2e-3, atol=2e-3)
                before = graph_out
                if tier.force_promote().promoted == 0:
                    break
                changed += int(not torch.equal(replay._forward(x), before))
            tier.step_end()
        assert replay._graph is not None and changed > 0   # promotions reached the graph
        assert pins_held(tier) == 0


@pytest.mark.gpu
def test_graph_decode_loop_runs_the_engine_sequence(model):
    if not _kernel_ready():
        pytest.skip("tierstore._C was built without the CUDA MoE decode kernel")
    tier, _decoder, replay = make_replay(device="cuda", tau=1.0, graph=True)
    reference = TinyDecoder(model, TOP_K)
    full = ReferenceTier(model)
    with tier:
        for step in range(4):
            x = model.tokens(2, seed=40 + step)
            logits = replay.decode(x.cuda())
            assert replay.history[-1].rounds < replay.max_rounds
            torch.testing.assert_close(logits.cpu(), reference.forward(full, x),
                                       rtol=2e-3, atol=2e-3)
        assert pins_held(tier) == 0
