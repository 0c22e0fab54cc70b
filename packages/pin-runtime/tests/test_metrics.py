from __future__ import annotations

from typing import Any, ClassVar, assert_type

import pytest
from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    Summary,
    generate_latest,
)

from pin_runtime.errors import PinRuntimeError
from pin_runtime.metrics import (
    MetricDeclarationError,
    MetricSet,
    MetricSpec,
    counter,
    gauge,
    histogram,
)


class _Svc(MetricSet):
    errors = counter("svc_errors", "Failures by kind.", labels=("kind",))
    backlog = gauge("svc_backlog", "Rows waiting.")
    size = histogram("svc_size", "Users per task.", labels=("outcome",), buckets=(1, 10))

    def __post_init__(self) -> None:
        self.errors.labels(kind="poll")


def test_each_declaration_is_created_on_its_attribute_on_the_given_registry_only() -> None:
    registry = CollectorRegistry()
    svc = _Svc(registry)

    svc.errors.labels(kind="poll").inc()
    svc.backlog.set(3)
    svc.size.labels(outcome="done").observe(5)

    assert svc.registry is registry
    text = generate_latest(registry).decode()
    assert 'svc_errors_total{kind="poll"} 1.0' in text
    assert "svc_backlog 3.0" in text
    assert 'svc_size_bucket{le="10.0",outcome="done"} 1.0' in text
    assert 'svc_size_bucket{le="1.0",outcome="done"} 0.0' in text
    assert "# HELP svc_backlog Rows waiting." in text
    assert REGISTRY.get_sample_value("svc_backlog") is None  # never the global registry


def test_an_attribute_is_typed_as_its_metric_on_an_instance_and_its_spec_on_the_class() -> None:
    svc = _Svc(CollectorRegistry())

    # assert_type is checked by mypy: no cast at a call site.
    assert isinstance(assert_type(svc.errors, Counter), Counter)
    assert isinstance(assert_type(svc.backlog, Gauge), Gauge)
    assert isinstance(assert_type(svc.size, Histogram), Histogram)
    assert assert_type(_Svc.size, MetricSpec[Histogram]) == MetricSpec(
        kind=Histogram,
        name="svc_size",
        help="Users per task.",
        labels=("outcome",),
        buckets=(1.0, 10.0),
    )
    assert _Svc.backlog.labels == ()
    assert _Svc.backlog.buckets == ()


def test_two_instances_on_two_registries_do_not_clash() -> None:
    first, second = CollectorRegistry(), CollectorRegistry()
    _Svc(first).backlog.set(1)
    _Svc(second).backlog.set(2)

    assert first.get_sample_value("svc_backlog") == 1
    assert second.get_sample_value("svc_backlog") == 2


def test_post_init_runs_once_the_metrics_exist() -> None:
    registry = CollectorRegistry()
    _Svc(registry)

    assert registry.get_sample_value("svc_errors_total", {"kind": "poll"}) == 0


def test_metrics_are_created_in_declaration_order_a_subclass_after_its_base() -> None:
    class More(_Svc):
        later = gauge("svc_later", "Declared by the subclass.")

    registry = CollectorRegistry()
    More(registry)

    assert [family.name for family in registry.collect()] == [
        "svc_errors",
        "svc_backlog",
        "svc_size",
        "svc_later",
    ]


def test_a_metric_read_before_it_is_created_names_it() -> None:
    class Early(MetricSet):
        backlog = gauge("svc_backlog", "Rows waiting.")

        def __init__(self, registry: CollectorRegistry) -> None:
            self.seen = self.backlog
            super().__init__(registry)

    with pytest.raises(AttributeError, match="metric 'svc_backlog' of Early is not created yet"):
        Early(CollectorRegistry())


