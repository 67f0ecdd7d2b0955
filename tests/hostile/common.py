"""What every hostile class shares: a digest of a directory that never opens a FIFO,
the batch child that runs cases under an address-space cap, and the one-line checks.

Cases are generated in the test process; the reading runs in ONE child process per
batch (``run_batch``) with ``RLIMIT_AS`` set, a per-case alarm and a wall clock, so a
header that would allocate gigabytes or block forever fails its case instead of
taking the suite down."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys

from cli_process import child_env

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TESTS)
CASE_SECONDS = 2.0  # every case, on the 2-core CI machine
ADDRESS_SPACE = 3 << 30  # the child's RLIMIT_AS: far above any honest case, far
# below what an unchecked header would ask for


def tree_digest(root: str, skip: set | None = None) -> dict:
    """path -> (kind, content hash or link target), without following links or opening
    anything but regular files (a FIFO must never be opened here). ``skip``: relative
    paths left out (the caller digests them otherwise, e.g. sparse TiB files)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in sorted(dirnames + filenames):
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            if skip and rel in skip:
                continue
            if stat.S_ISREG(st.st_mode):
                h = hashlib.sha256()
                with open(p, "rb") as f:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        h.update(block)
                out[rel] = ("file", st.st_size, h.hexdigest())
            elif stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(p))
            else:
                out[rel] = (stat.S_IFMT(st.st_mode), st.st_size)
    return out


EMPTY = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def without_new_locks(before: dict, after: dict) -> dict:
    """``after`` less the empty ``<stem>.lock`` files a live store creates as its flock
    target (FORMAT.md: "may be left behind"): the only file a reader may add."""
    return {
        k: v for k, v in after.items() if k in before or not (k.endswith(".lock") and v == ("file", 0, EMPTY))
    }


def run_batch(
    mode: str, cases: list[dict], timeout: float = 240.0, address_space: int = ADDRESS_SPACE
) -> dict:
    """Run ``hostile.child`` on ``cases`` (JSON-able dicts) in one capped child process;
    returns name -> result dict."""
    payload = json.dumps({"mode": mode, "address_space": address_space, "cases": cases})
    r = subprocess.run(
        [sys.executable, "-m", "hostile.child"],
        input=payload,
        text=True,
        capture_output=True,
        timeout=timeout,
        env=child_env(TESTS),
        cwd=TESTS,
    )
    assert r.returncode == 0, f"batch child failed ({r.returncode}): {r.stderr[-3000:]}"
    results = json.loads(r.stdout)
    missing = {c["name"] for c in cases} - set(results)
    assert not missing, f"the child reported nothing for {sorted(missing)[:5]}"
    return results


def assert_one_line_error(res: dict, names: str | list[str], where: str) -> None:
    """A TierstoreError subclass, one line, naming the file (every name in ``names``)."""
    assert res["outcome"] == "refused", f"{where}: expected a refusal, got {res}"
    assert "TierstoreError" in res["mro"], f"{where}: {res['etype']} is no TierstoreError: {res['msg']}"
    msg = res["msg"]
    assert msg and "\n" not in msg, f"{where}: not one line: {msg!r}"
    for name in [names] if isinstance(names, str) else names:
        assert name in msg, f"{where}: the message does not name {name!r}: {msg!r}"


def assert_fast(res: dict, where: str, limit: float = CASE_SECONDS) -> None:
    assert res["elapsed"] < limit, f"{where}: took {res['elapsed']:.2f} s (limit {limit} s)"
