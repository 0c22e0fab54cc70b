"""The frontier's rule without a database (`rules.advance_frontier`): over any interleaving of
writers (each takes its slot's lock, then an id, then ends; after its first id, at some
later point, it shows that id) with the two halves of a step (the last id handed out, later
the lock holders and the first ids shown), no open writer's row is ever at or below its
slot's frontier, and once the writers are gone every slot catches up."""

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
    shown: bool = False
    """Its first id shows in pg_locks (the trigger's second lock, right after that id)."""


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

    def show(self, which: int) -> None:
        open_writers = [w for w in self.writers if w.open and w.rows]
        if open_writers:
            open_writers[which % len(open_writers)].shown = True

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

    def firsts(self) -> dict[str, int]:
        return {w.name: w.rows[0][0] for w in self.writers if w.open and w.shown}


actions = st.lists(
    st.one_of(
        st.tuples(st.just("begin"), st.just(0), st.just(0)),
        st.tuples(st.just("insert"), st.integers(0, 2), st.integers(0, SOME_SLOTS - 1)),
        st.tuples(st.just("show"), st.integers(0, 2), st.just(0)),
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
        if action == "show":
            db.show(which)
        elif action == "begin":
            db.begin()
        elif action == "insert":
            db.insert(which, slot)
        elif action == "end":
            db.end(which)
        elif action == "look_last":
            last = db.last_id
        elif last is not None:  # the holders, read after the last id (one statement)
            frontier, waits = advance_frontier(frontier, waits, last, db.holders(), db.firsts())
            last = None
            for writer in db.writers:
                if writer.open:
                    for row_id, row_slot in writer.rows:
                        assert row_id > frontier[row_slot], (writer, frontier[:SOME_SLOTS])
        assert all(f <= db.last_id for f in frontier)
    # Every writer gone: one step settles every slot up to the last id.
    for writer in db.writers:
        writer.open = False
    frontier, waits = advance_frontier(frontier, waits, db.last_id, db.holders(), {})
    assert frontier == [db.last_id] * SLOTS
    assert waits == {}


def test_a_slot_waits_only_for_its_own_writers() -> None:
    frontier, waits = advance_frontier([0] * SLOTS, {}, 10, {5: frozenset({"3/1"})}, {})
    assert frontier[5] == 0
    assert waits == {5: SlotWait(10, frozenset({"3/1"}))}
    assert all(frontier[s] == 10 for s in range(SLOTS) if s != 5)
    # A later writer of the slot does not hold back what the first one's end settles.
    frontier, waits = advance_frontier(frontier, waits, 20, {5: frozenset({"3/2"})}, {})
    assert frontier[5] == 10
    assert waits == {5: SlotWait(20, frozenset({"3/2"}))}
    frontier, waits = advance_frontier(frontier, waits, 20, {}, {})
    assert frontier[5] == 20
    assert waits == {}


def test_a_writer_that_shows_its_first_id_holds_back_only_the_ids_from_there() -> None:
    # 3/1 took id 7 first; ids up to 6 are settled in the step that sees it, no second look.
    frontier, waits = advance_frontier([0] * SLOTS, {}, 10, {5: frozenset({"3/1"})}, {"3/1": 7})
    assert (frontier[5], waits) == (6, {})
    # 3/2 began after id 10 (its first is 12): the slot settles up to 11 while both are
    # open; a writer without a first id shown yet makes the bound wait for it.
    both = {5: frozenset({"3/1", "3/2"})}
    frontier, waits = advance_frontier(frontier, waits, 12, both, {"3/1": 7, "3/2": 12})
    assert (frontier[5], waits) == (6, {})
    frontier, waits = advance_frontier(
        frontier, waits, 12, {5: frozenset({"3/2", "3/3"})}, {"3/2": 12}
    )
    assert frontier[5] == 6
    assert waits == {5: SlotWait(11, frozenset({"3/3"}))}
    frontier, waits = advance_frontier(frontier, waits, 13, {5: frozenset({"3/2"})}, {"3/2": 12})
    assert (frontier[5], waits) == (11, {})
