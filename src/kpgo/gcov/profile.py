"""Kernel profiles as directories: a tree of .gcda files (paths relative to the kernel build directory) plus
profile.json.

API (used by `kpgo profile` and by the pipeline)
    iter_gcda(src) -> Iterator[Path]                 relative paths of the .gcda files, sorted
    profile_stats(src) -> dict                       files, functions, arcs_sum, arcs_max, with_summary, gcov_version, values, ...
    value_counters(idx) -> dict                      value counters by kind (sites, totals, dominant values, ...)
    value_counters_of(g) -> dict                     the same for one parsed file
    fix_profile(src, dst, runs=1) -> dict            copy with a correct object summary in every file (atomic dst)
    arcs_only(src, dst) -> dict                      copy with the arc counters only (a value profile made arc-only)
    read_profile_json(src) -> dict                       profile.json, {} when absent
    load_profile(src) -> (Index, rels)               the whole profile read and indexed at once (kpgo.gcov.gcda)
    write_tree(tmp, items) -> int                    write (relative path, bytes or list of pieces) items
    hot_fraction(src, share) -> dict                 GCC's hot-bb-count-fraction that makes `share` of the work hot

stats and fix read the whole profile into one buffer (memory: the profile size) and check and index all files at
once; files that fail that check (not in the kernel's shape) are read one by one (Index.gcda), with the same results.

The kernel writes .gcda files without the object summary record; GCC >= 9 then ignores the profile ("Profile info is
missing; giving up"). fix_profile adds it with sum_max = the largest arc counter over the whole profile, because the
kernel is one program: each object then judges hotness against the same maximum, as one user-space program would.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from kpgo import inputs
from kpgo.atomic import check_output, output_dir
from kpgo.errors import UserError
from kpgo.gcov.gcda import (
    ARCS,
    ARCS_TAG,
    DAMAGED_HINT,
    TAG_FUNCTION,
    Gcda,
    GcovFormatError,
    Index,
    Sites,
    SummaryWriter,
    counter_tag,
    counter_values,
    gcc_major,
    index_image,
    parse_gcda,
    version_text,
)
from kpgo.gcov.image import gcda_rels, read_file, read_image
from kpgo.records import PROFILE_SHAPE  # what kpgo reads of a profile.json: its home is kpgo.records (the Profile record)

PROFILE_JSON = "profile.json"
# The kernel's gcov code runs the counter reset and the snapshot, not the workload, and exists only in the instrumented
# kernel: `kpgo collect` leaves its files out of a profile, and `kpgo profile compare` skips them in one collected before
# (on the server kernel they were a tenth of a light workload's arc counts and held its largest counter).
APPARATUS = ("kernel/gcov/",)
APPARATUS_WHY = "the kernel's gcov code: the counter reset and the snapshot, not the workload; not in an optimized kernel"


def is_apparatus(rel: str) -> bool:
    return rel.startswith(APPARATUS)


# GCC reads counters as signed 64-bit numbers (gcov_type): a larger count is negative to it, and no kernel counts
# that far (2^63 events), so such a file is damaged, and a merge must not produce one.
GCOV_MAX = (1 << 63) - 1


def impossible_count(path: str, value: int) -> UserError:
    return UserError(f"{path}: arc counter {value} is above 2^63-1, which GCC reads as a negative count "
                     "(an impossible count)", DAMAGED_HINT)


def iter_gcda(src: Path) -> Iterator[Path]:
    """Relative paths of all .gcda files under src, sorted (deterministic output order)."""
    return (Path(p) for p in gcda_rels(src))


def gcda_list(src: Path) -> list[Path]:
    return [Path(p) for p in _rels_or_fail(src)]


def _rels_or_fail(src: Path | str) -> list[str]:
    rels = gcda_rels(src)
    if not rels:
        raise UserError(f"{src}: no .gcda files", "is this a profile directory (collected from an instrumented kernel)?")
    return rels


def read_profile_file(src: Path, rel: Path) -> Gcda:
    path = os.path.join(src, rel)  # str paths: pathlib costs more than the parse on small files
    return parse_gcda(read_file(path), path)


PROFILE_JSON_HINT = "repair or remove it (`kpgo collect` and `kpgo profile fix` write it)"


def read_profile_json(src: Path, strict: bool = True) -> dict[str, Any]:
    """profile.json of the profile directory src, {} when there is none. Not strict (a run's own profiles, whose step
    is done again when its record is unusable): {} for an unusable one too, instead of a UserError."""
    try:
        data = inputs.read_json(Path(src) / PROFILE_JSON, PROFILE_JSON_HINT, PROFILE_SHAPE, missing_ok=True)
    except UserError:
        if strict:
            raise
        data = None
    return {} if data is None else data


def origins(record: dict) -> list[dict]:
    """The collections a profile.json describes: itself, or for a merged profile each input's."""
    if "config_name" in record or "kernel_release" in record:
        return [record]
    merged = record.get("merged")
    ins = merged.get("inputs") if isinstance(merged, dict) else None
    return [o for i in ins or [] if isinstance(i, dict) and isinstance(i.get("profile"), dict) for o in origins(i["profile"])]


