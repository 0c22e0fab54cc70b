"""The alert rules the campaign's Prometheus evaluates: the repository's, with the horizon
alerts' windows shortened so that a snapshot held for `faults.HELD_SNAPSHOT_SECONDS` pages.

Their production windows (held more than 300 s, for 5 minutes) would need a 10-minute fault;
the expression is the same but for its threshold and `for`, so what the campaign checks is
the rule's shape: which series it reads, that a held snapshot raises it on the right
service's database and that it resolves once let go.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

import yaml

from pin_testkit.local.prometheus import repository_rule_files

__all__ = ["SHORTENED", "campaign_rule_files"]

SHORTENED: Final[dict[str, tuple[str, str, str]]] = {
    "IdentityPostgresHorizonHeld": ("> 300", "> 20", "15s"),
    "RewardsMembershipPostgresHorizonHeld": ("> 300", "> 20", "15s"),
}
"""Alert -> (its threshold, the campaign's, the campaign's `for`)."""


def campaign_rule_files(directory: Path) -> list[Path]:
    """The repository's rule files written to `directory`, the `SHORTENED` alerts changed."""
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    seen: set[str] = set()
    for source in repository_rule_files():
        rules = yaml.safe_load(source.read_text())
        for group in rules["groups"]:
            for rule in group["rules"]:
                change = SHORTENED.get(rule.get("alert", ""))
                if change is None:
                    continue
                threshold, shortened, for_ = change
                if not rule["expr"].rstrip().endswith(threshold):
                    raise ValueError(f"{rule['alert']}: expected to end with {threshold!r}")
                rule["expr"] = rule["expr"].rstrip()[: -len(threshold)] + shortened
                rule["for"] = for_
                seen.add(rule["alert"])
        target = directory / source.name
        target.write_text(yaml.safe_dump(rules, sort_keys=False))
        written.append(target)
    if missing := set(SHORTENED) - seen:
        raise ValueError(f"no such alert in the rule files: {', '.join(sorted(missing))}")
    return written
