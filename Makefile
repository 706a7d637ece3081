# The two set-up commands in README.md: `make demo` (the main job) and `make test` (the tests).
# Both install what they need; CONSTRAINTS pins the CPU torch build on machines without CUDA.
PYTHON ?= python3
CONSTRAINTS ?= constraints/cpu.txt
PIP = $(PYTHON) -m pip install -q -c $(CONSTRAINTS)
RUN ?= demo

.PHONY: install demo test test-fast clean

install:
	$(PIP) -e ".[test]"

demo: install
	WANDB_MODE=$${WANDB_MODE:-offline} bash scripts/demo.sh $(RUN)

test: install
	WANDB_MODE=disabled $(PYTHON) -m pytest -q -x tests

test-fast: install
	WANDB_MODE=disabled $(PYTHON) -m pytest -q -x -m "not slow" tests

clean:
	rm -rf runs multirun outputs .pytest_cache