def _versions_text(versions: set[int]) -> str:
    """Version words as text, sorted, comma-separated."""
    return ",".join(sorted(version_text(v) for v in versions))


def _exact_sum(v: np.ndarray) -> int:
    """Sum of uint64 values as a Python int, without wrap-around (high and low halves summed apart)."""
    if not len(v):
        return 0
    lo = int((v & np.uint64(0xFFFFFFFF)).sum(dtype=np.uint64))
    hi = int((v >> np.uint64(32)).sum(dtype=np.uint64))
    return (hi << 32) + lo


def load_profile(src: Path | str, rels: list[str] | None = None) -> tuple[Index, list[str]]:
    """Read and index a whole profile (kpgo.gcov.gcda.index_image), or only the files rels of it; returns the index
    and the relative paths."""
    rels = _rels_or_fail(src) if rels is None else rels
    return index_image(read_image(src, rels)), rels


# -- value counters -----------------------------------------------------------------------------------------------
#
# Per counter kind other than arcs. Top-N kinds (topn, indirect_call; GCC >= 11): sites, sites_with_values (n > 0),
# values (pairs), total (sum of the sites' totals, their magnitudes: a total is negative when a merge dropped values),
# dropped (sites with a negative total) and dominant: sites GCC 12 acts on with -fprofile-use -
#   indirect_call: a target (value != 0, count > 0) whose probability count/|total|, in GCC's fixed point rounded to
#     1/10000 (profile_count::probability_in, to_reg_br_prob_base; a count above the total counts as the total), is
#     at least 50%: ipa-profile then makes the call speculative (GCC <= 10 asked for more than 75%);
#   topn: the most frequent value's count is at least half the total (value-prof.cc: division, modulo and string
#     operations by a constant).
# Other kinds: counters, nonzero.

_MAX_PROB = 1 << 27  # profile_probability::max_probability (n_bits 29)
_PROB_BASE = 10000  # REG_BR_PROB_BASE


