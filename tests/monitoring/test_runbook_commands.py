"""Runbook commands against the shipped manifests: every `kubectl` command a runbook gives targets a
kind and name that deploy/ defines, on every overlay it applies to, and every command that costs
serving capacity is followed by a line that says what it costs.

Conventions the runbooks follow (and these tests hold them to):

- Variables: ``$WORKLOAD`` is the vLLM pod's owner as ``kind/name`` (found from the pod by the
  preamble's block), ``$HPA`` the HorizontalPodAutoscaler that scales it, ``$ROUTER`` the router's
  Deployment; ``$POD`` (and what is read from it: ``$OWNER``, ``$NODE``) is the pod itself.
- A fenced block whose first line is ``# Deployment ...`` or ``# StatefulSet ...`` holds commands
  for that kind of workload only (deploy/base and the phases run a Deployment with an HPA,
  deploy/overlays/fleet a StatefulSet with none); other commands must work on every overlay.
- A command that restarts pods or adds GPUs (``set``, ``rollout restart|undo|resume``, ``scale``,
  ``delete``, ``patch`` of the workload or its HPA) sits in a fenced block, and the first line after
  that block starts with ``Cost:`` and names what it costs.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest
from kustomize_render import build
from monitoring_paths import DEPLOY_DIR, RUNBOOKS_DIR

from growpage.config import ENV_PREFIX, FIELD_NAMES, load_config
from growpage.vllm_plugin.settings import PLUGIN_FIELDS, split_settings

PLUGIN_ENV_PREFIX = ENV_PREFIX + "VLLM_"  # the vLLM plugin's own keys (growpage.vllm_plugin.settings)

OVERLAYS = {"base": DEPLOY_DIR / "base",
            **{name: DEPLOY_DIR / "overlays" / name
               for name in ("phase1-monitor", "phase2-namespaces", "phase3-everywhere", "fleet")}}
# These alerts read the router or its replicas' load: only an overlay that runs vLLM's router raises them.
ROUTER_RUNBOOKS = {"GrowPageFleetRoutesToPreemptingReplica.md", "GrowPageRouterNoHealthyWorker.md",
                   "GrowPageRouterAvailabilityFastBurn.md", "GrowPageRouterAvailabilitySlowBurn.md",
                   "GrowPageRouterDown.md"}
# Objects the cluster makes from the manifests (a Deployment's ReplicaSets, every workload's pods):
# their names come from the pod, never from a runbook.
RUNTIME_KINDS = {"Pod", "ReplicaSet", "Event", "Node", "Endpoints", "EndpointSlice"}
FROM_THE_POD = {"POD", "OWNER", "NODE"}
POD_DERIVED = "<read-from-the-pod>"
KINDS = {
    "po": "Pod", "pod": "Pod", "pods": "Pod",
    "deploy": "Deployment", "deployment": "Deployment", "deployments": "Deployment",
    "sts": "StatefulSet", "statefulset": "StatefulSet", "statefulsets": "StatefulSet",
    "rs": "ReplicaSet", "replicaset": "ReplicaSet", "replicasets": "ReplicaSet",
    "hpa": "HorizontalPodAutoscaler", "horizontalpodautoscaler": "HorizontalPodAutoscaler",
    "svc": "Service", "service": "Service", "services": "Service",
    "cm": "ConfigMap", "configmap": "ConfigMap", "configmaps": "ConfigMap",
    "pdb": "PodDisruptionBudget", "poddisruptionbudget": "PodDisruptionBudget",
    "servicemonitor": "ServiceMonitor", "servicemonitors": "ServiceMonitor",
    "sa": "ServiceAccount", "serviceaccount": "ServiceAccount",
    "ev": "Event", "event": "Event", "events": "Event",
    "no": "Node", "node": "Node", "nodes": "Node",
    "ep": "Endpoints", "endpoints": "Endpoints", "endpointslice": "EndpointSlice",
}
VALUE_FLAGS = {"-n", "--namespace", "-o", "--output", "-p", "--patch", "-c", "--container", "-l",
               "--selector", "--type", "--field-selector", "--since", "--tail", "--replicas",
               "--to-revision", "-f", "--filename", "-k", "--kustomize", "--context"}
POD_VERBS = {"logs", "exec", "attach", "port-forward", "cp"}  # a bare name is a pod
NODE_VERBS = {"cordon", "uncordon", "drain"}
NO_TARGET_VERBS = {"apply", "diff", "api-resources", "version", "explain", "auth", "kustomize"}
TWO_WORD_VERBS = {"rollout", "set"}
WORKLOAD_KINDS = {"Deployment", "StatefulSet"}
# What a Cost: line must name for each kind of costly command.
RESTARTS, GPUS = "restart", "GPU"
FENCE = re.compile(r"^(?P<indent>[ ]*)```\w*\n(?P<body>.*?)^(?P=indent)```[ ]*\n", re.MULTILINE | re.DOTALL)
INLINE = re.compile(r"`([^`]+)`")
VARIABLE = re.compile(r"\$(?:\{(\w+)(?:#([^}]*))?\}|(\w+))")
SCOPE = re.compile(r"#\s*(Deployment|StatefulSet)\b")


class Unresolved(Exception):
    """A command whose target cannot be read: a variable the overlay does not set, no resource."""


@dataclass(frozen=True)
class Command:
    """One `kubectl` command of a runbook, where it stands and what comes after its block."""

    runbook: str
    text: str
    scope: str | None  # the only workload kind it is for, or None: every overlay
    fenced: bool
    cost_line: str | None  # the first line after its fenced block


@dataclass(frozen=True)
class Target:
    kind: str
    name: str | None  # None: a list of that kind


def _kubectl_commands(text: str) -> list[str]:
    """Every ``kubectl ...`` in shell ``text``, cut where the shell would end it (``|``, ``;``,
    ``&``, the ``)`` of a ``$(...)``, a line end outside quotes)."""
    commands = []
    for match in re.finditer(r"(?<![\w-])kubectl(?![\w-])", text):
        line_start = text.rfind("\n", 0, match.start()) + 1
        if text[line_start:match.start()].lstrip().startswith("#"):
            continue  # a comment that names kubectl
        quote, depth, end = None, 0, match.start()
        while end < len(text):
            char = text[end]
            if quote:
                quote = None if char == quote else quote
            elif char in "'\"":
                quote = char
            elif char == "(":
                depth += 1
            elif char == ")":
                if depth == 0:
                    break
                depth -= 1
            elif char in "|;&\n`":
                break
            end += 1
        commands.append(text[match.start():end].strip())
    return commands


def _commands(path: Path) -> list[Command]:
    text = path.read_text()
    found: list[Command] = []
    outside = text
    for block in FENCE.finditer(text):
        body = textwrap.dedent(block["body"]).replace("\\\n", " ")
        first = body.lstrip().splitlines()[0] if body.strip() else ""
        scope_match = SCOPE.match(first)
        after = [line.strip() for line in text[block.end():].splitlines() if line.strip()]
        found += [Command(path.name, command, scope_match[1] if scope_match else None, True,
                          after[0] if after else None) for command in _kubectl_commands(body)]
        outside = outside.replace(block.group(0), "\n", 1)
    for span in INLINE.findall(outside):
        span = " ".join(span.split())
        if span.startswith("kubectl "):
            found += [Command(path.name, command, None, False, None) for command in _kubectl_commands(span)]
    return found


def _all_commands() -> list[Command]:
    return [command for path in sorted(RUNBOOKS_DIR.glob("*.md")) for command in _commands(path)]


def _positionals(command: str, bindings: dict[str, str] | None = None) -> list[str]:
    """The words of ``command`` that are not flags nor flag values, variables set from ``bindings``
    (None: left as written)."""
    words = shlex.split(command)[1:]
    positionals, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word == "--":
            break  # what follows runs in the container
        elif word.startswith("-"):
            skip = word in VALUE_FLAGS
        else:
            positionals.append(word if bindings is None else _substitute(word, bindings))
    return positionals


def _verb(positionals: list[str]) -> tuple[str, list[str]]:
    """``("rollout restart", rest)`` or ``("get", rest)``."""
    if positionals[0] in TWO_WORD_VERBS:
        return " ".join(positionals[:2]), positionals[2:]
    return positionals[0], positionals[1:]


def _targets(command: str, bindings: dict[str, str]) -> list[Target] | None:
    """What ``command`` acts on once its variables are set; None: it names no object."""
    verb, rest = _verb(_positionals(command, bindings))
    if verb in NO_TARGET_VERBS or verb.startswith("rollout") and not rest:
        return None
    if verb in NODE_VERBS:
        return [Target("node", rest[0])]
    if verb in POD_VERBS:
        kind, _, name = rest[0].rpartition("/")
        return [Target(kind or "pod", name)]
    if verb.startswith(("set ", "rollout ")):
        rest = rest[:1]  # then KEY=VALUE pairs, or nothing
    rest = [word for word in rest if "=" not in word]  # KEY=VALUE of set env, label, annotate
    if not rest:
        raise Unresolved("names no resource")
    if "/" in rest[0]:
        return [Target(*word.split("/", 1)) for word in rest]
    kinds, names = rest[0].split(","), rest[1:]
    return [Target(kind, name) for kind in kinds for name in names] or [Target(kind, None) for kind in kinds]


def _substitute(word: str, bindings: dict[str, str]) -> str:
    def value(match: re.Match) -> str:
        name, pattern = match[1] or match[3], match[2]
        if name in FROM_THE_POD:
            return POD_DERIVED
        if name not in bindings:
            raise Unresolved(f"${name} is not set on this overlay (set: {sorted(bindings)})")
        bound = bindings[name]
        if pattern is None:
            return bound
        cut = next((i for i in range(len(bound) + 1) if fnmatch.fnmatchcase(bound[:i], pattern)), 0)
        return bound[cut:]  # ${NAME#pattern}: the shortest matching prefix removed, as the shell does
    return VARIABLE.sub(value, word)


def _workload(documents: list[dict]) -> dict:
    """The Deployment or StatefulSet that runs vLLM with the GrowPage plugin."""
    [workload] = [d for d in documents if d["kind"] in WORKLOAD_KINDS
                  and any({"name": "VLLM_PLUGINS", "value": "growpage"} in c.get("env", [])
                          for c in d["spec"]["template"]["spec"]["containers"])]
    return workload


def _bindings(documents: list[dict]) -> dict[str, str]:
    """The runbook variables as an SRE on this overlay would set them."""
    workload = _workload(documents)
    bindings = {"WORKLOAD": f"{workload['kind'].lower()}/{workload['metadata']['name']}"}
    for document in documents:
        if document["kind"] == "HorizontalPodAutoscaler":
            ref = document["spec"]["scaleTargetRef"]
            if (ref["kind"], ref["name"]) == (workload["kind"], workload["metadata"]["name"]):
                bindings["HPA"] = document["metadata"]["name"]
        if (document["kind"] == "Deployment"
                and document["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "vllm-router"):
            bindings["ROUTER"] = document["metadata"]["name"]
    return bindings


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    return {name: build(directory) for name, directory in OVERLAYS.items()}


def _problem(command: Command, documents: list[dict]) -> str | None:
    """Why ``command`` would fail on the cluster ``documents`` describe, or None."""
    defined = {(d["kind"], d["metadata"]["name"]) for d in documents}
    try:
        targets = _targets(command.text, _bindings(documents))
    except Unresolved as error:
        return str(error)
    for target in targets or []:
        kind = KINDS.get(target.kind.lower())
        if kind is None:
            return f"unknown kind {target.kind!r}"
        if target.name is None:
            if kind not in RUNTIME_KINDS and kind not in {k for k, _ in defined}:
                return f"lists {kind}, which this overlay defines none of"
        elif POD_DERIVED in target.name:
            continue
        elif kind in RUNTIME_KINDS:
            return f"names the {kind} {target.name!r}, which only the cluster names (read it from the pod)"
        elif (kind, target.name) not in defined:
            return f"targets {kind} {target.name!r}, which this overlay does not define"
    return None


def _applies(command: Command, documents: list[dict]) -> bool:
    if command.runbook in ROUTER_RUNBOOKS and "ROUTER" not in _bindings(documents):
        return False
    return command.scope in (None, _workload(documents)["kind"])


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_runbook_command_targets_what_the_overlay_defines(rendered, overlay):
    documents = rendered[overlay]
    checked = [c for c in _all_commands() if _applies(c, documents)]
    failures = [f"{c.runbook}: {c.text}\n    {problem}" for c in checked
                if (problem := _problem(c, documents))]
    assert checked
    assert not failures, "\n".join(failures)


def test_scoped_and_router_commands_are_checked_somewhere(rendered):
    # A scope or a router runbook must not hide its commands from every overlay.
    commands = _all_commands()
    for scope in WORKLOAD_KINDS:
        assert any(_workload(documents)["kind"] == scope for documents in rendered.values()), scope
    assert any("ROUTER" in _bindings(documents) for documents in rendered.values())
    assert {c.runbook for c in commands} >= ROUTER_RUNBOOKS


def _settings(workload: dict) -> tuple[dict[str, str], dict]:
    """The vLLM container's plain env and its ``--additional-config`` GrowPage keys."""
    [container] = workload["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    [additional] = [json.loads(arg.split("=", 1)[1])["growpage"] for arg in container["args"]
                    if arg.startswith("--additional-config=")]
    return env, additional


