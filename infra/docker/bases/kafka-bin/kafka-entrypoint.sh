#!/bin/sh
# server.properties from the environment as apache/kafka reads it (KAFKA_FOO_BAR=x ->
# foo.bar=x; `__` -> `_`, `___` -> `-`), storage formatted on first start, then the broker.
set -eu
props="${KAFKA_CONFIG:-/opt/kafka/config/server.properties}"
: >"$props"
env | while IFS='=' read -r name value; do
    case "$name" in
        KAFKA_HEAP_OPTS|KAFKA_OPTS|KAFKA_CONFIG|KAFKA_JVM_PERFORMANCE_OPTS) continue ;;
        KAFKA_*) ;;
        *) continue ;;
    esac
    key="$(printf '%s' "${name#KAFKA_}" | sed -e 's/___/-/g' -e 's/__/@/g' -e 's/_/./g' -e 's/@/_/g' | tr 'A-Z' 'a-z')"
    printf '%s=%s\n' "$key" "$value" >>"$props"
done
libs='/opt/kafka/libs/*'
logdir="$(sed -n 's/^log\.dirs=//p' "$props" | cut -d, -f1)"
if [ ! -f "$logdir/meta.properties" ]; then
    standalone="--standalone"
    if grep -q '^controller\.quorum\.voters=' "$props"; then standalone=""; fi
    # shellcheck disable=SC2086 # the flag or nothing
    java -cp "$libs" -Dlog4j2.configurationFile=/opt/kafka/log4j2.xml kafka.tools.StorageTool \
        format -t "${CLUSTER_ID:-5L6g3nShT-eMCtK--X86sw}" -c "$props" $standalone
fi
# shellcheck disable=SC2086 # word splitting of the JVM flags is intended
exec java ${KAFKA_HEAP_OPTS:--Xms256m -Xmx768m} ${KAFKA_OPTS:-} -cp "$libs" \
    -Dlog4j2.configurationFile=/opt/kafka/log4j2.xml kafka.Kafka "$props"
