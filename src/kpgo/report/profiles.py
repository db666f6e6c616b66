"""Profile analyses for the report: pairwise similarity of the run's fixed profiles and each profile's most
executed kernel functions (kpgo.analysis.characterize), cached in OUT_DIR because reading a server kernel's .gcno
files takes a while; function sizes in vmlinux from `nm -S` (kpgo.kernel.codesize)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kpgo import atomic, inputs
from kpgo.errors import KpgoError, UserError
from kpgo.kernel import codesize

CACHE_NAME = "profile-cache.json"
CACHE_VERSION = 1  # bump when what is cached changes
TOP = 20


def fixed_profiles(run_dir: Path, first: list[str] | None = None) -> dict[str, Path]:
    """RUN_DIR/profiles/NAME directories with a profile.json, except NAME.raw (the kernel's unrepaired copy); the
    names in `first` (the workloads, in run order) lead, the rest (merged universal profiles) follow by name."""
    root = run_dir / "profiles"
    if not root.is_dir():
        return {}
    found = {p.name: p for p in sorted(root.iterdir())
             if p.is_dir() and not p.name.endswith(".raw") and (p / "profile.json").is_file()}
    lead = [n for n in first or [] if n in found]
    return {n: found[n] for n in lead + [n for n in found if n not in lead]}


def cache_key(profiles: dict[str, Path], build: Path) -> str:
    """Identity of the inputs: each profile's profile.json (it names the collection and the build key) and the
    instrumented build's build.json."""
    h = hashlib.sha256(f"v{CACHE_VERSION}".encode())
    for name, d in profiles.items():
        h.update(b"\0" + name.encode() + b"\0" + inputs.read_bytes(d / "profile.json", "repair or remove it", inputs.JSON_LIMIT))
    bj = build / "build.json"
    h.update(b"\0build\0" + (inputs.read_bytes(bj, "build it again", inputs.JSON_LIMIT) if bj.is_file() else str(build).encode()))
    return h.hexdigest()


CACHE_SHAPE = {"key": str, "analysis": {"similarity": (dict, None), "similarity_error": (str, None), "top": dict, "top_error": (str, None)}}


def _cached(out_dir: Path, key: str) -> dict[str, Any] | None:
    try:  # the report's own cache: anything unusable there is computed again
        c = inputs.read_json(out_dir / CACHE_NAME, "", CACHE_SHAPE, missing_ok=True)
    except UserError:
        return None
    return c["analysis"] if c is not None and c["key"] == key else None


@dataclass
class Analysis:
    similarity: dict[str, Any] | None  # compare_profiles' result (two or more profiles)
    similarity_error: str | None
    top: dict[str, list[dict[str, Any]]]  # profile name -> most executed functions
    top_error: str | None
    cached: bool


def analyze(profiles: dict[str, Path], build: Path, out_dir: Path, top: int = TOP) -> Analysis:
    """Similarity matrices and top functions of `profiles` (collected from the instrumented `build`), from the cache
    in out_dir when the inputs are unchanged. Problems (a profile from another build) become error strings: the
    sections that need them are then skipped, the rest of the report still appears."""
    key = cache_key(profiles, build)
    hit = _cached(out_dir, key)
    if hit is not None:
        return Analysis(hit["similarity"], hit["similarity_error"], hit["top"], hit["top_error"], cached=True)
    from kpgo.analysis import characterize

    sim: dict[str, Any] | None = None
    sim_err: str | None = None
    if len(profiles) >= 2:
        try:
            sim = characterize.compare_profiles(list(profiles.values()), build, names=list(profiles))
        except KpgoError as e:
            sim_err = str(e)
    tops: dict[str, list[dict[str, Any]]] = {}
    top_err: str | None = None
    try:
        tops = top_functions(profiles, build, top)
    except KpgoError as e:
        top_err = str(e)
    entry = {"similarity": sim, "similarity_error": sim_err, "top": tops, "top_error": top_err}
    atomic.write_json(out_dir / CACHE_NAME, {"key": key, "analysis": entry})
    return Analysis(sim, sim_err, tops, top_err, cached=False)


def top_functions(profiles: dict[str, Path], build: Path, top: int = TOP) -> dict[str, list[dict[str, Any]]]:
    """Per profile its `top` functions by execution count (entry-block count from the arc counters and the CFG):
    name, object (source path without extension), count, share of all function executions."""
    import numpy as np

    from kpgo.analysis import characterize

    rels, _ = characterize.workload_files(profiles.values())
    model = characterize.build_model(build, rels)
    out: dict[str, list[dict[str, Any]]] = {}
    for name, d in profiles.items():
        f = characterize.profile_vectors(model, d)["functions"]
        total = float(f.sum())
        order = np.argsort(-f, kind="stable")[:top]
        rows = []
        for i in order.tolist():
            if f[i] <= 0:
                break
            obj, _, fn = model.function_names[i].rpartition(":")
            rows.append({"function": fn, "object": obj, "count": int(f[i]), "share": float(f[i]) / total if total else 0.0})
        out[name] = rows
    return out


# -- sizes in vmlinux -------------------------------------------------------------------------------------------


@dataclass
class SymSize:
    size: int  # bytes of the function's symbols other than .cold parts (GCC clones .isra/.constprop/.part included)
    cold: int  # bytes of its .cold parts (code GCC split off as unlikely)
    symbols: int  # how many non-cold symbols (static functions of the same name in several objects add up)


def text_sizes(vmlinux: Path) -> dict[str, SymSize]:
    """Function name -> sizes in `vmlinux`, from its function symbols (kpgo.kernel.codesize: the one `nm -S` parse;
    which symbols count is said there). Every symbol adds to its name, aliases included."""
    sizes: dict[str, SymSize] = {}
    for f in codesize.symbols(vmlinux).functions:
        base = f.name.split(".", 1)[0]  # foo.isra.0, foo.cold, foo.constprop.0.cold -> foo
        s = sizes.setdefault(base, SymSize(0, 0, 0))
        if f.name.endswith(".cold") or ".cold." in f.name:
            s.cold += f.size
        else:
            s.size += f.size
            s.symbols += 1
    return sizes
