"""Run every ``bench/bench_*.py`` in turn (``make bench``); exit non-zero if any fails."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    """Run each benchmark with this interpreter; report the failures at the end."""
    here = Path(__file__).resolve().parent
    failed: list[str] = []
    for script in sorted(here.glob("bench_*.py")):
        print(f"\n=== {script.name} ===", flush=True)
        started = time.perf_counter()
        code = subprocess.call([sys.executable, str(script)], cwd=here.parent)
        print(f"=== {script.name}: exit {code} after {time.perf_counter() - started:.0f} s ===", flush=True)
        if code != 0:
            failed.append(script.name)
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
