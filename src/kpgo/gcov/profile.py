"""Kernel profiles as directories: a tree of .gcda files (paths relative to the kernel build directory) plus
profile.json.

API (used by `kpgo profile` and by the pipeline)
    iter_gcda(src) -> Iterator[Path]                 relative paths of the .gcda files, sorted
    profile_stats(src) -> dict                       files, functions, arcs_sum, arcs_max, with_summary, gcov_version, ...
    fix_profile(src, dst, runs=1) -> dict            copy with a correct object summary in every file (atomic dst)
    read_manifest(src) -> dict                       profile.json, {} when absent

The kernel writes .gcda files without the object summary record; GCC >= 9 then ignores the profile ("Profile info is
missing; giving up"). fix_profile adds it with sum_max = the largest arc counter over the whole profile, because the
kernel is one program: each object then judges hotness against the same maximum, as one user-space program would.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from kpgo.atomic import output_dir
from kpgo.errors import UserError
from kpgo.gcov.gcda import ARCS, TAG_FUNCTION, Gcda, GcovFormatError, parse_gcda, summary_bytes

MANIFEST = "profile.json"


def iter_gcda(src: Path) -> Iterator[Path]:
    """Relative paths of all .gcda files under src, sorted (deterministic output order)."""
    src = Path(src)
    if not src.is_dir():
        raise UserError(f"profile directory {src} does not exist", "give a directory of .gcda files")
    found: list[str] = []
    for root, dirs, files in os.walk(src):
        dirs[:] = [d for d in dirs if not d.startswith(".")]  # skip our own temporary outputs
        rel_root = os.path.relpath(root, src)
        for f in files:
            if f.endswith(".gcda") and not f.startswith("."):
                found.append(f if rel_root == "." else os.path.join(rel_root, f))
    found.sort()
    return (Path(p) for p in found)


def gcda_list(src: Path) -> list[Path]:
    files = list(iter_gcda(src))
    if not files:
        raise UserError(f"{src}: no .gcda files", "is this a profile directory (collected from an instrumented kernel)?")
    return files


def read_profile_file(src: Path, rel: Path) -> Gcda:
    path = os.path.join(src, rel)  # str paths: pathlib costs more than the parse on small files
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})", "check the path and permissions") from None
    return parse_gcda(data, path)


def read_manifest(src: Path) -> dict[str, Any]:
    path = Path(src) / MANIFEST
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise UserError(f"{path}: not valid JSON ({e})", "repair or remove it") from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: not a JSON object", "repair or remove it")
    return data


def _versions_text(versions: set[str]) -> str:
    return ",".join(sorted(versions))


def profile_stats(src: Path) -> dict[str, Any]:
    """Counts over a profile. Keys: files, functions (FUNCTION records with data), arcs (arc counters), arcs_sum,
    arcs_max, arcs_nonzero, with_summary (files carrying an object summary), gcov_version (text; comma-separated if
    mixed), stamps (distinct stamps), bytes."""
    files = functions = arcs = with_summary = nbytes = nonzero = 0
    arcs_sum = arcs_max = 0
    versions: set[str] = set()
    stamps: set[int] = set()
    for rel in gcda_list(src):
        g = read_profile_file(src, rel)
        files += 1
        nbytes += len(g.payload) * 4
        versions.add(g.version_text)
        stamps.add(g.stamp)
        fsel = g.tags == TAG_FUNCTION
        functions += int(np.count_nonzero(np.diff(g.offsets)[fsel] >= 3))
        if g.summary is not None:
            with_summary += 1
        v = g.counters(ARCS)
        arcs += len(v)
        if len(v):
            # Python int sum: a kernel-wide sum may exceed 2**64 in theory; per-file uint64 sums do not.
            arcs_sum += int(v.sum(dtype=np.uint64))
            arcs_max = max(arcs_max, int(v.max()))
            nonzero += int(np.count_nonzero(v))
    return {
        "files": files,
        "functions": functions,
        "arcs": arcs,
        "arcs_sum": arcs_sum,
        "arcs_max": arcs_max,
        "arcs_nonzero": nonzero,
        "with_summary": with_summary,
        "gcov_version": _versions_text(versions),
        "stamps": len(stamps),
        "bytes": nbytes,
    }


def write_tree(tmp: Path, items: Iterator[tuple[Path, bytes]]) -> int:
    """Write files under a temporary output directory (the directory itself becomes visible atomically)."""
    made: set[Path] = set()
    n = 0
    for rel, data in items:
        d = (tmp / rel).parent
        if d not in made:
            d.mkdir(parents=True, exist_ok=True)
            made.add(d)
        with open(tmp / rel, "wb") as f:
            f.write(data)
        n += 1
    return n


def fix_profile(src: Path, dst: Path, runs: int = 1) -> dict[str, Any]:
    """Copy the profile src to dst with one correct object summary per file: runs, and sum_max = the largest arc
    counter over the whole profile (clamped to 32 bits, as GCC stores it). The layout of each file's GCC is kept.

    dst appears only when complete; src is never modified. Returns stats: files, runs, sum_max, sum_max_clamped,
    had_summary, gcov_version."""
    src, dst = Path(src), Path(dst)
    if runs < 1 or runs > 0xFFFFFFFF:
        raise UserError(f"--runs {runs} is out of range", "give a positive number of runs")
    if dst.exists():
        raise UserError(f"output directory {dst} already exists", "choose another -o or remove it")
    rels = gcda_list(src)
    # One profile in memory (the memory bound is the profile size): read once, find the global max, write.
    parsed: list[tuple[Gcda, bytes]] = []
    global_max = 0
    had = 0
    versions: set[str] = set()
    for rel in rels:
        path = os.path.join(src, rel)
        with open(path, "rb") as f:
            data = f.read()
        g = parse_gcda(data, path)
        parsed.append((g, data))
        versions.add(g.version_text)
        if g.summary is not None:
            had += 1
        v = g.counters(ARCS)
        if len(v):
            global_max = max(global_max, int(v.max()))
    sum_max = min(global_max, 0xFFFFFFFF)
    manifest = read_manifest(src)
    with output_dir(dst) as tmp:
        write_tree(tmp, ((rel, summary_bytes(g, data, runs, sum_max)) for rel, (g, data) in zip(rels, parsed)))
        manifest = dict(manifest)
        manifest["fixed"] = {"runs": runs, "sum_max": sum_max, "max_counter": global_max, "source": str(src)}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return {
        "files": len(rels),
        "runs": runs,
        "sum_max": sum_max,
        "max_counter": global_max,
        "sum_max_clamped": global_max > sum_max,
        "had_summary": had,
        "gcov_version": _versions_text(versions),
    }


__all__ = [
    "GcovFormatError",
    "MANIFEST",
    "fix_profile",
    "gcda_list",
    "iter_gcda",
    "profile_stats",
    "read_manifest",
    "read_profile_file",
    "write_tree",
]