def test_every_setting_a_runbook_changes_takes_effect_on_the_shipped_pods(rendered):
    """A `set env` of a GrowPage variable that --additional-config also sets would change nothing
    (the key there wins); one the config does not know would fail at start-up."""
    changes = [(c, word) for c in _all_commands() if _verb(_positionals(c.text))[0] == "set env"
               for word in _verb(_positionals(c.text))[1][1:]]
    assert changes
    for overlay, documents in rendered.items():
        env, additional = _settings(_workload(documents))
        for command, word in changes:
            key, _, value = word.partition("=")
            where = f"{overlay}: {command.runbook}: {word}"
            if not key.startswith(ENV_PREFIX):
                assert key in env, f"{where}: the shipped pods have no {key} to change"
                continue
            if key.startswith(PLUGIN_ENV_PREFIX):  # a key only the vLLM plugin reads
                name = key.removeprefix(PLUGIN_ENV_PREFIX).lower()
                assert name in PLUGIN_FIELDS and name not in additional, where
                if not value.startswith("<"):
                    _, plugin = split_settings(additional, env={**env, key: value})
                    assert str(getattr(plugin, name)) == value, where
                continue
            field = key.removeprefix(ENV_PREFIX).lower()
            assert field in FIELD_NAMES and field not in additional, where
            if not value.startswith("<"):  # a placeholder the reader fills in
                changed = load_config(env={**env, key: value}, overrides=additional)
                assert getattr(changed, field) == getattr(load_config(env={key: value}), field), where


