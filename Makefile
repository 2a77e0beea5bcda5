# `make demo` and `make test` each create .venv when missing and install the project into it.
VENV := .venv
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test bench

$(STAMP): pyproject.toml
	test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/openft demo

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q

bench: $(STAMP)
	$(VENV)/bin/python bench/validate.py
