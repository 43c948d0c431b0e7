"""Entry script kept where plugin hosts call it: ``python promptyoself/cli.py --help`` (docs/design.md §3, §10).

The command line itself lives in ``promptyoself.faces.cli``.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the package importable, not its folder
    _here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != _here]
    sys.path.insert(0, str(_here.parent))


from promptyoself.faces.stdio_entry import cli_main  # standard library only until the CLI loads

if __name__ == "__main__":
    sys.exit(cli_main(run_as=str(Path(__file__).resolve())))
