"""``python -m bench [SECTION ...]``: run the benchmark sections (all by default).

Each section is imported only when it runs, so one that is missing (not written yet) or broken
cannot stop the others: a missing one is skipped with a note, a failing one prints its
traceback, and the run goes on. The exit status is 1 if any section failed, 2 for an unknown
section name, else 0.
"""

from __future__ import annotations

import importlib
import sys
import time
import traceback
from collections.abc import Callable
from typing import cast

from bench import SECTIONS


def _run_section(name: str, module_name: str) -> str:
    """Run one section; return "ok", "skipped" or "failed"."""
    print(f"\n=== {name} ({module_name}) ===", flush=True)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as missing:
        if missing.name != module_name:
            traceback.print_exc()
            return "failed"
        print(f"skipped: {module_name} does not exist yet")
        return "skipped"
    except Exception:
        traceback.print_exc()
        return "failed"
    run = getattr(module, "run", None)
    if not callable(run):
        print(f"skipped: {module_name} has no run()")
        return "skipped"
    started = time.perf_counter()
    try:
        cast(Callable[[], None], run)()
    except Exception:
        traceback.print_exc()
        return "failed"
    finally:
        sys.stdout.flush()
    print(f"({name}: {time.perf_counter() - started:.1f} s)")
    return "ok"


def main(argv: list[str]) -> int:
    known = dict(SECTIONS)
    wanted = argv or [name for name, _ in SECTIONS]
    unknown = [name for name in wanted if name not in known]
    if unknown:
        print(
            f"unknown benchmark section(s): {', '.join(unknown)}; choose from: {', '.join(known)}",
            file=sys.stderr,
        )
        return 2
    outcomes = {name: _run_section(name, known[name]) for name in wanted}
    print("\n=== summary ===")
    for name, outcome in outcomes.items():
        print(f"{name:>10}: {outcome}")
    return 1 if "failed" in outcomes.values() else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
