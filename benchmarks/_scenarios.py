"""The options of a benchmark of named scenarios run against fake providers: --rows and --only.

Import it beside the benchmark (``sys.path.insert(0, <benchmarks>)``): benchmarks are scripts, not a package.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable


def scenario_options(doc: str, rows: int, names: str = "") -> tuple[argparse.Namespace, Callable[[str], bool]]:
    """Parse --rows and --only of a benchmark of named scenarios; the test says whether --only wants a scenario
    (no name given: every scenario)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--rows", type=int, default=rows)
    parser.add_argument("--only", default="", help=f"comma-separated scenario names{': ' + names if names else ''} (default: all)")
    args = parser.parse_args()
    wanted = set(filter(None, args.only.split(",")))
    return args, lambda name: not wanted or name in wanted
