"""tierstore.metrics: families from a store's own counters, scraped over HTTP (in-process)
and through prometheus_client's multiprocess files written by real worker processes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.parser import text_string_to_metric_families

import tierstore as ts
from tierstore import metrics, settings
from tierstore.errors import ConfigError
from tierstore.testing.packs import make_random_pack

L, E, SLOT = 4, 16, 8192
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def clean_metrics(monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    monkeypatch.delenv("TIERSTORE_METRICS_DIR", raising=False)
    settings.reset()
    yield
    for entry in metrics.registered():
        entry.close()
    settings.reset()


@pytest.fixture
def pack(tmp_path):
    return make_random_pack(tmp_path / "pack", L, E, SLOT, seed=3)


def samples(text: str) -> dict:
    """{(name, frozenset(labels)): value} of a Prometheus text exposition."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(found: dict, name: str, **labels) -> float:
    want = frozenset((k, str(v)) for k, v in labels.items())
    hits = [v for (n, ls), v in found.items() if n == name and want <= ls]
    assert hits, f"{name} {labels} not exported"
    return sum(hits)


def traffic(store, steps: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for t in range(steps):
        for layer in range(L):
            store.record(layer, rng.integers(0, E, size=6))
        if t % 4 == 0:
            store.release(store.fire([(0, t % E), (1, (3 * t) % E), (3, 5)]))
        store.step()


def scrape(exporter) -> dict:
    return samples(urllib.request.urlopen(exporter.url, timeout=10).read().decode())


# -- in-process ------------------------------------------------------------------------------
def test_scraped_metrics_move_with_the_traffic_and_match_stats(pack):
    # lazy_per_step=0: only fires read, so layer 2 (never fired) reads nothing
    with ts.ExpertStore(pack, vram_slots=12, ram_gb=0.001, device="cpu", lazy_per_step=0) as store:
        metrics.register_store(store, {"rank": "0"})
        exporter = metrics.serve(0)
        try:
            before = scrape(exporter)
            traffic(store, 24)
            after = scrape(exporter)
        finally:
            exporter.close()
        st = store.stats()
    assert value(before, "tierstore_fires_total", rank=0) == 0
    assert value(after, "tierstore_fires_total", rank=0) == st.fires == 6
    assert value(after, "tierstore_steps_total") == 24
    for tier in ("pool", "arena"):
        t = getattr(st, tier)
        assert value(after, "tierstore_hits_total", tier=tier) == t.hits
        assert value(after, "tierstore_misses_total", tier=tier) == t.misses
        # per layer: the same tokens split by layer
        assert value(after, "tierstore_layer_hits_total", tier=tier) == t.hits
        assert value(after, "tierstore_layer_misses_total", tier=tier) == t.misses
        assert value(after, "tierstore_resident", tier=tier) == t.resident
        assert value(after, "tierstore_capacity", tier=tier) == t.capacity
    assert value(after, "tierstore_layer_bytes_read_total") == st.bytes_read > 0
    assert (
        value(after, "tierstore_layer_rows_read_total", layer=2)
        == 0
        < value(after, "tierstore_layer_rows_read_total", layer=0)
    )
    assert value(after, "tierstore_fire_latency_seconds_count") == 6
    assert value(after, "tierstore_fire_latency_seconds_bucket", le="+Inf") == 6
    assert (
        value(after, "tierstore_bytes_read_total", source="pagecache")
        + value(after, "tierstore_bytes_read_total", source="disk")
        == st.bytes_read
    )


def test_pins_and_verify_failures_are_reported(pack, tmp_path):
    # a real rotted row on disk: the engine's checksum catches it, the batch rolls back
    st = os.stat(pack.path)
    fd = os.open(pack.path, os.O_RDWR)
    try:
        off = pack.row_offset(2, 7) + 64
        os.pwrite(fd, bytes(b ^ 0xFF for b in os.pread(fd, 8, off)), off)
    finally:
        os.close(fd)
    os.utime(pack.path, ns=(st.st_atime_ns, st.st_mtime_ns))
    with ts.ExpertStore(pack, vram_slots=8, device="cpu", verify="always", lazy_per_step=0) as store:
        metrics.register_store(store)
        held = store.fire([(0, 1), (0, 2), (1, 3)])
        with pytest.raises(ts.TierIOError):
            store.fire([(2, 7)])
        found = samples(generate_latest(metrics.scrape_registry()).decode())
        store.release(held)
        after = samples(generate_latest(metrics.scrape_registry()).decode())
    assert value(found, "tierstore_pinned", tier="pool", tag=pack.tag) == 3
    assert value(after, "tierstore_pinned", tier="pool") == 0
    assert value(found, "tierstore_verify_failures_total") == 1
    assert value(found, "tierstore_failed_reads_total") == 1


def test_a_closed_store_stops_reporting(pack):
    store = ts.ExpertStore(pack, vram_slots=8, device="cpu")
    metrics.register_store(store, {"rank": "7"})
    assert b'rank="7"' in generate_latest(metrics.scrape_registry())
    store.close()
    assert b'rank="7"' not in generate_latest(metrics.scrape_registry())
    assert metrics.registered() == []


def test_stats_without_fold_leaves_the_recorded_routing_for_the_step(pack):
    with ts.ExpertStore(pack, vram_slots=8, device="cpu") as store:
        store.record(0, np.array([1, 2, 3]))
        assert store.stats(fold=False).pool.misses == 0  # not folded yet
        store.step()
        assert store.stats(fold=False).pool.misses == 3


def test_metrics_setting_off_counts_nothing_per_layer_and_registers_nothing(pack):
    with settings.override(metrics=False):
        with ts.ExpertStore(pack, vram_slots=8, device="cpu") as store:
            assert store.counters.layers is None
            assert metrics.register_store(store) is None
            traffic(store, 4)
    assert metrics.registered() == []


@pytest.mark.parametrize(
    "labels, message",
    [
        ({"tier": "x"}, "label 'tier' is used by tierstore's own metrics"),
        ({"9rank": "0"}, "label name '9rank' is not a Prometheus label name"),
        ({"__x": "0"}, "label name '__x' is not a Prometheus label name"),
    ],
)
def test_bad_labels_are_refused_in_one_line(pack, labels, message):
    with ts.ExpertStore(pack, vram_slots=8, device="cpu") as store:
        with pytest.raises(ConfigError, match=re.escape(message)):
            metrics.register_store(store, labels)


def test_two_stores_need_distinct_labels(pack, tmp_path):
    other = make_random_pack(tmp_path / "other", L, E, SLOT, seed=5)
    with (
        ts.ExpertStore(pack, vram_slots=8, device="cpu") as a,
        ts.ExpertStore(other, vram_slots=8, device="cpu") as b,
    ):
        metrics.register_store(a, {"rank": "0"})
        with pytest.raises(ConfigError, match="already used"):
            metrics.register_store(b, {"rank": "0"})
        with pytest.raises(ConfigError, match="already registered"):
            metrics.register_store(a, {"rank": "1"})
        metrics.register_store(b, {"rank": "1"})
        text = generate_latest(metrics.scrape_registry()).decode()
    assert 'tierstore_capacity{rank="0",tier="pool"} 8.0' in text
    assert 'tierstore_capacity{rank="1",tier="pool"} 8.0' in text


def test_serve_refuses_a_taken_port_in_one_line():
    first = metrics.serve(0)
    try:
        with pytest.raises(ConfigError, match=rf"cannot listen on 127.0.0.1:{first.port}"):
            metrics.serve(first.port)
    finally:
        first.close()


def test_every_metric_is_documented():
    doc = (ROOT / "docs" / "METRICS.md").read_text()
    for name, kind, _help in metrics.METRICS:
        full = metrics.PREFIX + name + ("_total" if kind == "counter" else "")
        assert f"`{full}`" in doc, f"{full} missing from docs/METRICS.md"


# -- several processes --------------------------------------------------------------------
WORKER = textwrap.dedent("""
    import os, sys, time, numpy as np
    import tierstore as ts
    from tierstore import metrics
    from tierstore.format import Pack
    rank, fires, mode = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    store = ts.ExpertStore(Pack.open(sys.argv[4]), vram_slots=8, device="cpu")
    metrics.register_store(store, {"rank": str(rank)})
    for t in range(fires):
        store.record(0, np.array([t % 16, 1]))
        store.release(store.fire([(0, t % 16), (1, rank)]))
        store.step()
    if mode == "kill":          # the writer thread's periodic write, then SIGKILL
        time.sleep(0.6)
        print("written", flush=True)
        time.sleep(60)
    metrics.unregister_store(store)
    store.close()
""")


def _run_workers(tmp_path, pack, plan, env_extra) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "TIERSTORE_METRICS_INTERVAL_S": "0.1", **env_extra}
    procs = []
    for rank, fires, mode in plan:
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), str(rank), str(fires), mode, str(pack.path)],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    for p in procs:
        if p.args[4] == "kill":
            assert p.stdout.readline().strip() == "written"
            p.kill()
        assert p.wait(timeout=60) in (0, -9)


