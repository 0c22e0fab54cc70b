"""Benchmark comparisons: the ratio's direction, the results file, the summary's exit code;
the service's package at a git revision, for a baseline."""

from __future__ import annotations

from pathlib import Path

import pytest

from pin_testkit.bench import (
    RESULTS_ENV,
    Comparison,
    Figure,
    baseline_packages,
    checkout_package,
    load,
    main,
    record,
)


def rate(subject: float, limit: float, target: float = 0.5) -> Comparison:
    relay, plain = Figure("relay", subject), Figure("plain producer", limit)
    return Comparison.rate("relay drain", relay, plain, unit="rows/s", target=target)


def duration(subject: float, limit: float, target: float = 3.0) -> Comparison:
    worker, query = Figure("worker + relay", subject), Figure("one SQL statement", limit)
    return Comparison.duration("fan-out", worker, query, target=target)


def test_each_kind_of_figure_sets_its_unit_and_direction() -> None:
    # The named constructors fill the same record the field-by-field form does.
    assert rate(2.0, 4.0) == Comparison(
        benchmark="relay drain",
        subject="relay",
        subject_value=2.0,
        limit="plain producer",
        limit_value=4.0,
        unit="rows/s",
        better="higher",
        target=0.5,
    )
    figures = (Figure("subject", 2.0), Figure("limit", 4.0))
    kinds = {
        "duration": Comparison.duration("b", *figures, target=1.5, note="n"),
        "memory": Comparison.memory("b", *figures, target=1.5, note="n"),
    }
    assert {kind: (c.unit, c.better) for kind, c in kinds.items()} == {
        "duration": ("s", "lower"),
        "memory": ("MiB", "lower"),
    }
    assert kinds["duration"].subject_value == 2.0
    assert kinds["duration"].limit == "limit"
    assert kinds["memory"].note == "n"


def test_a_rate_meets_its_target_from_above_and_a_duration_from_below() -> None:
    assert rate(60_000, 100_000).met
    assert not rate(40_000, 100_000).met
    assert duration(5.9, 2.0).met
    assert not duration(6.1, 2.0).met
    assert duration(6.0, 2.0).ratio == pytest.approx(3.0)


def test_records_append_to_the_runs_file_and_print_as_one_table(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "results.jsonl"
    monkeypatch.setenv(RESULTS_ENV, str(results))
    record(rate(60_000, 100_000))
    record(duration(9.0, 2.0))
    assert load(results) == [rate(60_000, 100_000), duration(9.0, 2.0)]
    assert main([str(results)]) == 0
    printed = capsys.readouterr().out
    assert "relay drain" in printed
    assert "fan-out" in printed
    assert "NO" in printed  # 4.5x the floor misses its 3x target


def test_without_a_results_file_nothing_is_written_and_the_summary_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(RESULTS_ENV, raising=False)
    record(rate(1.0, 2.0))
    assert list(tmp_path.iterdir()) == []
    assert main([str(tmp_path / "missing.jsonl")]) == 1
    assert "no benchmark results" in capsys.readouterr().err


def test_a_baseline_is_the_package_at_its_revision_first_on_the_path() -> None:
    with baseline_packages(["HEAD"]) as packages:
        path = Path(packages["HEAD"])
        assert (path / "identity_fanout" / "__init__.py").is_file()
        assert (path / "identity_fanout" / "migrations").is_dir()
    assert not path.exists()  # removed with its temporary directory


def test_an_unknown_revision_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no-such-revision"):
        checkout_package("no-such-revision", str(tmp_path))
