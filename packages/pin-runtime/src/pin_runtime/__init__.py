"""Shared runtime of the PIN workers.

Import from the modules (`pin_runtime.settings`, `pin_runtime.kafka`, ...): this package
re-exports nothing, so a CLI that only reads settings does not load librdkafka or the
OpenTelemetry SDK.
"""
