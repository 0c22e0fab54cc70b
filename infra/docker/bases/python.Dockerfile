# Python 3.11 from Debian bookworm's own package, on the debootstrap base: the PYTHON_IMAGE of
# infra/docker/Dockerfile where python:3.11-slim-bookworm cannot be pulled (infra/docker/bases.sh).
ARG DEBIAN_IMAGE=pin-base/debian:bookworm
FROM ${DEBIAN_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/* \
    && ln -s /usr/bin/python3 /usr/local/bin/python
ENV LANG=C.UTF-8
CMD ["python3"]
