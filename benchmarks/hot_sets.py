#!/usr/bin/env python3
"""The hot functions of one workload as GCC's profile and Clang's sample profile see them (compare the hot
sets): GCC's from the instrumented kernel's arc counters (each function's entry count, `kpgo profile compare`'s
model), Clang's from the emulator's branch records of the clang-train kernel through llvm-profgen (each top-level
function's head samples: how often it was entered, as sampled). Names are compared without the suffixes the two
compilers give clones and local copies (`.constprop.N`, `.isra.N`, `.part.N`, `.cold`, `.llvm.N`); a function inlined
into every caller has no entry of its own in either. Prints and writes (JSON and Markdown) the overlap of the top N
of each and Spearman's rank correlation over the functions both profiles entered. Not a test.

    .venv/bin/python benchmarks/hot_sets.py --gcc PROFILE_DIR --build INSTRUMENTED_BUILD --clang AFDO_DIR \\
        -o docs/results/clang --name tiny-micro
"""

from __future__ import annotations

import argparse
import re
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import numpy as np

from kpgo import afdo, atomic, branches
from kpgo.analysis import characterize

SUFFIX = re.compile(r"(\.(constprop|isra|part|cold|llvm|lto_priv)(\.\d+)?)+$")
TOPS = (10, 50, 100, 500)


def base(name: str) -> str:
    return SUFFIX.sub("", name)


def gcc_entries(profile: Path, build: Path) -> dict[str, float]:
    rels, _ = characterize.workload_files([profile])
    model = characterize.build_model(build, rels)
    f = characterize.profile_vectors(model, profile)["functions"]
    out: dict[str, float] = {}
    for name, count in zip(model.function_names, f.tolist()):
        if count > 0:
            key = base(name.rpartition(":")[2])
            out[key] = out.get(key, 0.0) + count  # static functions of one name in several objects add up
    return out


def clang_entries(profile_dir: Path) -> dict[str, float]:
    out: dict[str, float] = {}
    for fn in afdo.read_functions(profile_dir / "profile.afdo"):
        if fn.head > 0:
            out[base(fn.name)] = out.get(base(fn.name), 0.0) + fn.head
    return out


def compare(gcc: dict[str, float], clang: dict[str, float]) -> dict:
    top_g = sorted(gcc, key=lambda k: -gcc[k])
    top_c = sorted(clang, key=lambda k: -clang[k])
    common = sorted(set(gcc) & set(clang))
    g = np.array([gcc[k] for k in common])
    c = np.array([clang[k] for k in common])
    rho = branches.spearman(g, c) if len(common) > 2 else None
    return {
        "functions_gcc": len(gcc), "functions_clang": len(clang), "functions_both": len(common),
        "spearman_over_both": round(rho, 4) if rho is not None else None,
        "top_overlap": {n: round(len(set(top_g[:n]) & set(top_c[:n])) / n, 4) for n in TOPS if n <= min(len(gcc), len(clang))},
        "gcc_share_entered_by_clang": round(sum(gcc[k] for k in common) / sum(gcc.values()), 4),
        "clang_share_entered_by_gcc": round(sum(clang[k] for k in common) / sum(clang.values()), 4),
        "top20": [{"gcc": a, "gcc_share": round(gcc[a] / sum(gcc.values()), 4), "clang": b, "clang_share": round(clang[b] / sum(clang.values()), 4)}
                  for a, b in zip(top_g[:20], top_c[:20])],
    }


def provenance() -> dict[str, str]:
    """The kpgo commit and the day a committed result was made, for its JSON and Markdown (hot_sets, branch_truth)."""
    here = Path(__file__).resolve().parent
    commit = subprocess.run(["git", "-C", str(here), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    return {"kpgo_commit": commit or "unknown", "made": datetime.now(UTC).strftime("%Y-%m-%d")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gcc", type=Path, required=True, help="a gcov profile directory (kpgo collect / profile fix)")
    ap.add_argument("--build", type=Path, required=True, help="the instrumented build it was collected on (its .gcno)")
    ap.add_argument("--clang", type=Path, required=True, help="a sample profile directory (kpgo profile afdo)")
    ap.add_argument("-o", type=Path, required=True)
    ap.add_argument("--name", required=True)
    a = ap.parse_args()
    res = compare(gcc_entries(a.gcc, a.build), clang_entries(a.clang))
    doc = {"name": a.name, "gcc_profile": a.gcc.name, "clang_profile": a.clang.name, **provenance(), **res}
    a.o.mkdir(parents=True, exist_ok=True)
    atomic.write_json(a.o / f"hot-sets-{a.name}.json", doc)
    lines = [f"# Hot functions, GCC profile vs Clang sample profile: {a.name}", "",
             f"kpgo {doc['kpgo_commit']}, {doc['made']}; `benchmarks/hot_sets.py` (entry counts vs head samples; names without clone suffixes).", "",
             f"- functions entered: GCC {res['functions_gcc']:,}, Clang {res['functions_clang']:,}, both {res['functions_both']:,}",
             f"- Spearman's rank correlation over the functions both entered: {res['spearman_over_both']}",
             "- overlap of the top N: " + ", ".join(f"top {n}: {v:.0%}" for n, v in res["top_overlap"].items()),
             f"- GCC's entries in functions Clang's profile also entered: {res['gcc_share_entered_by_clang']:.1%}; Clang's in GCC's: "
             f"{res['clang_share_entered_by_gcc']:.1%}", "",
             "GCC counts the entries of every function it instrumented, which is after its early inliner only: small static",
             "functions the later inliner puts into their callers (spin-lock and slab helpers) keep an entry count of their own.",
             "Clang's samples name only the functions the training kernel entered out of line. The top-N overlap suffers from",
             "that; the rank correlation over the functions both entered does not.", "",
             "| rank | GCC | share | Clang | share |", "|---|---|---|---|---|"]
    lines += [f"| {i} | {r['gcc']} | {r['gcc_share']:.1%} | {r['clang']} | {r['clang_share']:.1%} |" for i, r in enumerate(res["top20"], 1)]
    atomic.write_text(a.o / f"hot-sets-{a.name}.md", "\n".join(lines) + "\n")
    print("\n".join(lines[4:8]))


if __name__ == "__main__":
    main()
