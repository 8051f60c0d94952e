"""Turns the library's user-facing errors into one red line on stderr and exit code 2.

``growpage`` raises :class:`~growpage.errors.GrowPageError` for problems the user can fix; only the CLI
prints them. Anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.text import Text
from typer.core import TyperGroup

from growpage.errors import GrowPageError

USER_ERROR_EXIT_CODE = 2  # the same code typer/click use for usage errors


def print_error(message: str) -> None:
    """Prints ``error: <message>`` as one red line on stderr (no markup, no wrapping)."""
    # Built per call so it writes to the current sys.stderr (CliRunner swaps it).
    console = Console(stderr=True, highlight=False, soft_wrap=True)
    console.print(Text(f"error: {message}", style="bold red"))


class GrowPageGroup(TyperGroup):
    """The root command group: a :class:`GrowPageError` anywhere below it exits 2 with one line.

    Catching in ``main`` covers every path a user reaches, including option callbacks that run while
    arguments are parsed and commands of sub-apps added with ``app.add_typer``. ``main`` is also what
    :class:`typer.testing.CliRunner` calls, so tests see the same behaviour as the console script.
    """

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        windows_expand_args: bool = True,
        **extra: Any,
    ) -> Any:
        try:
            return super().main(
                args=args,
                prog_name=prog_name,
                complete_var=complete_var,
                standalone_mode=standalone_mode,
                windows_expand_args=windows_expand_args,
                **extra,
            )
        except GrowPageError as error:
            if not standalone_mode:
                raise
            print_error(_one_line(str(error)))
            sys.exit(USER_ERROR_EXIT_CODE)


def _one_line(message: str) -> str:
    # A multi-line message would read as a traceback fragment; SREs grep for one line.
    return " ".join(message.split()) or "unknown error"
