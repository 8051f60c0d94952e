# The two commands of README.md. Each one sets up whatever is missing first.
.PHONY: run test lint setup bench-core bench-engine bench-quick bench-all bench-vllm

setup:
	@./scripts/setup.sh

# The main job: vLLM's CPU build on the packaged model, alone and then with GrowPage enforce.
run: setup
	.venv/bin/gpctl demo --output bench-results/demo.json

# Lint and types first (seconds), then every test, vLLM's included.
test: setup lint
	.venv/bin/python -m pytest -q

lint: setup
	.venv/bin/ruff check agent cli tests
	.venv/bin/mypy

bench-core: setup
	.venv/bin/gpctl bench core --output bench-results/core.json

bench-engine: setup
	.venv/bin/gpctl bench engine --output bench-results/engine.json

# GrowPage vs full KV and fixed-budget methods: quality vs bytes, throughput vs latency (+ plots).
bench-quick: setup
	.venv/bin/gpctl bench all --quick --threads 1 --output-dir bench-results/quick

bench-all: setup
	.venv/bin/gpctl bench all --threads 1 --output-dir bench-results/full

# GrowPage inside vLLM: vLLM alone vs monitor vs enforce (three engine starts, ~6 minutes).
bench-vllm: setup
	.venv/bin/gpctl bench vllm --threads 1 --output bench-results/vllm.json
