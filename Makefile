# The two commands of README.md. Each one sets up whatever is missing first.
.PHONY: run test setup bench-core bench-engine bench-quick bench-all vllm-venv test-vllm

setup:
	@./scripts/setup.sh

# The main job: the packaged model on the reference engine with GrowPage on, next to full KV.
run: setup
	.venv/bin/gpctl demo --output bench-results/demo.json

test: setup
	.venv/bin/python -m pytest -q

bench-core: setup
	.venv/bin/gpctl bench core --output bench-results/core.json

bench-engine: setup
	.venv/bin/gpctl bench engine --output bench-results/engine.json

# GrowPage vs full KV and fixed-budget methods: quality vs bytes, throughput vs latency (+ plots).
bench-quick: setup
	.venv/bin/gpctl bench all --quick --threads 1 --output-dir bench-results/quick

bench-all: setup
	.venv/bin/gpctl bench all --threads 1 --output-dir bench-results/full

# GrowPage inside vLLM's CPU build, in its own environment (not part of `make test`: see
# docs/VLLM_PLUGIN.md). Each engine start takes about a minute here.
vllm-venv: setup
	@./scripts/setup-vllm.sh

test-vllm: vllm-venv
	.venv-vllm/bin/python -m pytest -q tests/vllm_plugin
