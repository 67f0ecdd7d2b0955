"""The batch child (``python -m hostile.child``, JSON on stdin and stdout): runs hostile
cases under ``RLIMIT_AS`` with a per-case alarm, so a case that allocates without bound
fails with MemoryError and one that blocks fails with "hang", instead of taking the
suite down. Modes: ``packs`` (Pack.open, every row, verify) and ``warm`` (strict read,
hint against a pack, the ``warm inspect`` summary)."""

from __future__ import annotations

import json
import resource
import signal
import sys
import time
import warnings

HANG_SECONDS = 10


class Hang(BaseException):
    pass


def _on_alarm(signum, frame):
    raise Hang()


def _error(exc: BaseException) -> dict:
    return {
        "outcome": "refused" if not isinstance(exc, Hang) else "hang",
        "etype": type(exc).__name__,
        "mro": [c.__name__ for c in type(exc).__mro__],
        "msg": str(exc),
    }


def _timed(fn, case: dict) -> dict:
    signal.alarm(HANG_SECONDS)
    t0 = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            res = fn(case)
        except (Exception, Hang) as exc:  # noqa: BLE001 - reported, judged by the parent
            res = _error(exc)
        finally:
            signal.alarm(0)
    res["elapsed"] = time.perf_counter() - t0
    res["warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
    return res


def _pack_case(case: dict) -> dict:
    import xxhash

    from tierstore.errors import FormatError
    from tierstore.format.pack import Pack

    with Pack.open(case["target"], **case["open_kwargs"]) as p:
        res = {
            "outcome": "opened",
            "layers": list(p.layers),
            "rows": {},
            "unwritten": {},
            "unknown_fields": list(p.unknown_fields),
            "path": p.path,
        }
        for layer in range(p.n_layers):
            for e in range(p.n_experts):
                key = f"{layer},{e}"
                if p.written[layer]:
                    res["rows"][key] = xxhash.xxh3_64_intdigest(p.read_row(layer, e).tobytes())
                else:
                    try:
                        p.read_row(layer, e)
                        res["unwritten"][key] = "served"
                    except FormatError as exc:
                        res["unwritten"][key] = str(exc)
        try:
            report = p.verify()
            res["verify"] = {
                "outcome": "ok",
                "rows_checked": report.rows_checked,
                "rows_unchecked": report.rows_unchecked,
            }
        except Exception as exc:  # noqa: BLE001
            res["verify"] = _error(exc)
    return res


def _warm_case(case: dict) -> dict:
    from tierstore.format.pack import Pack
    from tierstore.warm.formats import read_warm_file
    from tierstore.warm.tools import summarize
    from tierstore.warm.validate import load_hint

    res = {}
    try:
        wf = read_warm_file(case["target"])
        res["strict"] = {"outcome": "read", "pool": len(wf.pool), "arena": len(wf.arena)}
        res["summary"] = json.loads(json.dumps(summarize(wf)))["tiers"]["pool"]["entries"]
    except Exception as exc:  # noqa: BLE001
        res["strict"] = _error(exc)
    with Pack.open(case["pack"]) as pack, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        hint = load_hint(case["target"], pack)
        res["hint"] = (
            None if hint is None else {"pool": hint.pool.keys.tolist(), "arena": hint.arena.keys.tolist()}
        )
        res["hint_warnings"] = [str(w.message) for w in caught]
    res["outcome"] = "done"
    return res


def main() -> None:
    job = json.load(sys.stdin)
    limit = int(job["address_space"])
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    signal.signal(signal.SIGALRM, _on_alarm)
    run = {"packs": _pack_case, "warm": _warm_case}[job["mode"]]
    import tierstore.format.pack  # noqa: F401 - imported once, outside the timed cases
    import tierstore.warm.tools  # noqa: F401

    out = {case["name"]: _timed(run, case) for case in job["cases"]}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
