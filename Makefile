# Every target creates .venv and installs what it needs when missing, so a fresh machine with
# only Python 3.11+ and make can run `make demo` or `make test` straight away.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The stamp records that the venv holds this pyproject's dependencies; editing pyproject reinstalls.
STAMP := $(VENV)/.installed

.PHONY: demo test test-fast test-exo lint typecheck pytest bench mutation fmt soak-sim clean

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "exo-deploy needs Python 3.11 or newer (found " + sys.version.split()[0] + ")")'
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/exo-deploy-tui --demo

# pyright (one process, one core, ~45 s) runs beside pytest rather than before it: the suite's
# process tests mostly wait, so the two share the cores instead of one waiting on the other.
test: lint
	@$(MAKE) --no-print-directory -j2 typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/pyright

# promtool, for tests/pure/test_metrics_rules.py's check of deploy/prometheus/alerts.yml: no PyPI
# package ships it, Debian's `prometheus` does. Where apt is, its .deb is downloaded (not
# installed: no service, no system change) and promtool alone unpacked into the venv; elsewhere
# the tests check the rules in Python only. The stamp records that it was tried, either way.
PROMTOOL_STAMP := $(VENV)/.promtool
$(PROMTOOL_STAMP): $(STAMP)
	@if [ ! -x $(BIN)/promtool ] && command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null; then \
	  dir=$$(mktemp -d) && chmod 755 $$dir && \
	  { (cd $$dir && apt-get download -qq prometheus 2>/dev/null) || \
	    { [ "$$(id -u)" = 0 ] && apt-get update -qq && (cd $$dir && apt-get download -qq prometheus); }; } && \
	  dpkg-deb --fsys-tarfile $$dir/prometheus_*.deb | tar -x -C $$dir ./usr/bin/promtool && \
	  mv $$dir/usr/bin/promtool $(BIN)/promtool; \
	  rm -rf $$dir; \
	fi; \
	if [ -x $(BIN)/promtool ]; then echo "promtool: $(BIN)/promtool"; \
	else echo "promtool: not available here (no apt); the alert rules are checked in Python only"; fi
	@touch $(PROMTOOL_STAMP)

# Parallel: the process tests mostly wait on real time, so more workers than cores pay
# (measured on 2 cores: docs/design.md §10). loadgroup keeps each xdist_group on one worker.
PYTEST_WORKERS ?= 6
# The layering check lives in tests/pure/test_layering.py and runs with the rest of pytest.
# Bytecode is written (PYTHONDONTWRITEBYTECODE unset for the run, if the shell sets it): every
# test worker, and each of the hundreds of exo-deploy processes the suite starts, would otherwise
# compile our modules from source again, and pytest rewrite every test module's asserts again
# (docs/design.md §10, "Start-up").
pytest: $(STAMP) $(PROMTOOL_STAMP)
	env -u PYTHONDONTWRITEBYTECODE $(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist loadgroup --durations=20

# The pure tests alone (plain functions: no event loop, sockets or processes). The suite's other
# folders, tests/virtual, tests/tui and tests/processes, run with make test; each folder is also a
# marker (pytest -m "not processes").
# The pure tests without the long randomized ones (still run by `make test`): seconds.
test-fast: $(STAMP)
	$(BIN)/python -m pytest tests/pure -m 'not slow'

# The bridge against a real exo cluster (tests/exo; not part of `make test`, which never needs
# one). Needs EXO_DEPLOY_EXO_URLS, every exo node's API (comma-separated), and
# EXO_DEPLOY_EXO_CONTROL, the control API that kills, freezes and restarts them
# (tests/exo_cluster.py lists its routes). Serial, one scenario after another on one cluster
# (10-20 min); it ends by printing where the run's figures went (JSON).
test-exo: $(STAMP)
	@if [ -z "$$EXO_DEPLOY_EXO_URLS" ] || [ -z "$$EXO_DEPLOY_EXO_CONTROL" ]; then \
	  echo "make test-exo runs against a real exo cluster; set EXO_DEPLOY_EXO_URLS=http://HOST:PORT,... (every exo node's API) and EXO_DEPLOY_EXO_CONTROL=http://HOST:PORT (the control API that kills, freezes and restarts them)" >&2; \
	  exit 2; \
	fi
	$(BIN)/python -m pytest tests/exo -v -rxXf

# Every section, or those named: `make bench SECTIONS=requests` (bench/__init__.py lists them).
bench: $(STAMP)
	$(BIN)/python -m bench $(SECTIONS)

# Mutates the keeper and apply's rules ([tool.mutmut] in pyproject.toml), lists the survivors,
# then prints the score. A run that cannot start (broken config, failing clean tests) fails make;
# survivors do not, they are listed for a test or a `# pragma: no mutate` with its reason.
mutation: $(STAMP)
	rm -rf mutants
	$(BIN)/mutmut run --max-children 2
	$(BIN)/mutmut results
	$(BIN)/mutmut export-cicd-stats >/dev/null
	$(BIN)/python -c 'import json; print("mutation score: %(killed)d/%(total)d killed, %(survived)d survived" % json.load(open("mutants/mutmut-cicd-stats.json")))'

soak-sim: $(STAMP)
	$(BIN)/exo-deploy soak-sim --hours 24 --seed 1 --report soak-sim-report.json

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) mutants .pytest_cache
