# syntax=docker/dockerfile:1
# mirrorq broker image. Multi-stage: build a wheel, install it into a venv in a
# slim runtime that runs as uid 10001. Not built in this repository's CI (no
# Docker engine there): see docs/kubernetes.md.
ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
RUN pip install --no-cache-dir --upgrade pip wheel
COPY pyproject.toml README.md ./
COPY node ./node
COPY chaos/chaosmirrorq ./chaos/chaosmirrorq
COPY harness ./harness
RUN pip wheel --no-cache-dir --wheel-dir /wheels .
RUN python -m venv /opt/mirrorq \
 && /opt/mirrorq/bin/pip install --no-cache-dir /wheels/*.whl

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
