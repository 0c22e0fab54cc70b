"""The outbox's delivery guarantees, checked against one recorded `History`.

Pure functions: each returns a `Property` (its name, whether it holds, its figures, and
the first offending key, whose history the report prints).

- G1, nothing lost: every committed row is published, and within `bound` seconds of its
  reference: the later of its commit and the end of every transaction that held its
  slot's writer lock when it committed (a transaction holds slot s from its first INSERT
  into s until it ends). A row may wait for an earlier writer of its slot, never for
  anything else: not for a writer of another slot, nor for a transaction that writes no
  outbox row.
- G2, per-key order: for each key, the sequence of first publications is in id order (no
  row published for the first time after a higher id of its key), and for serialized keys
  in commit order; re-sends are allowed (at least once) but a key's last record is its
  newest row.
- G3, a row waits for nothing else: no row committed while a transaction that writes no
  outbox row was held goes out just after that one ended (within `BYSTANDER_WAIT`) when its
  own reference came `BYSTANDER_WAIT` or more before that end.
- Aborted rows are never published, and every record is a row of this run's writers.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from pin_e2e.history.model import History, Outcome, Publication, Row, Txn, WriterKind

__all__ = [
    "LATE",
    "Property",
    "Verdict",
    "check_history",
    "exercised",
    "gauges_agree",
    "key_history",
    "percentile",
]

LATE: Final = 0.5
"""A commit this long after the row's INSERT counts as a late commit."""
BYSTANDER_WAIT: Final = 5.0
"""A row whose reference came this long before the end of a transaction that writes no
outbox row, and that was published only after that end, waited for it: longer than any
hand-over or burst delays a row (about 4 s at most on two busy cores)."""


@dataclass(frozen=True, slots=True)
class Property:
    name: str
    holds: bool | None
    """None: not checked (the figures say why)."""
    figures: str
    offender: tuple[str, int] | None = None
    """The first key that breaks it and the row of it that does (the report prints the
    key's history around that row)."""


@dataclass(frozen=True, slots=True)
class Verdict:
    properties: tuple[Property, ...]
    delays: Delays

    @property
    def violated(self) -> list[Property]:
        return [p for p in self.properties if p.holds is False]


@dataclass(frozen=True, slots=True)
class Delays:
    """Seconds from a row's commit (and from its reference) to its first publication."""

    after_commit: tuple[float, ...] = ()
    after_reference: tuple[float, ...] = ()


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank `q` percentile (0 < q <= 100) of `values`; 0.0 when empty."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


@dataclass
class _Index:
    """The history looked up by token and by key."""

    txn_of: dict[str, Txn] = field(default_factory=dict)
    row_of: dict[str, Row] = field(default_factory=dict)
    records: dict[str, list[Publication]] = field(default_factory=dict)
    """Every record of a token, by partition and offset."""
    by_key: dict[str, list[Publication]] = field(default_factory=dict)
    """Every record of a key (this run's or not), by partition and offset."""
    rows_of_key: dict[str, list[Row]] = field(default_factory=dict)

    @classmethod
    def of(cls, history: History) -> _Index:
        index = cls()
        for txn in history.txns:
            for row in txn.rows:
                index.txn_of[row.token] = txn
                index.row_of[row.token] = row
                index.rows_of_key.setdefault(row.key, []).append(row)
        ordered = sorted(history.publications, key=lambda p: (p.partition, p.offset))
        for pub in ordered:
            index.by_key.setdefault(pub.key, []).append(pub)
            if pub.token is not None:
                index.records.setdefault(pub.token, []).append(pub)
        for rows in index.rows_of_key.values():
            rows.sort(key=lambda r: r.id)
        return index

    def outcome(self, token: str | None) -> Outcome | None:
        txn = self.txn_of.get(token) if token is not None else None
        return None if txn is None else txn.outcome

    def first(self, token: str) -> Publication | None:
        """A row's first publication: its earliest record."""
        found = self.records.get(token)
        return min(found, key=lambda p: (p.timestamp, p.offset)) if found else None

    def kept(self, token: str | None) -> bool:
        """A row that may have been committed (its records are checked for order)."""
        return self.outcome(token) in (Outcome.COMMITTED, Outcome.IN_DOUBT)


