# syntax=docker/dockerfile:1
# mirrorq image: the broker (`mirrorq`, the default entry point) and the operator
# (`kopf run -m mirrorq_operator.handlers`, what the chart's operator Deployment
# runs) in one image. Multi-stage: build the wheels, install them into a venv in a
# slim runtime that runs as uid 10001 (a read-only root filesystem is fine: the
# broker writes only /data, the operator only /tmp). `make image` builds it
# without Docker (k8s/image.sh); docs/kubernetes.md shows pushing it.
ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
RUN pip install --no-cache-dir --upgrade pip wheel
COPY pyproject.toml README.md ./
COPY node ./node
COPY chaos/chaosmirrorq ./chaos/chaosmirrorq
COPY harness ./harness
COPY operator/mirrorq_operator ./operator/mirrorq_operator
RUN pip wheel --no-cache-dir --wheel-dir /wheels ".[operator]"
RUN python -m venv /opt/mirrorq \
 && /opt/mirrorq/bin/pip install --no-cache-dir --no-index --find-links /wheels "mirrorq[operator]"

FROM ${PYTHON_IMAGE}
ENV PATH=/opt/mirrorq/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
RUN groupadd --system --gid 10001 mirrorq \
 && useradd --system --uid 10001 --gid 10001 --home-dir /data --no-create-home mirrorq \
 && mkdir -p /data /run/mirrorq \
 && chown 10001:10001 /data /run/mirrorq
COPY --from=build /opt/mirrorq /opt/mirrorq
USER 10001:10001
WORKDIR /data
VOLUME ["/data"]
# AMQP, admin (gRPC), metrics (Prometheus), Raft
EXPOSE 5672 15672 15682 15692 25672
ENTRYPOINT ["mirrorq"]
CMD ["--help"]
