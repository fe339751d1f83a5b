# mrcstack: the targets a newcomer uses.  `make demo` and `make test` are the two README commands.
SHELL := /bin/bash
PY    := .venv/bin/python
# Debian packages the project needs: tshark decodes our packets in tests; iproute2 and nftables
# build the testbed and its faults; clang and libbpf-dev compile the switch trimming program;
# prometheus (promtool and the server) and systemd (systemd-analyze) check what mrcd ships.
APT_PACKAGES := tshark iproute2 nftables clang libbpf-dev prometheus systemd
# gcc and the Python headers compile the per-packet modules with mypyc (`make native`).
NATIVE_PACKAGES := gcc python3-dev

.PHONY: setup native lint test bench demo experiments clean-venv

# The demo needs only the testbed's tools and the compiler for `native` (and Prometheus with
# PROMETHEUS=1), so a fresh machine runs it without waiting for clang or tshark.
DEMO_PACKAGES := iproute2 nftables $(if $(PROMETHEUS),prometheus)

# $(call apt-ensure,PACKAGES): install those of PACKAGES that are missing.
apt-ensure = @missing=""; for p in $(1); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

setup: native
	$(call apt-ensure,$(APT_PACKAGES))
	$(PY) -m mrcstack.netns.trim build >/dev/null

# The per-packet modules compiled with mypyc from their Python source (about a minute; again
# only when one of them changed).  Without the build they run as Python, more slowly.
native: .venv/.installed
	$(call apt-ensure,$(NATIVE_PACKAGES))
	$(PY) -m mrcstack native build

.venv/.installed: pyproject.toml
	@# A fresh Debian/Ubuntu may lack python3 or its venv module (package python3-venv).
	@command -v python3 >/dev/null && python3 -c 'import ensurepip, venv' 2>/dev/null || { \
	  echo "installing Debian packages: python3 python3-venv"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >/dev/null; }
	@python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || { \
	  echo "mrcstack needs Python >= 3.11; python3 here is $$(python3 --version 2>&1)"; exit 1; }
	test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

# mypy sees netns/ and daemons/ as mrcstack.netns and mrcstack.daemons (linked into mrcstack/);
# lint-imports checks the layers and that no package has an import cycle (pyproject.toml).
lint: setup
	.venv/bin/ruff check mrcstack netns daemons tests bench
	.venv/bin/ruff format --check mrcstack netns daemons tests bench
	.venv/bin/mypy mrcstack bench
	.venv/bin/lint-imports --no-cache

test: setup lint
	.venv/bin/pytest -q

bench: setup
	$(PY) -m bench

# The MRC paper's experiments in the quick profile: experiments-out/index.md. The
# simulator's run a process per CPU; the testbed's one at a time afterwards.
experiments: native
	$(PY) -m mrcstack experiment run --quick --jobs $$(nproc) --out experiments-out

# The demo needs root (namespaces); PROMETHEUS=1 leaves Prometheus, the testbed and mrcd up.
demo: native
	$(call apt-ensure,$(DEMO_PACKAGES))
	$(PY) -m mrcstack demo $(if $(PROMETHEUS),--prometheus)

clean-venv:
	rm -rf .venv

# The default testbed (4 planes, 2 racks x 2 hosts, 4 T1), named mrc; needs root.
.PHONY: testbed testbed-down
testbed: setup
	.venv/bin/python -m mrcstack testbed up $(TESTBED_ARGS)

testbed-down:
	.venv/bin/python -m mrcstack testbed down

# mrcd on every host of the running testbed (`make testbed` first); `cluster-down` stops them.
.PHONY: cluster cluster-down
cluster: setup
	.venv/bin/python -m mrcstack cluster up

cluster-down:
	.venv/bin/python -m mrcstack cluster down
