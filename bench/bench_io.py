"""Promote I/O benchmark driver: runs ``tierstore bench io`` with a checked-in config.

    python bench/bench_io.py bench/configs/io_h200.json [--out results.json] [extra CLI flags]

The config is a JSON object of ``tierstore bench io`` flags (without the dashes);
flags after it override the config. Results: see bench/results/io.md.
"""

from __future__ import annotations

import json
import sys

from tierstore.cli import main as cli_main


def config_args(config: dict) -> list[str]:
    argv = []
    for key, value in config.items():
        if key.startswith("_"):
            continue  # comments
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value not in (False, None):
            argv += [flag, str(value)]
    return argv


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    sys.exit(cli_main(["bench", "io"] + config_args(cfg) + sys.argv[2:]))
