"""ExpertStore construction: options, policies per tier, sizing, engine, allocation.

Every argument and option is validated once, here, and all bad values are
reported together in one ConfigError. Sizing order (tierstore.store.sizing): resolve
the pool's slot count (an "auto" pool from free memory), check it fits, size the
arena, and only then check the fire floor.

Policies are per tier and never share a knob: ``policy`` is a name (the pool's;
the arena uses ``arena_policy``) or ``{"pool": spec, "arena": spec}`` where a spec
is a name or ``{"name": ..., **params}``. The ``half_life`` / ``half_life_s``
options tune the pool's policy only; a heat-like policy given no parameters gets
the ``half_life_steps`` / ``half_life_s`` settings.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

import tierstore.store.sizing as sizing
from tierstore import policies, settings
from tierstore.errors import ConfigError

_OPTIONS = (
    "threads",
    "direct",
    "lazy_per_step",
    "half_life",
    "half_life_s",
    "arena_policy",
    "reserve_gb",
    "max_gb",
    "scan_keep",
    "fire_rounds",
    "latency_window",
    "engine",
    "stream",
    "snapshot",
    "snapshot_every_s",
    "gate_fp_max",
    "verify",
    "prefetch",
    "publish",
    "slot_table",
    "lazy_admission",
    "quarantine",
)
LAZY_ADMISSIONS = ("hotter", "all")  # step()'s promotions: over a colder victim only, or any
VERIFY_MODES = settings.VERIFY_MODES
# When background promotions become visible: "async" = as soon as the worker's copy
# landed; "step" = only at step(), on the caller's thread (engines that capture CUDA
# graphs and re-run fired steps: nothing changes between a step's forward and its replay,
# and the worker thread makes no CUDA call).
PUBLISH_MODES = ("async", "step")
DEFERRED = "deferred"
_POSITIVE = settings.number(0.0, lo_open=True)


def _spec(spec, tier: str, problems: list[str]) -> tuple[str, dict]:
    if isinstance(spec, str):
        return spec.lower(), {}
    if isinstance(spec, dict) and isinstance(spec.get("name"), str):
        params = {k: v for k, v in spec.items() if k != "name"}
        return spec["name"].lower(), params
    problems.append(f"{tier} policy must be a name or {{'name': ..., **params}}, found {spec!r}")
    return "lru", {}


def _check_half_life(half_life, half_life_s, problems: list) -> None:
    """The half_life / half_life_s options: one of them, a finite number > 0 (0 or
    True must not silently mean "the default" or 1)."""
    if half_life is not None and half_life_s is not None:
        problems.append(
            f"give half_life (steps) or half_life_s (seconds), not both ({half_life!r}, {half_life_s!r})"
        )
    for name, value in (("half_life", half_life), ("half_life_s", half_life_s)):
        if value is None:
            continue
        try:
            settings.argument(name, value, _POSITIVE)
        except ConfigError as exc:
            problems.append(str(exc))


def _default_params(name: str, half_life=None, half_life_s=None) -> dict:
    if not policies.has_half_life(name):
        return {}
    if half_life_s is None and half_life is None:
        half_life_s = settings.get("half_life_s") or None
        half_life = None if half_life_s else (settings.get("half_life_steps") or None)
    if half_life_s:
        return {"half_life_s": float(half_life_s)}
    return {"half_life": float(half_life)} if half_life else {}


@dataclass
class StoreConfig:
    device: torch.device
    n_slots: int
    n_rows: int
    max_promote: int
    pool_policy: tuple[str, dict]
    arena_policy: tuple[str, dict]
    threads: int
    direct: str
    lazy_per_step: int
    scan_keep: float
    fire_rounds: int
    latency_window: int
    snapshot: Any = None
    snapshot_every_s: float = 10.0
    verify: str = "always"
    engine: Any = None
    stream: Any = None
    floor: int | None = None
    prefetch: dict | None = None  # Prefetcher parameters (store/prefetch.py); None = off
    publish: str = "async"  # PUBLISH_MODES
    lazy_admission: str = "hotter"  # LAZY_ADMISSIONS
    quarantine: bool = False  # rows failing their checksum are never loaded again
    deferred: bool = False  # vram_slots="deferred": the pool is sized by finalize()
    slot_table: Any = None  # a table from new_slot_table to adopt
    force: bool = False
    reserve_gb: float = 3.0
    max_gb: float = 0.0
    floor_what: str = ""
    extra: dict = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        pack,
        *,
        vram_slots,
        vram_gb,
        ram_gb,
        policy,
        device,
        max_promote,
        top_k,
        n_spec,
        max_seqs,
        force,
        options: dict,
    ) -> StoreConfig:
        problems: list[str] = []
        unknown = sorted(set(options) - set(_OPTIONS))
        if unknown:
            problems.append(f"unknown option(s) {', '.join(unknown)} (known: {', '.join(_OPTIONS)})")
        opt = lambda name: options.get(name, None)  # noqa: E731
        # 1. device
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError):
            problems.append(f"device must be 'cuda', 'cuda:N' or 'cpu', found {device!r}")
            dev = torch.device("cpu")
        if dev.type == "cuda":
            if not torch.cuda.is_available():
                problems.append("device='cuda' but torch sees no CUDA device (use device='cpu')")
            elif dev.index is None:
                dev = torch.device("cuda", torch.cuda.current_device())
        elif dev.type != "cpu":
            problems.append(f"device must be 'cuda' or 'cpu', found {device!r}")
        # 2. policies, one per tier
        if isinstance(policy, dict) and set(policy) <= {"pool", "arena"} and policy:
            pool_spec = _spec(policy.get("pool", settings.get("pool_policy")), "pool", problems)
            if "arena" in policy and opt("arena_policy") is not None:
                problems.append("arena policy given twice (policy={'arena': ...} and arena_policy=)")
            arena_spec = _spec(
                policy.get("arena", opt("arena_policy") or settings.get("arena_policy")), "arena", problems
            )
        else:
            pool_spec = _spec(settings.get("pool_policy") if policy is None else policy, "pool", problems)
            arena_spec = _spec(opt("arena_policy") or settings.get("arena_policy"), "arena", problems)
        for (name, _params), tier in ((pool_spec, "pool"), (arena_spec, "arena")):
            if name not in policies.available():
                problems.append(
                    f"{tier} policy {name!r} unknown (available: {', '.join(policies.available())})"
                )
        n_problems = len(problems)
        _check_half_life(opt("half_life"), opt("half_life_s"), problems)
        half_lives = (opt("half_life"), opt("half_life_s")) if len(problems) == n_problems else (None, None)
        if (opt("half_life") is not None or opt("half_life_s") is not None) and not policies.has_half_life(
            pool_spec[0]
        ):
            # lru/auto have no half-life: taking the option silently would hide a typo'd
            # policy or a config that does not do what its author thinks
            given = "half_life" if opt("half_life") is not None else "half_life_s"
            problems.append(
                f"{given}={opt(given)!r} given, but the pool policy "
                f"{pool_spec[0]!r} has no half-life (only "
                f"{', '.join(n for n in policies.available() if policies.has_half_life(n))} do)"
            )
        if not pool_spec[1]:
            pool_spec = (pool_spec[0], _default_params(pool_spec[0], *half_lives))
        elif opt("half_life") is not None or opt("half_life_s") is not None:
            problems.append("half_life given both as an option and in the pool policy's parameters")
        if not arena_spec[1]:
            arena_spec = (arena_spec[0], _default_params(arena_spec[0]))

        # 3. numbers and modes: every value through the converter its TIERSTORE_* variable
        #    and command-line option use (settings.argument), all problems reported together
        def checked(name, value, convert, fallback, words=(), text=False):
            try:
                return settings.argument(name, value, convert, words, text=text)
            except ConfigError as exc:
                problems.append(str(exc))
                return fallback

        def knob(name):  # an option that is also a setting: the setting's own converter
            var = settings.KNOBS[name]
            if opt(name) is None:
                return settings.get(name)
            return checked(name, opt(name), var.parse, var.default, text=isinstance(var.default, str))

        max_promote = (
            settings.get("max_promote")
            if max_promote is None
            else checked("max_promote", max_promote, settings.count, 0)
        )
        threads, direct, verify = knob("threads"), knob("direct"), knob("verify")
        lazy, scan_keep, rounds = knob("lazy_per_step"), knob("scan_keep"), knob("fire_rounds")
        window, reserve, max_gb = knob("latency_window"), knob("reserve_gb"), knob("max_gb")
        snap_every = knob("snapshot_every_s")
        gate_fp_max = (
            3 if opt("gate_fp_max") is None else checked("gate_fp_max", opt("gate_fp_max"), settings.count, 3)
        )
        if top_k is not None:
            top_k = checked("top_k", top_k, settings.integer(1, int(pack.n_experts)), None)
        n_spec = checked("n_spec", n_spec, settings.count, 0)
        max_seqs = checked("max_seqs", max_seqs, settings.count, 1)
        deferred = isinstance(vram_slots, str) and vram_slots == DEFERRED
        if vram_slots is not None and vram_gb is not None and not deferred:
            problems.append(f"give vram_slots ({vram_slots!r}) or vram_gb ({vram_gb!r}), not both")
        if vram_slots is not None and not deferred:
            vram_slots = checked("vram_slots", vram_slots, settings.positive_count, 1, words=(DEFERRED,))
        if vram_gb is not None:
            vram_gb = checked("vram_gb", vram_gb, sizing.VRAM_GB, None, words=(settings.AUTO,))
        ram_gb = checked(
            "ram_gb", 0.0 if ram_gb is None else ram_gb, sizing.RAM_GB, 0.0, words=(settings.AUTO,)
        )
        prefetch = opt("prefetch")
        if prefetch is True:
            prefetch = {}
        elif prefetch is False:
            prefetch = None
        elif prefetch is not None and not isinstance(prefetch, dict):
            problems.append(
                f"prefetch must be True, False or a dict of prefetcher parameters, found {prefetch!r}"
            )
            prefetch = None
        publish = str(opt("publish") or "async").lower()
        if publish not in PUBLISH_MODES:
            problems.append(f"publish must be one of {', '.join(PUBLISH_MODES)}, found {opt('publish')!r}")
        lazy_admission = str(opt("lazy_admission") or "hotter").lower()
        if lazy_admission not in LAZY_ADMISSIONS:
            problems.append(
                f"lazy_admission must be one of {', '.join(LAZY_ADMISSIONS)}, found {opt('lazy_admission')!r}"
            )
        if deferred and prefetch is not None:
            problems.append(
                "prefetch= needs a sized pool: give vram_slots / vram_gb, not vram_slots='deferred'"
            )
        if deferred and vram_gb is not None:
            problems.append(
                f"vram_slots='deferred' sizes the pool at finalize(): give no vram_gb (found {vram_gb!r})"
            )
        table = opt("slot_table")
        if table is not None:
            shape = (int(pack.n_layers), int(pack.n_experts))
            if (
                not isinstance(table, torch.Tensor)
                or table.dtype != torch.int32
                or tuple(table.shape) != shape
                or not table.is_contiguous()
                or table.device.type != dev.type
                or (dev.type == "cuda" and table.device.index != dev.index)
            ):
                problems.append(
                    f"slot_table must be a contiguous int32 tensor {list(shape)} on "
                    f"{dev} (tierstore.store.pool.new_slot_table), found "
                    f"{getattr(table, 'dtype', type(table).__name__)} "
                    f"{list(getattr(table, 'shape', []))} on "
                    f"{getattr(table, 'device', '?')}"
                )
        if problems:
            raise ConfigError(f"ExpertStore({pack.path}): " + "; ".join(problems))
        # 4. sizing: the pool first (auto included), then memory, then the floor
        n_keys = int(pack.n_layers) * int(pack.n_experts)
        n_slots = (
            0
            if deferred
            else sizing.resolve_pool_slots(
                slot_bytes=pack.slot_bytes,
                n_keys=n_keys,
                device=dev,
                vram_slots=vram_slots,
                vram_gb=vram_gb,
                reserve_gb=reserve,
                max_gb=max_gb,
            )
        )
        host_avail = sizing.host_available_bytes()
        if dev.type == "cpu":
            host_avail -= n_slots * int(pack.slot_bytes)
        n_rows = sizing.resolve_arena_rows(
            ram_gb=ram_gb, stride=pack.stride, n_keys=n_keys, reserve_gb=reserve, available=host_avail
        )
        if publish == "step" and lazy and n_rows < min(2 * lazy, n_keys):
            # step()'s promotions are read into arena rows by the worker and copied up at
            # the next step(): the arena holds two steps' worth, as far as free host memory
            # (less the reserve) allows; a step stages no more than there are rows
            room = max(host_avail - int(reserve * sizing.GIB), 0) // int(pack.stride)
            n_rows = max(n_rows, min(2 * lazy, n_keys, room))
        floor = None
        what = (
            f"n_layers={pack.n_layers}, top_k={top_k}, n_spec={n_spec}, "
            f"max_seqs={max_seqs}, gate_fp_max={gate_fp_max}"
        )
        if top_k is not None:
            floor = sizing.fire_floor(pack.n_layers, int(top_k), int(n_spec), int(max_seqs), gate_fp_max)
            if not deferred:  # a deferred pool is checked by finalize()
                sizing.check_floor(
                    n_slots, floor, slot_bytes=int(pack.slot_bytes), force=bool(force), what=what
                )
        return cls(
            device=dev,
            n_slots=n_slots,
            n_rows=n_rows,
            max_promote=max_promote,
            pool_policy=pool_spec,
            arena_policy=arena_spec,
            threads=threads,
            direct=direct,
            lazy_per_step=lazy,
            scan_keep=scan_keep,
            fire_rounds=rounds,
            latency_window=window,
            snapshot=opt("snapshot"),
            snapshot_every_s=snap_every,
            engine=opt("engine"),
            stream=opt("stream"),
            floor=floor,
            verify=verify,
            prefetch=prefetch,
            publish=publish,
            deferred=deferred,
            slot_table=table,
            lazy_admission=lazy_admission,
            quarantine=bool(opt("quarantine") or False),
            force=bool(force),
            reserve_gb=reserve,
            max_gb=max_gb,
            floor_what=what,
        )

    # -- building the parts ------------------------------------------------------------
    def open_engine(self, pack):
        """(engine, owned): the shared engine given as an option, or a new one."""
        if self.engine is not None:
            return self.engine, False
        from tierstore.io.engine import Engine

        return Engine(
            pack.path,
            threads=self.threads,
            direct=self.direct,
            device=self.device.type,
            device_index=self.device.index or 0,
        ), True

    def pool_policy_for(self, pack, n_slots: int):
        """The pool's policy for ``n_slots`` (with prefetch= the one the simulator's
        <policy>+prefetch runs)."""
        n_keys = int(pack.n_layers) * int(pack.n_experts)
        return policies.make(
            self.pool_policy[0],
            n_keys,
            n_slots,
            **{"prefetching": self.prefetch is not None, **self.pool_policy[1]},
        )

    def allocate_tiers(self, pack, engine):
        from tierstore.store.arena import HostArena
        from tierstore.store.pool import SlotPool

        n_keys = int(pack.n_layers) * int(pack.n_experts)
        pool_pol = self.pool_policy_for(pack, self.n_slots)
        arena_pol = policies.make(self.arena_policy[0], n_keys, self.n_rows, **self.arena_policy[1])
        pool = SlotPool(
            self.n_slots,
            pack.slot_bytes,
            pack.n_layers,
            pack.n_experts,
            self.device,
            pool_pol,
            table=self.slot_table,
        )
        self.slot_table = None  # adopted: the pool owns it now
        if pool.n_slots:
            engine.register_buffer(pool.pool)  # submit then checks every slot row against it
        arena = HostArena(engine, self.n_rows, pack.stride, pack.slot_bytes, n_keys, arena_pol)
        return pool, arena

    def consumer_stream(self):
        """The stream slot-table writes are ordered on when a call names none."""
        if self.device.type != "cuda":
            return None
        return self.stream if self.stream is not None else torch.cuda.current_stream(self.device)
