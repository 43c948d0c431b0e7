"""Entry script kept where plugin hosts call it: ``python promptyoself/cli.py --help`` (DESIGN §6, §9).

The command line itself lives in ``promptyoself.faces.cli``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the package importable, not its folder
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]
    sys.path.insert(0, str(_here.parent))



def missing_dependency(exc: ModuleNotFoundError, argv: list[str]) -> str:
    """One line for a Python without PromptYoSelf's dependencies: what is missing and how to install."""
    root = Path(__file__).resolve().parent.parent
    venv = root / ".venv" / "bin" / "python"
    args = " ".join(argv[1:]) or "--help"
    run = (f"run it with the checkout's venv: {venv} {root / 'promptyoself' / 'cli.py'} {args}" if venv.exists()
           else f"install them: cd {root} && python3 -m venv .venv && .venv/bin/pip install -e ., then run "
           f".venv/bin/promptyoself {args}")
    return (f"promptyoself: this Python ({sys.executable}) lacks the dependency {exc.name!r}; {run} "
            "(or `pip install -e .` into this Python).\n")


try:
    from promptyoself.faces.cli import main
except ModuleNotFoundError as exc:  # a dependency, not our own code: say how to install, exit 2
    if __name__ != "__main__" or not exc.name or exc.name.split(".")[0] == "promptyoself":
        raise
    sys.stderr.write(missing_dependency(exc, sys.argv))
    sys.exit(2)

if __name__ == "__main__":
    sys.exit(main())
