# One command each: `make test` sets everything up and runs every gate; `make demo` runs the main job.
# Every recipe line can fail the run: no `|| true`, no `-` prefixes (a failure may be held
# until a summary is printed, then passed on).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed-dev

.PHONY: test lint typecheck pytest versions docs site notebooks lab demo races races-pg bench soak load clean setup

test: lint typecheck pytest docs site versions  ## every gate: ruff, mypy, pytest, docs + notebooks, the site in a browser, every Python

setup: $(STAMP)

# (Re)install when the venv is missing or pyproject.toml changed.
$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy --strict patterns

# The PostgreSQL tests run against a throwaway cluster that the script installs (Debian's
# packages, when missing), starts on 127.0.0.1, and stops afterwards, also when tests fail.
PG := scripts/pg-test-cluster.sh run --

pytest: $(STAMP)
	$(PG) $(VENV)/bin/pytest

# The suite again on every other CPython 3.11+ that nox finds (noxfile.py: one session and one
# venv per version), then one line naming the versions that ran and those not found; it is the
# last line of `make test`. REQUIRE_PYTHONS="3.11 3.12 3.13" (.ci/run sets it) fails the run
# when a named version did not run. One version alone: `.venv/bin/nox -s tests-3.13`.
REQUIRE_PYTHONS ?=

# The summary runs after a failed session too (so the line says which version failed), and
# the recipe then exits with the sessions' status.
versions: $(STAMP)
	status=0; $(PG) $(PY) scripts/pythons.py run || status=$$?; \
	$(PY) scripts/pythons.py summary --require "$(REQUIRE_PYTHONS)" && exit $$status

# -n nitpicky, -W warnings are errors, --keep-going reports them all; myst-nb executes every
# notebook during the build and a failing cell is an error. -E: no stale environment.
docs: $(STAMP)
	scripts/need.sh dot graphviz >/dev/null
	scripts/need.sh /usr/share/doc/python3.11/html/objects.inv python3.11-doc >/dev/null
	rm -rf docs/_build
	$(VENV)/bin/sphinx-build -E -n -W --keep-going -b html docs docs/_build/html

# Every notebook run on its own, in reading order, as a reader's kernel would run it (nbclient's
# `jupyter execute`, installed with myst-nb; the venv's kernel imports `patterns` from the
# checkout). The notebooks are not rewritten: outputs are not kept in git. A failing cell
# stops the run with its traceback; the docs build runs them all again (`make docs`).
notebooks: $(STAMP)
	cd notebooks && for nb in [0-9][0-9]-*.ipynb; do \
		echo "== notebooks/$$nb"; \
		../$(VENV)/bin/jupyter execute --timeout=120 "$$nb" || exit 1; \
	done

# The built site in headless Chromium (Debian's, installed by scripts/need.sh when missing),
# at 1280 px and 390 px: console errors, missing resources and images, broken links and
# anchors, sideways scrolling on a phone, search. Screenshots go to docs/_build/screenshots/.
site: docs
	CHROMIUM="$${CHROMIUM:-$$(scripts/need.sh chromium)}" $(VENV)/bin/pytest sitetests -q -p no:cacheprovider

# JupyterLab on the notebooks, with this venv's kernel (it imports `patterns` from the checkout).
lab: $(STAMP)
	$(PY) -m pip install --quiet -e '.[notebooks]'
	$(VENV)/bin/jupyter lab notebooks $(if $(filter 0,$(shell id -u)),--allow-root)

# The job queue on an embedded SQLite file: work flowing, a graceful stop, a restart that loses nothing.
demo: $(STAMP)
	$(PY) -m patterns.jobqueue demo

# Benchmarks print tables; they are never part of `make test` (no timed assertions in tests).
# benchmarks/jobqueue_ab.py compares two checkouts, so it needs --before and is run by hand.
bench: $(STAMP)
	start=$$(date +%s); status=0; \
	$(PY) -m pip install --quiet -e '.[bench]' && \
	$(PG) sh -c 'for m in $(filter-out jobqueue_ab,$(sort $(basename $(notdir $(wildcard benchmarks/[a-z]*.py))))); do \
		echo "== benchmarks.$$m"; $(PY) -m benchmarks.$$m || exit 1; done' && \
	echo "== benchmarks.postgres_compare, on a durable cluster (fsync and synchronous_commit on)" && \
	PG_TEST_DURABLE=1 $(PG) $(PY) -m benchmarks.postgres_compare || status=$$?; \
	echo "== make bench: $$(($$(date +%s) - start)) s in all; load average at the end" \
		"$$($(PY) -c 'import os; print(*(f"{x:.2f}" for x in os.getloadavg()), sep=", ")')"; \
	exit $$status

# The crash soak, long form: kill -9 at random moments, round after round, on SQLite and on
# PostgreSQL (the throwaway cluster; ~4 min each).
# `make test` runs a short version (SOAK_ROUNDS defaults to 3 there).
soak: $(STAMP)
	SOAK_ROUNDS=$${SOAK_ROUNDS:-200} $(PG) $(VENV)/bin/pytest tests/jobqueue/test_crash_matrix.py -k soak -o faulthandler_timeout=0 -p no:cacheprovider

# The suite beside LOAD_HOGS CPU-bound processes (default 2, on a 2-core machine: every thread
# waits for a core), stopped afterwards whatever happens. A test that passes alone and fails
# here relies on timing or shows a race in the code: fix the cause, never retry. Never part of
# `make test`. LOAD_PYTEST is the runner (another Python: LOAD_PYTEST=".venv/bin/nox -s
# tests-3.13 --"), LOAD_ARGS its arguments (a file, -k, --count 20 from pytest-repeat).
LOAD_HOGS   ?= 2
LOAD_PYTEST ?= $(VENV)/bin/pytest
LOAD_ARGS   ?=

load: $(STAMP)
	scripts/under-load.sh -n $(LOAD_HOGS) -- $(PG) $(LOAD_PYTEST) $(LOAD_ARGS)

# Every race test, quietly: only the table (what each naive version did, what each pattern
# held) and pytest's summary line are printed, or a failure's report when one fails.
# No database server is needed: the one race that needs PostgreSQL (PG1, in
# tests/jobqueue/test_postgres.py) joins the run when PATTERNS_PG_DSN names a server, and
# otherwise a last line says so; `make races-pg` runs it alone on a throwaway cluster.
RACES := $(VENV)/bin/pytest -m race -q -o console_output_style=classic --race-table -p no:cacheprovider

races: $(STAMP)
	$(RACES) $(if $(PATTERNS_PG_DSN),,--ignore=tests/jobqueue/test_postgres.py)
	@$(if $(PATTERNS_PG_DSN),true,echo "make races: PG1 (leases judged by each machine's clock) left out: it needs PostgreSQL; \
		set PATTERNS_PG_DSN, or run make races-pg (a throwaway cluster, installed with apt-get when missing)")

races-pg: $(STAMP)
	$(PG) $(RACES) tests/jobqueue/test_postgres.py

clean:
	rm -rf $(VENV) .nox docs/_build .pytest_cache .mypy_cache .ruff_cache
