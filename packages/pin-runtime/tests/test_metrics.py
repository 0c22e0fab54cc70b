from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import ClassVar

import pytest
from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from pin_runtime.metrics import (
    MetricCatalogueError,
    MetricSet,
    MetricSpec,
    load_catalogue,
    parse_catalogue,
)

ImportablePackage = Callable[[str, Mapping[str, str]], None]  # the conftest fixture

CATALOGUE = """
# A comment is kept out of the entries.
[errors]
name = "svc_errors"
help = "Failures by kind."
kind = "counter"
labels = ["kind"]

[backlog]
name = "svc_backlog"
help = "Rows waiting."
kind = "gauge"

[size]
name = "svc_size"
help = "Users per task."
kind = "histogram"
labels = ["outcome"]
buckets = [1, 10]
"""


class _Svc(MetricSet):
    catalogue = parse_catalogue(CATALOGUE, "svc/metrics.toml")

    errors: Counter
    backlog: Gauge
    size: Histogram

    def __post_init__(self) -> None:
        self.errors.labels(kind="poll")


def test_each_entry_is_bound_to_its_attribute_on_the_given_registry_only() -> None:
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


def test_metrics_are_created_in_the_catalogue_order() -> None:
    class Reordered(MetricSet):
        catalogue = parse_catalogue(CATALOGUE, "svc/metrics.toml")

        size: Histogram
        backlog: Gauge
        errors: Counter

    registry = CollectorRegistry()
    Reordered(registry)

    assert [family.name for family in registry.collect()] == [
        "svc_errors",
        "svc_backlog",
        "svc_size",
    ]


def test_an_entry_is_decoded_into_its_typed_spec() -> None:
    catalogue = parse_catalogue(CATALOGUE, "svc/metrics.toml")

    assert catalogue.source == "svc/metrics.toml"
    assert list(catalogue.entries) == ["errors", "backlog", "size"]
    assert catalogue.entries["size"] == MetricSpec(
        name="svc_size",
        help="Users per task.",
        kind="histogram",
        labels=("outcome",),
        buckets=(1.0, 10.0),
    )
    assert catalogue.entries["backlog"].labels == ()
    assert catalogue.entries["backlog"].buckets == ()


def _entry(key: str, **fields: object) -> str:
    lines = [f"[{key}]"]
    lines += [f"{name} = {value!r}".replace("'", '"') for name, value in fields.items()]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            _entry("size", name="s", help="h", kind="histogram"),
            "x/m.toml: metric 'size': a histogram needs buckets",
            id="histogram-without-buckets",
        ),
        pytest.param(
            _entry("size", name="s", help="h", kind="histogram", buckets=[]),
            "x/m.toml: metric 'size': a histogram needs buckets",
            id="histogram-with-empty-buckets",
        ),
        pytest.param(
            _entry("size", name="s", help="h", kind="histogram", buckets=[10, 1]),
            "x/m.toml: metric 'size': buckets must increase: [10.0, 1.0]",
            id="buckets-out-of-order",
        ),
        pytest.param(
            _entry("n", name="s", help="h", kind="counter", buckets=[1]),
            "x/m.toml: metric 'n': a counter takes no buckets (only a histogram does)",
            id="buckets-on-a-counter",
        ),
        pytest.param(
            _entry("a", name="s", help="h", kind="gauge")
            + _entry("b", name="s", help="h", kind="gauge"),
            "x/m.toml: metric 'b': name 's' is also the name of 'a'",
            id="name-given-twice",
        ),
        pytest.param(
            _entry("n", name="s", help="h", kind="summary"),
            "x/m.toml: metric 'n': Invalid enum value 'summary' - at `$.kind`",
            id="unknown-kind",
        ),
        pytest.param(
            _entry("n", name="s", help="h", kind="gauge", label=["x"]),
            "x/m.toml: metric 'n': Object contains unknown field `label`",
            id="unknown-field",
        ),
        pytest.param(
            _entry("n", name="s", kind="gauge"),
            "x/m.toml: metric 'n': Object missing required field `help`",
            id="missing-help",
        ),
        pytest.param(
            "[n\nname = 1",
            "x/m.toml: Expected ']' at the end of a table declaration",
            id="not-toml",
        ),
        pytest.param("n = 1", "x/m.toml: Expected `object`, got `int`", id="not-a-table"),
    ],
)
def test_a_malformed_catalogue_is_refused_naming_the_file_and_the_entry(
    text: str, message: str
) -> None:
    with pytest.raises(MetricCatalogueError) as raised:
        parse_catalogue(text, "x/m.toml")

    assert str(raised.value).startswith(message)


