"""A transactional outbox and its relay to Kafka, knowing no service: where its tables live,
its channel and lock names and what it must know of the events are the service's
(`tables.OutboxTables`; identity-fanout's is `identity_fanout.schema.OUTBOX_TABLES`).

Every statement on the outbox, its quarantine and its lanes is the `store`'s. Writers put
one row per event into the outbox inside their own transaction (`writer` builds them);
each row carries the slot of its key (lanes: `rules`), so relay instances share the table by lane,
one publisher per slot at a time, in id order per key. The `relay` (one loop: read,
produce, settle, delete, with the in-flight `window`, the pure decisions of `rules` and the Kafka
`publisher`) publishes rows after commit and deletes them once acknowledged; rows Kafka
refuses for good go to the quarantine. What `outbox status` prints is
`identity_fanout.ops.outbox`.
"""