def _cost_phrases(command: str) -> set[str]:
    """What a Cost: line after ``command`` must name: the restarts it causes, the GPUs it adds."""
    words = shlex.split(command)
    if "--list" in words or any(word.startswith("--dry-run") for word in words):
        return set()  # reads, changes nothing
    verb, rest = _verb(_positionals(command))
    target = rest[0] if rest else ""
    kind = "Workload" if target.startswith("$WORKLOAD") else KINDS.get(target.split("/")[0].lower())
    if verb.startswith("set ") or verb in ("rollout restart", "rollout undo", "rollout resume", "delete"):
        return {RESTARTS}
    if verb == "scale" or verb == "patch" and kind == "HorizontalPodAutoscaler":
        return {GPUS}
    if verb == "patch" and kind in {"Workload", *WORKLOAD_KINDS}:
        return {RESTARTS}  # a patch to the pod template restarts every pod
    return set()


def test_every_command_that_costs_capacity_says_what_it_costs():
    failures = []
    for command in _all_commands():
        phrases = _cost_phrases(command.text)
        if not phrases:
            continue
        if not command.fenced:
            failures.append(f"{command.runbook}: `{command.text}` is inline: put it in a fenced block "
                            f"followed by a 'Cost:' line")
        elif not (command.cost_line or "").startswith("Cost:"):
            failures.append(f"{command.runbook}: `{command.text}`: the line after its block does not "
                            f"start with 'Cost:' ({command.cost_line!r})")
        elif missing := {p for p in phrases if p.lower() not in command.cost_line.lower()}:
            failures.append(f"{command.runbook}: `{command.text}`: its Cost: line names no {sorted(missing)}")
    assert not failures, "\n".join(failures)


