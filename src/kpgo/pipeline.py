"""`kpgo run`: the whole loop as cached steps under one run directory.

  RUN/builds/instrumented   RUN/profiles/<wl>.raw -> RUN/profiles/<wl>   RUN/builds/optimized-<wl> (+ proof)
  RUN/builds/vanilla        RUN/bench/ (one design, all kernels)          RUN/summary.md, RUN/run.json

With several workloads, each gets its own profile and its own optimized kernel (app-specific PGO);
one bench measures vanilla on every workload and each optimized kernel on its own workload.
Studies add to that: `universal` merges the workloads' profiles (raw sums and normalized, each
profile scaled to the same total) into RUN/profiles/universal-{raw,norm}, builds those kernels
and measures them on every workload; `cross` measures every optimized kernel on every workload;
`variability` collects every workload's profile a second time (RUN/profiles/again/<wl>), compares
the two collections' similarity beside the workloads' (RUN/studies/variability/similarity.json) and
measures the kernel built from the second (optimized-<wl>.2) beside the first on its workload;
`layout` records every workload's branches on vanilla, on its optimized kernel and on its PGO kernel
without hot/cold split (pgo-nosplit-<wl>, built for this: BOLT cannot use the functions GCC splits)
(RUN/branches/<kernel>/<wl>) and measures, each on its workload, vanilla + BOLT (bolt-<wl>), PGO +
BOLT (pgo-bolt-<wl>) and PGO + function order (pgo-order-<wl>); with several workloads also their universal
variants, measured on every workload: BOLT on vanilla from every workload's records merged normalized
(RUN/branches/merged/vanilla; bolt-universal) and, with `universal` too, the workloads' records on
universal-norm and on pgo-nosplit-universal merged (RUN/branches/merged/<kernel>) for pgo-order-universal
and pgo-bolt-universal (docs/LAYOUT.md);
`clang` builds the clang-train kernel, records its branches under every workload
(RUN/branches/clang-train/<wl>), makes their normalized sample profile (RUN/profiles/clang-afdo) and
measures clang, clang-thinlto, clang-afdo and clang-afdo-thinlto on every workload (docs/CLANG.md).
Each step is skipped when its output exists with the same inputs (bench boots included), so
running the same command again, or with a study added, redoes only what is missing (the bench whole when its
kernels or workloads changed: kpgo.bench)."""

from __future__ import annotations

import shutil
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from kpgo import atomic, bench, client, collect, inputs, records, variants, vm, workloads
from kpgo import sim as simulator
from kpgo.errors import KpgoError, UserError
from kpgo.guest.contract import Workload
from kpgo.kernel import kbuild, kconfig, source, values
from kpgo.kernel.source import KernelSource  # as `source` is also a field of RunOptions
from kpgo.progress import fmt_secs, say
from kpgo.remote import Remote