class _SlotHolders:
    """When each slot's writer lock was held, by which transactions: `reference(txn, slot)`
    is the later of `txn`'s end and the end of every transaction holding the slot when
    `txn` committed, in O(log n) per row."""

    def __init__(self, txns: Iterable[Txn]) -> None:
        spans: dict[int, list[tuple[float, float, Txn]]] = defaultdict(list)
        for txn in txns:
            for slot in {r.slot for r in txn.rows}:
                since = txn.holds_from(slot)
                if since is not None:
                    spans[slot].append((since, txn.ended_at, txn))
        self._spans = {slot: sorted(found, key=lambda s: s[0]) for slot, found in spans.items()}
        self._starts = {slot: [s[0] for s in found] for slot, found in self._spans.items()}
        self._latest_end: dict[int, list[float]] = {}
        for slot, found in self._spans.items():
            latest, running = [], -math.inf
            for _, ended, _ in found:
                running = max(running, ended)
                latest.append(running)
            self._latest_end[slot] = latest

    def reference(self, txn: Txn, slot: int) -> float:
        # Every holder that took the slot before `txn` ended: the latest end among them is
        # either after `txn`'s commit was sent (it held the slot then, and counts) or
        # before it (then none did, and `txn`'s own end is the reference).
        n = bisect.bisect_right(self._starts.get(slot, []), txn.ended_at)
        latest = self._latest_end[slot][n - 1] if n else -math.inf
        return max(txn.ended_at, latest)

    def holders(self, txn: Txn, slot: int) -> list[Txn]:
        """The other transactions that held `slot` at some moment of `txn`'s commit."""
        return [
            other
            for since, ended, other in self._spans.get(slot, [])
            if other is not txn and since <= txn.ended_at and ended >= txn.commit_sent_at
        ]


def check_history(history: History, *, bound: float) -> Verdict:
    """Every guarantee of the module docstring. A row first published after every relay was
    restarted for the rows still missing (`History.restarted_at`) counts as lost, whatever
    its delay."""
    index = _Index.of(history)
    lost, delays = _delivered(history, index, bound=bound, restarted_at=history.restarted_at)
    properties = (
        *lost,
        _bystanders_hold_nothing(history, index),
        _first_publications_in_id_order(index),
        _serialized_in_commit_order(index),
        _last_record_is_newest(index),
        _one_partition_per_key(index),
        _aborted_never_published(history, index),
        _records_of_writers(history, index),
    )
    return Verdict(properties, delays)


def _delivered(
    history: History, index: _Index, *, bound: float, restarted_at: float | None
) -> tuple[tuple[Property, Property], Delays]:
    holders = _SlotHolders(history.txns)
    committed = [
        (txn, row) for txn in history.txns if txn.outcome is Outcome.COMMITTED for row in txn.rows
    ]
    missing: list[tuple[Txn, Row]] = []
    rescued: list[tuple[Txn, Row]] = []
    late: list[tuple[float, Txn, Row]] = []
    after_commit: list[float] = []
    after_reference: list[float] = []
    for txn, row in committed:
        first = index.first(row.token)
        if first is None:
            missing.append((txn, row))
            continue
        if restarted_at is not None and first.timestamp >= restarted_at:
            rescued.append((txn, row))
        waited = first.timestamp - holders.reference(txn, row.slot)
        after_commit.append(max(0.0, first.timestamp - txn.ended_at))
        after_reference.append(max(0.0, waited))
        if waited > bound:
            late.append((waited, txn, row))
    never = sorted(missing, key=lambda m: m[1].id)
    first_missing = never[0][1] if never else (rescued[0][1] if rescued else None)
    lost = Property(
        "G1: every committed row published (none lost)",
        not missing and not rescued,
        f"{len(committed):,} committed rows: {len(missing)} not published by the end, "
        f"{len(rescued)} only after every relay was restarted"
        + (f" (first: id {first_missing.id}, key {first_missing.key})" if first_missing else ""),
        offender=(first_missing.key, first_missing.id) if first_missing else None,
    )
    worst = max(late, key=lambda w: w[0], default=None)
    in_time = Property(
        f"G1: published within {bound:g}s of max(commit, end of the slot's writers then)",
        not late and not missing,
        f"delay after commit max {max(after_commit, default=0.0):.2f}s, "
        f"p99 {percentile(after_commit, 99):.2f}s; after that reference max "
        f"{max(after_reference, default=0.0):.2f}s, p99 "
        f"{percentile(after_reference, 99):.2f}s; {len(late)} rows later than {bound:g}s"
        + (f" (worst: id {worst[2].id}, {worst[0]:.1f}s)" if worst else ""),
        offender=(worst[2].key, worst[2].id) if worst else None,
    )
    return (lost, in_time), Delays(tuple(after_commit), tuple(after_reference))


