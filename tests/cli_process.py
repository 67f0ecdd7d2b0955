"""Driving a real ``tierstore`` process in tests: interrupt it at a point of its run."""

from __future__ import annotations

import os
import signal
import subprocess
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def child_env(*first: str, **set_vars: str) -> dict:
    """The environment of a tierstore child process: this checkout, then ``first``, then
    the inherited PYTHONPATH (where a machine may keep a dependency, e.g. a --target
    install of msgspec), the rest of the environment kept and ``set_vars`` set."""
    path = os.pathsep.join(p for p in (ROOT, *first, os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, **set_vars, "PYTHONPATH": path}


def interrupt_after_line(p: subprocess.Popen, line: str, sig=signal.SIGINT, timeout=120):
    """Send ``sig`` to ``p`` the moment its stderr shows ``line``: a point in the run that
    does not depend on how fast this machine is (or whether it has a GPU). ``p`` was
    started with text-mode stdout/stderr pipes. Returns (returncode, stdout, all stderr,
    whether ``line`` was seen)."""
    seen = []
    try:
        deadline = time.monotonic() + timeout
        for text in p.stderr:
            seen.append(text)
            if line in text or time.monotonic() > deadline:
                break
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    return p.returncode, out, "".join(seen) + err, any(line in t for t in seen)