FAKE_KUBECTL = '''\
"""kubectl get KIND NAME -o jsonpath=... answered from a JSON file of objects, as a cluster would."""
import json, os, re, sys
words = sys.argv[1:]
words = [w for i, w in enumerate(words) if w != "-n" and (i == 0 or words[i - 1] != "-n")]
output = next(w.split("=", 1)[1] for w in words if w.startswith("jsonpath="))
kind, name = words[words.index("get") + 1:words.index("get") + 3]
obj = json.load(open(os.environ["FAKE_CLUSTER"]))[kind][name]
def walk(path):
    value = obj
    for key, index in re.findall(r"\\.(\\w+)(?:\\[(\\d+)\\])?", path):
        value = value[key] if index == "" else value[key][int(index)]
    return str(value)
sys.stdout.write(re.sub(r"\\{([^}]*)\\}", lambda m: walk(m[1]), output))
'''


def _cluster_for(workload: dict) -> dict:
    """A pod of ``workload`` and its owners, named and linked as the controllers do."""
    name = workload["metadata"]["name"]
    if workload["kind"] == "Deployment":
        replicaset = f"{name}-5d4f8b9c7"
        return {"pod": {"the-pod": {"metadata": {"ownerReferences": [{"kind": "ReplicaSet", "name": replicaset}]}}},
                "replicaset": {replicaset: {"metadata": {"ownerReferences": [{"kind": "Deployment", "name": name}]}}}}
    return {"pod": {"the-pod": {"metadata": {"ownerReferences": [{"kind": workload["kind"], "name": name}]}}}}


