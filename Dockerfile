# One image, two entry points: `compass-broker` (control plane) and `compass-agent`
# (every Kyma runtime). Build it with `make image` (buildah, no daemon; docs/image.md), or with
#   docker build -t ghcr.io/<org>/kyma-compass-pull:<appVersion> .
# Dependencies come from requirements.lock (hashes required); regenerate it with `make lock`.
#
# Behind a TLS-inspecting proxy, give pip its CA bundle as a build secret (mounted for one RUN,
# never written to a layer): `--secret id=pip-ca,src=<bundle>` (buildah, docker buildx).

# python:3.11-slim-bookworm, pinned by the digest published for its 3.11.14 build. Where no
# registry is reachable, `make image` passes a base made from Debian's packages instead
# (--build-arg PYTHON_IMAGE=localhost/...; Debian 12's python3 is 3.11 too).
ARG PYTHON_IMAGE=docker.io/library/python:3.11.14-slim-bookworm@sha256:65a93d69fa75478d554f4ad27c85c1e69fa184956261b4301ebaf6dbb0a3543d

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/venv
COPY requirements.lock ./
RUN --mount=type=secret,id=pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
 && /opt/venv/bin/pip install --require-hashes --no-deps --only-binary=:all: -r requirements.lock
# Only the product packages go into the image; devenv/ and tests/ stay behind.
COPY pyproject.toml README.md ./
COPY agent ./agent
COPY control_plane_broker ./control_plane_broker
COPY kubeapi ./kubeapi
COPY observability ./observability
# pip fetches the build backend (setuptools) for the wheel: the same CA bundle, if any.
RUN --mount=type=secret,id=pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
 && /opt/venv/bin/pip wheel --no-deps --wheel-dir /wheels . \
 && /opt/venv/bin/pip install --no-deps /wheels/*.whl \
 && /opt/venv/bin/pip uninstall --yes pip \
 && find /opt/venv -name '__pycache__' -type d -prune -exec rm -rf {} +

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="kyma-compass-pull" \
      org.opencontainers.image.description="Pull-model connection of Kyma runtimes to Compass: compass-broker and compass-agent" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/venv /opt/venv
# The nonroot numeric user of distroless images; numeric so runAsNonRoot can verify it.
USER 65532:65532
EXPOSE 8080
ENTRYPOINT []
CMD ["compass-broker"]
