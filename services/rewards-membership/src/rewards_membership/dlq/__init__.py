"""The dead-letter topic: writing a batch's dead letters (`writer`, with a `reference`
record when the copy cannot go), reading them back (`topic`), and the operator's passes
over it (`passes`): `replay` to the source topic and `resolve` without one. It imports
nothing of `consumer`: the consumer depends on it, not the other way round."""
