"""Scenario 13: a seeded history of writers and relays on the real outbox, checked against
the outbox's delivery guarantees.

`model` is what a run records (each transaction's rows, times and outcome; each record read
back from the topic), `checks` the guarantees as pure functions of it, `plan` the seeded
schedule of writers' choices and faults, `run` the I/O that plays it on PostgreSQL, Kafka
and real relay processes, `report` the printed table.
"""