def _collect(directory) -> dict:
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=str(directory))
    return samples(generate_latest(registry).decode())


def test_worker_processes_write_files_the_scraping_process_reads(tmp_path, pack):
    directory = tmp_path / "prom"
    directory.mkdir()
    _run_workers(
        tmp_path,
        pack,
        [(0, 5, "exit"), (1, 9, "exit"), (2, 3, "kill")],
        {"PROMETHEUS_MULTIPROC_DIR": str(directory)},
    )
    found = _collect(directory)
    assert value(found, "tierstore_fires_total", rank=0) == 5
    assert value(found, "tierstore_fires_total", rank=1) == 9
    assert value(found, "tierstore_fires_total", rank=2) == 3  # SIGKILLed after a write
    assert value(found, "tierstore_fire_latency_seconds_count", rank=1) == 9
    assert value(found, "tierstore_layer_hits_total", rank=1, layer=0, tier="pool") >= 1
    # live gauges: a worker that unregistered its last store removed them (as
    # prometheus_client's mark_process_dead does); the killed one's stay until marked dead
    assert ("tierstore_capacity", frozenset({("rank", "0"), ("tier", "pool")})) not in found
    assert value(found, "tierstore_capacity", rank=2, tier="pool") == 8
    names = sorted(p.name for p in directory.iterdir())
    assert all(n.split("_")[-1].startswith("tierstore-") for n in names), names


