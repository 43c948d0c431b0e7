"""Run ``python -m promptyoself ARGS`` with delivery fast paths switched off (benchmarks only).

    python -m bench.fastpaths --off http1 -- worker --shared

``http1``: message sends go through httpx instead of ``promptyoself/letta/http1.py``
(``promptyoself.letta.client.HTTP1``). (``direct``, the claim and record statements on psycopg 3
directly, was measured here and removed: docs/design.md, "Fast paths".) The switches are
module-level flags, not settings: only the
benchmarks (bench/peer.py, bench/burst.py) set them, through this wrapper, so that the same worker
runs with and without each path.
"""

from __future__ import annotations

import argparse
import runpy
import sys

PATHS = ("http1",)


def switch_off(names: list[str]) -> None:
    """Set the module flags of the fast paths named in ``names`` to False."""
    unknown = set(names) - set(PATHS)
    if unknown:
        raise SystemExit(f"unknown fast path(s): {', '.join(sorted(unknown))} (known: {', '.join(PATHS)})")
    if "http1" in names:
        import promptyoself.letta.client as client

        client.HTTP1 = False


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.fastpaths", description=__doc__.split("\n\n")[0])
    parser.add_argument("--off", default="", help="comma-separated fast paths to switch off: http1")
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="-- then the arguments of python -m promptyoself")
    args = parser.parse_args()
    rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
    switch_off([n for n in args.off.split(",") if n])
    sys.argv = ["promptyoself", *rest]
    runpy.run_module("promptyoself", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
