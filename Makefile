# The two commands a new user needs: `make run` and `make test`.
# Both create .venv and install what they need, on a fresh Debian/Ubuntu machine.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
SUDO   := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_PACKAGES := mosquitto mosquitto-clients systemd lintian systemd-container util-linux
# MQTT.js (npm) for the WebSocket tests: installed into tests/js/node_modules, never globally.
JS := tests/js
ARGS ?=
# make bench SCENARIOS=fanin_qos0,edge_10000 runs a subset (bench/run.py --list names them all).
SCENARIOS ?=
# make fuzz: how many inputs, from which seed (CI runs 200,000 from seed 26).
FUZZ_INPUTS ?= 1000000
FUZZ_SEED ?= 26

# A target whose recipe fails is removed (a half-written .deb is not up to date next time).
.DELETE_ON_ERROR:

.PHONY: run test fuzz bench bench-client bench-plot install install-test system-deps build-deps venv-deps clean dist dist-measure \
	dist-arm64 test-arm64 deb deb-arm64 test-boot

$(BIN)/python: | venv-deps
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel

# csrc/ is compiled by the install (cffi_modules): a change there reinstalls.
$(VENV)/.installed: $(BIN)/python setup.cfg setup.py pyproject.toml csrc/edgebroker_native.c \
		csrc/edgebroker_native.h edgebroker/_native/_build.py | build-deps
	$(BIN)/python -m pip install -q -e .
	$(BIN)/python -c 'import edgebroker._native._edgebroker_c' || \
	  { echo "the C helper did not build (see above)"; exit 1; }
	touch $@

# `python3 -m venv` needs ensurepip, which Debian ships apart (python3.X-venv): installed when
# missing. (A pyenv or python.org interpreter has its own.)
venv-deps:
	@$(PYTHON) -c 'import ensurepip' 2>/dev/null || { \
	  pkg=$$($(PYTHON) -c 'import sys; print("python%d.%d-venv" % sys.version_info[:2])'); \
	  echo "installing the Debian package for python3 -m venv: $$pkg"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$pkg; }

# The C helper's build needs a C compiler and the interpreter's headers (Python.h): on Debian
# gcc and python3-dev, installed when missing. (A pyenv or python.org interpreter has its own.)
build-deps:
	@missing=""; command -v cc >/dev/null 2>&1 || missing="$$missing gcc"; \
	inc=$$($(PYTHON) -c 'import sysconfig; print(sysconfig.get_paths()["include"])'); \
	[ -f "$$inc/Python.h" ] || missing="$$missing python3-dev"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages for the C helper:$$missing"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing; \
	fi

$(VENV)/.installed-test: $(VENV)/.installed
	$(BIN)/python -m pip install -q -e '.[test,spark]'
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test system-deps $(JS)/node_modules/.installed

# Debian packages the tests drive (the mosquitto broker, the remote of the bridge tests and the
# other broker of the client tests; mosquitto_pub/mosquitto_sub; systemd-analyze, offline, for
# the unit in systemd/; lintian for the Debian package; systemd-nspawn for the boot test;
# node and npm for MQTT.js; util-linux for setpriv and unshare, Essential on Debian),
# installed when missing. Node and npm are looked for as commands, so a node installed some
# other way (NodeSource's nodejs package, which holds npm and conflicts with Debian's) is used.
# Java runs the Spark tests (tests/spark/, PySpark on local[2]): a java command, or Java 17.
# Debian's mosquitto package starts its broker as a service on 127.0.0.1:1883 (make run's
# address); when this installs it, the service is stopped and disabled (one installed before
# is left as it is).
system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	command -v java >/dev/null 2>&1 || missing="$$missing openjdk-17-jre-headless"; \
	command -v node >/dev/null 2>&1 || missing="$$missing nodejs"; \
	command -v npm >/dev/null 2>&1 || missing="$$missing npm"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get update -q && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $$missing \
	    || exit 1; \
	  case " $$missing " in *" mosquitto "*) \
	    if [ -d /run/systemd/system ]; then \
	      echo "stopping and disabling mosquitto.service (installed for the tests, which start their own;"; \
	      echo "  it would hold 127.0.0.1:1883, where make run listens)"; \
	      $(SUDO) systemctl disable --now mosquitto.service || true; \
	    fi;; \
	  esac; \
	fi

# The versions package-lock.json pins; again whenever package.json or the lock file changes
# (npm ci starts from an empty node_modules).
$(JS)/node_modules/.installed: $(JS)/package.json $(JS)/package-lock.json | system-deps
	npm_config_update_notifier=false npm ci --prefix $(JS) --no-audit --no-fund
	touch $@

run: install
	$(BIN)/edgebroker serve $(ARGS)

# The frozen binary's smoke test (tests/frozen/) runs dist/edgebroker and lints the Debian
# package: built first, and rebuilt only when the sources, the spec or the interpreter's
# packages change.
test: install-test dist deb
	$(BIN)/python -m pytest $(ARGS)

