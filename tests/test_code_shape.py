"""Small units: every function of the package and the CLI fits on a screen (at most 60 lines, from its
``def`` line to its last line), so a reader can take each one at a time; and no class that holds
state carries more than 20 instance attributes, so each has one job a reader can name."""

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


MAX_INSTANCE_ATTRIBUTES = 20


def _is_frozen_record(node: ast.ClassDef) -> bool:
    """A frozen dataclass: an immutable record (settings, a snapshot), whose width is its schema."""
    for decorator in node.decorator_list:
        if isinstance(decorator, ast.Call) and any(
                keyword.arg == "frozen" and isinstance(keyword.value, ast.Constant) and keyword.value.value
                for keyword in decorator.keywords):
            return True
    return False


def instance_attributes(node: ast.ClassDef) -> set[str]:
    """Names a class's methods assign on ``self``, and its annotated class-level fields."""
    names = {statement.target.id for statement in node.body
             if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)}
    for sub in ast.walk(node):
        if isinstance(sub, ast.Assign | ast.AnnAssign | ast.AugAssign):
            for target in sub.targets if isinstance(sub, ast.Assign) else [sub.target]:
                names |= {element.attr for element in ast.walk(target) if isinstance(element, ast.Attribute)
                          and isinstance(element.value, ast.Name) and element.value.id == "self"}
    return names


def wide_classes(root: Path = ROOT) -> dict[str, int]:
    """``{"path Class": attributes}`` of every stateful class wider than the limit."""
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
                if isinstance(node, ast.ClassDef) and not _is_frozen_record(node):
                    width = len(instance_attributes(node))
                    if width > MAX_INSTANCE_ATTRIBUTES:
                        found[f"{path.relative_to(root)} {node.name}"] = width
    return found


def test_no_stateful_class_holds_more_than_twenty_attributes():
    assert wide_classes() == {}, f"classes over {MAX_INSTANCE_ATTRIBUTES} instance attributes: give a group of " \
                                 "them its own small class"


def test_the_width_counts_self_assignments_and_fields_but_not_frozen_records(tmp_path):
    fields = "\n".join(f"    f{i}: int = 0" for i in range(MAX_INSTANCE_ATTRIBUTES))
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "wide.py").write_text(
        f"import dataclasses\n@dataclasses.dataclass\nclass Wide:\n{fields}\n    def grow(self):\n"
        f"        self.extra = 1\n@dataclasses.dataclass(frozen=True)\nclass Record:\n{fields}\n    g: int = 0\n")
    assert wide_classes(tmp_path) == {"agent/wide.py Wide": MAX_INSTANCE_ATTRIBUTES + 1}


# vLLM's objects are described by Protocols (growpage.vllm_plugin.vllm_types), so an ``Any`` in the
# plugin is left only where a Protocol would lie; this bounds them (32 when it was set).
MAX_PLUGIN_ANY = 40


def annotation_anys(path: Path) -> int:
    """``Any`` in a module's annotations: parameters, returns and annotated assignments."""
    annotations: list[ast.expr] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            arguments = node.args
            every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg, arguments.kwarg]
            annotations += [argument.annotation for argument in every if argument is not None and argument.annotation]
            annotations += [node.returns] if node.returns is not None else []
        elif isinstance(node, ast.AnnAssign):
            annotations.append(node.annotation)
    count = 0
    for annotation in annotations:
        for element in ast.walk(annotation):
            if isinstance(element, ast.Name) and element.id == "Any":
                count += 1
            elif isinstance(element, ast.Constant) and isinstance(element.value, str):
                count += element.value.count("Any")
    return count


def test_the_vllm_plugin_names_vllms_objects_instead_of_any():
    plugin = ROOT / "agent" / "growpage" / "vllm_plugin"
    total = sum(annotation_anys(path) for path in plugin.glob("*.py"))
    assert total <= MAX_PLUGIN_ANY, f"{total} Any in the plugin's annotations: describe the object in vllm_types.py"


def test_an_any_is_counted_in_parameters_returns_and_fields(tmp_path):
    module = tmp_path / "m.py"
    module.write_text("def f(a: Any, *b: Any) -> dict[str, Any]:\n    x: Any = 1\n    y: 'list[Any]' = []\n")
    assert annotation_anys(module) == 5
