#!/usr/bin/env python3
"""GCC's function idents in an instrumented build, as kpgo recomputes them (kpgo.gcov.ident; docs/PROFILES.md, "Where
GCC looks a function up"): for every function of every .gcno, which rule reproduces the ident GCC wrote (public:
its name; static: its file's path, name and object) and whether the line checksum is reproduced too; with profiles,
the share of each one's arc counts in static functions (what a tree at another path loses without re-keying).
Prints; not a test.

    .venv/bin/python benchmarks/idents.py BUILD [--profile DIR]...
"""

from __future__ import annotations

import argparse
import os
from collections import Counter
from pathlib import Path

from kpgo.gcov import ident
from kpgo.gcov.gcda import ARCS, read_gcda
from kpgo.gcov.gcno import Gcno, read_gcno


def notes_of(build: Path) -> dict[str, Gcno]:
    out = {}
    for root, _dirs, files in os.walk(build):
        for f in files:
            if f.endswith(".gcno"):
                path = Path(root) / f
                out[str(path.relative_to(build))[: -len(".gcno")]] = read_gcno(path)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("build", type=Path, help="an instrumented build directory (its .gcno files)")
    ap.add_argument("--profile", type=Path, action="append", default=[], help="a profile of that build (repeatable)")
    a = ap.parse_args()
    notes = notes_of(a.build)
    kinds: Counter[str] = Counter()
    lines = 0
    for stem, n in notes.items():
        for fn in n.functions:
            kinds[ident.kind(fn, stem) or "unexplained"] += 1
            lines += fn.name is not None and fn.source is not None and ident.line_checksum(fn.start_line, fn.source, fn.name) == fn.lineno_checksum
    total = sum(kinds.values())
    print(f"{a.build}: {len(notes):,} .gcno, {total:,} functions: public {kinds['public']:,}, static {kinds['static']:,}, "
          f"unexplained {kinds['unexplained']:,}; line checksums reproduced {lines:,}")
    for prof in a.profile:
        weight: Counter[str] = Counter()
        for p in prof.rglob("*.gcda"):
            stem = str(p.relative_to(prof))[: -len(".gcda")]
            if stem not in notes:
                continue
            by_id = {fn.ident: fn for fn in notes[stem].functions}
            for fr in read_gcda(p).functions():
                fn = by_id.get(fr.ident) if fr.ident is not None else None
                arcs = fr.counters.get(ARCS)
                if fn is not None and arcs is not None:
                    weight[ident.kind(fn, stem) or "unexplained"] += int(arcs.sum())
        w = sum(weight.values()) or 1
        print(f"{prof}: arc counts in static functions {weight['static'] / w:.1%}, public {weight['public'] / w:.1%}, "
              f"unexplained {weight['unexplained'] / w:.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
