"""Builds a kustomize overlay: with kustomize (or kubectl kustomize) when installed, else in Python.

The Python renderer covers what deploy/ uses (resources, components that add resources, strategic-merge
patches from files or inline, ``$patch: delete``) and fails loudly on anything else, so a patch that no
longer applies is caught either way.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path

import yaml


def kustomize_command(directory: Path) -> list[str] | None:
    if shutil.which("kustomize"):
        return ["kustomize", "build", str(directory)]
    if shutil.which("kubectl"):
        return ["kubectl", "kustomize", str(directory)]
    return None


def build_with_kustomize(directory: Path) -> list[dict]:
    command = kustomize_command(directory)
    assert command is not None, "neither kustomize nor kubectl is installed"
    # a hang guard, not a timing check
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, check=True)
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc]


def _merge(base, patch):
    """Strategic merge as kustomize applies it to our patches: maps merge, lists of named maps
    (containers, env, ports) merge by name, other lists are replaced."""
    if isinstance(base, dict) and isinstance(patch, dict):
        merged = dict(base)
        for key, value in patch.items():
            merged[key] = _merge(base[key], value) if key in base else copy.deepcopy(value)
        return merged
    if (isinstance(base, list) and isinstance(patch, list)
            and all(isinstance(item, dict) and "name" in item for item in base + patch)):
        by_name = {item["name"]: item for item in base}
        patched = [_merge(by_name[item["name"]], item) if item["name"] in by_name else copy.deepcopy(item)
                   for item in patch]
        patched_names = {item["name"] for item in patch}
        return patched + [copy.deepcopy(item) for item in base if item["name"] not in patched_names]
    return copy.deepcopy(patch)


def render_in_python(directory: Path) -> list[dict]:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unsupported = set(kustomization) - {"apiVersion", "kind", "resources", "patches", "components"}
    assert not unsupported, f"{directory}: the Python renderer does not support {sorted(unsupported)}"
    documents: list[dict] = []
    # Components that only add resources (ours) render like resources, after the kustomization's own.
    for resource in [*kustomization.get("resources", []), *kustomization.get("components", [])]:
        path = directory / resource
        if path.is_dir():
            documents += render_in_python(path)
        else:
            documents += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    for patch_ref in kustomization.get("patches", []):
        unsupported = set(patch_ref) - {"path", "patch"}
        assert not unsupported, f"{directory}: the Python renderer does not support patch {sorted(unsupported)}"
        where = patch_ref.get("path", "an inline patch")
        patch = yaml.safe_load((directory / patch_ref["path"]).read_text() if "path" in patch_ref
                               else patch_ref["patch"])
        key = (patch["kind"], patch["metadata"]["name"])
        targets = [i for i, doc in enumerate(documents) if (doc["kind"], doc["metadata"]["name"]) == key]
        assert len(targets) == 1, f"patch {where} matches {len(targets)} resources, not 1"
        if patch.get("$patch") == "delete":
            del documents[targets[0]]
        else:
            documents[targets[0]] = _merge(documents[targets[0]], patch)
    return documents


def build(directory: Path) -> list[dict]:
    """kustomize's output where it is installed, else the Python render."""
    return build_with_kustomize(directory) if kustomize_command(directory) else render_in_python(directory)
