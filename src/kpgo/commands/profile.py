"""`kpgo profile`: read, repair, merge, validate and compare kernel profiles (directories of .gcda files).

    kpgo profile stats DIR [--json] [--values [--build BUILD_DIR]]
    kpgo profile fix DIR -o OUT [--summary-runs N]
    kpgo profile arcs DIR -o OUT
    kpgo profile merge DIR... -o OUT [--weights w1,w2,...] [--normalize] [--cluster ADDRESS [--fan-in K]]  (gcov or branch profiles)
    kpgo profile afdo BRANCH_DIR... -o OUT [--weights w1,w2,...] [--normalize]
    kpgo profile check DIR --build BUILD_DIR [--json]
    kpgo profile compare DIR... --build BUILD_DIR [--json] [--plot PREFIX]
    kpgo profile port DIR --from OLD_BUILD --to NEW_BUILD -o OUT [--json]

See docs/PROFILES.md for the JSON keys and the exact definitions of the similarity metrics."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("profile", help="read, repair, merge, validate and compare kernel profiles",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="profile_command", metavar="ACTION")
    p.set_defaults(func=lambda args: (p.print_help(), 2)[1])

    s = sub.add_parser("stats", help="counts over a profile (files, functions, arc counters, summary, version; or a branch profile's records)")
    s.add_argument("dir", type=Path, help="profile directory (gcov, or branches from `kpgo collect --branches`)")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.add_argument("--values", action="store_true",
                   help="list the indirect calls with a dominant target (>= 50%%, which GCC 12 promotes) and say where each "
                   "target is defined: in the caller's object, in another one (out of reach without LTO), or nowhere in the profile")
    s.add_argument("--build", type=Path, metavar="BUILD_DIR",
                   help="with --values: the instrumented build whose .gcno files name the functions (default: the one profile.json names)")
    s.set_defaults(func=run_stats)

    f = sub.add_parser("fix", help="add or correct the object summary the kernel leaves out")
    f.add_argument("dir", type=Path, help="profile directory (never modified)")
    f.add_argument("-o", "--out", type=Path, required=True, metavar="DIR", help="output profile directory (must not exist)")
    f.add_argument("--summary-runs", type=int, default=1, metavar="N", help="runs recorded in the object summary (default 1)")
    f.add_argument("--json", action="store_true", help="print the result as JSON")
    f.set_defaults(func=run_fix)

    a = sub.add_parser("arcs", help="copy a value profile with its arc counters only (an arc-only PGO kernel from the same run)",
                       description="Copy the profile with its arc counters only, dropping the value counters (and "
                       "time_profiler) a --values kernel records: an optimized kernel built from the copy differs from "
                       "the one built from DIR in the value transforms alone (docs/VALUES.md).")
    a.add_argument("dir", type=Path, help="profile directory (never modified)")
    a.add_argument("-o", "--out", type=Path, required=True, metavar="DIR", help="output profile directory (must not exist)")
    a.add_argument("--time-profile", action="store_true",
                   help="keep the time_profiler counters too (GCC orders functions by when they first ran), and the "
                   "value counters as zeros (gcc-12 crashes on time_profiler without them): a kernel built from this "
                   "copy differs from the value-profiled one in the value transforms only")
    a.add_argument("--json", action="store_true", help="print the result as JSON")
    a.set_defaults(func=run_arcs)

    m = sub.add_parser("merge", help="N-way weighted merge of profiles of one build (a universal profile); gcov or branch profiles",
                       description="Merge gcov profiles collected on one instrumented build (a universal profile for --profile), or "
                       "branch profiles recorded on one kernel (`kpgo collect --branches`; a universal profile for BOLT and the "
                       "function order: their records added up, docs/LAYOUT.md).")
    m.add_argument("dirs", type=Path, nargs="+", metavar="DIR", help="profile directories")
    m.add_argument("-o", "--out", type=Path, required=True, metavar="DIR", help="output profile directory (must not exist)")
    m.add_argument("--weights", help="comma-separated weights, one per input (default all 1)")
    m.add_argument("--normalize", action="store_true",
                   help="scale each input to the same total arc count (branch profiles: recorded branches) before weighting")
    m.add_argument("--summary-runs", type=int, default=None, metavar="N", help="runs recorded in the output's object summary (default: sum of inputs)")
    m.add_argument("--json", action="store_true", help="print the result as JSON")
    m.add_argument("--cluster", metavar="ADDRESS",
                   help="merge as a tree of Ray tasks: a Ray address (host:port), auto, or local (needs kpgo[cluster]; docs/SCALE.md)")
    m.add_argument("--fan-in", type=int, default=None, metavar="K",
                   help="with --cluster: inputs (or partial merges) one task reads, at most (default 16)")
    m.set_defaults(func=run_merge)

    d = sub.add_parser("afdo", help="a Clang sample profile (AutoFDO) from branch records of the clang-train kernel",
                       description="Turn branch profiles recorded on one clang-train kernel (`kpgo collect BUILD --branches`) "
                       "into a Clang sample profile with llvm-profgen --kernel, merging several with llvm-profdata (a universal "
                       "profile), for `kpgo build --variant clang-afdo --profile OUT` (docs/CLANG.md).")
    d.add_argument("dirs", type=Path, nargs="+", metavar="BRANCH_DIR", help="branch profile directories of one training kernel")
    d.add_argument("-o", "--out", type=Path, required=True, metavar="DIR", help="output profile directory (must not exist)")
    d.add_argument("--weights", help="comma-separated weights, one per input (default all 1)")
    d.add_argument("--normalize", action="store_true", help="scale each input to the same total samples before weighting")
    d.add_argument("--json", action="store_true", help="print the manifest as JSON")
    d.set_defaults(func=run_afdo)

    c = sub.add_parser("check", help="match each .gcda to the instrumented build's .gcno")
    c.add_argument("dir", type=Path, help="profile directory")
    c.add_argument("--build", type=Path, required=True, help="instrumented kernel build directory (with .gcno)")
    c.add_argument("--json", action="store_true", help="print one JSON object")
    c.add_argument("--strict", action="store_true", help="exit 1 unless every file matches")
    c.set_defaults(func=run_check)

    k = sub.add_parser("compare", help="pairwise similarity of profiles (\"One Profile Fits All\" metrics)")
    k.add_argument("dirs", type=Path, nargs="+", metavar="DIR", help="profile directories (two or more)")
    k.add_argument("--build", type=Path, required=True, help="instrumented kernel build directory (with .gcno)")
    k.add_argument("--names", help="comma-separated labels for the profiles (default: directory names)")
    k.add_argument("--json", action="store_true", help="print one JSON object")
    k.add_argument("--plot", metavar="PREFIX", help="write PREFIX-<metric>.png heatmaps")
    k.set_defaults(func=run_compare)

    t = sub.add_parser("port", help="carry a profile over to a new instrumented build (a point release): matched functions keep their counters",
                       description="Port a profile collected on OLD_BUILD to NEW_BUILD (both instrumented builds, with .gcno). "
                       "Functions are matched by name: those whose CFG is unchanged keep their counters (under the new build's "
                       "checksums, where only their lines moved); those whose CFG changed get counts mapped by source lines and "
                       "structure and made consistent again (flow conservation), or are dropped when too little maps (GCC then "
                       "estimates them). The report gives the profile weight (sum of arc counters) kept, carried, mapped and "
                       "dropped, per object and in total; OUT is a profile for `kpgo build --profile` (docs/PROFILES.md).")
    t.add_argument("dir", type=Path, help="profile directory collected on OLD_BUILD (never modified)")
    t.add_argument("--from", dest="old", type=Path, required=True, metavar="OLD_BUILD", help="instrumented build the profile was collected on")
    t.add_argument("--to", dest="new", type=Path, required=True, metavar="NEW_BUILD", help="instrumented build of the new source")
    t.add_argument("-o", "--out", type=Path, required=True, metavar="DIR", help="output profile directory (must not exist)")
    t.add_argument("--json", action="store_true", help="print the port report as JSON")
    t.set_defaults(func=run_port)


def _quiet_numpy() -> None:
    """These commands use no multi-threaded BLAS: one thread makes importing numpy ~50 ms faster (OpenBLAS starts
    a thread per CPU on import), which matters for commands that take a fraction of a second."""
    if "numpy" not in sys.modules:
        os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def _print_json(obj: Any) -> None:
    from kpgo.progress import print_json

    print_json(obj)


def _table(rows: list[tuple[str, Any]]) -> None:
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def run_stats(args: argparse.Namespace) -> int:
    _quiet_numpy()
    if _is_branch_profile(args.dir):
        return _branch_stats(args)
    from kpgo import afdo

    if afdo.is_sample_profile(args.dir):
        return _sample_stats(args)
    from kpgo.gcov.profile import profile_stats

    if args.build is not None and not args.values:
        from kpgo.errors import UserError

        raise UserError("--build names the functions of --values", "add --values, or leave --build out")
    st = profile_stats(args.dir)
    if args.values:
        st["indirect_sites"] = _indirect_sites(args.dir, args.build)
    if args.json:
        _print_json(st)
        return 0
    _table([
        ("files", st["files"]),
        ("functions", st["functions"]),
        ("arc counters", f"{st['arcs']} ({st['arcs_nonzero']} non-zero)"),
        ("arcs sum", st["arcs_sum"]),
        ("arcs max", st["arcs_max"]),
        ("with summary", f"{st['with_summary']} of {st['files']}"),
        ("gcov version", st["gcov_version"]),
        ("build stamps", st["stamps"]),
    ])
    for line in value_lines(st["values"]):
        print(line)
    if args.values:
        for line in indirect_site_lines(st["indirect_sites"]):
            print(line)
    return 0


SHOWN_SITES = 20  # the hottest sites `stats --values` prints (--json: all)


def _indirect_sites(profile: Path, build: Path | None) -> dict[str, Any]:
    """kpgo.analysis.values.site_summary of a profile, the functions named from `build` or from the instrumented build
    profile.json names (when its .gcno files are still there)."""
    from kpgo.analysis.values import dominant_sites, site_summary
    from kpgo.errors import UserError
    from kpgo.gcov.profile import read_profile_json

    if build is not None and not build.is_dir():
        raise UserError(f"--build {build} is not a directory", "give the instrumented build directory (with its .gcno files)")
    if build is None:
        named = read_profile_json(profile, strict=False).get("build_dir")
        build = Path(named) if isinstance(named, str) and Path(named).is_dir() else None
    res = site_summary(dominant_sites(profile, build))
    res["names_from"] = str(build) if build is not None else None
    return res


def indirect_site_lines(res: dict[str, Any]) -> list[str]:
    """`stats --values` as text: the counts, then the hottest sites."""
    out = [f"indirect calls with a dominant target (>= 50%, which GCC 12 promotes): {res['sites_with_dominant_target']}; the target in "
           f"the caller's object {res['target_in_same_object']}, in another object {res['target_in_another_object']} (out of reach "
           f"without LTO), not in the profile {res['target_not_in_profile']}"]
    if res["names_from"] is None:
        out.append("  (functions named by ident: give --build with the instrumented build to name them)")
    for s in res["sites"][:SHOWN_SITES]:
        out.append(f"  {s['caller']} -> {s['target']}  {s['count']:,} of {s['all']:,}  ({s['object']}; {s['where']})")
    if len(res["sites"]) > SHOWN_SITES:
        out.append(f"  ... {len(res['sites']) - SHOWN_SITES} more (--json lists them all)")
    return out


def _is_branch_profile(path: Path) -> bool:
    from kpgo.branches import PROFILE_KIND
    from kpgo.gcov.profile import read_profile_json

    # not strict: a gcov profile's profile.json is checked where it is used (stats reads none of it)
    return read_profile_json(path, strict=False).get("kind") == PROFILE_KIND


def _branch_stats(args: argparse.Namespace) -> int:
    """A branch profile (kpgo.branches): its records read again (build id and completeness checked) and the manifest."""
    from kpgo.branches import read_profile

    st = read_profile(args.dir)
    if args.json:
        _print_json(st)
        return 0
    rec, samp = st["records"], st.get("sampling", {})
    lost = rec["lost_edges"] + rec["lost_ranges"] + rec["lost_samples"]
    _table([
        ("kind", "branch records (QEMU plugin)"),
        ("kernel", f"{st.get('kernel_release')} (build id {rec['build_id']})"),
        ("workload", f"{st['workload']['name']}, {st.get('throughput', 0):.0f} {st['workload']['unit']}, window {st.get('window_seconds')} s"),
        ("recorded branches", f"{rec['branches']} ({rec['side']} side, {rec['windows']} window(s), {rec['vcpus']} vCPU(s))"),
        ("edges", f"{rec['edges']} distinct, {rec['edge_count']} executions"),
        ("ranges", f"{rec['ranges']} distinct, {rec['range_count']} executions"),
        ("sampled stacks", f"{rec['samples']} samples every {rec['period']} branches, {rec['stacks']} distinct, {rec['depth']} entries"),
        ("lost at the bounds", f"{lost} (edges {rec['lost_edges']}, ranges {rec['lost_ranges']}, samples {rec['lost_samples']})"),
        ("in vmlinux functions", f"{st.get('in_functions', float('nan')):.4f}"),
        ("samples vs exact", f"spearman {samp.get('spearman')}, cosine {samp.get('cosine')}, hottest 1% overlap {samp.get('hot1pct_overlap')} "
                             f"over {samp.get('functions')} functions"),
        ("call graph", f"{st.get('call_graph', {}).get('edges')} caller -> callee edges"),
        ("files", ", ".join(f"{k} {v:,} B" for k, v in st["files"].items())),
    ])
    for f in st.get("hot_functions", [])[:5]:
        print(f"  hot: {f['function']} ({f['branches']} branches)")
    return 0


def _sample_stats(args: argparse.Namespace) -> int:
    """A Clang sample profile (kpgo.afdo): its manifest, checked, with the profile parsed again."""
    from kpgo import afdo

    st = afdo.check_for_build(args.dir)
    if args.json:
        _print_json(st)
        return 0
    inputs = ", ".join(f"{i.get('workload') or i['dir']} (weight {i['weight']:g})" for i in st["inputs"])
    _table([
        ("kind", "Clang sample profile (AutoFDO, from branch records)"),
        ("training kernel", f"{st['vmlinux']} (build id {st['build_id']})"),
        ("inputs", inputs + (", normalized" if st["normalized"] else "")),
        ("functions", f"{st['functions']:,}"),
        ("samples", f"{st['samples']:,}"),
        ("tools", ", ".join(f"{k} {v}" for k, v in st["tools"].items())),
    ])
    for f in st["hot_functions"][:5]:
        print(f"  hot: {f['function']} ({f['samples']:,} samples)")
    return 0


# What "dominant" means per kind in the text (docs/PROFILES.md, kpgo.gcov.profile).
_DOMINANT = {"indirect_call": "with a target >= 50%, which GCC 12 promotes", "topn": "with a value >= 50%"}


def value_lines(values: dict[str, dict[str, int]], indent: str = "") -> list[str]:
    """The value counters of `kpgo profile stats --json` ("values") as text, one line per kind."""
    if not values:
        return []
    width = max(len(k) for k in values)
    out = [f"{indent}value counters:"]
    for kind, v in values.items():
        if "sites" in v:
            text = (f"{v['sites']} sites, {v['sites_with_values']} with values ({v['values']} values), total {v['total']}, "
                    f"{v['dominant']} {_DOMINANT.get(kind, 'dominant')}")
            if v["dropped"]:
                text += f", {v['dropped']} that lost values in a merge"
        else:
            text = f"{v['counters']} counters ({v['nonzero']} non-zero)"
        out.append(f"{indent}  {kind:<{width}}  {text}")
    return out


def run_fix(args: argparse.Namespace) -> int:
    _quiet_numpy()
    from kpgo.gcov.profile import fix_profile

    res = fix_profile(args.dir, args.out, runs=args.summary_runs, strict=True)
    if args.json:
        _print_json(res)
    else:
        clamp = " (clamped to 32 bits)" if res["sum_max_clamped"] else ""
        gone = f"; left out {len(res['left_out'])} files of the kernel's gcov code (its counters are the reset and the snapshot)" if res["left_out"] else ""
        print(f"fixed {res['files']} files -> {args.out}: runs={res['runs']} sum_max={res['sum_max']}{clamp}{gone}")
    return 0


def run_arcs(args: argparse.Namespace) -> int:
    _quiet_numpy()
    from kpgo.gcov.profile import arcs_only

    res = arcs_only(args.dir, args.out, time_profile=args.time_profile)
    if args.json:
        _print_json(res)
    else:
        none = "none: it held no value counters" if args.time_profile else "none: it held arc counters only"
        dropped = ", ".join(f"{kind} {n:,}" for kind, n in res["dropped"].items()) or none
        if args.time_profile:
            print(f"copied {res['files']} files with their arc and time_profiler counters -> {args.out}; value counters zeroed: {dropped}")
        else:
            print(f"copied {res['files']} files with their arc counters only -> {args.out}; counters dropped: {dropped}")
    return 0


def _given_once(dirs: list[Path]) -> None:
    from kpgo.errors import UserError

    seen = [d.resolve() for d in dirs]
    twice = [d for i, d in enumerate(dirs) if seen[i] in seen[:i]]
    if twice:
        # Most likely a slip of the shell; counting a profile twice is what --weights is for.
        raise UserError(f"profile {twice[0]} is given twice", "give each profile once; --weights counts one more than once")


def run_merge(args: argparse.Namespace) -> int:
    _quiet_numpy()
    from kpgo.errors import UserError
    from kpgo.gcov.merge import merge_profiles, parse_weights

    weights = parse_weights(args.weights, len(args.dirs))
    _given_once(args.dirs)
    kinds = {_is_branch_profile(d) for d in args.dirs}
    if kinds == {True}:
        return _merge_branches(args, weights)
    if len(kinds) > 1:
        raise UserError("the inputs mix branch profiles and gcov profiles", "merge profiles of one kind")
    if args.fan_in is not None and not args.cluster:
        raise UserError("--fan-in is for a merge on a cluster", "add --cluster ADDRESS (local: this machine), or leave --fan-in out")
    if args.cluster:
        from kpgo.cluster import Cluster

        res = Cluster(args.cluster).merge(args.dirs, args.out, weights=weights, normalize=args.normalize, runs=args.summary_runs, strict=True,
                                          fan_in=args.fan_in or 16)
    else:
        res = merge_profiles(args.dirs, args.out, weights=weights, normalize=args.normalize, runs=args.summary_runs, strict=True)
    if args.json:
        _print_json(res)
    else:
        print(f"merged {len(args.dirs)} profiles ({res['files']} files) -> {args.out}: "
              f"weights={res['weights']} sum_max={res['sum_max']}")
    return 0


def _merge_branches(args: argparse.Namespace, weights: list[float] | None) -> int:
    """`kpgo profile merge` of branch profiles (kpgo.branches.merge): the records of one kernel added up."""
    from kpgo import branches
    from kpgo.errors import UserError

    for given, option in ((args.cluster, "--cluster"), (args.fan_in, "--fan-in"), (args.summary_runs, "--summary-runs")):
        if given is not None:
            raise UserError(f"{option} is for gcov profiles, not branch profiles", f"leave {option} out")
    res = branches.merge(args.dirs, args.out, weights=weights, normalize=args.normalize)
    if args.json:
        _print_json(res)
    else:
        rec = res["records"]
        print(f"merged {len(args.dirs)} branch profiles -> {args.out}: {rec['branches']:,} kernel branches, {rec['edges']:,} edges, "
              f"{rec['ranges']:,} ranges, {rec['stacks']:,} distinct stacks; factors "
              + ",".join(f"{i['factor']:g}" for i in res["merged"]["inputs"]))
    return 0


def run_afdo(args: argparse.Namespace) -> int:
    from kpgo import afdo
    from kpgo.gcov.merge import parse_weights

    weights = parse_weights(args.weights, len(args.dirs))
    _given_once(args.dirs)
    res = afdo.make(args.dirs, args.out, weights=weights, normalize=args.normalize)
    if args.json:
        _print_json(res)
    else:
        hot = ", ".join(f["function"] for f in res["hot_functions"][:3])
        print(f"sample profile of {len(args.dirs)} branch profile(s) -> {args.out}: {res['functions']:,} functions, "
              f"{res['samples']:,} samples (hottest: {hot})")
    return 0


def run_check(args: argparse.Namespace) -> int:
    _quiet_numpy()
    from kpgo.gcov.validate import check_profile

    res = check_profile(args.dir, args.build)
    if args.json:
        _print_json(res)
    else:
        t = res["total"]
        print(f"{t['matched']} matched, {t['stale']} stale, {t['missing']} missing "
              f"(of {t['files']} .gcda; {res['gcno_without_gcda']} .gcno without .gcda)")
        g = res["gcc"]
        weight = sum(v["arcs_sum"] for v in g.values()) or 1
        rk = res.get("rekeyed_from")
        print("GCC, function by function" + (f" (the profile re-keyed from {rk} for this build's tree, as `kpgo build` installs it)" if rk else "")
              + ": " + ", ".join(f"{s} {v['functions']:,} ({v['arcs_sum'] / weight:.1%} of the arc counts)" for s, v in g.items()))
        bad = {d: c for d, c in res["directories"].items() if c["stale"] or c["missing"]}
        for d, c in sorted(bad.items()):
            print(f"  {d or '.'}: {c['matched']} matched, {c['stale']} stale, {c['missing']} missing")
        for p in res["problems"][:20]:
            print(f"  {p['file']}: {p['status']}: {p['reason']}")
        if len(res["problems"]) > 20:
            print(f"  ... {len(res['problems']) - 20} more (use --json)")
        for line in value_lines(res["values"]):
            print(line)
    t = res["total"]
    return 1 if args.strict and (t["stale"] or t["missing"]) else 0


def run_port(args: argparse.Namespace) -> int:
    _quiet_numpy()
    from kpgo.gcov.port import port_profile, report_lines

    report = port_profile(args.dir, args.old, args.new, args.out)
    if args.json:
        _print_json(report)
        return 0
    for line in report_lines(report):
        print(line)
    print(f"ported profile -> {args.out} (report in its profile.json, \"ported\")")
    return 0


def run_compare(args: argparse.Namespace) -> int:
    _quiet_numpy()
    from kpgo.analysis.characterize import compare_profiles
    from kpgo.errors import UserError

    names = args.names.split(",") if args.names else None
    labels = names or [d.name for d in args.dirs]
    twice = sorted({n for n in labels if labels.count(n) > 1})
    if twice:
        # Rows and columns of the matrices are told apart only by their labels.
        raise UserError(f"label {twice[0]} names two profiles", "give distinct --names (or directories with distinct names)")
    if args.plot:
        from kpgo.atomic import check_writable

        check_writable(Path(args.plot).parent, "plot directory", "--plot")
    res = compare_profiles(args.dirs, args.build, names=names, plot_prefix=args.plot)
    if args.json:
        _print_json(res)
        return 0
    labels = res["names"]
    for metric in ("function_cosine", "branch_cosine", "taken_l0", "taken_l1", "taken_l2"):
        print(f"{metric}:")
        mat = res["matrices"][metric]
        w = max(8, max(len(n) for n in labels))
        print(" " * w + "".join(f"{n[:w]:>{w + 1}}" for n in labels))
        for n, row in zip(labels, mat):
            print(f"{n[:w]:<{w}}" + "".join(f"{x:>{w + 1}.4f}" for x in row))
    for name, values in zip(labels, res["values"]):
        for line in value_lines(values):
            print(f"{name}: {line}" if line.endswith(":") else line)
    for path in res.get("plots", []):
        print(f"wrote {path}")
    return 0