def _bystanders_hold_nothing(history: History, index: _Index) -> Property:
    holders = _SlotHolders(history.txns)
    during = 0
    waited: list[tuple[Txn, Row, str]] = []
    for txn in history.txns:
        if txn.outcome is not Outcome.COMMITTED:
            continue
        for begun, ended, what in history.bystanders:
            if not begun <= txn.ended_at <= ended:
                continue
            during += len(txn.rows)
            for row in txn.rows:
                first = index.first(row.token)
                reference = holders.reference(txn, row.slot)
                # Out within BYSTANDER_WAIT after its end, long after its own reference:
                # what waiting for it looks like (a row out much later is G1's).
                waited_long = reference <= ended - BYSTANDER_WAIT
                out = first is not None and ended <= first.timestamp <= ended + BYSTANDER_WAIT
                if waited_long and out:
                    waited.append((txn, row, what))
    kinds = ", ".join(sorted({what for _, _, what in history.bystanders})) or "none held"
    first_row = min(waited, key=lambda w: w[1].id)[1] if waited else None
    return Property(
        "G3: nothing waits for a transaction that writes no outbox row",
        not waited,
        f"{len(history.bystanders)} held ({kinds}); {during:,} rows committed meanwhile: "
        f"{len(waited)} published just after one ended, {BYSTANDER_WAIT:g}s or more after "
        "their reference",
        offender=(first_row.key, first_row.id) if first_row else None,
    )


def _first_ids(index: _Index, key: str) -> list[tuple[Row, Publication]]:
    """The key's rows in the order of their first publication (committed or in doubt)."""
    seen: set[str] = set()
    order: list[tuple[Row, Publication]] = []
    for pub in index.by_key.get(key, []):
        token = pub.token
        if token is None or token in seen or not index.kept(token):
            continue
        seen.add(token)
        order.append((index.row_of[token], pub))
    return order


def _key_kind(index: _Index, key: str) -> str:
    kinds = {index.txn_of[r.token].kind for r in index.rows_of_key.get(key, [])}
    own = kinds - {WriterKind.PREPARED}
    return min(own or kinds or {WriterKind.FLOOD}).value


def _first_publications_in_id_order(index: _Index) -> Property:
    inverted: list[tuple[float, str, Row]] = []
    keys: dict[str, int] = defaultdict(int)
    for key in index.rows_of_key:
        keys[_key_kind(index, key)] += 1
        highest = 0
        for row, pub in _first_ids(index, key):
            if row.id < highest:
                inverted.append((pub.timestamp, key, row))
            highest = max(highest, row.id)
    first = min(inverted, key=lambda i: i[0], default=None)
    by_kind = ", ".join(f"{n} {kind}" for kind, n in sorted(keys.items()))
    bad_keys = {key for _, key, _ in inverted}
    by_bad_kind = _count_by_kind(index, bad_keys)
    return Property(
        "G2: per key, first publications in id order",
        not inverted,
        f"{sum(keys.values())} keys checked ({by_kind}); {len(inverted)} rows first published "
        f"after a higher id of their key, in {len(bad_keys)} keys{by_bad_kind}",
        offender=(first[1], first[2].id) if first else None,
    )


