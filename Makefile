# The two commands of README.md. Each one sets up whatever is missing first.
.PHONY: run test setup bench-core bench-engine

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
