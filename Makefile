# The front door of the course. `make help` lists the targets.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# The Pythons the course supports, newest first. PYTHON=... chooses one; otherwise the newest that runs
# here (a pyenv shim of a version that is not selected exists but does not run: each is tried).
SUPPORTED_PYTHONS := 3.14 3.13 3.12 3.11
VENV ?= .venv
# The environment's own Python once there is one (made by `make setup PYTHON=...`, every later target uses it);
# before, the newest supported Python on PATH.
PYTHON ?= $(or $(shell test -x $(VENV)/bin/python && $(VENV)/bin/python -c 'import sys; print(sys.executable)' 2>/dev/null),$(firstword $(foreach v,$(SUPPORTED_PYTHONS),$(shell python$(v) -c 'import sys; print(sys.executable)' 2>/dev/null))),$(shell command -v python3))
BIN := $(abspath $(VENV))/bin
# nbgrader calls `jupyter` and `alembic` by name: the venv's bin leads PATH everywhere.
export PATH := $(BIN):$(PATH)
export PYTHONWARNINGS := ignore
PYTHON_VERSION := $(shell $(PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
# One stamp per Python version: PYTHON=... with another version than the venv's is caught below, not ignored.
STAMP := $(VENV)/.installed-$(PYTHON_VERSION)
ASSIGNMENTS ?=
WORKERS ?=
CLUSTER ?=

.PHONY: help setup lab test test-fast lint release autograde feedback grades report student-bundle bench bench-grading clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-15s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml Makefile
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "make setup: '$(PYTHON)' is not Python 3.11 or newer ($$($(PYTHON) --version 2>&1)); install one and say which: make setup PYTHON=python3.13"; exit 2; }
	@# 3.11.0-3.11.4 mishandle possessive quantifiers (CPython gh-106052), which soupsieve, under nbconvert, uses.
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11, 5))' || { echo "make setup: '$(PYTHON)' is $$($(PYTHON) --version 2>&1), whose regular expressions break nbconvert's pages (soupsieve's possessive quantifiers): use 3.11.5 or newer (Debian 12: docs/jupyterhub.md, step 1)"; exit 2; }
	@test -x $(BIN)/python || { echo "make setup: a new environment $(VENV) with $(PYTHON) ($$($(PYTHON) --version))"; $(PYTHON) -m venv $(VENV); }
	@test "$$($(BIN)/python -c 'import sys; print(sys.version_info[:2])')" = "$$($(PYTHON) -c 'import sys; print(sys.version_info[:2])')" \
	  || { echo "make setup: $(VENV) was made with $$($(BIN)/python --version), not $(PYTHON)'s $$($(PYTHON) --version): remove it (make clean) or choose another folder (VENV=.venv-3.13)"; exit 2; }
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e .
	@# rfc3987-syntax (pulled in by jupyter-events) builds ~35 parsers whenever nbformat is imported:
	@# 2 s of CPU in every nbgrader process, for a URI format no notebook schema uses. jsonschema
	@# skips that format without it (tests/course/test_environment.py checks that it is gone).
	$(BIN)/python -m pip uninstall --quiet --yes rfc3987-syntax
	@touch $(STAMP)

# PYTHON=... named on the command line for an existing environment: the one it was made from (two 3.11s, pyenv's
# and the system's, are two Pythons: their sys.base_prefix tells them apart), else a refusal that says what to do.
BASE_PREFIX := import sys; print(sys.base_prefix)
setup: $(if $(filter command line,$(origin PYTHON)),setup-same-python) $(STAMP) ## create .venv and install everything (fast when already done; PYTHON=python3.13 to choose)
	@echo "make: Python $(PYTHON_VERSION) ($(PYTHON)) in $(VENV)"

.PHONY: setup-same-python
setup-same-python:
	@test ! -x $(BIN)/python || test "$$($(BIN)/python -c '$(BASE_PREFIX)')" = "$$($(PYTHON) -c '$(BASE_PREFIX)')" \
	  || { echo "make setup: $(VENV) was made with the Python of $$($(BIN)/python -c '$(BASE_PREFIX)'), not $(PYTHON) (of $$($(PYTHON) -c '$(BASE_PREFIX)')): remove it (rm -rf $(VENV)) and run make setup PYTHON=$(PYTHON) again, or choose another folder (VENV=.venv-other)"; exit 2; }

exchange: ## make the nbgrader exchange folder (the Assignment List needs it)
	mkdir -p exchange

lab: setup exchange ## the instructor's JupyterLab (Formgrader, Assignment List) on the course, opened at notebooks/
	$(BIN)/jupyter lab --notebook-dir=. --ServerApp.default_url=/lab/tree/notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

test: setup ## run every test on two workers: lint, unit, drift, grading end to end, and nbval on solutions/ (another Python: PYTHON=python3.13 VENV=.venv-3.13)
	$(BIN)/ruff check autograder tests bench
	$(BIN)/python -m pytest -n 2 --dist loadgroup --no-loadscope-reorder --durations=12 \
	  --nbval --nbval-sanitize-with tests/nbval_sanitize.cfg tests solutions  # the order: tests/conftest.py

test-fast: setup ## the quick tests only (no nbgrader runs)
	$(BIN)/python -m pytest -m "not slow" tests

lint: setup ## ruff on the package and the tests
	$(BIN)/ruff check autograder tests bench

release: setup ## regenerate notebooks/ and solutions/ from source/ (ASSIGNMENTS="01_soft_lookup" for one)
	$(BIN)/python -m autograder release $(ASSIGNMENTS)

autograde: setup ## grade every submission in submitted/ (WORKERS=n; CLUSTER=tcp://host:8786 on Dask; NO_SANDBOX=1 where bwrap is missing)
	$(BIN)/python -m autograder autograde $(ASSIGNMENTS) $(if $(WORKERS),--workers $(WORKERS)) $(if $(CLUSTER),--cluster $(CLUSTER)) $(if $(NO_SANDBOX),--no-sandbox)

.PHONY: new-notebook
new-notebook: setup ## the files of a new notebook, one example exercise, all passing (NAME=10_name TITLE="...")
	@test -n "$(NAME)" || { echo 'make new-notebook: say NAME=NN_name, e.g. NAME=10_linear_attention'; exit 2; }
	$(BIN)/python -m autograder new-notebook $(NAME) $(if $(TITLE),--title "$(TITLE)")
	$(BIN)/python -m autograder release $(NAME)

.PHONY: settings
settings: setup ## print every setting (name, value in this course, where to set it): the manual's table
	$(BIN)/python -m autograder settings

.PHONY: docs
docs: setup ## the manual: docs/_build/html/index.html (Sphinx, API pages from the docstrings; warnings are errors)
	$(BIN)/sphinx-build -M html docs docs/_build -E -W --keep-going

.PHONY: collect-zip
collect-zip: setup ## put an LMS zip of submissions into submitted/ (ZIP=file.zip ASSIGNMENTS=01_soft_lookup)
	$(BIN)/python -m autograder collect-zip $(ASSIGNMENTS) $(ZIP)

feedback: setup ## write feedback/ HTML for every graded submission
	$(BIN)/python -m autograder feedback $(ASSIGNMENTS)

grades: setup ## grades.csv (nbgrader export) and grades-canvas.csv (Canvas's gradebook import)
	$(BIN)/python -m autograder grades

report: setup ## report/index.html: the class report (scores per exercise, named mistakes, failures, time)
	$(BIN)/python -m autograder.grading.report $(ASSIGNMENTS)

.PHONY: similarity
similarity: setup ## report/similarity/index.html: similar answers per exercise, and answers matching the reference (THRESHOLD=0.5)
	$(BIN)/python -m autograder similarity $(ASSIGNMENTS) $(if $(THRESHOLD),--threshold $(THRESHOLD))

student-bundle: setup ## dist/attention-course.zip: notebooks, public checks, README, one-command setup
	$(BIN)/python -m autograder bundle dist/attention-course.zip

.PHONY: test-versions
VERSION_ENDS = $(or $(ENDS),oldest newest)
# Each end on a worker of its own, its kernels on one PyTorch thread: the two ends side by side on two cores.
test-versions: setup ## every released notebook with the references at both ends of the students' ranges, its printed numbers and figures compared with the pinned releases' (ENDS="oldest newest"; each end's environment downloads PyPI's PyTorch once, about 3 GB)
	OMP_NUM_THREADS=1 COURSE_TEST_VERSIONS="$(VERSION_ENDS)" $(BIN)/python -m pytest tests/course/test_students_anywhere.py \
	  -k both_ends -n $(words $(VERSION_ENDS)) --dist loadgroup

.PHONY: hub
HUB_EXCHANGE ?= /srv/nbgrader/exchange
hub/node_modules/.installed: hub/package.json hub/package-lock.json
	cd hub && npm ci --no-audit --no-fund
	@touch $@

# What make hub needs, said before anything is installed.
.PHONY: hub-allowed
hub-allowed:
	@test "$$(id -u)" = 0 || { echo "make hub: run it as root: the hub starts each user's JupyterLab as that Linux user"; exit 2; }
	@test -n "$(COURSE_STUDENTS)$(COURSE_INSTRUCTORS)" || { echo "make hub: say who may log in: make hub COURSE_STUDENTS=alice,bob COURSE_INSTRUCTORS=prof (Linux users of this machine)"; exit 2; }

hub: hub-allowed setup hub/node_modules/.installed ## JupyterHub for the class on this server, with the grading service (as root; COURSE_STUDENTS=a,b COURSE_INSTRUCTORS=prof)
	mkdir -p $(HUB_EXCHANGE) && chmod 777 $(HUB_EXCHANGE)
	NBGRADER_EXCHANGE=$(HUB_EXCHANGE) COURSE_STUDENTS=$(COURSE_STUDENTS) COURSE_INSTRUCTORS=$(COURSE_INSTRUCTORS) \
	  $(BIN)/jupyterhub -f hub/jupyterhub_config.py

.PHONY: gradescope
gradescope: setup ## dist/gradescope/NN_name.zip: a Gradescope autograder per notebook (HIDDEN_VISIBILITY=after_published)
	$(BIN)/python -m autograder.grading.gradescope build $(ASSIGNMENTS) $(if $(HIDDEN_VISIBILITY),--hidden-visibility $(HIDDEN_VISIBILITY))

bench: setup ## time and memory: attention, its backward pass (08), decoding with a KV cache (09), long context (10), paged vs contiguous caches (11) (bench/results/)
	$(BIN)/python bench/attention_bench.py
	$(BIN)/python bench/flash_backward_bench.py
	$(BIN)/python bench/decoding_and_training_bench.py
	$(BIN)/python bench/long_context_bench.py
	$(BIN)/python bench/serving_bench.py

.PHONY: bench-similarity
bench-similarity: setup ## make similarity's time on a generated class of 1000 submissions of one notebook (bench/results/)
	$(BIN)/python bench/similarity_bench.py

.PHONY: bench-hub
bench-hub: setup ## the grading service's time from Submit to feedback, for one student and 20 at once (bench/results/)
	$(BIN)/python bench/hub_bench.py

bench-grading: setup ## grading throughput: a sweep of workers, with and without the kernel pool, vs plain nbclient; the graded kernel's start; pairs of mistakes named
	$(BIN)/python bench/grading_bench.py
	$(BIN)/python bench/graded_kernel_bench.py
	$(BIN)/python bench/catalogue_pairs_bench.py

.PHONY: bench-memory
bench-memory: setup ## memory seen from outside: a grading kernel's rise on 07/08's case (needs root), the grader's own on the hostile class
	$(BIN)/python bench/kernel_memory_bench.py
	$(BIN)/python bench/grader_memory_bench.py

clean: ## remove the venv, caches and nbgrader's working folders
	rm -rf $(VENV) build dist .pytest_cache .ruff_cache autograded feedback released-feedback gradebook.db grades.csv grades-canvas.csv report docs/_build docs/api
	find . -name __pycache__ -prune -exec rm -rf {} +