def _count_by_kind(index: _Index, keys: set[str]) -> str:
    if not keys:
        return ""
    counts: dict[str, int] = defaultdict(int)
    for key in keys:
        counts[_key_kind(index, key)] += 1
    return " (" + ", ".join(f"{n} {kind}" for kind, n in sorted(counts.items())) + ")"


def _serialized_keys(index: _Index) -> list[str]:
    return [
        key
        for key, rows in index.rows_of_key.items()
        if any(r.seq is not None for r in rows)
        and all(
            r.seq is not None for r in rows if index.txn_of[r.token].outcome is Outcome.COMMITTED
        )
    ]


def _serialized_in_commit_order(index: _Index) -> Property:
    keys = _serialized_keys(index)
    out_of_order: list[tuple[float, str, int]] = []
    unordered_ids: list[tuple[str, int]] = []
    for key in keys:
        committed = [r for r in index.rows_of_key[key] if r.seq is not None]
        seqs = [r.seq for r in committed if r.seq is not None]
        if seqs != sorted(seqs):  # the construction failed: ids not in commit order
            unordered_ids.append((key, committed[0].id))
        last = 0
        for row, pub in _first_ids(index, key):
            if row.seq is None:
                continue
            if row.seq < last:
                out_of_order.append((pub.timestamp, key, row.id))
            last = max(last, row.seq)
    first = min(out_of_order, default=None)
    offender = (first[1], first[2]) if first else (unordered_ids[0] if unordered_ids else None)
    return Property(
        "G2: serialized keys, first publications in commit order",
        not out_of_order and not unordered_ids,
        f"{len(keys)} serialized keys: {len(out_of_order)} rows first published after a "
        f"later commit of their key, in {len({k for _, k, _ in out_of_order})} keys; "
        f"{len(unordered_ids)} keys whose ids are not in commit order (must be 0: the "
        "writers' serialization)",
        offender=offender,
    )


def _last_record_is_newest(index: _Index) -> Property:
    older: list[tuple[str, int]] = []
    stale = 0
    for key in index.rows_of_key:
        records = [p for p in index.by_key.get(key, []) if index.kept(p.token)]
        if not records:
            continue
        newest_id = max(index.row_of[p.token].id for p in records if p.token is not None)
        highest = 0
        seen: set[str] = set()
        for pub in records:
            assert pub.token is not None  # kept() holds only for a writer's token
            row_id = index.row_of[pub.token].id
            if pub.token in seen and row_id < highest:
                stale += 1
            seen.add(pub.token)
            highest = max(highest, row_id)
        last = records[-1].token
        assert last is not None
        if index.row_of[last].id != newest_id:
            older.append((key, index.row_of[last].id))
    return Property(
        "G2: per key, the last record is its newest row",
        not older,
        f"{len(older)} keys ending on an older row; {stale} older rows re-sent after a newer "
        "one (allowed while the newest comes last)",
        offender=older[0] if older else None,
    )


def _one_partition_per_key(index: _Index) -> Property:
    spread = [
        k for k in index.rows_of_key if len({p.partition for p in index.by_key.get(k, [])}) > 1
    ]
    return Property(
        "per key, one partition",
        not spread,
        f"{len(spread)} keys on several partitions",
        offender=(spread[0], index.rows_of_key[spread[0]][0].id) if spread else None,
    )


def _aborted_never_published(history: History, index: _Index) -> Property:
    aborted = [r for t in history.txns if t.outcome is Outcome.ABORTED for r in t.rows]
    published = [r for r in aborted if r.token in index.records]
    prepared = sum(
        len(t.rows)
        for t in history.txns
        if t.outcome is Outcome.ABORTED and t.kind is WriterKind.PREPARED
    )
    return Property(
        "aborted rows never published",
        not published,
        f"{len(aborted)} aborted rows ({prepared} rolled back after PREPARE TRANSACTION): "
        f"{len(published)} published",
        offender=(published[0].key, published[0].id) if published else None,
    )


