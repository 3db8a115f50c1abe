# gpupool: `docker build -t gpupool:0.1.0 .` then `docker run --rm gpupool:0.1.0 --help`.
# The Kubernetes manifests in deploy/ run it as `gpupool scheduler --leader-elect`.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MPLCONFIGDIR=/tmp/matplotlib

WORKDIR /build
COPY pyproject.toml README.md* ./
COPY src ./src
RUN pip install . \
    && rm -rf /build \
    && groupadd --system --gid 10001 gpupool \
    && useradd --system --uid 10001 --gid gpupool --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin gpupool

WORKDIR /
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["gpupool"]
CMD ["--help"]
