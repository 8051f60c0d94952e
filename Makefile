# The two commands of README.md. Each one sets up whatever is missing first.
.PHONY: run test lint setup bench-core bench-engine bench-quick bench-all bench-vllm bench-calibrate \
	bench-serving bench-quality

setup:
	@./scripts/setup.sh

# The main job: vLLM's CPU build on the packaged model, alone and then with GrowPage enforce.
run: setup
	.venv/bin/gpctl demo --output bench-results/demo.json

# Lint and types first (seconds), then every test, vLLM's included.
test: setup lint
	.venv/bin/python -m pytest -q -n 2 --dist loadfile --durations=25

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

# Thresholds for the packaged model: monitor mode over a calibration trace, then gpctl calibrate.
CALIBRATED = docs/benchmarks/calibrated-smollm2-135m.yaml
bench-calibrate: setup
	.venv/bin/gpctl bench calibration-trace --threads 1 --output docs/benchmarks/calibration-snapshot.prom
	.venv/bin/gpctl calibrate --snapshot docs/benchmarks/calibration-snapshot.prom --output $(CALIBRATED)

# The reference engine at full scale, calibrated: 48 requests in a pool that fits about 8 at
# full KV, two seeds (one per core, side by side); every method and ablation in each run.
SERVING_METHODS = --method growpage --method growpage_uncalibrated --method growpage_no_pressure \
	--method growpage_no_quant --method snapkv --method zipage --method h2o --method streaming_llm
bench-serving: setup
	for seed in 0 1; do taskset -c $$seed .venv/bin/gpctl bench serving --threads 1 --reasoning 40 --summaries 8 \
	  --pool-requests 8 --seed $$seed --config $(CALIBRATED) $(SERVING_METHODS) \
	  --output-dir bench-results/serving-seed$$seed & done; wait

# Quality at equal memory: 26 answerable tasks, every method given the budget's pages per request.
QUALITY_METHODS = --method growpage --method snapkv --method zipage --method h2o --method streaming_llm \
	--method growpage_no_pressure --method growpage_uncalibrated --method growpage_no_quant \
	--method growpage_no_sts --method growpage_no_lts --method growpage_random --method growpage_10_layers
QUALITY = --threads 1 --reasoning 14 --summaries 0 --pool budget --config $(CALIBRATED) \
	--retrieval-depth 0.1 --retrieval-depth 0.3 --retrieval-depth 0.5 --retrieval-depth 0.7 \
	--retrieval-depth 0.9 --retrieval-depth 1.0
bench-quality: setup  # budget 6 (with the ablations) and budget 12 side by side, one per core
	taskset -c 0 .venv/bin/gpctl bench quality $(QUALITY) --budget 6 $(QUALITY_METHODS) \
	  --output-dir bench-results/quality-b6 & \
	taskset -c 1 .venv/bin/gpctl bench quality $(QUALITY) --budget 12 --method growpage --method snapkv \
	  --method zipage --method h2o --method streaming_llm --output-dir bench-results/quality-b12 & wait
