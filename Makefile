# The two commands of README.md. Each one sets up whatever is missing first.
.PHONY: run test setup bench-core

setup:
	@./scripts/setup.sh

# The main job. Until the reference engine lands, it is the core benchmark on this machine.
run: setup
	.venv/bin/gpctl bench core --output bench-results/core.json

test: setup
	.venv/bin/python -m pytest -q

bench-core: setup
	.venv/bin/gpctl bench core --output bench-results/core.json