@pytest.mark.parametrize(
    ("declarations", "message"),
    [
        pytest.param(
            {"size": histogram("s", "h", buckets=())},
            "Svc.size: metric 's': a histogram needs buckets",
            id="histogram-without-buckets",
        ),
        pytest.param(
            {"size": histogram("s", "h", buckets=[10, 1])},
            "Svc.size: metric 's': buckets must increase: [10.0, 1.0]",
            id="buckets-out-of-order",
        ),
        pytest.param(
            {"size": histogram("s", "h", buckets=(1, 1))},
            "Svc.size: metric 's': buckets must increase: [1.0, 1.0]",
            id="bucket-given-twice",
        ),
        pytest.param(
            {"n": MetricSpec(Counter, "s", "h", buckets=(1.0,))},
            "Svc.n: metric 's': a counter takes no buckets (only a histogram does)",
            id="buckets-on-a-counter",
        ),
        pytest.param(
            {"n": MetricSpec(Summary, "s", "h")},  # type: ignore[type-var]
            "Svc.n: metric 's': kind <class 'prometheus_client.metrics.Summary'> is none of "
            "Counter, Gauge, Histogram",
            id="unknown-kind",
        ),
        pytest.param(
            {"a": gauge("s", "h"), "b": gauge("s", "h")},
            "Svc.b: metric 's' exports 's', as Svc.a does",
            id="name-given-twice",
        ),
        pytest.param(
            {"a": counter("s", "h"), "b": counter("s_total", "h")},
            "Svc.b: metric 's_total' exports 's', as Svc.a does",
            id="a-counter-with-and-without-total",
        ),
        pytest.param(
            {"a": counter("s", "h"), "b": gauge("s_total", "h")},
            "Svc.b: metric 's_total' exports 's_total', as Svc.a does",
            id="a-gauge-named-as-a-counters-series",
        ),
        pytest.param(
            {"a": histogram("s", "h", buckets=(1,)), "b": gauge("s_count", "h")},
            "Svc.b: metric 's_count' exports 's_count', as Svc.a does",
            id="a-gauge-named-as-a-histograms-series",
        ),
        pytest.param(
            {"n": gauge("svc-size", "h")},
            "Svc.n: metric 'svc-size': 'svc-size' is not a Prometheus metric name "
            "([a-zA-Z_:][a-zA-Z0-9_:]*)",
            id="bad-metric-name",
        ),
        pytest.param(
            {"n": gauge("s", "h", labels=("the-topic",))},
            "Svc.n: metric 's': 'the-topic' is not a label name "
            "(a-z, A-Z, 0-9, _, not starting with __)",
            id="bad-label-name",
        ),
        pytest.param(
            {"n": gauge("s", "h", labels=("__name",))},
            "Svc.n: metric 's': '__name' is not a label name "
            "(a-z, A-Z, 0-9, _, not starting with __)",
            id="reserved-label-name",
        ),
        pytest.param(
            {"n": gauge("s", "h", labels=("topic", "topic"))},
            "Svc.n: metric 's': a label is given twice: ['topic', 'topic']",
            id="label-given-twice",
        ),
        pytest.param(
            {"n": gauge("s", "h", labels="topic")},  # type: ignore[arg-type]
            "Svc.n: metric 's': labels must be a tuple of label names, not 'topic'",
            id="labels-as-one-string",
        ),
        pytest.param(
            {"n": histogram("s", "h", labels=("le",), buckets=(1,))},
            "Svc.n: metric 's': a histogram takes no label 'le' (its buckets' own)",
            id="le-on-a-histogram",
        ),
        pytest.param(
            {"registry": gauge("s", "h")},
            "Svc.registry: the name of MetricSet's own 'registry'",
            id="attribute-named-registry",
        ),
    ],
)
def test_a_wrong_declaration_is_refused_when_the_class_is_defined(
    declarations: dict[str, Any], message: str
) -> None:
    with pytest.raises(MetricDeclarationError) as raised:
        type("Svc", (MetricSet,), declarations)

    assert str(raised.value) == message
    assert isinstance(raised.value, PinRuntimeError)
    assert raised.value.owner == "Svc"
    assert raised.value.attribute in declarations


def test_a_name_given_twice_across_a_base_and_its_subclass_is_refused() -> None:
    with pytest.raises(MetricDeclarationError) as raised:

        class Again(_Svc):
            pending = gauge("svc_backlog", "Rows waiting, again.")

    assert str(raised.value) == (
        "Again.pending: metric 'svc_backlog' exports 'svc_backlog', as Again.backlog does"
    )


def test_one_declaration_on_two_attributes_is_refused() -> None:
    backlog = gauge("svc_backlog", "Rows waiting.")

    with pytest.raises(MetricDeclarationError, match=r"Svc\.pending: .* as Svc\.backlog does"):
        type("Svc", (MetricSet,), {"backlog": backlog, "pending": backlog})


def test_a_metric_annotated_but_not_declared_is_refused() -> None:
    with pytest.raises(MetricDeclarationError) as raised:

        class Svc(MetricSet):
            errors = counter("svc_errors", "Failures.")
            backlog: Gauge

    assert raised.value.attribute == "backlog"
    assert str(raised.value) == "Svc.backlog: annotated Gauge but not declared: `= gauge(...)`"


@pytest.mark.parametrize(
    ("spec", "annotation", "problem"),
    [
        (gauge("m", "h"), Counter, "declared a gauge, annotated Counter"),
        (counter("m", "h"), "Histogram", "declared a counter, annotated Histogram"),
        (
            histogram("m", "h", buckets=(1,)),
            "prometheus_client.Gauge",
            "declared a histogram, annotated Gauge",
        ),
    ],
)
def test_an_annotation_of_another_kind_than_the_declaration_is_refused(
    spec: MetricSpec[Any], annotation: object, problem: str
) -> None:
    with pytest.raises(MetricDeclarationError) as raised:
        type("Svc", (MetricSet,), {"m": spec, "__annotations__": {"m": annotation}})

    assert str(raised.value) == f"Svc.m: {problem}"


def test_other_annotations_are_not_metrics() -> None:
    class Svc(MetricSet):
        kinds: ClassVar[tuple[str, ...]] = ("a", "b")
        limit: int = 3
        m = gauge("svc_m", "h")
        _seen: set[str]

        def __post_init__(self) -> None:
            self._seen = set(self.kinds)

    registry = CollectorRegistry()
    svc = Svc(registry)

    assert svc._seen == {"a", "b"}
    assert svc.limit == 3
    assert [family.name for family in registry.collect()] == ["svc_m"]


def test_a_metric_set_declaring_nothing_creates_nothing() -> None:
    class Empty(MetricSet):
        pass

    registry = CollectorRegistry()
    Empty(registry)

    assert list(registry.collect()) == []
