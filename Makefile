# The two set-up commands of the README. Each creates .venv if missing and installs what it needs.
#   make demo   synthetic data -> the main job, end to end, on 2 CPU cores
#   make test   the test suite (what CI runs via .ci/run)
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_OUT ?= demo_out

.PHONY: demo test system-deps browser-deps

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip

# libvips from Debian/Ubuntu gives pyvips its openslideload (NDPI, SVS, MRXS). Without apt or root,
# cyto still reads slides through openslide-python + openslide-bin (pip); say so instead of failing.
system-deps:
	@if python3 -c "import ctypes.util,sys; sys.exit(0 if ctypes.util.find_library('vips') else 1)"; then \
	  echo "system-deps: libvips present"; \
	elif [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "system-deps: installing libvips42 with apt"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libvips42 >/dev/null) \
	    || echo "system-deps: apt-get failed; continuing with the pip-only slide readers (openslide-bin)"; \
	else \
	  echo "system-deps: no apt/root here; continuing with the pip-only slide readers (openslide-bin). pyvips needs libvips (e.g. 'apt install libvips42' or 'brew install vips')."; \
	fi

# The review page's browser tests drive the system Chromium through playwright (nothing is
# downloaded at run time). Without apt or root they skip, saying why.
browser-deps:
	@if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then \
	  echo "browser-deps: chromium present"; \
	elif [ "$$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "browser-deps: installing chromium with apt (for the review page's browser tests)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	    || echo "browser-deps: apt-get failed; the browser tests will skip"; \
	else \
	  echo "browser-deps: no chromium and no apt/root; the browser tests will skip (apt install chromium)"; \
	fi

$(VENV)/.installed-cpu: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[cpu]'
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(PY)
	$(PY) -m pip install --quiet -e '.[cpu,test]'
	touch $@

demo: system-deps $(VENV)/.installed-cpu
	$(VENV)/bin/cyto demo --out $(DEMO_OUT)

test: system-deps browser-deps $(VENV)/.installed-test
	@set +e; $(PY) -m pytest -q; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing on purpose"; exit 1; fi; exit $$rc
