# One image, two entry points: `compass-broker` (control plane) and `compass-agent`
# (every Kyma runtime). Build: docker build -t kyma-compass-pull .
# Dependencies come from requirements.lock (hashes required); regenerate it with `make lock`.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/venv
COPY requirements.lock ./
RUN /opt/venv/bin/pip install --require-hashes --no-deps --only-binary=:all: -r requirements.lock
# Only the product packages go into the image; devenv/ and tests/ stay behind.
COPY pyproject.toml README.md ./
COPY agent ./agent
COPY control_plane_broker ./control_plane_broker
COPY kubeapi ./kubeapi
COPY observability ./observability
RUN /opt/venv/bin/pip wheel --no-deps --wheel-dir /wheels . \
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
