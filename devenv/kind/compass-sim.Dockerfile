# The Compass simulator as an image, for the kind end-to-end run only (never shipped):
# the product image plus devenv/ and the simulator's GraphQL library.
ARG PRODUCT_IMAGE=kyma-compass-pull:e2e
FROM ${PRODUCT_IMAGE}
USER 0:0
COPY devenv /opt/compass-sim/devenv
RUN python -m ensurepip --default-pip >/dev/null 2>&1 || true; \
    python -m pip install --no-cache-dir --target /opt/compass-sim/lib "graphql-core>=3.2,<4"
ENV PYTHONPATH=/opt/compass-sim:/opt/compass-sim/lib
USER 65532:65532
CMD ["python", "-m", "devenv.compass_sim", "--host", "0.0.0.0", "--port", "8080"]