# ----- the one-file binary (packaging/, docs/deploy.md) ------------------------------------
PYINSTALLER := pyinstaller==6.22.3 pyinstaller-hooks-contrib==2026.9
DIST_SOURCES := $(shell find edgebroker -name '*.py') packaging/edgebroker.spec packaging/entry.py \
	packaging/check-native.sh \
	$(wildcard packaging/hooks/*.py)

$(VENV)/.installed-dist: $(VENV)/.installed
	$(BIN)/python -m pip install -q $(PYINSTALLER)
	touch $@

dist: dist/edgebroker

# A binary without the C helper is removed by packaging/check-native.sh: the next make dist builds
# again rather than finding it up to date, and make deb never packages it.
# PYTHONNODEBUGRANGES=1: the modules are compiled without the column positions of tracebacks'
# ^^^ markers (smaller code objects: the binary's memory and size, docs/deploy.md).
dist/edgebroker: $(DIST_SOURCES) $(VENV)/.installed $(VENV)/.installed-dist
	PYTHONNODEBUGRANGES=1 $(BIN)/pyinstaller --noconfirm --clean --log-level WARN --distpath dist \
	  --workpath build/pyinstaller packaging/edgebroker.spec
	packaging/check-native.sh $@
	touch $@

# The arm64 binary, built in a Debian bookworm arm64 root file system under qemu-user (root and
# the network the first time; the root file systems are cached under ~/.cache/edgebroker/).
EDGEBROKER_CACHE ?= $(HOME)/.cache/edgebroker
dist-arm64:
	$(SUDO) env EDGEBROKER_CACHE=$(EDGEBROKER_CACHE) packaging/arm64.sh build

# The smoke test of tests/frozen/ on it, through qemu-user, its libraries from a root file
# system without Python; its Debian package's test; and the package booted as test-boot does,
# in an arm64 Debian bookworm whose programs qemu-user runs (tests/boot/, docs/deploy.md).
test-arm64: install-test dist-arm64 deb-arm64
	EDGEBROKER_BINARY=dist-arm64/edgebroker QEMU_LD_PREFIX=$(EDGEBROKER_CACHE)/bookworm-arm64-run \
	  EDGEBROKER_DEB=dist/edgebroker_$(DEB_VERSION)_arm64.deb \
	  $(BIN)/python -m pytest tests/frozen/test_binary.py tests/frozen/test_deb.py $(ARGS)
	$(call boot_test,arm64,dist/edgebroker_$(DEB_VERSION)_arm64.deb)

# ----- the Debian package (packaging/deb.sh, docs/deploy.md) ---------------------------------
# dist/edgebroker_<version>_<arch>.deb: the binary, the units of systemd/ (the socket when there
# is one), the configuration as a conffile. DEB_VERSION=... builds another version.
ifndef DEB_VERSION
DEB_VERSION := $(shell packaging/deb.sh --version)
endif
DEB_ARCH := $(shell dpkg --print-architecture)
DEB := dist/edgebroker_$(DEB_VERSION)_$(DEB_ARCH).deb
DEB_SOURCES := packaging/deb.sh $(wildcard packaging/debian/*) systemd/edgebroker.service \
	systemd/edgebroker.toml $(wildcard systemd/edgebroker.socket)

deb: $(DEB)

$(DEB): dist/edgebroker $(DEB_SOURCES)
	DEB_VERSION=$(DEB_VERSION) packaging/deb.sh dist/edgebroker $(DEB_ARCH) dist

# From make dist-arm64's binary; its C library's version from the root file system it was built in.
deb-arm64: dist-arm64
	DEB_VERSION=$(DEB_VERSION) packaging/deb.sh dist-arm64/edgebroker arm64 dist \
	  $(EDGEBROKER_CACHE)/bookworm-arm64

# The package in a booted Debian bookworm (systemd-nspawn --boot): install, MQTT, reload, the
# watchdog, upgrade, remove and purge (tests/boot/). Root; the root file system is made once
# (packaging/boot-root.sh, about 2 minutes) and cached under $(EDGEBROKER_CACHE).
test-boot: install-test deb
	$(call boot_test,$(DEB_ARCH),$(DEB))

# The boot test of package $(2), architecture $(1) (test-boot; test-arm64 under qemu-user).
define boot_test
	$(SUDO) env EDGEBROKER_CACHE=$(EDGEBROKER_CACHE) EDGEBROKER_BOOT_ARCH=$(1) packaging/boot-root.sh
	$(SUDO) env EDGEBROKER_BOOT_TEST=1 EDGEBROKER_CACHE=$(EDGEBROKER_CACHE) \
	  EDGEBROKER_DEB=$(2) $(BIN)/python -m pytest tests/boot $(ARGS)
endef

# Size, start to READY=1 and idle RSS of dist/edgebroker against their budgets.
dist-measure: dist
	$(BIN)/python packaging/measure.py dist/edgebroker

# The fuzz test of the suite, longer (README.md).
fuzz: install-test
	EDGEBROKER_FUZZ_INPUTS=$(FUZZ_INPUTS) EDGEBROKER_FUZZ_SEED=$(FUZZ_SEED) \
	  $(BIN)/python -m pytest -q -s tests/server/test_fuzz.py $(ARGS)

# matplotlib is for the benchmark plots only: installed here, never by make test.
$(VENV)/.installed-bench: $(VENV)/.installed-test
	$(BIN)/python -m pip install -q 'matplotlib>=3.5'
	touch $@

# Installs Mosquitto (Debian package) itself when missing; see bench/README.md.
bench: install-test $(VENV)/.installed-bench
	$(BIN)/python bench/run.py $(if $(SCENARIOS),--scenarios $(SCENARIOS)) $(ARGS)
	$(BIN)/python bench/client_bench.py --brokers edgebroker,mosquitto

# One client's publish rate: edgebroker.client next to paho-mqtt (bench/client_bench.py).
bench-client: install-test
	$(BIN)/python bench/client_bench.py --brokers edgebroker,mosquitto $(CLIENT_ARGS)

# PNGs of the newest full run in bench/results/ into bench/plots/ (ARGS="--run ID" for another).
bench-plot: $(VENV)/.installed-bench
	$(BIN)/python bench/plot.py $(ARGS)

clean:
	rm -rf $(VENV) build dist dist-arm64 *.egg-info .pytest_cache .hypothesis $(JS)/node_modules
