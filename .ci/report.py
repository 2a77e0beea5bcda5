"""The CI budget report: each target's wall time and result, then the slowest tests of the whole run.

Reads what .ci/run leaves under build/ci/: `times` (one line per target: name, exit status, seconds,
and `beside` for what ran beside another target, left out of the total)
and one JUnit XML file per target (pytest's --junitxml; a test's time there is its setup, call and
teardown together). Prints plain text, so that the next change sees in CI's own output what it costs.
"""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path

SLOWEST = 10


def targets(folder: Path) -> list[tuple[str, int, int]]:
    path = folder / "times"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        name, status, seconds, *beside = line.split()
        rows.append((name, int(status), int(seconds), bool(beside)))
    return rows


def tests(folder: Path) -> list[tuple[float, str, str]]:
    found = []
    for xml in sorted(folder.glob("*.xml")):
        try:
            root = ET.parse(xml).getroot()
        except ET.ParseError:  # a target killed mid-write: its times are in `times` anyway
            continue
        for case in root.iter("testcase"):
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            found.append((float(case.get("time") or 0.0), xml.stem, name))
    return sorted(found, reverse=True)


def fmt(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


def main(folder: Path) -> None:
    rows = targets(folder)
    print("== CI budget: each target's wall time (installs included) ==")
    for name, status, seconds, beside in rows:
        print(f"{name:<14} {fmt(seconds):>6}  {'ok' if status == 0 else f'FAILED (exit {status})'}"
              + ("  (beside another target, not in the total)" if beside else ""))
    print(f"{'total':<14} {fmt(sum(s for _, _, s, beside in rows if not beside)):>6}")
    print(f"== the {SLOWEST} slowest tests (setup + call + teardown) ==")
    for seconds, target, name in tests(folder)[:SLOWEST]:
        print(f"{seconds:8.1f} s  {target:<14} {name}")


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "build/ci"))
