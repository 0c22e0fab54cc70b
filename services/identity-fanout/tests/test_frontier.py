"""The frontier's rule without a database (`rules.advance_frontier`): over any interleaving of
writers (each takes its slot's lock, then an id, then ends) with the two halves of a step
(the last id handed out, later the lock holders), no open writer's row is ever at or below
its slot's frontier, and once the writers are gone every slot catches up."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from identity_fanout.outbox.rules import SLOTS, SlotWait, advance_frontier

SOME_SLOTS = 2
"""The writers use slots 0 and 1: few enough that they meet."""


@dataclass
class Writer:
    name: str
    slots: set[int] = field(default_factory=set)
    rows: list[tuple[int, int]] = field(default_factory=list)
    """(id, slot) of its rows."""
    open: bool = True


@dataclass
class Database:
    """What the frontier looks at: ids handed out in order, writers holding slot locks."""

    last_id: int = 0
    writers: list[Writer] = field(default_factory=list)
    transactions: int = 0

    def begin(self) -> None:
        self.transactions += 1
        self.writers.append(Writer(f"3/{self.transactions}"))

    def insert(self, which: int, slot: int) -> None:
        open_writers = [w for w in self.writers if w.open]
        if not open_writers:
            return
        writer = open_writers[which % len(open_writers)]
        writer.slots.add(slot)  # the trigger: the lock first, then the id
        self.last_id += 1
        writer.rows.append((self.last_id, slot))

    def end(self, which: int) -> None:
        open_writers = [w for w in self.writers if w.open]
        if open_writers:
            open_writers[which % len(open_writers)].open = False

    def holders(self) -> dict[int, frozenset[str]]:
        held: dict[int, set[str]] = {}
        for writer in self.writers:
            if writer.open:
                for slot in writer.slots:
                    held.setdefault(slot, set()).add(writer.name)
        return {slot: frozenset(names) for slot, names in held.items()}


actions = st.lists(
    st.one_of(
        st.tuples(st.just("begin"), st.just(0), st.just(0)),
        st.tuples(st.just("insert"), st.integers(0, 2), st.integers(0, SOME_SLOTS - 1)),
        st.tuples(st.just("end"), st.integers(0, 2), st.just(0)),
        st.tuples(st.just("look_last"), st.just(0), st.just(0)),
        st.tuples(st.just("look_holders"), st.just(0), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=2000, deadline=None)
@given(actions)
def test_no_open_writers_row_is_ever_within_its_slots_frontier(
    steps: list[tuple[str, int, int]],
) -> None:
    db = Database()
    frontier: list[int] = [0] * SLOTS
    waits: dict[int, SlotWait] = {}
    last: int | None = None
    for action, which, slot in steps:
        if action == "begin":
            db.begin()
        elif action == "insert":
            db.insert(which, slot)
        elif action == "end":
            db.end(which)
        elif action == "look_last":
            last = db.last_id
        elif last is not None:  # the holders, read after the last id (one statement)
            frontier, waits = advance_frontier(frontier, waits, last, db.holders())
            last = None
            for writer in db.writers:
                if writer.open:
                    for row_id, row_slot in writer.rows:
                        assert row_id > frontier[row_slot], (writer, frontier[:SOME_SLOTS])
        assert all(f <= db.last_id for f in frontier)
    # Every writer gone: two steps settle every slot up to the last id.
    for writer in db.writers:
        writer.open = False
    for _ in range(2):
        frontier, waits = advance_frontier(frontier, waits, db.last_id, db.holders())
    assert frontier == [db.last_id] * SLOTS
    assert waits == {}


def test_a_slot_waits_only_for_its_own_writers() -> None:
    frontier, waits = advance_frontier([0] * SLOTS, {}, 10, {5: frozenset({"3/1"})})
    assert frontier[5] == 0
    assert waits == {5: SlotWait(10, frozenset({"3/1"}))}
    assert all(frontier[s] == 10 for s in range(SLOTS) if s != 5)
    # A later writer of the slot does not hold back what the first one's end settles.
    frontier, waits = advance_frontier(frontier, waits, 20, {5: frozenset({"3/2"})})
    assert frontier[5] == 10
    assert waits == {5: SlotWait(20, frozenset({"3/2"}))}
    frontier, waits = advance_frontier(frontier, waits, 20, {})
    assert frontier[5] == 20
    assert waits == {}
