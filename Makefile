# Two commands matter: `make demo` (the local demo) and `make test` (everything CI runs).
# Both set up what they need: a virtual environment in .venv and the test control
# plane binaries (kube-apiserver, etcd, helm), built once into ~/.cache.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
TOOLCHAIN := devenv/toolchain/build.sh
RUNTIME_AGENT := devenv/runtime_agent/build.sh
REAL_COMPASS := devenv/real_director/build.sh
REAL_CONNECTOR := devenv/real_director/build-connector.sh
KLM := devenv/klm/build.sh

.PHONY: test check lint unit toolchain node runtime-agent real-compass klm image image-if-possible demo bench lock e2e-kind module clean

$(INSTALLED): pyproject.toml
	@echo "==> creating the virtual environment in $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check --upgrade pip
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $@

toolchain:
	@bash $(TOOLCHAIN) >/dev/null

# The real node's binaries (kubelet, kube-controller-manager, kube-scheduler, kube-proxy, from the
# same module as kube-apiserver) and its pause image, built before pytest runs. Where this machine
# cannot run a node (not root, no containerd: devenv/node/host-packages.sh), it says why, builds
# nothing, and the node's tests skip with that reason (docs/real-node.md).
node: $(INSTALLED) toolchain
	@$(PY) -m devenv.node --prepare

# Kyma's real compass-runtime-agent, built from the pinned source before pytest runs (the Go build
# must not eat a test's timeout). Exit 3 means the source is not here: its tests skip and say so.
runtime-agent:
	@bash $(RUNTIME_AGENT) >/dev/null || { rc=$$?; [ $$rc -eq 3 ] || exit $$rc; }

# The real Compass Director, built from the pinned source before pytest runs, for the same reason;
# then the real Connector and hydrator (same tree) and Oathkeeper (Go module proxy).
# Exit 3 means a source is not here: its tests skip and say so (docs/real-compass.md).
real-compass:
	@bash $(REAL_COMPASS) >/dev/null || { rc=$$?; [ $$rc -eq 3 ] || exit $$rc; }
	@bash $(REAL_CONNECTOR) >/dev/null || { rc=$$?; [ $$rc -eq 3 ] || exit $$rc; }

# Kyma's real lifecycle-manager and our OCI registry for it, built from the pinned source before
# pytest runs, for the same reason (about 6 minutes the first time). Exit 3 means the source is
# not here: the KLM tests skip and say so (docs/module.md#the-real-lifecycle-manager).
klm:
	@bash $(KLM) >/dev/null || { rc=$$?; [ $$rc -eq 3 ] || exit $$rc; }

# The product image (docs/image.md): buildah from Debian's packages (installed when missing, as
# root), on a base made from them where no registry serves the Dockerfile's pinned one. Prints the
# OCI archive it is cached as; IMAGE=<registry>/<name>:<tag> names it otherwise.
image:
	@$(PYTHON) -m devenv.image

# The same before pytest runs, so the build does not eat a test's timeout. Exit 3 means no builder
# can run here (not root): the image's tests skip and say so.
image-if-possible:
	@$(PYTHON) -m devenv.image >/dev/null || { rc=$$?; [ $$rc -eq 3 ] || exit $$rc; }

lint: $(INSTALLED)
	@echo "==> ruff check, ruff format --check, mypy, lint-imports"
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-cache

test: $(INSTALLED) toolchain node runtime-agent real-compass klm image-if-possible lint
	@echo "==> pytest"
	$(PY) -m pytest $(PYTEST_ARGS)

unit: $(INSTALLED)
	$(PY) -m pytest tests/unit $(PYTEST_ARGS)

demo: $(INSTALLED) toolchain runtime-agent
	$(PY) -m devenv.demo $(DEMO_ARGS)

bench: $(INSTALLED) toolchain
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,bench]'
	$(PY) -m bench $(BENCH_ARGS)

# The agent as a Kyma module (docs/module.md): the raw manifest rendered from the chart, the
# ModuleTemplates (KCP and community) and the ModuleReleaseMeta, into dist/module/.
module: $(INSTALLED) toolchain
	$(PY) -m devenv.kyma_module --helm "$$(bash $(TOOLCHAIN))/helm" --out dist/module

# Needs Docker and kind; not part of `make test`.
e2e-kind:
	bash devenv/kind/e2e.sh

lock: $(INSTALLED)
	$(VENV)/bin/uv pip compile pyproject.toml --generate-hashes --python-version 3.11 \
		--python-platform x86_64-manylinux_2_28 --no-header --quiet -o requirements.lock

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