def _preamble_block(path: Path) -> str:
    head = path.read_text().split("<!-- BEGIN GENERATED", 1)[0]
    blocks = [block["body"] for block in FENCE.finditer(head) if "WORKLOAD=" in block["body"]]
    assert len(blocks) == 1, f"{path.name}: its preamble has {len(blocks)} blocks that set WORKLOAD, not 1"
    return textwrap.dedent(blocks[0])


def _runbooks_using_workload() -> list[Path]:
    return [path for path in sorted(RUNBOOKS_DIR.glob("GrowPage*.md")) if "$WORKLOAD" in path.read_text()]


def test_every_runbook_that_uses_workload_sets_it_the_same_way():
    blocks = {path.name: _preamble_block(path) for path in _runbooks_using_workload()}
    assert blocks and len(set(blocks.values())) == 1, sorted(blocks)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_preamble_finds_the_workload_from_the_pod(rendered, overlay, tmp_path):
    [path, *_] = _runbooks_using_workload()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (tmp_path / "fake_kubectl.py").write_text(FAKE_KUBECTL)
    (bin_dir / "kubectl").write_text(f'#!/bin/sh\nexec {sys.executable} {tmp_path / "fake_kubectl.py"} "$@"\n')
    (bin_dir / "kubectl").chmod(0o755)
    (tmp_path / "cluster.json").write_text(json.dumps(_cluster_for(_workload(rendered[overlay]))))
    script = f"NAMESPACE=ns POD=the-pod\n{_preamble_block(path)}\nprintf %s \"$WORKLOAD\""
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, timeout=60,
                            env={"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_CLUSTER": str(tmp_path / "cluster.json")})
    assert result.stdout.splitlines()[-1] == _bindings(rendered[overlay])["WORKLOAD"]
