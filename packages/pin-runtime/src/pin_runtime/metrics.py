"""A service's metric catalogue: data in a TOML file inside its package, bound to typed
attributes on a registry of the service's own.

The catalogue names each metric once, under the key of the attribute that holds it:

    # Per-message latency of a batch, in milliseconds.
    [consume_duration_ms]
    name = "rewards_membership_consume_duration_ms"
    help = "Milliseconds from a batch's poll to its offset commit"
    kind = "histogram"
    buckets = [1, 2.5, 5, 10, 25]

    [applied]
    name = "rewards_membership_applied_total"
    help = "Membership changes applied, by stored status"
    kind = "counter"
    labels = ["status"]

and the class holding the metrics declares only their types, so attribute access stays typed:

    class Metrics(MetricSet):
        catalogue = load_catalogue("rewards_membership", "metrics.toml")
        consume_duration_ms: Histogram
        applied: Counter

`Metrics(registry)` creates every entry on `registry` (never the process-global default)
and binds it to its attribute. Failing loudly, at import: a malformed catalogue (a TOML or
type error, an unknown field, a histogram without buckets, buckets on another kind, buckets
out of order, a metric name given twice) raises `MetricCatalogueError` when it is loaded,
and a class that does not match its catalogue (an attribute without an entry, an entry
without an attribute, a kind other than the annotation's type) when the class is defined,
so a wrong catalogue stops the process (and the tests) before a metric is created.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Mapping
from importlib import resources
from types import MappingProxyType
from typing import Any, ClassVar, Literal

import msgspec
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from pin_runtime.errors import PinRuntimeError, TemplatedError

__all__ = [
    "MetricCatalogue",
    "MetricCatalogueError",
    "MetricSet",
    "MetricSpec",
    "load_catalogue",
    "parse_catalogue",
]

Kind = Literal["counter", "gauge", "histogram"]
_TYPES: Mapping[Kind, type[Counter | Gauge | Histogram]] = {
    "counter": Counter,
    "gauge": Gauge,
    "histogram": Histogram,
}


class MetricCatalogueError(PinRuntimeError, TemplatedError):
    """A metric catalogue is malformed or does not match the class bound to it; `source`
    names the file, `entry` the metric (None for a fault of the whole file)."""

    template = "{source}: metric {entry!r}: {problem}"
    source: str
    entry: str | None
    problem: str

    def describe(self) -> str:
        if self.entry is None:
            return f"{self.source}: {self.problem}"
        return super().describe()


class MetricSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One entry of a catalogue: what prometheus_client needs to create the metric."""

    name: str
    help: str
    kind: Kind
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    """Upper bounds, increasing; required for a histogram, refused for any other kind."""


@dataclasses.dataclass(frozen=True)
class MetricCatalogue:
    """The entries of one catalogue file, by attribute name; immutable."""

    source: str
    entries: Mapping[str, MetricSpec]


def _entry_problem(spec: MetricSpec) -> str | None:
    if spec.kind == "histogram" and not spec.buckets:
        return "a histogram needs buckets"
    if spec.kind != "histogram" and spec.buckets:
        return f"a {spec.kind} takes no buckets (only a histogram does)"
    if any(low >= high for low, high in zip(spec.buckets, spec.buckets[1:], strict=False)):
        return f"buckets must increase: {list(spec.buckets)}"
    return None


def parse_catalogue(text: str, source: str = "<metrics>") -> MetricCatalogue:
    """The entries of a catalogue's TOML text; MetricCatalogueError on anything malformed."""
    try:
        tables = msgspec.toml.decode(text, type=dict[str, dict[str, Any]])
    except msgspec.DecodeError as exc:
        raise MetricCatalogueError(source, None, str(exc)) from exc
    entries: dict[str, MetricSpec] = {}
    names: dict[str, str] = {}
    for key, table in tables.items():
        # One table at a time, so that an error names its entry (msgspec's path does not
        # name a key of a dict).
        try:
            spec = entries[key] = msgspec.convert(table, MetricSpec)
        except msgspec.ValidationError as exc:
            raise MetricCatalogueError(source, key, str(exc)) from exc
        problem = _entry_problem(spec)
        if spec.name in names:
            problem = f"name {spec.name!r} is also the name of {names[spec.name]!r}"
        if problem is not None:
            raise MetricCatalogueError(source, key, problem)
        names[spec.name] = key
    return MetricCatalogue(source, MappingProxyType(entries))


