"""Opcode histogram of the MoE decode kernels' SASS (run where cuobjdump exists):
shows which pipe the per-element decode lands on (e.g. F2F vs HADD2.F32 for the
fp16 -> fp32 widening) without hardware counters.

    python bench/device/sass_hist.py path/to/_C.so [kernel-substring ...]
"""

from __future__ import annotations

import collections
import re
import subprocess
import sys


def main(argv: list[str]) -> int:
    so, subs = argv[0], argv[1:] or ["w13_silu_kernelI13__nv_bfloat16Li1E", "moe_w2_kernelILi1E"]
    sass = subprocess.run(["cuobjdump", "-sass", so], capture_output=True, text=True).stdout
    funcs = re.split(r"\n\s*Function : ", sass)
    for f in funcs[1:]:
        name = f.split("\n", 1)[0].strip()
        if not any(s in name for s in subs):
            continue
        ops = collections.Counter(
            m.group(1).split(".")[0]
            for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", f)
        )
        total = sum(ops.values())
        print(f"{name[:90]}: {total} instructions")
        print("  " + ", ".join(f"{op} {n}" for op, n in ops.most_common(22)))
        full = collections.Counter(
            m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]+)", f)
        )
        print(
            "  conversions/loads: "
            + ", ".join(
                f"{op} {n}"
                for op, n in full.items()
                if op.startswith(("F2F", "HADD2", "I2F", "LDG", "LDS", "PRMT"))
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
