"""Tests for the gpctl entry point and ``gpctl kv-size``, as a user runs them."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from gpctl.errors import GrowPageGroup
from gpctl.main import app
from growpage import __version__
from growpage.errors import GrowPageError

SMOLLM2_ARGS = ["kv-size", "--model", "smollm2-135m"]
QUOTED_EXAMPLE_ARGS = ["kv-size", "--layers", "32", "--kv-heads", "32", "--head-dim", "128", "--tokens", "640"]


@pytest.fixture
def runner() -> CliRunner:
    # Wide enough that no table cell wraps; a narrow-terminal test sets COLUMNS itself.
    return CliRunner(env={"COLUMNS": "120", "NO_COLOR": "1"})


def _gpctl_script() -> Path:
    script = Path(sys.executable).parent / "gpctl"
    if not script.exists():
        found = shutil.which("gpctl")
        if found is None:
            pytest.skip("gpctl console script is not installed")
        script = Path(found)
    return script


def test_help_lists_kv_size(runner):
    result = runner.invoke(app, ["--help"])
    assert result.exit_code == 0
    assert "kv-size" in result.output


def test_no_arguments_shows_help(runner):
    result = runner.invoke(app, [])
    assert "Usage" in result.output
    assert "kv-size" in result.output


def test_version(runner):
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"gpctl {__version__}"


def test_kv_size_text_shows_the_quoted_example_s_true_numbers_and_formula(runner):
    result = runner.invoke(app, [*QUOTED_EXAMPLE_ARGS, "--batch", "8"])
    assert result.exit_code == 0, result.output
    for expected in ("512 KiB", "524,288", "320 MiB", "335,544,320", "2.5 GiB", "2,684,354,560"):
        assert expected in result.stdout
    assert "Pages per request" in result.stdout and " 40 " in result.stdout
    assert "Pages per batch" in result.stdout and " 320 " in result.stdout
    assert "32 layers x 32 KV heads x 128 head_dim x 2 (K and V) x 2 B (float16)" in result.stdout
    assert "1.8 GB" in result.stdout  # the quoted figure, corrected


def test_kv_size_text_fits_80_columns():
    result = CliRunner(env={"COLUMNS": "80", "NO_COLOR": "1"}).invoke(
        app, [*SMOLLM2_ARGS, "--tokens", "1000", "--dtype", "int8", "--batch", "3"]
    )
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.stdout.splitlines()) <= 80
    assert "scales amortized" in result.stdout


def test_kv_size_json_is_stable_and_exact(runner):
    result = runner.invoke(app, [*QUOTED_EXAMPLE_ARGS, "--batch", "8", "--output", "json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["bytes_per_token"] == 524_288
    assert document["bytes_per_request"] == 335_544_320
    assert document["bytes_per_batch"] == 2_684_354_560
    assert document["pages_per_request"] == 40
    assert document["pages_per_batch"] == 320
    assert document["dtype"] == "float16"
    assert document["model"] is None
    assert "524,288 B per token" in document["formula"]
    byte_counts = {key: value for key, value in document.items() if "bytes" in key}
    assert len(byte_counts) == 8
    assert all(isinstance(value, int) for value in byte_counts.values())


def test_kv_size_model_preset_with_override(runner):
    result = runner.invoke(app, [*SMOLLM2_ARGS, "--tokens", "1", "--output", "json"])
    document = json.loads(result.stdout)
    assert document["model"] == "smollm2-135m"
    assert document["bytes_per_token"] == 23_040

    overridden = runner.invoke(
        app, [*SMOLLM2_ARGS, "--layers", "60", "--tokens", "1", "--output", "json"]
    )
    assert json.loads(overridden.stdout)["bytes_per_token"] == 2 * 23_040


@pytest.mark.parametrize(
    ("extra_args", "fragment"),
    [
        (["--dtype", "fp8"], "unknown KV dtype 'fp8'"),
        (["--batch", "0"], "batch must be a positive whole number"),
        (["--block-size", "-16"], "block_size must be a positive whole number"),
    ],
)
def test_kv_size_bad_input_is_one_error_line_and_exit_2(runner, extra_args, fragment):
    result = runner.invoke(app, [*QUOTED_EXAMPLE_ARGS, *extra_args])
    assert result.exit_code == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: ") and fragment in lines[0]
    assert "Traceback" not in result.output


def test_kv_size_missing_geometry_is_one_error_line(runner):
    result = runner.invoke(app, ["kv-size", "--tokens", "640"])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("error: missing model geometry: --layers, --kv-heads, --head-dim")


def test_any_command_raising_growpage_error_exits_2_with_one_line():
    # What a future command (e.g. a `bench` sub-app) gets without extra code.
    demo = typer.Typer(cls=GrowPageGroup)
    sub = typer.Typer()

    @sub.command()
    def run() -> None:
        raise GrowPageError("endpoint unreachable\nset --url to the vLLM service")

    @demo.callback()
    def _root() -> None:
        pass

    demo.add_typer(sub, name="bench")
    result = CliRunner().invoke(demo, ["bench", "run"])
    assert result.exit_code == 2
    assert result.stderr == "error: endpoint unreachable set --url to the vLLM service\n"


def test_console_script_version_and_bad_input_without_traceback():
    script = _gpctl_script()
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "100"}

    version = subprocess.run(
        [script, "--version"], capture_output=True, text=True, env=env, timeout=60
    )
    assert version.returncode == 0
    assert version.stdout.strip() == f"gpctl {__version__}"

    bad = subprocess.run(
        [script, *QUOTED_EXAMPLE_ARGS, "--dtype", "fp8"], capture_output=True, text=True, env=env, timeout=60
    )
    assert bad.returncode == 2
    assert bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [
        "error: unknown KV dtype 'fp8'; use one of: float16, bfloat16, float32, int8, int4"
    ]
    assert "Traceback" not in bad.stderr


def _has_vllm() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


@pytest.mark.skipif(_has_vllm(), reason="vLLM is installed in this interpreter")
def test_bench_vllm_without_vllm_says_how_to_get_it(runner):
    result = runner.invoke(app, ["bench", "vllm", "--quick"])
    assert result.exit_code == 2
    assert "make setup" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("command", ["quality", "serving", "all"])
def test_bench_comparison_refuses_an_unknown_method_before_loading_the_model(runner, command):
    result = runner.invoke(app, ["bench", command, "--quick", "--method", "lru"])
    assert result.exit_code == 2
    assert "unknown method(s) lru" in result.output


def test_bench_fidelity_refuses_a_coverage_outside_its_range_before_loading_the_model(runner):
    result = runner.invoke(app, ["bench", "fidelity", "--quick", "--attention-coverage", "1.5"])
    assert result.exit_code == 2
    assert "--attention-coverage" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize(("option", "message"), [
    (["--method", "lru"], "error: --method lru is unknown; use one of growpage, growpage_when_it_pays"),
    (["--part", "speed"], "error: --part speed is unknown; use --part pressure, overhead"),
])
def test_bench_vllm_refuses_unknown_choices_before_starting_an_engine(runner, option, message):
    result = runner.invoke(app, ["bench", "vllm", "--quick", *option])
    assert result.exit_code == 2
    assert result.stderr.strip().startswith(message) and "Traceback" not in result.output


@pytest.mark.parametrize(("setting", "message"), [
    ("observe_every_steps", "is not KEY=VALUE"),
    ("observe_every_steps=0", "observe_every_steps must be an int >= 1"),
    ("no_such_setting=1", "no_such_setting"),
])
def test_bench_vllm_checks_growpage_settings_as_the_plugin_will(runner, setting, message):
    result = runner.invoke(app, ["bench", "vllm", "--quick", "--setting", setting])
    assert result.exit_code == 2 and message in result.stderr and "Traceback" not in result.output
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("part", ["retrieval", "mixed"])
def test_bench_vllm_refuses_a_retrieval_skip_that_names_no_variant_before_starting_an_engine(runner, part):
    result = runner.invoke(app, ["bench", "vllm", "--part", part, "--retrieval-skip", "h2o@99"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert result.stderr.strip() == ("error: retrieval_skip names no variant: h2o@99; choose among vllm, vllm@seqs4, "
                                     "vllm@seqs6, monitor, growpage, growpage@projected, streaming_llm@4, h2o@4, "
                                     "snapkv@4, "
                                     "tova@4, limit")


def test_bench_vllm_settings_reach_growpages_runs():
    from gpctl.commands.bench import _vllm_settings

    settings = _vllm_settings(True, 1, ["overhead"], "h2o", ["observe_every_steps=2", "sink_tokens=8"],
                              {"repeats": 3, "seeds": None})
    assert settings.parts == ("overhead",) and settings.repeats == 3 and settings.threads == 1
    config = settings.growpage_config("monitor")
    assert (config["method"], config["observe_every_steps"], config["sink_tokens"]) == ("h2o", 2, 8)


def test_bench_vllm_refuses_a_sweep_coverage_outside_its_range(runner):
    result = runner.invoke(app, ["bench", "vllm", "--quick", "--sweep-coverage", "1.5"])
    assert result.exit_code == 2 and "--sweep-coverage" in result.output and "Traceback" not in result.output


def test_bench_vllm_sweep_coverage_reaches_the_sweep():
    from gpctl.commands.bench import _vllm_settings

    settings = _vllm_settings(True, 1, ["sweep"], None, [], {"sweep_coverage": (0.9, 0.95)})
    assert settings.sweep_coverage == (0.9, 0.95)


@pytest.mark.parametrize(("option", "value", "said"), [
    ("--sweep-variant", "heads", "LABEL[@METHOD,...]:KEY=VALUE"),
    ("--sweep-variant", "heads@h2o2:keep_sets=kv_head", "names 'h2o2'"),
    ("--sweep-variant", "heads:keep_sets=every_head", "keep_sets must be one of request, kv_head"),
    ("--sweep-method", "zipage", "--sweep-method zipage is unknown"),
    ("--headline-variant", "stale:readings_every_steps=0", "readings_every_steps must be an int >= 1"),
    ("--headline-variant", "stale@h2o:readings_every_steps=32", "--headline-variant takes no @METHOD"),
])
def test_bench_vllm_refuses_a_bad_sweep_variant_or_method_with_the_form_to_use(runner, option, value, said):
    result = runner.invoke(app, ["bench", "vllm", "--quick", "--part", "sweep", option, value])
    assert result.exit_code == 2 and said in result.output and "Traceback" not in result.output


def test_bench_vllm_sweep_variants_and_methods_reach_the_sweep():
    from gpctl.commands.bench import _vllm_settings

    settings = _vllm_settings(True, 1, ["sweep"], None, [], {}, ["growpage", "h2o"],
                              ["heads:keep_sets=kv_head", "rkv@growpage:keep_sets=kv_head,redundancy_weight=0.9"])
    assert settings.sweep_methods == ("growpage", "h2o")
    heads, rkv = settings.sweep_variants
    assert (heads.label, dict(heads.settings), heads.methods) == ("heads", {"keep_sets": "kv_head"}, ())
    assert dict(rkv.settings) == {"keep_sets": "kv_head", "redundancy_weight": 0.9} and rkv.methods == ("growpage",)


def test_bench_vllm_headline_variants_run_growpage_again_with_their_settings():
    from gpctl.commands.bench import _vllm_settings
    from growpage.bench.headline import variant_configs

    settings = _vllm_settings(True, 1, ["headline"], None, [], {}, headline_variants=["stale:readings_every_steps=32"])
    configs = variant_configs(settings, budget=6)
    assert configs["growpage/stale"]["growpage"] == {**configs["growpage"]["growpage"], "readings_every_steps": 32}