@functools.cache
def load_catalogue(package: str, filename: str) -> MetricCatalogue:
    """The catalogue `filename` (a path with `/` inside `package`), read through
    `importlib.resources`: it works from a wheel, a zip or a source tree alike."""
    resource = resources.files(package).joinpath(*filename.split("/"))
    return parse_catalogue(resource.read_text(encoding="utf-8"), f"{package}/{filename}")


def _annotated_metrics(cls: type[MetricSet]) -> dict[str, type]:
    """The metric attributes `cls` declares: its public annotations but MetricSet's own and
    ClassVars (a `_name` is the subclass's own state). The metric types resolve even where a
    module imports them for typing only."""
    localns = {kind.__name__: kind for kind in _TYPES.values()}
    hints = typing.get_type_hints(cls, localns=localns)
    own = typing.get_type_hints(MetricSet, localns=localns)
    return {
        attribute: hint
        for attribute, hint in hints.items()
        if not attribute.startswith("_")
        and attribute not in own
        and typing.get_origin(hint) is not ClassVar
    }


def _bindings(cls: type[MetricSet]) -> tuple[tuple[str, MetricSpec], ...]:
    """Each annotated attribute with its entry; MetricCatalogueError on any mismatch."""
    catalogue = cls.catalogue
    annotated = _annotated_metrics(cls)
    for attribute, hint in annotated.items():
        spec = catalogue.entries.get(attribute)
        if hint not in _TYPES.values():
            problem = f"{cls.__name__} annotates it {hint!r}, not Counter, Gauge or Histogram"
        elif spec is None:
            problem = f"{cls.__name__} annotates it {hint.__name__}; the catalogue has no entry"
        elif _TYPES[spec.kind] is not hint:
            problem = f"a {spec.kind} in the catalogue, {cls.__name__} annotates it {hint.__name__}"
        else:
            continue
        raise MetricCatalogueError(catalogue.source, attribute, problem)
    unbound = sorted(catalogue.entries.keys() - annotated.keys())
    if unbound:
        problem = f"in the catalogue but {cls.__name__} declares no attribute for it"
        raise MetricCatalogueError(catalogue.source, unbound[0], problem)
    # In the catalogue's order: the order of the exposition, whatever the class's.
    return tuple(catalogue.entries.items())


def _create(spec: MetricSpec, registry: CollectorRegistry) -> Counter | Gauge | Histogram:
    if spec.kind == "histogram":
        return Histogram(spec.name, spec.help, spec.labels, buckets=spec.buckets, registry=registry)
    return _TYPES[spec.kind](spec.name, spec.help, spec.labels, registry=registry)


class MetricSet:
    """The metrics of one catalogue, each on its annotated attribute, on `registry`.

    A subclass sets `catalogue` (`load_catalogue(...)`) and annotates one attribute per
    entry with the entry's type (in the catalogue's order, so the two read side by side); it
    is checked against the catalogue when it is defined. What its metrics need once they
    exist (labels set to 0 up front, the state of helpers over several metrics) goes in
    `__post_init__`, as in a dataclass, so no subclass restates the constructor.
    """

    catalogue: ClassVar[MetricCatalogue]
    _bound: ClassVar[tuple[tuple[str, MetricSpec], ...]]
    registry: CollectorRegistry

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if not isinstance(getattr(cls, "catalogue", None), MetricCatalogue):
            raise TypeError(f"{cls.__name__} sets no `catalogue = load_catalogue(...)`")
        cls._bound = _bindings(cls)

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        for attribute, spec in self._bound:
            setattr(self, attribute, _create(spec, registry))
        self.__post_init__()

    def __post_init__(self) -> None:
        """Runs once every metric is bound; nothing to do by default."""
