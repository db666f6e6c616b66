#!/usr/bin/env python3
"""The compiler study's tables from its committed files, with intervals computed as this kpgo computes them (prints
Markdown; not a test). docs/MEASUREMENTS.md has the command and what it printed.

    .venv/bin/python benchmarks/compiler_table.py docs/results/compiler/compiler.json docs/results/compiler/results.json

A results.json of schema 2 (percentile-bootstrap CIs) is restated from its samples first (kpgo.bench.restate), and
the table's ratios taken from it again (kpgo.study.restate_table), as `kpgo report` does."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kpgo import records, study


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("table", type=Path, help="the study's compiler.json")
    ap.add_argument("results", type=Path, help="the study's results.json")
    a = ap.parse_args()
    results = records.Results.from_json(json.loads(a.results.read_text()), a.results)  # restated as it is read
    print(study.format_compiler(study.restate_table(json.loads(a.table.read_text()), results)))


if __name__ == "__main__":
    main()