def _records_of_writers(history: History, index: _Index) -> Property:
    foreign = [p for p in history.publications if p.token is None or p.token not in index.row_of]
    doubt = sum(len(t.rows) for t in history.txns if t.outcome is Outcome.IN_DOUBT)
    rows = {p.token for p in history.publications if index.kept(p.token)}
    kept = sum(1 for p in history.publications if index.kept(p.token))
    return Property(
        "every record is a row of the run's writers",
        not foreign,
        f"{len(history.publications):,} records: {len(rows):,} rows, {kept - len(rows):,} "
        f"duplicates (re-sends); {len(foreign)} of no writer"
        + (f" (first: {foreign[0].partition}@{foreign[0].offset})" if foreign else "")
        + f"; {doubt} rows in doubt",
    )


Gauges = Mapping[str, tuple[float | None, float | None]]
"""Each running relay's (identity_outbox_backlog, identity_outbox_oldest_age_seconds); None:
not exported, or its /metrics did not answer."""


def gauges_agree(status: tuple[int, int] | None, gauges: Gauges) -> Property:
    """Once the run settled, every running relay's `identity_outbox_backlog` is what
    `outbox status` counts, and its `identity_outbox_oldest_age_seconds` is 0 exactly when
    that is 0. `status`: the count just before and just after the gauges were read; while
    it changes in between (rows still going out) nothing is checked."""
    name = "backlog gauges agree with `outbox status` once settled"

    def shown(value: float | None) -> str:
        return "-" if value is None else f"{value:g}"

    figures = "identity_outbox_backlog (oldest age): " + (
        ", ".join(
            f"{label} {shown(rows)} ({shown(age)}s)"
            for label, (rows, age) in sorted(gauges.items())
        )
        or "no relay running"
    )
    if status is None:
        return Property(name, None, f"not checked: no `outbox status`; {figures}")
    before, after = status
    if before != after:
        return Property(
            name,
            None,
            f"not checked: the outbox never settled (`outbox status` {before}, then {after} "
            f"rows); {figures}",
        )
    agree = bool(gauges) and all(
        rows is not None and age is not None and rows == before and (age == 0) == (before == 0)
        for rows, age in gauges.values()
    )
    return Property(name, agree, f"outbox status: {before} rows; {figures}")


def exercised(history: History, faults: Mapping[str, int]) -> Property:
    """Every kind of fault happened at least once: the writers' (late commits, late under a
    higher id of their slot, flood, prepared writers) from the history, the others as the
    run counted them (`faults`)."""
    counts = _writer_faults(history) | dict(faults)
    missing = [name for name, n in counts.items() if n <= 0]
    return Property(
        "every kind of fault exercised",
        not missing,
        "; ".join(f"{name} {n:,}" for name, n in counts.items())
        + (f" — none of: {', '.join(missing)}" if missing else ""),
    )


def _writer_faults(history: History) -> dict[str, int]:
    committed = [t for t in history.txns if t.outcome is Outcome.COMMITTED]
    late = sum(1 for t in committed for r in t.rows if t.commit_sent_at - r.inserted_at >= LATE)
    below = _committed_below(committed)
    unserialized = {r.key for t in committed if t.kind is WriterKind.UNSERIALIZED for r in t.rows}
    concurrent = _keys_written_concurrently(
        [t for t in committed if t.kind is WriterKind.UNSERIALIZED], unserialized
    )
    flood = [t for t in committed if t.kind is WriterKind.FLOOD]
    flood_rows = sum(len(t.rows) for t in flood)
    fanouts = [t for t in committed if t.kind is WriterKind.FANOUT]
    span = max((t.ended_at for t in flood), default=0.0) - min(
        (t.began_at for t in flood), default=0.0
    )
    prepared = [t for t in history.txns if t.kind is WriterKind.PREPARED]
    return {
        "late commits (>= 0.5s)": late,
        "rows committed after a higher id of their slot": below,
        "unserialized keys written concurrently": concurrent,
        f"flood rows ({flood_rows / span if span > 0 else 0.0:.0f}/s)": flood_rows,
        f"fan-out bursts ({sum(len(t.rows) for t in fanouts):,} rows)": len(fanouts),
        "prepared writers committed": sum(t.outcome is Outcome.COMMITTED for t in prepared),
        "prepared writers rolled back": sum(t.outcome is Outcome.ABORTED for t in prepared),
    }


