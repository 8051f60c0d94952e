"""``gpctl fleet``: bad input stops it with one line and exit 2 before anything starts; the replicas are
``gpctl serve --engine vllm`` with their own ports and KV sizes, and the router polls their load.

Starting a real fleet is ``tests/vllm_plugin/test_vllm_fleet_router.py``'s job.
"""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from gpctl.main import app
from growpage.errors import ConfigError
from growpage.tooling.fleet import check_ports_free, fleet_spec, replica_command, router_command


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})


@pytest.mark.parametrize("args, fragment", [
    (["--replicas", "0"], "at least 1 replica"),
    (["--policy", "fastest"], "not one of vllm-router's"),
    (["--kv-blocks", "64,lots"], "whole numbers separated by commas"),
    (["--kv-blocks", "64,0"], "at least 1 block"),
    (["--kv-blocks", "1,2,3"], "one per replica"),
    (["--mode", "turbo"], "mode turbo is not one of"),
    (["--port", "8000", "--router-port", "8000"], "ports overlap"),
    (["--port", "70000"], "out of range"),
])
def test_bad_input_exits_2_with_one_line_before_anything_starts(runner, args, fragment):
    result = runner.invoke(app, ["fleet", *args])
    assert result.exit_code == 2, result.output
    assert fragment in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_a_port_another_process_holds_is_named():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        # the held port is the router's, the first checked: the ports beside it are other tests'
        # ephemeral ports as often as not, and must not decide which port is named
        spec = fleet_spec(replicas=1, port=port + 1, router_port=port, metrics_port=port + 2)
        with pytest.raises(ConfigError, match=f"port {port} is in use"):
            check_ports_free(spec)


def test_replicas_are_gpctl_serve_with_their_own_ports_kv_and_cpu():
    spec = fleet_spec(replicas=2, port=8101, router_port=8100, metrics_port=9501, mode="enforce",
                      kv_blocks=[24, 96], base_pages=6, max_model_len=512, cpu_binds=("0", "1"))
    (first, first_env), (second, second_env) = (replica_command(spec, r) for r in spec.replicas)
    assert first[1:4] == ["serve", "--engine", "vllm"] and first[0].endswith("gpctl")
    for argv, port, metrics, blocks in ((first, 8101, 9501, 24), (second, 8102, 9502, 96)):
        options = dict(zip(argv[4::2], argv[5::2], strict=False))
        assert options["--port"] == str(port) and options["--metrics-port"] == str(metrics)
        assert options["--kv-blocks"] == str(blocks) and options["--mode"] == "enforce"
        assert options["--base-pages"] == "6" and options["--max-model-len"] == "512"
    assert (first_env["VLLM_CPU_OMP_THREADS_BIND"], second_env["VLLM_CPU_OMP_THREADS_BIND"]) == ("0", "1")


def test_vllm_alone_replicas_load_no_plugin(prepared_model_dir):
    spec = fleet_spec(replicas=1, port=8101, router_port=8100, metrics_port=9501, mode="vllm", kv_blocks=[24],
                      model=str(prepared_model_dir))
    argv, env = replica_command(spec, spec.replicas[0])
    assert env["VLLM_PLUGINS"] == "" and "--num-gpu-blocks-override" in argv and "gpctl" not in argv[0]


def test_the_router_polls_every_replica_under_the_chosen_policy():
    spec = fleet_spec(replicas=2, port=8101, router_port=8100, metrics_port=9501, policy="round_robin",
                      load_poll_s=2)
    argv = router_command(spec)
    assert argv[0].endswith("vllm-router")
    assert argv[argv.index("--policy") + 1] == "round_robin"
    start = argv.index("--worker-urls") + 1
    assert argv[start:start + 2] == ["http://127.0.0.1:8101", "http://127.0.0.1:8102"]
    assert argv[argv.index("--worker-startup-check-interval") + 1] == "2"
