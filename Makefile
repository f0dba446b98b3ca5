# Two entry points, both self-contained on a fresh machine (Python 3.11 + make):
#   make run    set up, then serve the built-in zoo (KServe v2 on :8000 HTTP, :8001 gRPC) until Ctrl-C
#   make test   set up, then lint, type-check and run the test suite (what CI runs)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
RUN_STAMP := $(VENV)/.installed-run
STAMP := $(VENV)/.installed

.PHONY: run simulate test lint bench paper scenarios gpu-check image clean

# Serving needs less than the tests (no Ray, test tools or type checker): about a minute less to set up.
$(RUN_STAMP): pyproject.toml requirements-run.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-run.txt
	$(BIN)/pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $(RUN_STAMP)

$(STAMP): $(RUN_STAMP) requirements-ci.txt
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-ci.txt
	touch $(STAMP)

run: $(RUN_STAMP)
	$(BIN)/mainspring serve

simulate: $(RUN_STAMP)
	$(BIN)/mainspring simulate

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

test: lint
	bash scripts/install_browser.sh  # Debian's chromium for the dashboard test (only when missing)
	$(BIN)/pytest -q

# The one command to run the first time a GPU is at hand (about 5 minutes on one): the CUDA path's tests
# (tests/worker/test_cuda*.py), then the zoo profiled and served on it, with the prediction error of each
# kind of action and exec p99/p50 (scripts/gpu_check.py). ONNX on CUDA needs onnxruntime-gpu in place of
# onnxruntime (the CPU package hides the CUDA provider): this swaps them in the venv.
gpu-check: $(STAMP)
	$(BIN)/python -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU (or a CPU build of torch): nothing to check'"
	$(BIN)/pip uninstall --quiet --yes onnxruntime
	$(BIN)/pip install --quiet --disable-pip-version-check --force-reinstall 'onnxruntime-gpu>=1.17'
	$(BIN)/python -c "import torch, onnxruntime as o; print('torch', torch.__version__, 'CUDA', torch.version.cuda, '| onnxruntime', o.__version__, o.get_available_providers())"
	$(BIN)/pytest -q -s -m gpu tests/worker/test_cuda.py tests/worker/test_cuda_stress.py
	$(BIN)/python scripts/gpu_check.py

# Mainspring beside Triton and Ray Serve, live (about an hour): installs the peers into .peers/, writes BENCHMARKS.md
scenarios: $(STAMP)
	bash benchmarks/peers/install.sh
	$(BIN)/python benchmarks/scenarios.py --fresh --repeats 2 --seconds 20 --plots
	$(BIN)/python benchmarks/scenarios.py --scenarios S3 --servers triton-docs,ray-docs --repeats 2 --seconds 20

bench: $(STAMP)
	$(BIN)/python benchmarks/sim_speed.py
	$(BIN)/python benchmarks/azure_replay.py
	$(BIN)/python benchmarks/slo_sweep.py
	$(BIN)/python benchmarks/controller_cost.py
	$(BIN)/python benchmarks/prediction_error.py
	$(BIN)/python benchmarks/worker_predictability.py
	$(BIN)/python benchmarks/cpu_exec_settings.py
	$(BIN)/python benchmarks/serving_overhead.py
	$(BIN)/python benchmarks/controller_throughput.py

# Clockwork's evaluation in the simulator (benchmarks/paper/), written to docs/paper.md; PAPER_ARGS=--quick for a smoke run.
paper: $(STAMP)
	cd benchmarks/paper && for fig in fig5 fig6 fig7 fig8 fragments fig9 fig11 overload; do \
		MAINSPRING_PAPER_OUT=../../out/paper ../../$(BIN)/python $$fig.py $(PAPER_ARGS) || exit 1; done
	cd benchmarks/paper && MAINSPRING_PAPER_OUT=../../out/paper ../../$(BIN)/python write_doc.py ../../docs/paper.md

# The container images (docker/; docs/deploy.md): mainspring:VERSION (CPU) and mainspring:VERSION-cuda. Needs a
# Docker daemon; without one this says so and fails (the tests lint the Dockerfiles with hadolint instead).
IMAGE ?= mainspring
IMAGE_VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
image:
	@command -v docker >/dev/null 2>&1 || { echo "make image: no docker command on this machine: install Docker to build the images (docker/Dockerfile, docker/Dockerfile.cuda)" >&2; exit 1; }
	@docker info >/dev/null 2>&1 || { echo "make image: docker is installed but no Docker daemon answers (docker info failed): start one, or build elsewhere" >&2; exit 1; }
	docker build -f docker/Dockerfile -t $(IMAGE):$(IMAGE_VERSION) .
	docker build -f docker/Dockerfile.cuda -t $(IMAGE):$(IMAGE_VERSION)-cuda .

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
