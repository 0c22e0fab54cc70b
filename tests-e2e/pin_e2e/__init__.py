"""Helpers of the end-to-end suite: its own servers, service processes, Kafka reads, report."""
