# PostgreSQL 15 from Debian bookworm's postgresql-15, with an entrypoint that reads the
# official image's variables (POSTGRES_USER, POSTGRES_PASSWORD, POSTGRES_DB,
# POSTGRES_HOST_AUTH_METHOD, PGPORT, /docker-entrypoint-initdb.d/*.sql), so the compose file
# and the test plugin run on it or on postgres:15 alike.
ARG DEBIAN_IMAGE=pin-base/debian:bookworm
FROM ${DEBIAN_IMAGE}
# No cluster at install time: the entrypoint makes one in PGDATA on first start.
RUN mkdir -p /etc/postgresql-common \
    && echo 'create_main_cluster = false' >/etc/postgresql-common/createcluster.conf \
    && apt-get update \
    && apt-get install -y --no-install-recommends postgresql-15 \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/postgresql/data /docker-entrypoint-initdb.d \
    && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql \
    && chmod 2777 /var/run/postgresql
ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data \
    LANG=C.UTF-8
COPY postgres-entrypoint.sh /usr/local/bin/docker-entrypoint.sh
USER postgres
# As the official image: `docker stop` is PostgreSQL's fast shutdown, not the smart one that
# waits for every client to leave.
STOPSIGNAL SIGINT
ENTRYPOINT ["docker-entrypoint.sh"]
CMD ["postgres"]
