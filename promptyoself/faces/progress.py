"""A progress bar for long work started from a terminal (``import-legacy``, ``python -m bench``).

The bar is rich's (``rich.progress``) and goes to stderr, and only when stderr is a terminal: piped or
redirected, nothing is drawn and stdout keeps carrying the result alone. The core never sees the bar:
it takes a plain ``progress(done, total)`` callable (``promptyoself.core.legacy.import_legacy``).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TextIO

Update = Callable[[int, int], None]
"""``update(done, total)``: how much of the work is done."""


def _noop(done: int, total: int) -> None:
    return None


@contextmanager
def progress_bar(description: str, *, stream: TextIO | None = None) -> Iterator[Update]:
    """Within the block, ``update(done, total)`` moves a bar on ``stream`` (stderr) if it is a terminal;
    otherwise ``update`` does nothing. The bar is removed when the block ends."""
    stream = stream if stream is not None else sys.stderr
    if not stream.isatty():
        yield _noop
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(file=stream)
    with Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=True, redirect_stdout=False,
    ) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


@contextmanager
def section_bar(total: int, *, stream: TextIO | None = None) -> Iterator[Callable[[int, str], None]]:
    """For work in named steps (bench sections): ``step(done, name)`` shows ``name`` and ``done/total``."""
    stream = stream if stream is not None else sys.stderr
    if not stream.isatty():
        yield lambda done, name: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=Console(file=stream), transient=True, redirect_stdout=False,
    ) as bar:
        task = bar.add_task("", total=total)

        def step(done: int, name: str) -> None:
            bar.update(task, completed=done, description=name)

        yield step
