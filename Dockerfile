# gpupool: `docker build -t gpupool:0.1.0 .` then `docker run --rm gpupool:0.1.0 --help`.
# The Kubernetes manifests in deploy/ run it as `gpupool scheduler --leader-elect`.
# Base image: an exact Python patch release on Debian bookworm (pin the digest too, `@sha256:...`, for
# byte-identical rebuilds). Dependencies: requirements/image.lock, every version pinned with its hashes
# (regenerate it with the command in its header after changing pyproject.toml's dependencies).
FROM python:3.11.14-slim-bookworm

# NUMBA_CACHE_DIR: the engine's compiled kernels are cached where the manifests mount a writable /tmp
# (emptyDir; the root file system is read-only and the user has no home), so a restarted container loads them
# in a fraction of a second instead of compiling them again (seconds).
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    MPLCONFIGDIR=/tmp/matplotlib \
    NUMBA_CACHE_DIR=/tmp/numba-cache

WORKDIR /build
# The locked dependencies first (their own layer, kept while only src/ changes), then gpupool itself with
# nothing else fetched: no dependency resolution, no build isolation (setuptools and wheel are locked too).
COPY requirements/image.lock ./requirements/image.lock
RUN pip install --require-hashes --no-deps -r requirements/image.lock
COPY pyproject.toml README.md* ./
COPY src ./src
RUN pip install --no-deps --no-build-isolation --no-index . \
    && pip check \
    && rm -rf /build \
    && groupadd --system --gid 10001 gpupool \
    && useradd --system --uid 10001 --gid gpupool --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin gpupool

WORKDIR /
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["gpupool"]
CMD ["--help"]