@dataclass(frozen=True)
class RunOptions:
    """One `kpgo run` request, typed. run.json keeps it (to_json) so that `kpgo study` extends the run exactly as
    it was started (from_json); the workloads, the simulator settings and the build requests derive from it here."""

    run_dir: Path
    base: str | None
    config: Path | None
    fragments: tuple[Path, ...]
    source: Path | None
    workload: str  # as written: "a,b" or "all"
    sets: tuple[str, ...]
    design: bench.Design
    jobs: int
    guest: vm.Guest
    client: str = workloads.DEFAULT_CLIENT
    sim_mode: str = "auto"  # bench.SIM_MODES
    sim_opts: tuple[str, ...] = ()
    studies: tuple[str, ...] = ()
    partial_training: bool = True  # builds with a profile add GCC's -fprofile-partial-training (docs/COMPILERS.md)
    values: bool = False  # the instrumented kernel records value profiles too (kpgo.kernel.values)
    hot_share: float | None = None  # optimized builds: only this share of the profiled work is hot (kbuild.hot_share_flags)

    def __post_init__(self) -> None:
        unknown = sorted(set(self.studies) - set(STUDIES))
        if unknown:
            raise UserError(f"unknown study {', '.join(unknown)}", f"studies of a run: {', '.join(STUDIES)}")
        if self.studies and len(self.workloads) < 2:
            raise UserError(f"the {' and '.join(self.studies)} study needs two or more workloads", "pass --workload a,b[,...]")
        self.sim  # noqa: B018 -- parsed now: a bad --sim-opt fails before anything is built

    @cached_property
    def workloads(self) -> tuple[Workload, ...]:
        return tuple(workloads.load_many(self.workload, list(self.sets), self.client))

    @property
    def sim(self) -> bench.SimChoice:
        return bench.SimChoice(self.sim_mode, simulator.SimConfig.parse(",".join(self.sim_opts)))

    def kernel(self) -> tuple[kconfig.ConfigSpec, KernelSource]:
        """The run's configuration and kernel source (a tarball is extracted once, into the cache)."""
        return kconfig.resolve(self.base, self.config, list(self.fragments)), source.resolve(self.source)

    def builder(self, spec: kconfig.ConfigSpec, src: KernelSource, cluster: Remote | None = None) -> Builder:
        """The run's kernels of each variant in RUN/builds/LABEL (cached); with a cluster (kpgo.cluster.Cluster) built there."""
        return Builder(self, spec, src, cluster)

    def to_json(self) -> dict[str, Any]:
        """The options under their command-line names (the run.json "request" of every kpgo so far)."""
        d = self.design
        return {
            "source": _str(self.source), "base": self.base, "config": _str(self.config), "fragment": [str(f) for f in self.fragments],
            "jobs": self.jobs, "workload": self.workload, "set": list(self.sets), "client": self.client,
            "boots": d.boots, "runs": d.runs, "order": d.order, "seed": d.seed,
            "sim": {"auto": None, "on": True, "off": False}[self.sim_mode], "sim_opt": list(self.sim_opts),
            "cpus": self.guest.cpus, "memory": self.guest.memory, "guest_timeout": self.guest.timeout,
            "study": list(self.studies), "partial_training": self.partial_training,
            **({"values": True} if self.values else {}),  # only where set: earlier run.json stay as they were
            **({"data": self.guest.data} if self.guest.data != "tmpfs" else {}),
            **({"hot_share": self.hot_share} if self.hot_share is not None else {}),
            **({"precision": d.precision, "max_boots": d.max_boots, "max_time": d.max_time} if d.precision is not None else {}),
        }

    @classmethod
    def from_json(cls, r: dict[str, Any], run_dir: Path) -> RunOptions:
        inputs.check({"request": r}, {"request": REQUEST_SHAPE}, run_dir / "run.json", "re-run the `kpgo run` command that made it (cached steps are kept)")
        try:  # a run.json without "client" was written before --client existed: its clients ran in the guest
            return cls(
                run_dir, r["base"], _path(r["config"]), tuple(Path(f) for f in r["fragment"]), _path(r["source"]), r["workload"],
                tuple(r["set"]), bench.Design(int(r["boots"]), int(r["runs"]), r["order"], r["seed"], r.get("precision"),
                                                            int(r.get("max_boots", 10)), r.get("max_time")), int(r["jobs"]),
                vm.Guest(r["cpus"], r["memory"], float(r["guest_timeout"]), data=r.get("data", "tmpfs")), r.get("client", "guest"),
                {None: "auto", True: "on", False: "off"}[r["sim"]], tuple(r["sim_opt"]), tuple(r["study"]),
                bool(r.get("partial_training")),  # absent: written before partial training was an option, built without
                bool(r.get("values")), r.get("hot_share"),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise UserError(f"{run_dir / 'run.json'}: its request is incomplete or damaged ({e!r})",
                            "re-run the `kpgo run` command that made it (cached steps are kept)") from None


# A build a step wants: (variant, label, profile) or, for a layout variant, (variant, label, profile, branch profile).
Wanted = tuple[str | variants.Variant, str, Path | None] | tuple[str | variants.Variant, str, Path | None, Path | None]


# run.json's "request" as to_json writes it (optional: the keys of options added since), for from_json.
REQUEST_SHAPE = {"source": (str, None), "base": (str, None), "config": (str, None), "fragment": [str], "jobs": int, "workload": str,
                 "set": [str], "client?": str, "boots": int, "runs": int, "order": str, "seed": (int, None), "sim": (bool, None),
                 "sim_opt": [str], "cpus": (int, None), "memory": str, "guest_timeout": float, "data?": str, "study": [str], "partial_training?": bool,
                 "values?": bool, "hot_share?": (float, None), "precision?": (float, None), "max_boots?": int, "max_time?": (float, None)}


@dataclass(frozen=True)
class Builder:
    """build(variant, label, profile=None): the run's kernel of that variant (a name, or a variants.Variant from a
    user's file) in RUN/builds/LABEL, cached; many([(variant, label, profile), ...]) several, which on a cluster are
    built at once, each on its own node (kpgo.cluster.builds; the builds up to date here are kept). Each build is handed
    back as the record of its build.json."""

    opts: RunOptions
    spec: kconfig.ConfigSpec
    src: KernelSource
    cluster: Remote | None = None

    def request(self, variant: str | variants.Variant, label: str, profile: Path | None = None, branches: Path | None = None) -> kbuild.BuildRequest:
        """branches: the branch profile a layout variant takes (its call graph for order = true, its records for bolt = true)."""
        o = self.opts
        v = variants.get(variant) if isinstance(variant, str) else variant
        kcflags = kbuild.partial_training_flags(v) if o.partial_training else ()
        if v.name == "optimized":
            kcflags += kbuild.hot_share_flags(v, profile, o.hot_share)
        return kbuild.BuildRequest(self.src, self.spec, v, o.run_dir / "builds" / label, profile, o.jobs, kcflags, o.values and v.gcov,
                                   branches if v.order else None, branches if v.bolt else None)

    def __call__(self, variant: str | variants.Variant, label: str, profile: Path | None = None, branches: Path | None = None) -> records.Build:
        return self.many([(variant, label, profile, branches)])[label]

    def many(self, wanted: Sequence[Wanted]) -> dict[str, records.Build]:
        reqs = {w[1]: self.request(*w) for w in wanted}
        if self.cluster is None:
            return {label: records.Build.of(r.out, kbuild.build(r)) for label, r in reqs.items()}
        done = {label: records.Build.of(r.out, rec) for label, r in reqs.items() if (rec := kbuild.cached(r)) is not None}
        todo = [r for label, r in reqs.items() if label not in done]
        failed: list[KpgoError] = []
        for r, res in self.cluster.builds(todo, self.opts.source):
            if isinstance(res, KpgoError):
                say(f"build {r.out.name}: FAILED: {res}")
                failed.append(res)
            else:
                done[r.out.name] = records.Build.of(r.out, res)
        if failed:
            raise type(failed[0])(f"{len(failed)} of {len(todo)} builds on the cluster failed (first: {failed[0].message})", failed[0].hint)
        return {label: done[label] for label in reqs}


def _str(p: Path | None) -> str | None:
    return None if p is None else str(p)


def _path(s: str | None) -> Path | None:
    return None if s is None else Path(s)


STUDIES = ("universal", "cross", "variability", "layout", "clang")
LAYOUT = ("bolt", "pgo-bolt", "pgo-order")  # the layout study's variants: LABEL-<wl>, each measured on its workload
UNIVERSAL_LAYOUT = "universal"  # LABEL-universal: from every workload's records merged, measured on each workload
AGAIN = "again"  # RUN/profiles/AGAIN/<wl>: the variability study's second collection of each workload's profile
AGAIN_SUFFIX = ".2"  # optimized-<wl>.2: the kernel built from it
CLANG = ("clang", "clang-thinlto", "clang-afdo", "clang-afdo-thinlto")  # the clang study's kernels, measured on every workload
AFDO = "clang-afdo"  # RUN/profiles/AFDO: the sample profile of every workload's branches on clang-train, normalized
UNIVERSAL = {"universal-raw": False, "universal-norm": True}  # label -> normalize
RUN_MARKS = ("run.json", "builds", "profiles", "bench")  # what a run directory holds (older runs have no lock)


def run(opts: RunOptions, cluster: Remote | None = None) -> dict:
    """The whole loop. cluster: a Ray address; the collections and the bench boots then run on its guest nodes (the
    builds here), with the same results and caching (where guests ran is not part of the request)."""
    t_start = time.monotonic()
    phases: dict[str, float] = {}
    spec, src = opts.kernel()
    opts = replace(opts, run_dir=opts.run_dir.resolve())
    atomic.check_resumable(opts.run_dir, "run directory", RUN_MARKS, "--dir")
    if opts.values:  # a compiler without plugin headers fails now, not after the first build
        instrumented = variants.get("instrumented")
        kbuild.check_request(instrumented, None, with_values=True)
        values.plugin(instrumented.compiler)
    with atomic.exclusive(opts.run_dir, "run directory"):  # created only once the request is known to be sound
        say(f"run: {spec.name} kernel {src.version}, workloads {', '.join(wl.name for wl in opts.workloads)}, in {opts.run_dir}")
        return _run(opts, spec, src, t_start, phases, cluster)


def _run(opts: RunOptions, spec: kconfig.ConfigSpec, src: KernelSource, t_start: float, phases: dict[str, float], cluster: Remote | None) -> dict:
    rd = opts.run_dir
    names = [wl.name for wl in opts.workloads]
    build = opts.builder(spec, src, cluster)

    def timed(name: str, fn):
        t = time.monotonic()
        value = fn()
        phases[name] = round(time.monotonic() - t, 1)
        say(f"run: phase {name} took {fmt_secs(phases[name])}")
        return value

    if cluster:  # each step's builds at once, each on a node; the steps below then find them up to date
        timed("builds on the cluster: instrumented, vanilla", lambda: build.many([("instrumented", "instrumented", None), ("vanilla", "vanilla", None)]))
    instr = timed("build instrumented", lambda: build("instrumented", "instrumented"))
    profiles: dict[str, tuple[records.Profile, dict]] = {}  # each workload's collection and its fixed profile's stats
    raws = timed("collect on the cluster", lambda: collect_cached_on_cluster(
        rd / "profiles", rd / "builds" / "instrumented", instr, list(opts.workloads), opts.guest, cluster)) if cluster else {}
    for wl in opts.workloads:
        prof = raws.get(wl.name) or timed(f"collect {wl.name}", lambda: collect_cached(rd / "profiles", rd / "builds" / "instrumented", instr, wl, opts.guest))  # noqa: B023 -- timed() calls the lambda at once
        pstats = timed(f"profile fix {wl.name}", lambda: fix_cached(rd / "profiles", instr, wl, prof))  # noqa: B023 -- timed() calls the lambda at once
        profiles[wl.name] = (prof, pstats)
    wanted: list[Wanted] = [("optimized", f"optimized-{n}", rd / "profiles" / n) for n in names]
    if "variability" in opts.studies:
        wanted += timed("variability: second collections", lambda: _again(opts, instr, names))
    if "universal" in opts.studies:
        for label, normalize in UNIVERSAL.items():
            timed(f"merge {label}", lambda: _merge(rd, names, label, normalize))  # noqa: B023 -- timed() calls the lambda at once
            wanted.append(("optimized", label, rd / "profiles" / label))
    if cluster:
        timed("builds on the cluster: optimized", lambda: build.many(wanted))
    opt = {w[1]: timed(f"build {w[1]}", lambda: build(*w)) for w in wanted}  # noqa: B023 -- timed() calls the lambda at once
    van = timed("build vanilla", lambda: build("vanilla", "vanilla"))
    # layout before clang: it builds on the GCC kernels already there, and its BOLT step is the likelier to need a look
    if "layout" in opts.studies:
        opt |= _layout_study(opts, build, timed, van, opt)
    if "clang" in opts.studies:
        opt |= _clang_study(opts, build, timed)
    labels = ["vanilla"] + [f"optimized-{n}" for n in names] + [u for u in UNIVERSAL if u in opt] + [c for c in CLANG if c in opt]
    labels += [f"optimized-{n}{AGAIN_SUFFIX}" for n in names if f"optimized-{n}{AGAIN_SUFFIX}" in opt]
    labels += [f"{v}-{n}" for v in LAYOUT for n in [*names, UNIVERSAL_LAYOUT] if f"{v}-{n}" in opt]
    kernels = [bench.Kernel(label, rd / "builds" / label) for label in labels]
    cells = [("vanilla", n) for n in names]
    cells += [(f"optimized-{a}", b) for a in names for b in names if a == b or "cross" in opts.studies]
    cells += [(u, n) for u in UNIVERSAL if u in opt for n in names]
    cells += [(c, n) for c in CLANG if c in opt for n in names]
    cells += [(f"optimized-{n}{AGAIN_SUFFIX}", n) for n in names if f"optimized-{n}{AGAIN_SUFFIX}" in opt]
    cells += [(f"{v}-{n}", n) for v in LAYOUT for n in names if f"{v}-{n}" in opt]
    cells += [(f"{v}-{UNIVERSAL_LAYOUT}", n) for v in LAYOUT for n in names if f"{v}-{UNIVERSAL_LAYOUT}" in opt]
    builds = {"vanilla": van, "instrumented": instr, **opt}
    proofs = {label: b.proof.raw if b.proof else None for label, b in builds.items()}  # run.json keeps each proof as build.json has it
    results = timed("bench", lambda: bench.bench(kernels, list(opts.workloads), rd / "bench", design=opts.design, guest=opts.guest, cells=cells, sim=opts.sim,
                                                 cluster=cluster))
    summary = {
        "run_dir": str(rd),
        "request": opts.to_json(),
        "studies": list(opts.studies),
        "kernel": {"source": str(src.path), "version": src.version, "config": spec.name},
        "builds": {label: _build_info(b) for label, b in builds.items()},
        "workloads": {
            n: {
                "params": wl.params,
                "unit": wl.unit,
                "client": client.placement_of(wl),
                "profile": {"collected": asdict(profiles[n][0].collected), "stats": profiles[n][1]},
                "proof": proofs[f"optimized-{n}"],
            }
            for n, wl in zip(names, opts.workloads)
        },
        "universal": {u: {"proof": proofs[u], "inputs": names, "normalized": UNIVERSAL[u]} for u in UNIVERSAL if u in opt},
        **({"clang": {c: {"proof": proofs[c]} for c in CLANG}} if "clang" in opts.studies else {}),
        **({"layout": {f"{v}-{n}": _layout_info(builds[f"{v}-{n}"]) for v in LAYOUT for n in [*names, UNIVERSAL_LAYOUT] if f"{v}-{n}" in builds}}
           if "layout" in opts.studies else {}),
        **({"variability": {n: {"proof": proofs[f"optimized-{n}{AGAIN_SUFFIX}"], "profile": str(rd / "profiles" / AGAIN / n)}
                            for n in names} | {"similarity": "studies/variability/similarity.json"}} if "variability" in opts.studies else {}),
        "bench": "bench/results.json",
        "host": results["host"],
        "phases_seconds": phases,
        "total_seconds": round(time.monotonic() - t_start, 1),
    }
    atomic.write_json(rd / "run.json", summary)
    atomic.write_text(rd / "summary.md", markdown(records.Run.from_json(summary, rd / "run.json"),
                                                  records.Results.from_json(results, rd / "bench" / "results.json")))
    return summary


def _again(opts: RunOptions, instr: records.Build, names: list[str]) -> list[Wanted]:
    """The variability study: each workload's profile collected again on the instrumented kernel (a boot of its own),
    fixed, and compared with the first collections (self-similarity beside cross-application similarity); the kernels
    to build from the second collections."""
    from kpgo.analysis.characterize import compare_profiles

    rd = opts.run_dir
    again = rd / "profiles" / AGAIN
    for wl in opts.workloads:
        fix_cached(again, instr, wl, collect_cached(again, rd / "builds" / "instrumented", instr, wl, opts.guest))
    out = rd / "studies" / "variability" / "similarity.json"
    dirs = [rd / "profiles" / n for n in names] + [again / n for n in names]
    stamps = [records.Profile.read(d, strict=False).collected_at for d in dirs]
    try:  # kpgo's own record: redone when unusable
        have = inputs.read_json(out, "", dict, missing_ok=True) or {}
    except UserError:
        have = {}
    if have.get("collected_at") != stamps:
        res = compare_profiles(dirs, rd / "builds" / "instrumented", names=[*names, *(n + AGAIN_SUFFIX for n in names)])
        atomic.write_json(out, {"collected_at": stamps, **res})
    return [("optimized", f"optimized-{n}{AGAIN_SUFFIX}", again / n) for n in names]


def _layout_study(opts: RunOptions, build: Builder, timed: Any, van: records.Build, opt: dict[str, records.Build]) -> dict[str, records.Build]:
    """The layout study's kernels: each workload's branches recorded on vanilla, on its optimized kernel and on its
    pgo-nosplit kernel (PGO without GCC's hot/cold split, which BOLT cannot use on the kernel), then BOLT on vanilla
    from the first, the PGO kernel in C3's function order from the second, BOLT on the PGO kernel from the third
    (docs/LAYOUT.md). The pgo-nosplit kernels are built and recorded on, not measured."""
    rd = opts.run_dir
    wanted: list[Wanted] = []
    made: dict[str, records.Build] = {}
    for wl in opts.workloads:
        n = wl.name
        prof = rd / "profiles" / n
        made[f"pgo-nosplit-{n}"] = timed(f"build pgo-nosplit-{n}", lambda: build("pgo-nosplit", f"pgo-nosplit-{n}", prof))  # noqa: B023
        on = {k: rd / "branches" / k / n for k in ("vanilla", f"optimized-{n}", f"pgo-nosplit-{n}")}
        for k, b in (("vanilla", van), (f"optimized-{n}", opt[f"optimized-{n}"]), (f"pgo-nosplit-{n}", made[f"pgo-nosplit-{n}"])):
            timed(f"collect {n} --branches on {k}", lambda: branches_cached(on[k], rd / "builds" / k, b, wl, opts.guest))  # noqa: B023
        wanted += [("bolt", f"bolt-{n}", None, on["vanilla"]), ("pgo-bolt", f"pgo-bolt-{n}", prof, on[f"pgo-nosplit-{n}"]),
                   ("pgo-order", f"pgo-order-{n}", prof, on[f"optimized-{n}"])]
    names = [wl.name for wl in opts.workloads]
    if len(names) > 1:  # the universal variants: every workload's records on one kernel, merged normalized
        merged = rd / "branches" / "merged"
        van_all = timed("merge branches on vanilla", lambda: merge_branches_cached([rd / "branches" / "vanilla" / n for n in names], merged / "vanilla"))
        wanted.append(("bolt", f"bolt-{UNIVERSAL_LAYOUT}", None, van_all))
        if "universal-norm" in opt:
            prof = rd / "profiles" / "universal-norm"
            nosplit = f"pgo-nosplit-{UNIVERSAL_LAYOUT}"
            made[nosplit] = timed(f"build {nosplit}", lambda: build("pgo-nosplit", nosplit, prof))
            on_all = {}
            for k, b in (("universal-norm", opt["universal-norm"]), (nosplit, made[nosplit])):
                for wl in opts.workloads:
                    timed(f"collect {wl.name} --branches on {k}",
                          lambda: branches_cached(rd / "branches" / k / wl.name, rd / "builds" / k, b, wl, opts.guest))  # noqa: B023
                on_all[k] = timed(f"merge branches on {k}",
                                  lambda: merge_branches_cached([rd / "branches" / k / n for n in names], merged / k))  # noqa: B023
            wanted += [("pgo-bolt", f"pgo-bolt-{UNIVERSAL_LAYOUT}", prof, on_all[nosplit]),
                       ("pgo-order", f"pgo-order-{UNIVERSAL_LAYOUT}", prof, on_all["universal-norm"])]
    return made | {w[1]: timed(f"build {w[1]}", lambda: build(*w)) for w in wanted}  # noqa: B023


def merge_branches_cached(srcs: list[Path], out: Path) -> Path:
    """OUT: the normalized merge of the branch profiles `srcs` (kpgo.branches.merge), unless it is there for the
    same recordings."""
    from kpgo import branches

    have = records.Profile.read(out, strict=False).merged or {}
    stamps = [records.Profile.read(s, strict=False).collected_at for s in srcs]
    if [(i.get("dir"), i.get("collected_at")) for i in have.get("inputs", [])] == [(str(s.resolve()), c) for s, c in zip(srcs, stamps)] \
            and have.get("normalize") is True:
        say(f"merge branches: up to date in {out}")
        return out
    shutil.rmtree(out, ignore_errors=True)
    branches.merge(srcs, out, normalize=True)
    return out


def _clang_study(opts: RunOptions, build: Builder, timed: Any) -> dict[str, records.Build]:
    """The clang study's kernels: clang-train, its branch records under every workload, their sample profile, and
    the four kernels measured (kpgo.afdo; docs/CLANG.md)."""
    from kpgo import afdo

    rd = opts.run_dir
    train = timed("build clang-train", lambda: build("clang-train", "clang-train"))
    recs = [timed(f"collect {wl.name} --branches on clang-train",
                  lambda: branches_cached(rd / "branches" / "clang-train" / wl.name, rd / "builds" / "clang-train", train, wl, opts.guest))  # noqa: B023
            for wl in opts.workloads]
    prof = rd / "profiles" / AFDO
    inputs = [rd / "branches" / "clang-train" / wl.name for wl in opts.workloads]
    have = afdo.read_profile(prof) if afdo.is_sample_profile(prof) else {}
    stamps = [r.collected_at for r in recs]  # records taken again (at the same place) make the profile again
    if [(i.get("dir"), i.get("samples") is not None, i.get("collected_at")) for i in have.get("inputs", [])] != \
            [(str(d.resolve()), True, c) for d, c in zip(inputs, stamps)] or \
            have.get("build_id") != recs[0].build_id or not have.get("normalized"):
        shutil.rmtree(prof, ignore_errors=True)
        timed("profile afdo", lambda: afdo.make(inputs, prof, normalize=True))
    else:
        say(f"profile afdo: up to date in {prof}")
    wanted: list[Wanted] = [(c, c, prof if variants.get(c).profile else None) for c in CLANG]
    return {w[1]: timed(f"build {w[1]}", lambda: build(*w)) for w in wanted}  # noqa: B023


def branches_cached(out: Path, build_dir: Path, built: records.Build, wl: Workload, guest: vm.Guest) -> records.Profile:
    """OUT: the branch profile of the build under the workload, unless it is there for the same build and parameters."""
    have = records.Profile.read(out, strict=False)
    # Records from before thunks were folded hold every call through a retpoline as a call of the thunk: again.
    if have.build_key == built.key and have.params == wl.params and have.thunks is not None:
        say(f"collect {wl.name} --branches: up to date in {out}")
        return have
    return records.Profile.of(out, collect.collect_branches(build_dir, wl, out, guest=guest, replace=True))


def _build_info(b: records.Build) -> dict:
    """What run.json keeps of a build (records.RunBuild reads it back)."""
    return {"seconds": b.seconds["total"], "sizes": b.sizes, "release": b.kernel_release}


def _layout_info(b: records.Build) -> dict:
    """What run.json keeps of a layout kernel: its proof, BOLT's report and the order's check, each as build.json has it."""
    return {"proof": b.proof.raw if b.proof else None, "bolt": b.bolt, "order": b.order}


def _collected(profiles: Path, instr: records.Build, wl: Workload) -> records.Profile | None:
    """PROFILES/NAME.raw's profile.json if it was collected from this build with these parameters."""
    raw = profiles / f"{wl.name}.raw"
    have = records.Profile.read(raw, strict=False)
    # Profiles from before client placement existed were collected with the client in the guest.
    same_client = (have.client == "host") == (client.placement_of(wl) == "host")
    # Profiles whose snapshot read the files in the walk's order hold the reads' own kernel work: collected again.
    if have.build_key == instr.key and have.params == wl.params and same_client and have.read_first is not None:
        say(f"collect {wl.name}: up to date in {raw}")
        return have
    return None


def collect_cached(profiles: Path, build: Path, instr: records.Build, wl: Workload, guest: vm.Guest) -> records.Profile:
    """PROFILES/NAME.raw from the instrumented build, unless it is there for the same build and parameters."""
    have = _collected(profiles, instr, wl)
    if have is not None:
        return have
    shutil.rmtree(profiles / wl.name, ignore_errors=True)
    out = profiles / f"{wl.name}.raw"
    return records.Profile.of(out, collect.collect(build, wl, out, guest=guest, replace=True))


def collect_cached_on_cluster(profiles: Path, build: Path, instr: records.Build, wls: list[Workload], guest: vm.Guest,
                              cluster: Remote) -> dict[str, records.Profile]:
    """collect_cached of every workload, those not up to date collected at once on the cluster's guest nodes; the
    first failure is raised once every collection ended (the profiles that were written stay for a rerun)."""
    have = {wl.name: p for wl in wls if (p := _collected(profiles, instr, wl)) is not None}
    todo = [wl for wl in wls if wl.name not in have]
    for wl in todo:
        for stale in (profiles / f"{wl.name}.raw", profiles / wl.name):
            shutil.rmtree(stale, ignore_errors=True)
    failed: list[KpgoError] = []
    outs = {wl.name: profiles / f"{wl.name}.raw" for wl in todo}
    for wl, res in collect.on_cluster(cluster, build, outs, todo, guest=guest) if todo else ():
        if isinstance(res, KpgoError):
            say(f"collect {wl.name}: FAILED: {res}")
            failed.append(res)
        else:
            have[wl.name] = records.Profile.of(outs[wl.name], res)
    if failed:
        raise type(failed[0])(f"{len(failed)} of {len(todo)} collections on the cluster failed (first: {failed[0].message})", failed[0].hint)
    return have


def _merge(rd: Path, names: list[str], label: str, normalize: bool) -> dict:
    """The universal profile of all the run's workloads (kept while its inputs are unchanged)."""
    from kpgo.gcov.merge import merge_profiles
    from kpgo.gcov.profile import read_profile_json

    dst = rd / "profiles" / label
    srcs = [rd / "profiles" / n for n in names]
    have = records.Profile.read(dst, strict=False).merged or {}
    if [i.get("profile") for i in have.get("inputs", [])] == [read_profile_json(d) for d in srcs] and have.get("normalize") == normalize:
        say(f"merge {label}: up to date in {dst}")
        return have
    shutil.rmtree(dst, ignore_errors=True)
    return merge_profiles(srcs, dst, normalize=normalize)


def fix_cached(profiles: Path, instr: records.Build, wl: Workload, prof: records.Profile) -> dict:
    """PROFILES/NAME: the raw profile with the object summary added (redone when the raw one changed); its stats
    (kpgo.gcov.profile.profile_stats)."""
    from kpgo.gcov.profile import fix_profile, profile_stats

    raw = profiles / f"{wl.name}.raw"
    fixed = profiles / wl.name
    have = records.Profile.read(fixed, strict=False)
    # "left_out" in "fixed": fixed by a kpgo that leaves the gcov code's counters out (an older fix is redone)
    if have.build_key == instr.key and have.collected_at == prof.collected_at and "left_out" in (have.fixed or {}):
        say(f"profile fix {wl.name}: up to date in {fixed}")
    else:
        shutil.rmtree(fixed, ignore_errors=True)
        fix_profile(raw, fixed)
    return profile_stats(fixed)


def markdown(run: records.Run, results: records.Results) -> str:
    """summary.md: a view of the report's model (kpgo.report.summary), rendered as the report's Markdown is."""
    from kpgo.report import summary

    return summary.markdown(run, results)
