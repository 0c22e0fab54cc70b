# uv's binary alone, as ghcr.io/astral-sh/uv ships it (/uv): taken from uv's PyPI wheel by
# infra/docker/bases.sh, which puts it in this build's context.
FROM scratch
COPY uv /uv
ENTRYPOINT ["/uv"]
