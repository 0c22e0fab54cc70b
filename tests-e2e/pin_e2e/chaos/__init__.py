"""The chaos campaign: a running system in the chart's topology under a seeded random schedule
of faults, and the invariants that must hold once it has converged."""
