# syntax=docker/dockerfile:1
# gpuscope: one image for both halves; the command decides the role
# (`gpuscope agent ...`, `gpuscope analyzer ...`). docs/kubernetes.md builds
# and deploys it; deploy/helm/gpuscope runs it on Kubernetes.
#
# NVML is not in the image. The NVIDIA container toolkit mounts the host
# driver's libnvidia-ml.so.1 and the GPU device files into a container that
# asks for them (NVIDIA_VISIBLE_DEVICES; NVIDIA_DRIVER_CAPABILITIES=utility is
# NVML and nvidia-smi, no CUDA), so the library always matches the driver.
# Debian 12's own Python 3.11 (the version gpuscope is tested on): with
# ca-certificates, 120 MB under /opt/gpuscope's 268 (docs/benchmarks.md,
# "Container image", measured by running these steps: bench/image_build.py).
# For a byte-for-byte reproducible build pin the digest:
#   docker build --build-arg BASE=debian:bookworm-slim@sha256:... .
ARG BASE=debian:bookworm-slim

FROM ${BASE} AS build
# Extras of pyproject.toml to install besides gpuscope: `fleet` for the fleet
# tier on S3 or GCS (`--publish s3://...`; a directory needs none):
#   docker build --build-arg EXTRAS=fleet -t REGISTRY/gpuscope:VERSION-fleet .
# None by default: s3fs and gcsfs bring botocore and google's libraries,
# ~60 MB, and the image is at 388 MB of its 400 (docs/kubernetes.md).
ARG EXTRAS=
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-venv binutils \
 && rm -rf /var/lib/apt/lists/*
COPY . /src
RUN EXTRAS="${EXTRAS}" sh /src/deploy/container/install.sh /opt/gpuscope /src

FROM ${BASE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 ca-certificates \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/cache/debconf/*-old /var/log/apt /var/log/dpkg.log \
 && mkdir -p /var/lib/gpuscope \
 && chown 65532:65532 /var/lib/gpuscope
COPY --from=build /opt/gpuscope /opt/gpuscope
COPY deploy/container/gpuscope-health /opt/gpuscope/bin/gpuscope-health
# XDG_STATE_HOME: the default DB is /var/lib/gpuscope/gpuscope.duckdb, as under systemd
ENV PATH=/opt/gpuscope/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/var/lib/gpuscope \
    XDG_STATE_HOME=/var/lib \
    PYTHONDONTWRITEBYTECODE=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
# Not root: the analyzer needs nothing more. The agent on Kubernetes runs as
# uid 0 with every capability dropped, only to connect to the kubelet's
# pod-resources socket, which is root's (deploy/helm/gpuscope/values.yaml).
USER 65532:65532
EXPOSE 9403 9464
# No HEALTHCHECK: the role, its port and the TLS files to probe with are
# chosen at run time. Kubernetes ignores HEALTHCHECK and runs
# `gpuscope-health` from its probes (deploy/helm/gpuscope); under Docker,
#   --health-cmd 'gpuscope-health 127.0.0.1:9401 --ca ... --cert ... --key ...'
HEALTHCHECK NONE
ENTRYPOINT ["gpuscope"]
CMD ["--help"]
