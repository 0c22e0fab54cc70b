"""A service's metrics, each declared once: a typed attribute of a `MetricSet`, created on a
registry of the service's own.

    class RelayMetrics(MetricSet):
        backlog = gauge("identity_outbox_backlog", "Outbox rows waiting to be published.")
        quarantined = counter(
            "identity_outbox_quarantined_total",
            "Outbox rows refused for good, moved to the quarantine.",
            labels=("topic", "reason"),
        )
        # Why the buckets are these: a comment beside them.
        pass_seconds = histogram("relay_pass_seconds", "One pass (s)", buckets=(0.1, 1, 10))

`counter`, `gauge` and `histogram` return a `MetricSpec`: the metric's name, help, labels
and (a histogram's, required) buckets, and the attribute's descriptor. Read on an instance
it is the prometheus_client metric, typed `Counter`, `Gauge` or `Histogram`, so
`self.backlog.set(n)` type-checks with no cast; read on the class it is the spec.
`RelayMetrics(registry)` creates every declared metric on `registry` (never the
process-global default), in declaration order (the exposition's), then runs
`__post_init__`. No counter or histogram exports a `_created` series (turned off for the
process on import of this module). The name is the exported name, exactly: dashboards,
alert rules and tests read it. A counter's name may end in `_total` or not:
prometheus_client exports it with `_total` either way.

Failing loudly, when the class is defined: a metric or label name Prometheus refuses, a
label given twice (or `le` on a histogram), a histogram without buckets or with buckets
not increasing, buckets on another kind, a kind that is none of the three, two metrics
exporting the same series name (`x` and `x_total` are one counter's), or an attribute
annotated `Counter`, `Gauge` or `Histogram` with no declaration (or a declaration of
another kind) raise `MetricDeclarationError` naming the class and the attribute, so a
wrong declaration stops the process (and the tests) at import, before a metric exists.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Generic, TypeVar, overload

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
)

from pin_runtime.errors import PinRuntimeError, TemplatedError

__all__ = [
    "MetricDeclarationError",
    "MetricSet",
    "MetricSpec",
    "counter",
    "gauge",
    "histogram",
    "no_created_series",
]

_M = TypeVar("_M", Counter, Gauge, Histogram)

# No counter or histogram of this project exports `<name>_created` (the Unix time its series
# was made): no rule, dashboard or runbook reads it, and it doubles the series a scrape
# stores. prometheus_client decides it per process, when a registry is collected, so turning
# it off here, on import of the module every metric set comes from, covers every registry
# the process builds (its service's metric sets, the horizon watch's, the lag watcher's).
# `long_running` turns it off again at a process's start.


def no_created_series() -> None:
    """Turn off `_created` for every counter and histogram of the process (idempotent)."""
    disable_created_metrics()  # type: ignore[no-untyped-call] # prometheus_client is untyped here


no_created_series()

_KINDS: Mapping[type[Any], str] = {Counter: "counter", Gauge: "gauge", Histogram: "histogram"}
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
# The series names a metric registers beside its own (prometheus_client's registry refuses
# a second metric that registers any of them, `_created` included though none is exported).
_SUFFIXES: Mapping[type[Any], tuple[str, ...]] = {
    Counter: ("_total", "_created"),
    Gauge: (),
    Histogram: ("_bucket", "_sum", "_count", "_created"),
}


class MetricDeclarationError(PinRuntimeError, TemplatedError):
    """A `MetricSet` subclass declares a metric wrongly; `owner` names the class,
    `attribute` the metric's attribute."""

    template = "{owner}.{attribute}: {problem}"
    owner: str
    attribute: str
    problem: str


@dataclasses.dataclass(frozen=True)
class MetricSpec(Generic[_M]):
    """One metric's declaration (what prometheus_client needs to create it), and the
    descriptor of the attribute that holds it on a `MetricSet`."""

    kind: type[_M]
    name: str
    help: str
    labels: tuple[str, ...] = ()
    buckets: tuple[float, ...] = ()
    """Upper bounds, increasing; required for a histogram, refused for any other kind."""

    @overload
    def __get__(self, instance: None, owner: type[Any]) -> MetricSpec[_M]: ...
    @overload
    def __get__(self, instance: MetricSet, owner: type[Any]) -> _M: ...
    def __get__(self, instance: MetricSet | None, owner: type[Any]) -> MetricSpec[_M] | _M:
        if instance is None:
            return self
        # The metric, once created, is in the instance's __dict__, which a descriptor without
        # __set__ gives way to: this is reached only before MetricSet.__init__ created it.
        raise AttributeError(
            f"metric {self.name!r} of {type(instance).__name__} is not created yet "
            "(MetricSet.__init__ has not run)"
        )


def counter(name: str, help: str, *, labels: tuple[str, ...] = ()) -> MetricSpec[Counter]:
    """A counter; exported as `name` with `_total` (whether `name` ends in it or not)."""
    return MetricSpec(Counter, name, help, labels)


def gauge(name: str, help: str, *, labels: tuple[str, ...] = ()) -> MetricSpec[Gauge]:
    return MetricSpec(Gauge, name, help, labels)


def histogram(
    name: str,
    help: str,
    *,
    buckets: Sequence[float],
    labels: tuple[str, ...] = (),
) -> MetricSpec[Histogram]:
    return MetricSpec(Histogram, name, help, labels, tuple(float(bound) for bound in buckets))


