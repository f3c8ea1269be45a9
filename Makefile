# The two set-up commands of the README. Each creates .venv if missing and installs what it needs.
#   make demo   synthetic data -> the main job, end to end, on 2 CPU cores
#   make test   the test suite (what CI runs via .ci/run); it builds the docs too
#   make docs   the documentation site, into docs/_build/html
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_OUT ?= demo_out

.PHONY: demo test docs system-deps browser-deps server-deps

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# $(call apt_dep,TARGET,CHECK,PACKAGE,WITHOUT): when the shell command CHECK fails, install the
# Debian/Ubuntu PACKAGE with apt if this is root with apt; otherwise (or when apt fails) go on and
# print WITHOUT: what works without it.
define apt_dep
	@if $(2); then \
	  echo "$(1): $(3) present"; \
	elif [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "$(1): installing $(3) with apt"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(3) >/dev/null) \
	    || echo "$(1): apt-get failed; $(4)"; \
	else \
	  echo "$(1): no $(3) and no apt/root here (apt install $(3)); $(4)"; \
	fi
endef
HAS_VIPS := python3 -c "import ctypes.util,sys; sys.exit(0 if ctypes.util.find_library('vips') else 1)"
HAS_NGINX := command -v nginx >/dev/null 2>&1 || test -x /usr/sbin/nginx
HAS_ORTHANC := { command -v Orthanc >/dev/null 2>&1 || test -x /usr/sbin/Orthanc; } && \
	{ test -e /usr/share/orthanc/plugins/libOrthancDicomWeb.so || test -e /usr/lib/orthanc/libOrthancDicomWeb.so; }
HAS_CHROMIUM := command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1

# libvips from Debian/Ubuntu gives pyvips its openslideload (NDPI, SVS, MRXS). Without apt or root,
# cyto still reads slides through openslide-python + openslide-bin (pip); say so instead of failing.
system-deps:
	$(call apt_dep,system-deps,$(HAS_VIPS),libvips42,continuing with the pip-only slide readers (openslide-bin))

# The review page's browser tests drive the system Chromium through playwright (nothing is
# downloaded at run time). Without apt or root they skip, saying why.
browser-deps:
	$(call apt_dep,browser-deps,$(HAS_CHROMIUM),chromium,the browser tests will skip)

# The remote-slide tests serve slides from the system nginx (range requests, ETags), started by
# the tests on loopback; the DICOMweb tests, from Orthanc with its DICOMweb plugin. Without apt or
# root they skip, saying why.
server-deps:
	$(call apt_dep,server-deps,$(HAS_NGINX),nginx-light,the nginx remote-slide tests will skip)
	$(call apt_dep,server-deps,$(HAS_ORTHANC),orthanc orthanc-dicomweb,the DICOMweb tests will skip)

# pip compiles every file it installs to bytecode, one at a time: about a minute of the install on
# 2 cores for torch and the rest. compileall does the same work on every core (about 25 s). Files
# written for newer Pythons (torch's py312 test helpers) cannot compile and are never imported here;
# pip skips them the same way, so their errors are not shown.
comma := ,
# $(call pip_install,EXTRAS)
define pip_install
	$(PY) -m pip install --quiet --no-compile -e '.[$(1)]'
	$(PY) -m compileall -qq -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || true
endef

$(VENV)/.installed-cpu: pyproject.toml | $(PY)
	$(call pip_install,cpu)
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(PY)
	$(call pip_install,cpu$(comma)test)
	touch $@

$(VENV)/.installed-docs: pyproject.toml | $(PY)
	$(call pip_install,cpu$(comma)docs)
	touch $@

# The site, with warnings as errors as in the tests (tests/unit/test_docs.py builds it too). The
# reference pages of the CLI and the method configs are written by docs/generate.py first.
docs: $(VENV)/.installed-docs
	$(PY) docs/generate.py
	$(PY) -m sphinx -W --keep-going -q -b html docs docs/_build/html
	@echo "the documentation site: docs/_build/html/index.html"

demo: system-deps $(VENV)/.installed-cpu
	$(VENV)/bin/cyto demo --out $(DEMO_OUT) --overwrite

# What a test run may not leave behind: a Ray cluster record, cyto's cache, files in the tree. The
# suite runs with a scratch folder of its own as cyto's cache, the user cache home and Ray's
# temporary folder (tests/conftest.py gives each session its own below them), so whatever is
# found there is the suite's: another cyto process of the same user writing ~/.cache/cyto or
# starting a Ray cluster meanwhile is not counted against it. The scratch folder is removed.
LEFTOVERS = { ls -a "$$RAY_TMPDIR/ray/ray_current_cluster" 2>/dev/null; \
	ls -aR "$$CYTO_CACHE_DIR" "$$XDG_CACHE_HOME/cyto" 2>/dev/null; \
	git status --porcelain 2>/dev/null; true; }

# The suite on two pytest-xdist workers where the machine has two cores or more (one where it has
# one), each test module on one worker; more workers were never measured (each holds about 2 GB).
# `make test TEST_WORKERS="-n 0"` runs it in one process (CONTRIBUTING.md, Tests).
# PYTHONDONTWRITEBYTECODE (set in some shells and CI images) is lifted for the run: with it every
# process the suite starts (`python -m cyto`, pipeline workers, Ray workers) compiled cyto's
# sources again; without it they are compiled once, into the tree's ignored __pycache__ folders.
TEST_WORKERS ?= -n auto --maxprocesses 2 --dist loadscope

test: system-deps browser-deps server-deps $(VENV)/.installed-test
	@set +e; scratch=$$(mktemp -d "$${TMPDIR:-/tmp}/cyto-make-test-XXXXXX"); \
	export CYTO_CACHE_DIR="$$scratch/cache" XDG_CACHE_HOME="$$scratch/xdg" RAY_TMPDIR="$$scratch/ray"; \
	unset PYTHONDONTWRITEBYTECODE; \
	before=$$scratch/leftovers-before; after=$$scratch/leftovers-after; $(LEFTOVERS) > $$before; \
	$(PY) -m pytest -q $(TEST_WORKERS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing on purpose"; rm -rf "$$scratch"; exit 1; fi; \
	$(LEFTOVERS) > $$after; \
	if ! diff -u $$before $$after > /dev/null; then \
	  echo "the tests left files behind outside their temporary folders:"; \
	  diff -u $$before $$after | tail -n +3; rc=1; fi; \
	rm -rf "$$scratch"; exit $$rc
