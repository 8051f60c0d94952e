"""Small units: every function of the package and the CLI fits on a screen (at most 60 lines, from its
``def`` line to its last line), so a reader can take each one at a time."""

from __future__ import annotations

import ast
from pathlib import Path

MAX_FUNCTION_LINES = 60
ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "cli")
# Functions still over the limit, by "path name". Each entry goes when its function is split: the
# last test fails while an entry names a function that already fits.
KNOWN_LONG: set[str] = set()


def long_functions(root: Path = ROOT) -> dict[str, int]:
    """``{"path name": lines}`` of every function or method longer than the limit."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    assert node.end_lineno is not None
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        found[f"{path.relative_to(root)} {node.name}"] = lines
    return found


def test_every_function_fits_on_a_screen():
    over = {name: lines for name, lines in long_functions().items() if name not in KNOWN_LONG}
    assert over == {}, f"functions over {MAX_FUNCTION_LINES} lines: split them by meaning into named helpers"


def test_every_known_long_function_is_still_long():
    assert KNOWN_LONG <= set(long_functions()), "a function in KNOWN_LONG fits now: remove its entry"


def test_the_walk_measures_from_the_def_line_to_the_last_line(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES - 1))
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "fits.py").write_text(f"@decorator\ndef fits():\n{body}\n")
    (tmp_path / "agent" / "over.py").write_text(f"class Holder:\n    def over(self):\n{body}\n        y = 1\n"
                                                .replace("\n    x", "\n        x"))
    assert long_functions(tmp_path) == {"agent/over.py over": MAX_FUNCTION_LINES + 1}