def _problem(spec: MetricSpec[Any]) -> str | None:
    """What is wrong with `spec` on its own; None when nothing is."""
    kind = _KINDS.get(spec.kind)
    if kind is None:
        return f"kind {spec.kind!r} is none of Counter, Gauge, Histogram"
    if not _NAME.fullmatch(spec.name):
        return f"{spec.name!r} is not a Prometheus metric name ([a-zA-Z_:][a-zA-Z0-9_:]*)"
    return _labels_problem(spec) or _buckets_problem(spec, kind)


def _labels_problem(spec: MetricSpec[Any]) -> str | None:
    labels: object = spec.labels  # typed, but a caller may be untyped: "topic" is no tuple
    if not isinstance(labels, tuple) or not all(isinstance(label, str) for label in labels):
        return f"labels must be a tuple of label names, not {labels!r}"
    for label in spec.labels:
        if not _LABEL.fullmatch(label) or label.startswith("__"):
            return f"{label!r} is not a label name (a-z, A-Z, 0-9, _, not starting with __)"
    if len(set(spec.labels)) != len(spec.labels):
        return f"a label is given twice: {list(spec.labels)}"
    if spec.kind is Histogram and "le" in spec.labels:
        return "a histogram takes no label 'le' (its buckets' own)"
    return None


def _buckets_problem(spec: MetricSpec[Any], kind: str) -> str | None:
    if spec.kind is Histogram and not spec.buckets:
        return "a histogram needs buckets"
    if spec.kind is not Histogram and spec.buckets:
        return f"a {kind} takes no buckets (only a histogram does)"
    if any(low >= high for low, high in zip(spec.buckets, spec.buckets[1:], strict=False)):
        return f"buckets must increase: {list(spec.buckets)}"
    return None


def _exported_names(spec: MetricSpec[Any]) -> frozenset[str]:
    """The series names `spec` registers: a counter's without `_total`, and the suffixed."""
    base = spec.name.removesuffix("_total") if spec.kind is Counter else spec.name
    return frozenset({base} | {base + suffix for suffix in _SUFFIXES[spec.kind]})


def _annotated_kind(annotation: object) -> type[Any] | None:
    """The metric type an annotation names (a type, or its text under `from __future__
    import annotations`); None for anything else."""
    if isinstance(annotation, str):
        last = annotation.strip().rpartition(".")[2]
        return next((kind for kind in _KINDS if kind.__name__ == last), None)
    return next((kind for kind in _KINDS if kind is annotation), None)


def _annotation_problem(annotation: object, spec: MetricSpec[Any] | None) -> str | None:
    """What is wrong with a metric type's annotation beside the attribute's declaration
    (`spec`, None for none); None for any other annotation."""
    kind = _annotated_kind(annotation)
    if kind is None:
        return None
    if spec is None:
        return f"annotated {kind.__name__} but not declared: `= {_KINDS[kind]}(...)`"
    if spec.kind is not kind:
        return f"declared a {_KINDS.get(spec.kind, repr(spec.kind))}, annotated {kind.__name__}"
    return None


def _declarations(cls: type[MetricSet]) -> tuple[tuple[str, MetricSpec[Any]], ...]:
    """Each declared attribute of `cls` (its bases' first) with its spec, in declaration
    order; MetricDeclarationError on the first wrong one."""
    declared: dict[str, MetricSpec[Any]] = {}
    for klass in reversed(cls.__mro__):
        for attribute, value in vars(klass).items():
            if isinstance(value, MetricSpec):
                declared[attribute] = value
            else:
                declared.pop(attribute, None)  # a subclass's other value replaces the metric

    def fail(attribute: str, problem: str) -> MetricDeclarationError:
        return MetricDeclarationError(cls.__name__, attribute, problem)

    for attribute, annotation in vars(cls).get("__annotations__", {}).items():
        if attribute.startswith("_"):
            continue  # a subclass's own state, not a metric
        wrong = _annotation_problem(annotation, declared.get(attribute))
        if wrong is not None:
            raise fail(attribute, wrong)

    exported: dict[str, str] = {}
    for attribute, spec in declared.items():
        if attribute in vars(MetricSet) or attribute == "registry":
            raise fail(attribute, f"the name of MetricSet's own {attribute!r}")
        wrong = _problem(spec)
        if wrong is not None:
            raise fail(attribute, f"metric {spec.name!r}: {wrong}")
        for series in sorted(_exported_names(spec)):
            if series in exported:
                wrong = f"metric {spec.name!r} exports {series!r}, as {exported[series]} does"
                raise fail(attribute, wrong)
            exported[series] = f"{cls.__name__}.{attribute}"
    return tuple(declared.items())


def _create(spec: MetricSpec[Any], registry: CollectorRegistry) -> Counter | Gauge | Histogram:
    if spec.kind is Histogram:
        return Histogram(spec.name, spec.help, spec.labels, buckets=spec.buckets, registry=registry)
    kind: type[Counter | Gauge] = spec.kind
    return kind(spec.name, spec.help, spec.labels, registry=registry)


class MetricSet:
    """The metrics a subclass declares (`name = gauge(...)`, `counter(...)`,
    `histogram(...)`), each created on `registry` and held by its attribute.

    The declarations are checked when the subclass is defined. What its metrics need once
    they exist (labels set to 0 up front, the state of helpers over several metrics) goes in
    `__post_init__`, as in a dataclass, so no subclass restates the constructor.
    """

    _declared: ClassVar[tuple[tuple[str, MetricSpec[Any]], ...]] = ()
    registry: CollectorRegistry

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls._declared = _declarations(cls)

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        for attribute, spec in self._declared:
            setattr(self, attribute, _create(spec, registry))
        self.__post_init__()

    def __post_init__(self) -> None:
        """Runs once every metric is created; nothing to do by default."""