SCRAPER = textwrap.dedent("""
    import os, subprocess, sys
    from prometheus_client import REGISTRY, generate_latest, Counter
    from tierstore import metrics
    own = Counter("vllm_like_requests", "the serving process's own metric")  # in-process
    own.inc(3)
    directory = metrics.setup_scrape_process()
    assert os.environ["TIERSTORE_METRICS_DIR"] == directory and "PROMETHEUS_MULTIPROC_DIR" not in os.environ
    subprocess.run([sys.executable, sys.argv[1], "4", "7", "exit", sys.argv[2]], check=True)
    sys.stdout.write(generate_latest(REGISTRY).decode())
""")


def test_setup_scrape_process_puts_worker_metrics_on_the_servers_own_registry(tmp_path, pack):
    (tmp_path / "worker.py").write_text(WORKER)
    (tmp_path / "scraper.py").write_text(SCRAPER)
    out = subprocess.run(
        [sys.executable, str(tmp_path / "scraper.py"), str(tmp_path / "worker.py"), str(pack.path)],
        capture_output=True,
        text=True,
        timeout=120,
        env={
            k: v
            for k, v in os.environ.items()
            if k not in ("PROMETHEUS_MULTIPROC_DIR", "TIERSTORE_METRICS_DIR")
        },
    )
    assert out.returncode == 0, out.stderr
    found = samples(out.stdout)
    assert value(found, "vllm_like_requests_total") == 3  # the server's own metrics stay
    assert value(found, "tierstore_fires_total", rank=4) == 7


def test_a_forked_child_starts_with_no_registered_store(pack):
    with ts.ExpertStore(pack, vram_slots=8, device="cpu") as store:
        metrics.register_store(store)
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # child: report and leave at once (no cleanup of the parent's objects)
            os.write(w, str(len(metrics.registered())).encode())
            os._exit(0)
        os.close(w)
        got = os.read(r, 16).decode()
        os.waitpid(pid, 0)
        os.close(r)
        assert got == "0" and len(metrics.registered()) == 1


def test_a_registered_gate_reports_its_counters(pack):
    gate = ts.UncertaintyGate()
    with ts.ExpertStore(pack, vram_slots=8, device="cpu") as store:
        metrics.register_store(store, {"rank": "0"}, gate=gate)
        gate.note_step(True, rounds=2, promoted=5)
        gate.note_step(False)
        found = samples(generate_latest(metrics.scrape_registry()).decode())
    assert value(found, "tierstore_gate_steps_total") == 2
    assert value(found, "tierstore_gate_fires_total") == 1
    assert value(found, "tierstore_gate_rounds_total") == 2
    assert value(found, "tierstore_gate_promoted_total") == 5


def test_the_vllm_moet_face_registers_its_store(monkeypatch, tmp_path):
    from moet_surface_helpers import E, env, moet_env, planes

    from tierstore.testing.moet_engine import MoetEngine

    with moet_env(monkeypatch, env(tmp_path, slots=14)) as m:
        eng = MoetEngine(m, planes(), n_experts=E, dev="cpu", top_k=2, tokens=2).boot()
        for _ in range(4):
            eng.step(fire=True)
        found = samples(generate_latest(metrics.scrape_registry()).decode())
        assert value(found, "tierstore_fires_total", tag="delta", device="cpu") >= 1
        assert value(found, "tierstore_capacity", tag="delta", tier="pool") == 14
    assert metrics.registered() == []  # shutdown unregistered it
