# A single-node KRaft Kafka 4.2 broker: Debian bookworm's Java 17 and the jars Maven Central
# gives for infra/local/kafka/pom.xml (plus kafka-tools, for the topic and health commands),
# which infra/docker/bases.sh puts in this build's context as libs/. It reads the apache/kafka
# image's variables (KAFKA_<PROPERTY> -> <property>, KAFKA_HEAP_OPTS, CLUSTER_ID) and has its
# /opt/kafka/bin commands the project uses, so the compose file and the test plugin run on it
# or on apache/kafka alike.
ARG DEBIAN_IMAGE=pin-base/debian:bookworm
FROM ${DEBIAN_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends openjdk-17-jre-headless \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 1000 appuser \
    && useradd --system --uid 1000 --gid appuser --home-dir /opt/kafka --shell /usr/sbin/nologin appuser \
    && mkdir -p /var/lib/kafka/data /opt/kafka/config \
    && chown appuser:appuser /var/lib/kafka/data /opt/kafka/config
COPY libs/ /opt/kafka/libs/
COPY kafka-bin/ /opt/kafka/bin/
COPY kafka-log4j2.xml /opt/kafka/log4j2.xml
ENV KAFKA_LOG_DIRS=/var/lib/kafka/data \
    LANG=C.UTF-8
USER appuser
ENTRYPOINT ["/opt/kafka/bin/kafka-entrypoint.sh"]
