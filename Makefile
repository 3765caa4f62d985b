# Two commands for a fresh machine: `make lab` (open the course) and `make test` (run every test).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: lab test course bench install lint data clean

# Create the venv if missing and install the package with its notebook and dev extras,
# at the exact versions the tests passed with (constraints.txt).
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[notebooks,dev]'
	touch $(STAMP)

install: $(STAMP)

# Jupyter refuses to run as root (containers, some cloud VMs) unless told it may.
lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/ $(if $(filter 0,$(shell id -u)),--allow-root)

test: $(STAMP)
	$(PY) -m pytest

course: $(STAMP)
	$(PY) -m rlhf_helpers.run_course --out build/

bench: $(STAMP)
	$(PY) -m benchmarks

data: $(STAMP)
	$(PY) -m rlhf_helpers.world.build

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf build/ .pytest_cache