def ipa_probability(count: int, total: int) -> int:
    """GCC 12's probability of an indirect-call target, in REG_BR_PROB_BASE units (ipa-profile.cc)."""
    if total <= 0 or count <= 0:
        return 0
    count = min(count, total)
    if count == total:
        return _PROB_BASE
    p = (count * _MAX_PROB + total // 2) // total
    return (p * _PROB_BASE + _MAX_PROB // 2) // _MAX_PROB


def _site_figures(kind: str, sites: Sites) -> dict[str, int]:
    n = sites.n
    mag, neg = sites.magnitude()
    has = np.flatnonzero(n > 0)
    counts = sites.counts.copy()
    counts[counts >= np.uint64(1 << 63)] = 0  # a negative count is none
    if kind == "indirect_call":
        counts[sites.values == 0] = 0  # GCC skips a zero target
    top = np.maximum.reduceat(counts, sites.first[has]) if len(has) else np.zeros(0, dtype=np.uint64)
    if kind == "indirect_call":
        dominant = sum(ipa_probability(c, t) >= _PROB_BASE // 2 for c, t in zip(top.tolist(), mag[has].tolist()))
    else:
        dominant = int(np.count_nonzero(2 * top.astype(object) >= mag[has].astype(object))) if len(has) else 0
    return {"sites": len(sites), "sites_with_values": len(has), "values": int(n.sum()), "total": _exact_sum(mag),
            "dropped": int(neg.sum()), "dominant": int(dominant)}


def _add_figures(into: dict[str, dict[str, int]], kind: str, figures: dict[str, int]) -> None:
    have = into.setdefault(kind, dict.fromkeys(figures, 0))
    for k, v in figures.items():
        have[k] += v


def value_counters_of(g: Gcda, into: dict[str, dict[str, int]] | None = None) -> dict[str, dict[str, int]]:
    """The value counters of one parsed file by kind (see above), added into `into` when given."""
    out = {} if into is None else into
    for kind in sorted(g.counter_kinds_present()):
        if kind == ARCS:
            continue
        name = g.layout.kind_name(kind)
        if g.is_topn(kind):
            _add_figures(out, name, _site_figures(name, g.sites(kind)))
        else:
            v = g.counters(kind)
            _add_figures(out, name, {"counters": len(v), "nonzero": int(np.count_nonzero(v))})
    return out


def value_counters(idx: Index, slow: dict[int, Gcda] | None = None) -> dict[str, dict[str, int]]:
    """The value counters of an indexed profile by kind (see above): its fast files at once, the others one by one
    (slow: those already parsed)."""
    out: dict[str, dict[str, int]] = {}
    ver = idx.version[idx.rec_fid]
    for v, lay in sorted(idx.layouts.items()):
        of_version = ver == v if len(idx.layouts) > 1 else np.ones(len(ver), dtype=bool)
        for kind in range(1, len(lay.counter_kinds)):
            recs = (idx.rec_tag == counter_tag(kind)) & of_version
            if not recs.any():
                continue
            name = lay.kind_name(kind)
            if kind in lay.topn_kinds:
                _add_figures(out, name, _site_figures(name, idx.sites(recs)[0]))
            else:
                lo, _ = idx.counter_slots(recs)
                c = counter_values(idx.image.words, lo)
                _add_figures(out, name, {"counters": len(c), "nonzero": int(np.count_nonzero(c))})
    for k in idx.slow():
        g = slow[k] if slow is not None and k in slow else idx.gcda(k)
        value_counters_of(g, out)
    return dict(sorted(out.items()))


def profile_stats(src: Path) -> dict[str, Any]:
    """Counts over a profile. Keys: files, functions (FUNCTION records with data), arcs (arc counters), arcs_sum,
    arcs_max, arcs_nonzero, with_summary (files carrying an object summary), gcov_version (text; comma-separated if
    mixed), stamps (distinct stamps), bytes (payload bytes: the files without their header and record headers),
    values (value counters by kind: see value_counters; {} for an arc profile)."""
    idx, rels = load_profile(src)
    img = idx.image
    fast = idx.fast
    # Files that pass the whole-profile check, all at once.
    functions = int(np.count_nonzero((idx.rec_tag == TAG_FUNCTION) & (idx.rec_len >= 3)))
    lo, _ = idx.counter_slots(idx.rec_tag == ARCS_TAG)
    v = counter_values(img.words, lo)
    arcs = len(v)
    arcs_sum = _exact_sum(v)
    arcs_max = int(v.max()) if len(v) else 0
    nonzero = int(np.count_nonzero(v))
    del v
    srec = idx.summary_records()
    with_summary = len(set(idx.rec_fid[srec[idx.rec_len[srec] >= 2]].tolist()))
    nrec = np.diff(idx.rec_first)
    trailer = img.wstart[:-1] + img.size // 4 - idx.rend  # words from an end marker on
    nbytes = int((img.size - 4 * idx.hw - 8 * nrec - 4 * trailer)[fast].sum())
    versions = set(idx.version[fast].tolist())
    stamps = set(idx.stamp[fast].tolist())
    # The others one by one (the walk also names the first defective file).
    slow: dict[int, Gcda] = {}
    for k in idx.slow():
        g = slow[k] = idx.gcda(k)
        nbytes += len(g.payload) * 4
        versions.add(g.version)
        stamps.add(g.stamp)
        fsel = g.tags == TAG_FUNCTION
        functions += int(np.count_nonzero(np.diff(g.offsets)[fsel] >= 3))
        if g.summary is not None:
            with_summary += 1
        v = g.counters(ARCS)
        arcs += len(v)
        if len(v):
            arcs_sum += _exact_sum(v)
            arcs_max = max(arcs_max, int(v.max()))
            nonzero += int(np.count_nonzero(v))
    return {
        "files": len(rels),
        "functions": functions,
        "arcs": arcs,
        "arcs_sum": arcs_sum,
        "arcs_max": arcs_max,
        "arcs_nonzero": nonzero,
        "with_summary": with_summary,
        "gcov_version": _versions_text(versions),
        "stamps": len(stamps),
        "bytes": nbytes,
        "values": value_counters(idx, slow),
    }


Data = bytes | bytearray | memoryview | Sequence[bytes | memoryview]


def write_tree(tmp: Path, items: Iterable[tuple[Path | str, Data]]) -> int:
    """Write files under a temporary output directory (the directory itself becomes visible atomically). Each item
    is (relative path, bytes) or (relative path, list of byte pieces written back to back)."""
    made: set[str] = {""}
    prefix = os.path.join(os.fspath(tmp), "")
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0)
    n = 0
    for rel, data in items:
        rel = os.fspath(rel)
        path = prefix + rel
        d = rel.rpartition("/")[0]
        if d not in made:
            os.makedirs(prefix + d, exist_ok=True)
            made.add(d)
        pieces = [data] if isinstance(data, (bytes, bytearray, memoryview)) else list(data)
        fd = os.open(path, flags, 0o666)
        try:
            total = sum(len(p) for p in pieces)
            done = os.writev(fd, pieces) if len(pieces) > 1 else os.write(fd, pieces[0])
            if done < total:  # short write (rare): write the rest piece by piece
                rest = b"".join(bytes(p) for p in pieces)[done:]
                while rest:
                    rest = rest[os.write(fd, rest):]
        finally:
            os.close(fd)
        n += 1
    return n


def _scan(idx: Index, strict: bool) -> tuple[int, int, set[int], dict[int, Gcda]]:
    """What fix and the build's check need of a whole profile: the largest arc counter, the files with an object
    summary, the gcov version words, and the files that failed the fast check, read one by one (a damaged one is a
    one-line error naming it). strict: counters GCC cannot read are refused."""
    img = idx.image
    lo, fid = idx.counter_slots(idx.rec_tag == ARCS_TAG)
    v = counter_values(img.words, lo)
    global_max = int(v.max()) if len(v) else 0
    if strict and global_max > GCOV_MAX:
        k = int(np.argmax(v > np.uint64(GCOV_MAX)))
        raise impossible_count(img.path(int(fid[k])), int(v[k]))
    del v, lo, fid
    srec = idx.summary_records()
    had = len(set(idx.rec_fid[srec[idx.rec_len[srec] >= 2]].tolist()))
    versions = set(idx.version[idx.fast].tolist())
    slow: dict[int, Gcda] = {}
    for k in idx.slow():
        g = idx.gcda(k)
        slow[k] = g
        versions.add(g.version)
        if g.summary is not None:
            had += 1
        c = g.counters(ARCS)
        if len(c):
            top = int(c.max())
            if strict and top > GCOV_MAX:
                raise impossible_count(img.path(k), top)
            global_max = max(global_max, top)
    return global_max, had, versions, slow


def _one_version(src: Path | str, versions: set[int]) -> None:
    """One build is compiled by one GCC: files of several gcov versions in one profile come from several builds."""
    if len(versions) > 1:
        raise UserError(f"{src} mixes .gcda files of {len(versions)} gcov versions ({_versions_text(versions)}), "
                        "so they come from different builds", "collect the profile again from one instrumented build")


def check_for_build(src: Path) -> dict[str, Any]:
    """What an optimized build needs of a profile, checked before the build starts: every file readable, counts
    GCC can read, one gcov version, and an object summary in every file (the kernel writes none, and GCC then
    ignores the profile). Returns files, gcov_version (text) and gcc_major (of that version)."""
    idx, rels = load_profile(src)
    _, had, versions, _ = _scan(idx, strict=True)
    _one_version(src, versions)
    if had < len(rels):
        raise UserError(f"{src}: {len(rels) - had} of {len(rels)} .gcda files have no object summary (a raw kernel "
                        "profile), so GCC would ignore them", f"run `kpgo profile fix {src} -o {src}.fixed` and pass that")
    version = next(iter(versions))
    return {"files": len(rels), "gcov_version": version_text(version), "gcc_major": gcc_major(version)}


def fix_profile(src: Path, dst: Path, runs: int = 1, strict: bool = False) -> dict[str, Any]:
    """Copy the profile src to dst with one correct object summary per file: runs, and sum_max = the largest arc
    counter over the whole profile (clamped to 32 bits, as GCC stores it). The layout of each file's GCC is kept.
    The measurement apparatus's files (APPARATUS), which a profile collected before kpgo left them out holds, are
    left out here too (listed as left_out): they are not the workload, and their counters would set sum_max.

    dst appears only when complete; src is never modified. With strict (`kpgo profile fix`), files of several gcov
    versions (so of several builds) and counters GCC cannot read (above 2^63-1) are refused; without, each file is
    fixed as it is, in its own layout. Returns stats: files, runs, sum_max, sum_max_clamped,
    had_summary, gcov_version.

    The whole profile is read into one buffer (memory: the profile size) and checked at once; each output file is
    its header, the new summary record and the rest of the input file (without its old summaries), written from
    that buffer without a rebuild. Files that fail the whole-profile check go through the full parser."""
    src, dst = Path(src), Path(dst)
    if runs < 1 or runs > 0xFFFFFFFF:
        raise UserError(f"--summary-runs {runs} is out of range (the object summary holds 1 to 4294967295 runs)",
                        "give a smaller --summary-runs")
    check_output(dst, inputs=[src])
    every = _rels_or_fail(src)
    apparatus = [r for r in every if is_apparatus(r)]  # in a profile collected before `kpgo collect` left them out
    if len(apparatus) == len(every):
        raise UserError(f"{src} holds only the kernel's gcov code's files ({APPARATUS[0]}), which are not the workload",
                        "give a profile collected with `kpgo collect`")
    idx, rels = load_profile(src, [r for r in every if not is_apparatus(r)])
    img = idx.image
    global_max, had, versions, slow = _scan(idx, strict)
    if strict:
        _one_version(src, versions)
    sum_max = min(global_max, 0xFFFFFFFF)
    info = read_profile_json(src)
    buf = memoryview(img.buf)
    writer = SummaryWriter(idx, buf, runs, sum_max)

    def items() -> Iterator[tuple[str, Data]]:
        for k, rel in enumerate(rels):
            g = slow.get(k)
            yield rel, writer.pieces(k) if g is None else g.with_summary(runs, sum_max).to_bytes()

    with output_dir(dst) as tmp:
        write_tree(tmp, items())
        info = dict(info)
        info["fixed"] = {"runs": runs, "sum_max": sum_max, "max_counter": global_max, "source": str(src), "left_out": apparatus}
        (tmp / PROFILE_JSON).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    buf.release()
    return {
        "files": len(rels),
        "runs": runs,
        "sum_max": sum_max,
        "max_counter": global_max,
        "sum_max_clamped": global_max > sum_max,
        "had_summary": had,
        "gcov_version": _versions_text(versions),
        "left_out": apparatus,
    }


def arcs_only(src: Path, dst: Path, time_profile: bool = False) -> dict[str, Any]:
    """Copy the profile src to dst with its arc counters only: a value profile (`--values`) as an arc-only kernel
    would have collected it, so that an arc-only PGO kernel built from it differs from the value-profiled one in the
    value transforms alone (and time_profiler's function order: -fprofile-values adds that kind too). With
    time_profile, time_profiler stays and the value counters stay as zeros instead (Gcda.values_zeroed), to separate
    the two. Function records and object summaries stay; src is never modified; dst appears only when complete.
    Returns files and dropped (counters per kind name: left out, or zeroed with time_profile)."""
    src, dst = Path(src), Path(dst)
    check_output(dst, inputs=[src])
    rels = _rels_or_fail(src)
    info = read_profile_json(src)
    dropped: dict[str, int] = {}

    def items() -> Iterator[tuple[Path, bytes]]:
        for rel in map(Path, rels):
            g = read_profile_file(src, rel)
            for kind in sorted(g.counter_kinds_present() - {ARCS}):
                name = g.layout.kind_name(kind)
                if not (time_profile and name == "time_profiler"):
                    dropped[name] = dropped.get(name, 0) + g.counter_count(kind)
            yield rel, (g.values_zeroed() if time_profile else g.arcs_only()).to_bytes()

    with output_dir(dst) as tmp:
        write_tree(tmp, items())
        info = dict(info)
        info["arcs_only"] = {"source": str(src), "dropped": dict(sorted(dropped.items())), "time_profile": time_profile}
        (tmp / PROFILE_JSON).write_text(json.dumps(info, indent=2, sort_keys=True) + "\n")
    return {"files": len(rels), "dropped": dict(sorted(dropped.items()))}


def hot_fraction(src: Path, share: float) -> dict[str, Any]:
    """The --param=hot-bb-count-fraction=F under which the counters holding the hottest `share` of a profile's
    counted executions are hot, and the rest of the executed code is optimized for size.

    With a profile, GCC takes a count as hot when it is at least sum_max / F (predict.cc, get_hot_bb_threshold;
    default F = 10000) and optimizes blocks below it for size; sum_max is the one fix_profile wrote (the profile's
    largest arc counter, as GCC reads it: 32 bits). The threshold T is the smallest count among the hottest arc
    counters that together reach `share` of the sum of all arc counters (GCC's own working-set cut, param
    hot-bb-count-ws-permille, is per object without LTO; this one is over the whole kernel, like the summary)."""
    if not 0 < share < 1:
        raise UserError(f"--hot-share {share} is not between 0 and 1", "give the share of the executed work to keep hot, e.g. 0.99")
    idx, _ = load_profile(src)
    lo, _ = idx.counter_slots(idx.rec_tag == ARCS_TAG)
    parts = [counter_values(idx.image.words, lo)] + [idx.gcda(k).counters(ARCS) for k in idx.slow()]
    v = np.concatenate(parts)
    v = np.sort(v[v > 0])[::-1]
    if not len(v):
        raise UserError(f"{src}: every arc counter is zero, so no code is hot", "collect the profile again under load")
    cum = np.cumsum(v.astype(np.float64))
    k = min(int(np.searchsorted(cum, share * cum[-1])), len(v) - 1)
    threshold = int(v[k])
    sum_max = min(int(v[0]), 0xFFFFFFFF)
    fraction = max(1, sum_max // max(threshold, 1))
    return {"share": share, "threshold": threshold, "fraction": fraction, "sum_max": sum_max, "gcc_threshold": sum_max // fraction,
            "hot_counters": k + 1, "executed_counters": len(v)}


__all__ = [
    "GcovFormatError",
    "GCOV_MAX",
    "PROFILE_JSON",
    "check_for_build",
    "fix_profile",
    "gcda_list",
    "hot_fraction",
    "iter_gcda",
    "load_profile",
    "profile_stats",
    "read_profile_json",
    "read_profile_file",
    "write_tree",
]