def _committed_below(committed: Sequence[Txn]) -> int:
    """Rows committed after a row with a higher id of their slot had committed."""
    by_slot: dict[int, list[tuple[float, float, int]]] = defaultdict(list)
    for txn in committed:
        for row in txn.rows:
            by_slot[row.slot].append((txn.commit_sent_at, txn.ended_at, row.id))
    found = 0
    for rows in by_slot.values():
        rows.sort(key=lambda r: r[1])  # by end
        highest_ended = -1
        pending = sorted(rows, key=lambda r: r[0])  # by commit sent
        ends = [r[1] for r in rows]
        ids = [r[2] for r in rows]
        done = 0
        for sent, _, row_id in pending:
            while done < len(ends) and ends[done] < sent:
                highest_ended = max(highest_ended, ids[done])
                done += 1
            if highest_ended > row_id:
                found += 1
    return found


def _keys_written_concurrently(txns: Sequence[Txn], keys: set[str]) -> int:
    """Keys two of whose transactions were open at once."""
    spans: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for txn in txns:
        for key in {r.key for r in txn.rows} & keys:
            spans[key].append((txn.began_at, txn.ended_at))
    overlapping = 0
    for found in spans.values():
        found.sort()
        if any(b[0] < a[1] for a, b in itertools.pairwise(found)):
            overlapping += 1
    return overlapping


def key_history(history: History, key: str, focus: int | None = None) -> list[str]:
    """The key's writes (by id) and records (by offset), times from the run's start, the
    lines of row `focus` marked: what the report prints for an offending key. A long history
    shows `AROUND` lines either side of the focus row's first."""
    index = _Index.of(history)
    t0 = history.started
    rows = index.rows_of_key.get(key, [])
    slot = rows[0].slot if rows else None
    holders = _SlotHolders(history.txns)
    writes: list[tuple[bool, str]] = []
    for row in rows:
        txn = index.txn_of[row.token]
        seq = f" seq {row.seq}" if row.seq is not None else ""
        reference = ""
        if txn.outcome is Outcome.COMMITTED:
            ref = holders.reference(txn, row.slot)
            if ref > txn.ended_at:
                blamed = ", ".join(o.name for o in holders.holders(txn, row.slot)[:4])
                reference = f", reference +{ref - t0:.2f}s (slot held by {blamed})"
        prepared = f" prepared +{txn.prepared_at - t0:.2f}s" if txn.prepared_at else ""
        writes.append(
            (
                row.id == focus,
                f"id {row.id} {row.token} [{txn.kind.value}]{seq}: insert "
                f"+{row.inserted_at - t0:.2f}s{prepared}, commit sent "
                f"+{txn.commit_sent_at - t0:.2f}s, ended +{txn.ended_at - t0:.2f}s, "
                f"{txn.outcome.value}{reference}",
            )
        )
    records: list[tuple[bool, str]] = []
    seen: set[str] = set()
    for pub in index.by_key.get(key, []):
        written = index.row_of.get(pub.token) if pub.token else None
        what = f"id {written.id}" if written is not None else f"token {pub.token}"
        again = " (again)" if pub.token in seen else ""
        if pub.token:
            seen.add(pub.token)
        mine = written is not None and written.id == focus
        at = pub.timestamp - t0
        records.append((mine, f"{pub.partition}@{pub.offset} +{at:.2f}s {what}{again}"))
    return [
        f"key {key} (slot {slot}, {_key_kind(index, key)}): writes by id",
        *_around(writes),
        f"key {key}: records by offset",
        *_around(records),
    ]


AROUND: Final = 12


def _around(lines: list[tuple[bool, str]]) -> list[str]:
    """Every line (the focus marked), or for a long list those around the first focus."""
    at = next((i for i, (focus, _) in enumerate(lines) if focus), 0)
    first, last = max(0, at - AROUND), min(len(lines), at + AROUND + 1)
    shown = [f"  {text}{'   <==' if focus else ''}" for focus, text in lines[first:last]]
    if first:
        shown.insert(0, f"  ... {first} before")
    if last < len(lines):
        shown.append(f"  ... {len(lines) - last} after")
    return shown