def _catalogue(**kinds: str) -> str:
    return "".join(
        _entry(key, name=f"svc_{key}", help="h", kind=kind)
        + ("buckets = [1]\n" if kind == "histogram" else "")
        for key, kind in kinds.items()
    )


def test_an_annotation_without_an_entry_is_refused_when_the_class_is_defined() -> None:
    with pytest.raises(MetricCatalogueError) as raised:

        class Svc(MetricSet):
            catalogue = parse_catalogue(_catalogue(errors="counter"), "svc/metrics.toml")

            errors: Counter
            backlog: Gauge

    assert raised.value.entry == "backlog"
    assert str(raised.value) == (
        "svc/metrics.toml: metric 'backlog': Svc annotates it Gauge; the catalogue has no entry"
    )


def test_an_entry_without_an_annotation_is_refused_when_the_class_is_defined() -> None:
    with pytest.raises(MetricCatalogueError) as raised:

        class Svc(MetricSet):
            catalogue = parse_catalogue(
                _catalogue(errors="counter", backlog="gauge"), "svc/metrics.toml"
            )

            errors: Counter

    assert raised.value.entry == "backlog"
    assert str(raised.value) == (
        "svc/metrics.toml: metric 'backlog': in the catalogue but Svc declares no attribute for it"
    )


@pytest.mark.parametrize(
    ("kind", "annotation", "problem"),
    [
        ("gauge", Counter, "a gauge in the catalogue, Svc annotates it Counter"),
        ("counter", Histogram, "a counter in the catalogue, Svc annotates it Histogram"),
        ("histogram", Gauge, "a histogram in the catalogue, Svc annotates it Gauge"),
    ],
)
def test_a_kind_other_than_the_annotation_is_refused(
    kind: str, annotation: type, problem: str
) -> None:
    with pytest.raises(MetricCatalogueError) as raised:
        type(
            "Svc",
            (MetricSet,),
            {
                "catalogue": parse_catalogue(_catalogue(m=kind), "svc/metrics.toml"),
                "__annotations__": {"m": annotation},
            },
        )

    assert str(raised.value) == f"svc/metrics.toml: metric 'm': {problem}"


def test_an_attribute_that_is_not_a_metric_type_is_refused() -> None:
    with pytest.raises(MetricCatalogueError, match=r"metric 'm': Svc annotates it <class 'int'>"):

        class Svc(MetricSet):
            catalogue = parse_catalogue(_catalogue(m="gauge"), "svc/metrics.toml")

            m: int


def test_private_and_class_level_annotations_are_not_metrics() -> None:
    class Svc(MetricSet):
        catalogue = parse_catalogue(_catalogue(m="gauge"), "svc/metrics.toml")
        kinds: ClassVar[tuple[str, ...]] = ("a", "b")

        m: Gauge
        _seen: set[str]

        def __post_init__(self) -> None:
            self._seen = set(self.kinds)

    svc = Svc(CollectorRegistry())

    assert svc._seen == {"a", "b"}


def test_a_metric_set_without_a_catalogue_is_refused() -> None:
    with pytest.raises(TypeError, match="Svc sets no `catalogue = load_catalogue"):

        class Svc(MetricSet):
            m: Gauge


def test_a_catalogue_is_read_from_its_package_once(
    importable_package: ImportablePackage,
) -> None:
    importable_package("catalogue_pkg", {"sub/metrics.toml": CATALOGUE})

    catalogue = load_catalogue("catalogue_pkg", "sub/metrics.toml")

    assert catalogue.source == "catalogue_pkg/sub/metrics.toml"
    assert list(catalogue.entries) == ["errors", "backlog", "size"]
    assert load_catalogue("catalogue_pkg", "sub/metrics.toml") is catalogue
