"""Out-of-tree (O=) kernel builds of one variant (kpgo.variants: compiler, level, flags, profile), cached by their inputs.

A build directory is complete when its build.json exists and carries the same key; an
interrupted build keeps its objects and resumes with an incremental make."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shlex
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path

from kpgo import afdo, atomic, branches, inputs, proc, variants
from kpgo.errors import InfraError, UserError
from kpgo.gcov import ident
from kpgo.kernel import bolt, codesize, kconfig, order, proof, values
from kpgo.kernel.source import KernelSource
from kpgo.paths import cache_dir
from kpgo.progress import Progress, fmt_secs, say
from kpgo.records import BUILD_SHAPE  # what kpgo reads of a build.json: its home is kpgo.records (the Build record)
from kpgo.variants import Variant

RECIPE = 3  # bump when the way kpgo builds changes, so cached builds are redone

# What a profile-use kernel build needs (see docs/ARCHITECTURE.md):
# - the kernel's counters are updated without atomics on SMP, so they are slightly inconsistent;
# - a file compiled differently than when profiled (config, source) must warn, not fail;
# - Kbuild compiles helper files that were never profiled;
# - the ipa-profile dump is how we prove, per object, that GCC read the profile ("-optimized": with the value
#   transforms it applied), the profile_estimate dump which indirect calls it promoted (kpgo.kernel.proof);
# - a profile changes inlining, cloning and block order, so GCC's flow-sensitive warnings (-Wstringop-*,
#   -Warray-bounds) can flag paths the vanilla build does not have, which the kernel's -Werror would make a failed
#   build (server kernel, a redis profile, with and without its value counters: "'strncmp' specified bound 4 exceeds
#   source size 0" in drivers/acpi/property.c). The warnings stay in build.log, as for the compiler variants.
PROFILE_USE_FLAGS = (
    "-fprofile-use",
    "-fprofile-correction",
    "-Wno-error=coverage-mismatch",
    "-Wno-coverage-mismatch",
    "-Wno-missing-profile",
    "-fdump-ipa-profile-optimized",
    "-fdump-ipa-profile_estimate",
    "-Wno-error",
)
# GCC's option that keeps functions the profile never saw at their normal optimization instead of optimizing them
# for size: kpgo adds it to every build with a profile unless told not to (`--no-partial-training`; docs/COMPILERS.md
# "Partial training by default" says why, from docs/MEASUREMENTS.md "First measurement: partial training
# against GCC's default").
PARTIAL_TRAINING = variants.PARTIAL_TRAINING


def extra_flags(meta: dict) -> list[str] | None:
    """A build's compiler flags beyond the profile-use set every PGO build has (-O3, the variant's, partial training,
    the user's --kcflags; -Wno-error, which is in that set, changes no code): what tells kernels apart in a table.
    None for a build.json without its flags."""
    flags = meta.get("kcflags")
    return None if flags is None else [f for f in flags if f not in PROFILE_USE_FLAGS]


def partial_training_flags(variant: Variant) -> tuple[str, ...]:
    """What partial training adds to a variant: nothing to one without a profile, nor where the variant's file
    decides itself (-fprofile-partial-training or, pgo-no-pt, -fno-profile-partial-training)."""
    decided = {PARTIAL_TRAINING, variants.NO_PARTIAL_TRAINING} & set(variant.flags)
    return () if decided or not variant.profile or variant.autofdo else variants.PARTIAL_TRAINING_FLAGS


def hot_share_flags(variant: Variant, profile: Path | None, share: float | None) -> tuple[str, ...]:
    """`--hot-share S`: GCC's hot-count cut placed so that the hottest share S of the profile's executed work is hot
    and the rest of the executed code is optimized for size (kpgo.gcov.profile.hot_fraction; docs/COMPILERS.md)."""
    if share is None:
        return ()
    if not variant.profile or profile is None or variant.autofdo:
        raise UserError(f"--hot-share is only for a variant that takes a profile; {variant.name} takes none" if not variant.profile
                        else f"--hot-share is GCC's; {variant.name} is Clang's AutoFDO" if variant.autofdo
                        else "--hot-share needs the profile", "add --variant optimized --profile DIR, or drop --hot-share")
    from kpgo.gcov.profile import hot_fraction

    h = hot_fraction(profile, share)
    say(f"build: --hot-share {share}: counts of {h['gcc_threshold']:,} and more are hot (the hottest {h['hot_counters']:,} of "
        f"{h['executed_counters']:,} executed arc counters hold {share:.2%} of the work): --param=hot-bb-count-fraction={h['fraction']}")
    return (f"--param=hot-bb-count-fraction={h['fraction']}",)


@dataclass(frozen=True)
class BuildRequest:
    source: KernelSource
    config: kconfig.ConfigSpec
    variant: Variant  # variants.get(name)
    out: Path
    profile: Path | None = None
    jobs: int = 3
    kcflags: tuple[str, ...] = ()  # the user's, after the variant's flags
    values: bool = False  # a gcov kernel that records value profiles too (kpgo.kernel.values)
    call_graph: Path | None = None  # a variant with order = true: the branch profile whose call graph orders the functions
    branches: Path | None = None  # a variant with bolt = true: the branch profile BOLT optimizes vmlinux with
    # a profile collected on another kernel version, used as it is (GCC drops the functions whose code changed): the
    # contrast `kpgo profile port` is measured against; refused without it
    stale_profile: bool = False

    @property
    def fragments(self) -> tuple[str, ...]:
        return self.variant.fragments + (("values",) if self.values else ())


@functools.cache
def gcc_version() -> str:
    """The host's plain gcc (bench records it as part of the host); a build's own compiler is its variant's."""
    return proc.capture(["gcc", "-dumpfullversion"]).strip()


def profile_digest(profile: Path) -> str:
    """The profile's digest as the build key hashes it (and kpgo package's manifest names it)."""
    return _profile_digest(profile)


def profile_collections(record: dict) -> list[dict]:
    """The collections a profile.json describes (one, or a merged profile's inputs): workload, kernel and moment."""
    rows = []
    from kpgo.gcov.profile import origins

    for o in origins(record):
        wl = o.get("workload")
        rows.append({"workload": wl.get("name") if isinstance(wl, dict) else wl, "kernel_release": o.get("kernel_release"),
                     "config_name": o.get("config_name"), "build_key": o.get("build_key"), "collected_at": o.get("collected_at")})
    return rows


def _profile_digest(profile: Path) -> str:
    h = hashlib.sha256()
    for p in sorted([*profile.rglob("*.gcda"), *profile.glob(afdo.PROFILE_FILE)]):
        h.update(str(p.relative_to(profile)).encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def _files_digest(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        data = inputs.read_bytes(f, "pass an existing file", inputs.TEXT_LIMIT)
        h.update(f"{f.name}\0{len(data)}\0".encode() + data)
    return h.hexdigest()[:16]


def build_key(req: BuildRequest) -> str:
    v = req.variant
    parts: dict[str, object] = {
        "recipe": RECIPE,
        "source": req.source.ident,
        "config": req.config.digest(),
        # the kind of build (vanilla, instrumented, optimized), not the variant's name: builds made before variants
        # were data keep their keys, and a variant is cached by what it does (pgo-no-pt is optimized --no-partial-training)
        "variant": v.kind,
        "profile": _profile_digest(req.profile) if req.profile else None,
        "gcc": v.compiler.version(),  # the variant's compiler's version, whichever compiler it is
        "kcflags": [*v.flags, *req.kcflags],
    }
    # Only where a variant differs from those builds (gcc-12, -O2), so theirs stay as they were.
    if v.compiler.name != variants.DEFAULT_COMPILER:
        parts["compiler"] = v.compiler.name
    if v.opt != "O2":
        parts["opt"] = v.opt
    if req.values:  # the patched source's ident covers the patch; the plugin is an input of every object
        parts["values"] = values.plugin_digest()
    if req.call_graph is not None:  # the patched source's ident covers the patch; the order comes from these bytes
        parts["order"] = order.input_digest(order.recording(req.call_graph))
    if v.autofdo:  # its flags are kpgo's (kcflags), not the variant file's
        parts["autofdo"] = afdo.RECIPE
    if v.lto:
        parts["lto"] = v.lto
    if _gcov_rekey(req) is not None:  # the installed profile is re-keyed for this tree's path (only then: other keys stay)
        parts["profile_ids"] = "rekeyed"
    if v.bolt:  # the patched source's ident covers the patch; BOLT's work comes from the records' bytes
        parts["bolt"] = bolt.input_digest(bolt.recording(req.branches)) if req.branches is not None else "no records"
    # The bytes of every file the build applies beyond the config (whose digest covers the user's files): the variant's
    # file and the shipped fragments it adds (gcov, os, values). An edited fragment or variant file is another build.
    parts["applied"] = _files_digest([v.path, *kconfig.variant_fragments(req.fragments)])
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]




def read_build_json(out: Path) -> dict | None:
    """The build.json in out, None when it is absent or unusable (a build there is then done again)."""
    try:
        return inputs.read_json(out / "build.json", "", BUILD_SHAPE, missing_ok=True)
    except UserError:
        return None


def load_build(out: Path, hint: str) -> dict:
    """The record of the finished build in `out`, for a step that boots it: a UserError naming what is missing or
    damaged (build.json, the kernel image) before any guest starts."""
    if not out.is_dir():
        what = f"is {inputs.kind(out) or 'a file'}" if out.exists() else "does not exist"
        raise UserError(f"build directory {out} {what}, so it holds no complete kpgo build", hint)
    path = out / "build.json"
    if not os.path.lexists(path):
        raise UserError(f"{out} holds no complete kpgo build (no build.json)", hint)
    build: dict = inputs.read_json(path, hint, BUILD_SHAPE)
    if not build["ok"]:
        raise UserError(f"{path}: the build did not complete (ok is false)", hint)
    img = image(out)
    if not inputs.is_regular(img):
        what = f"is {inputs.kind(img)}" if os.path.lexists(img) else "is missing"
        raise UserError(f"{out}: its kernel image {img.relative_to(out.resolve())} {what}", hint)
    return build


def image(out: Path) -> Path:
    """The bootable image of the build in `out` (not build.json's absolute path: a copied build directory boots its own)."""
    return out.resolve() / "arch" / "x86" / "boot" / "bzImage"


def check_request(variant: Variant, profile: Path | None, need_compiler: bool = True, with_values: bool = False,
                  call_graph: Path | None = None, branches: Path | None = None) -> None:
    """The cheap checks, done before anything slow (like extracting the source). Without need_compiler (a dry run)
    a missing compiler passes, and so does the profile check that needs its version."""
    # the variants fed by a branch profile, and the option that gives it: (wants it, given, option, what it does, a variant)
    for wants, given, option, does, example in ((variant.order, call_graph, "--call-graph", "order functions by a recorded call graph", "order"),
                                                (variant.bolt, branches, "--branches", "run BOLT on the kernel from recorded branches", "bolt")):
        if wants and given is None:
            raise UserError(f"the {variant.name} variant needs a branch profile, to {does}, and none was given",
                            f"pass {option} DIR (a branch profile from `kpgo collect BUILD_DIR --branches`)")
        if given is not None and not wants:
            others = ", ".join(n for n, v in variants.load_all().items() if getattr(v, example))
            raise UserError(f"{option} is only for the variants that {does} ({others}); {variant.name} does not",
                            f"drop {option} or add --variant {example}")
    if call_graph is not None:  # the recording, its kernel and the call graph itself, read now: a bad file fails here
        order.plan(order.recording(call_graph))
    if branches is not None:  # the records against their kernel's build id, and BOLT itself: a bad input fails here
        bolt.require_unsplit(bolt.recording(branches))
        if need_compiler:
            bolt.require_tools()
    if with_values:
        if not variant.gcov:
            raise UserError(f"--values is for the instrumented variant (it records value profiles); {variant.name} records none",
                            "add --variant instrumented, or drop --values (a profile-use build uses the value profiles it is given)")
        values.check(variant.compiler)
    if variant.profile and profile is None:
        made = "`kpgo profile afdo` from branch records of the clang-train kernel" if variant.autofdo else "`kpgo collect` or `kpgo profile fix`"
        raise UserError(f"the {variant.name} variant needs a profile", f"pass --profile DIR (a directory from {made})")
    if not variant.profile and profile is not None:
        others = ", ".join(n for n, v in variants.load_all().items() if v.profile and n != "optimized")
        raise UserError(f"--profile is only for --variant optimized and the other variants that take one ({others}); {variant.name} takes none",
                        "drop --profile or add --variant optimized")
    if need_compiler:
        variants.require(variant)
    if profile is not None and variant.autofdo:
        afdo.check_for_build(profile)
    elif profile is not None and afdo.is_sample_profile(profile):
        raise UserError(f"{profile} is a Clang sample profile; {variant.name} is built with {variant.compiler.name} from gcov profiles",
                        "use it with --variant clang-afdo or clang-afdo-thinlto")
    elif profile is not None and variant.compiler.installed():
        _check_profile(profile, variant.compiler.version())


def check_inputs(req: BuildRequest) -> None:
    """What the request's source and config must satisfy, checked without running make: a mistake found here costs a
    second, found by configure or by GCC it costs a build and leaves a half-made build directory."""
    if req.jobs < 1:
        raise UserError(f"-j {req.jobs}: the number of compile jobs must be at least 1", "fix -j")
    if req.out.exists() and not req.out.is_dir():
        raise UserError(f"build directory {req.out} is a file", "choose another -o")
    if req.profile is not None:
        out, prof = req.out.resolve(), req.profile.resolve()
        if out == prof or prof in out.parents or out in prof.parents:
            # The build would write into the profile (or the profile into the build: each .gcda is installed there).
            raise UserError(f"build directory {req.out} and profile {req.profile} overlap", "choose an -o outside the profile directory")
    atomic.check_writable(req.out, "build directory")
    if req.call_graph is not None:
        order.check_out(req.out)
    if req.branches is not None:
        bolt.check_out(req.out)
    kconfig.check_applies(req.config, req.source.path)
    if req.profile is not None:
        _check_profile_origin(req)


def build(req: BuildRequest) -> dict:
    """Build (or reuse) the variant in req.out and return its build.json."""
    try:
        with atomic.full_disk_names(req.out):
            return _build(req)
    except InfraError as e:
        full = atomic.full_disk(req.out)
        if full and full not in e.message:  # make's own complaint is deep in the log, about a file it could not finish
            raise InfraError(f"{e.message}: {full}", f"free some space there and run the same command again ({e.hint})") from None
        raise


def kcflags(req: BuildRequest) -> list[str]:
    """Every object's KCFLAGS, in order: the profile-use flags, the level's, the variant's, the user's."""
    v = req.variant
    if v.autofdo:  # upstream's AutoFDO flags (kpgo.afdo); the profile is installed in the build directory
        use = (f"-fprofile-sample-use={afdo.installed(req.out)}", *afdo.USE_FLAGS) if v.profile else ()
        return [*afdo.TRAIN_FLAGS, *use, *v.opt_flags, *v.flags, *req.kcflags]
    return [*(PROFILE_USE_FLAGS if v.profile else ()), *v.opt_flags, *v.flags, *req.kcflags]


def _compiler_record(v: Variant) -> dict:
    """build.json's account of the variant: which compiler exactly, its level, its flags and make variables."""
    c = v.compiler
    return {"compiler": {"name": c.name, "command": c.command, "version": c.version(), "version_text": c.version_text()},
            "variant_file": str(v.path), "opt": v.opt, "flags": list(v.flags), "make_vars": list(c.make_args())}


def key_of(req: BuildRequest) -> str:
    """The key req's build will have (of the patched source, for a value-profiling kernel)."""
    check_request(req.variant, req.profile, with_values=req.values, call_graph=req.call_graph, branches=req.branches)
    return build_key(_patched(req))


def cached(req: BuildRequest) -> dict | None:
    """The build.json of req's finished build in req.out when its inputs are the same (what build() would return
    without building), else None. (kpgo.cluster builds the others elsewhere.)"""
    return _up_to_date(req, key_of(req))


def _up_to_date(req: BuildRequest, key: str) -> dict | None:
    out = req.out.resolve()
    done = read_build_json(out)
    if not (done and done.get("key") == key and done.get("ok")):
        return None
    say(f"build {req.variant.name}: up to date in {out}")
    # a build made before kpgo measured functions_size/text_span/bzimage gets them from its vmlinux now
    # (in the returned record only: the sizes are not an input, the key and build.json stay as they are)
    done["sizes"] = codesize.complete(out, done.get("sizes"))
    # and the vmlinux digest and build id of a build made before they were recorded (not reproducible then: no
    # "reproducible" record says how it was made)
    if "vmlinux_sha256" not in done:
        done |= vmlinux_identity(out)
    # likewise the compiler record of a build made before variants were data (same key: same compiler and flags)
    return _compiler_record(req.variant) | done


def _patched(req: BuildRequest) -> BuildRequest:
    """req with the source it builds from: the patched copy (cached, never the user's tree) for value profiles, a
    function order, AutoFDO, BOLT and the kernel BOLT rewrites."""
    if req.values:
        return replace(req, source=values.patched(req.source))
    if req.variant.order or req.variant.autofdo:  # function sections placed; KPGO_LDFLAGS (kpgo.afdo)
        return replace(req, source=order.patched(req.source))
    if req.variant.bolt or req.variant.bolt_base:  # bolt_base: the same source path, so the same code (variants.Variant)
        return replace(req, source=bolt.patched(req.source))
    return req


def _build(req: BuildRequest) -> dict:
    name = req.variant.name
    check_request(req.variant, req.profile, with_values=req.values, call_graph=req.call_graph, branches=req.branches)
    plugin = values.plugin(req.variant.compiler) if req.values else None
    req = _patched(req)
    check_inputs(req)
    # gcc is Kbuild's HOSTCC for a GCC variant (LLVM=-N makes it clang-N); the variant's compiler is checked above
    for tool in ("make", "flex", "bison", "bc", *(("gcc",) if req.variant.compiler.family == "gcc" else ())):
        proc.need(tool)
    key = build_key(req)
    out = req.out.resolve()
    done = _up_to_date(req, key)
    if done is not None:
        return done
    # A flag the compiler rejects fails here in one line, not in the first object after configuring.
    variants.check_flags(req.variant, tuple(req.kcflags))
    keyfile = out / ".kpgo-key"
    if out.exists() and not (keyfile.exists() and keyfile.read_text() == key):
        if any(out.iterdir()) and not keyfile.exists():
            raise UserError(f"{out} exists and is not a kpgo build directory", "choose another output directory")
        say(f"build {name}: inputs changed, starting {out} afresh")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "build.json").unlink(missing_ok=True)
    keyfile.write_text(key)
    log = out / "build.log"
    t0 = time.monotonic()
    added = f"; and {' '.join(req.kcflags)}" if req.kcflags else ""  # partial training, --hot-share's, --kcflags
    say(f"build {name}: configuring {req.config.name} in {out} (log: {log}; {req.variant.summary()}{added})")
    config = kconfig.configure(req.source.path, out, req.config, req.fragments, log, req.variant.compiler.make_args())
    t_config = time.monotonic() - t0

    rekey = _gcov_rekey(req)
    installed, zero, moved = 0, 0, 0
    if req.profile is not None and req.variant.autofdo:
        installed, zero = afdo.install(req.profile, out)
    elif req.profile is not None:
        installed, zero, moved = _install_profile(req.profile, out, rekey)
    if rekey is not None:
        say(f"build {name}: the profile's kernel compiled {rekey.old_root}; {moved:,} static functions re-keyed for {rekey.new_root} "
            "(GCC keys them by their source path)")
    flags = kcflags(req)
    make_args, reuse_env = _make_vars(req.variant)
    env = reproducible_env(req.source.path) | reuse_env
    if plugin is not None:
        make_args.append(f"{values.PLUGIN_VAR}={plugin}")
    if req.variant.autofdo and req.variant.lto:
        make_args.append(f"{afdo.LDFLAGS_VAR}={' '.join(afdo.lto_ldflags(out if req.variant.profile else None))}")
    plan = order.plan(order.recording(req.call_graph)) if req.call_graph is not None else None
    if plan is not None:
        say(f"build {name}: function order: C3 over {plan.recording.graph}: {len(plan.order):,} functions in {plan.stats['clusters']:,} clusters")
        make_args.append(f"{order.MAKE_VAR}={order.write(plan, out)}")
    rec = bolt.recording(req.branches) if req.branches is not None else None
    if rec is not None:
        # perf2bolt reads the records against their own kernel (names and offsets); the step runs BOLT after the link
        ran = bolt.per_function(rec)
        fdata_info = bolt.to_fdata(rec, out) | {"split_functions": bolt.split_functions(ran)}
        reserve = bolt.reserve_bytes(ran)
        say(f"build {name}: BOLT profile: {fdata_info['entries_written']:,} entries from {rec.dir} (perf2bolt: "
            f"{fdata_info['mismatching_share'] or 0:.1%} of the traces mismatch the recorded kernel's code); {reserve >> 20} MiB kept for moved code")
        make_args += [f"{bolt.MAKE_VAR}={bolt.write_step(out, out / bolt.FDATA)}", f"{bolt.RESERVE_VAR}={reserve}"]
    if req.variant.profile and req.variant.compiler.family == "gcc" and "KPGO_REUSE" not in env:
        say(f"build {name}: ccache not found, so no object is reused from earlier builds (apt-get install ccache)")
    before = _ccache_stats(reuse_env)
    modules = config.get("CONFIG_MODULES") == "y"
    argv = make_command(req, out, flags, make_args, modules)
    compiled = _make(req, out, log, argv, env)
    if modules:  # virtme-ng's module directory (symlinks into the build), made here so that a boot writes nothing
        proc.run(["virtme-prep-kdir-mods"], cwd=out, log=log, what="virtme-prep-kdir-mods")
    after = _ccache_stats(reuse_env)
    t_total = time.monotonic() - t0
    plugin_var = [f"{values.PLUGIN_VAR}={plugin}"] if plugin is not None else []  # the patched Makefile needs it to parse
    release = proc.capture(["make", "-s", "-C", req.source.path, f"O={out}", *plugin_var, "kernelrelease"]).strip().splitlines()[-1]
    build: dict = {
        "key": key,
        "variant": name,
        "config_name": req.config.name,
        "config_hash": hashlib.sha256((out / ".config").read_bytes()).hexdigest()[:16],
        "config_files": [str(f) for f in req.config.files],
        "source": str(req.source.path),
        "source_version": req.source.version,
        "kernel_release": release,
        "gcc": req.variant.compiler.version(),  # the compiler's version (read by collect: the profile's GCC)
        **_compiler_record(req.variant),
        "kcflags": flags,
        "make_command": _shell(argv, env),
        "jobs": req.jobs,
        "objects_compiled": compiled,
        "seconds": {"configure": round(t_config, 1), "total": round(t_total, 1)},
        "bzImage": str(out / "arch/x86/boot/bzImage"),
        "vmlinux": str(out / "vmlinux"),
        "build_dir": str(out),
        "gcov": config.get("CONFIG_GCOV_KERNEL") == "y",
        # Objects taken from ccache (compiled before with identical inputs, .gcda included) vs compiled now.
        "reuse": {"mode": env.get("KPGO_REUSE", "off"), "objects_all_zero_profile": zero,
                  "reused": sum(after.get(k, 0) - before.get(k, 0) for k in ("direct_cache_hit", "preprocessed_cache_hit")),
                  "cache_misses": after.get("cache_miss", 0) - before.get("cache_miss", 0)},
        "sizes": text_sizes(out),
        "modules": len((out / "modules.order").read_text().split()) if modules else 0,
        # what makes two builds of the same inputs byte-identical (reproducible()), and the bytes they give
        "reproducible": {**{k: v for k, v in env.items() if k.startswith("KBUILD_BUILD_")}, "prefix_maps": prefix_maps(req.source.path, out)},
        **vmlinux_identity(out),
    }
    if plugin is not None:
        build["values"] = {"patch": str(values.PATCH), "patched_source": str(req.source.path), "plugin": str(plugin),
                           "pool_nodes": int(config.get("CONFIG_GCOV_VALUES_POOL", "0"))}
    build["ok"] = True
    if req.profile is not None:
        # the digest is the build key's (kpgo package puts it in its manifest: the profile may be gone by then)
        from kpgo.gcov.profile import read_profile_json

        build["profile"] = {"dir": str(req.profile.resolve()), "files_installed": installed, "digest": _profile_digest(req.profile),
                            "collections": profile_collections(read_profile_json(req.profile))}
        if rekey is not None:
            build["profile"]["rekeyed"] = {"from_source": rekey.old_root, "instrumented_build": str(rekey.build), "functions": moved}
        build["proof"] = afdo.check(out, req.profile) if req.variant.autofdo else proof.check(out, req.profile, counts_gate=not req.stale_profile)
        build["ok"] = build["proof"]["ok"]
    if rec is not None:  # BOLT's report, the build ids before and after it (kpgo.kernel.bolt.check)
        build["bolt"] = bolt.check(out, rec, fdata_info, reserve)
        build["ok"] = build["ok"] and build["bolt"]["ok"]
    if plan is not None:  # the order as the binary shows it (kpgo.kernel.order.check), and the hot text's span
        build["order"] = order.check(out, plan)
        build["ok"] = build["ok"] and build["order"]["ok"]
    _remember_count(req, compiled)
    atomic.write_json(out / "build.json", build)
    reused = build["reuse"]["reused"]
    # ccache also answers compiles make does not count as objects (host tools, objtool): the two counts are apart
    objects = f"{compiled} objects, {reused} compiles answered by ccache" if reused else f"{compiled} objects compiled"
    say(f"build {name}: done in {fmt_secs(t_total)} ({objects}) — {out / 'arch/x86/boot/bzImage'}")
    if req.profile is not None and req.variant.autofdo:
        say(f"build {name}: {afdo.summary_line(build['proof'])}")
        afdo.enforce(build["proof"], out)
    elif req.profile is not None:
        proof.enforce(build["proof"], out)
    if plan is not None:
        order.enforce(build["order"], out)
    if rec is not None:
        bolt.enforce(build["bolt"], out)
    return build


def _check_profile(profile: Path, gcc: str) -> None:
    """The profile as GCC will read it, before anything is built: an optimized build that GCC silently builds
    without the profile fails only at its proof, an hour later."""
    from kpgo.gcov.gcda import gcov_version_prefix
    from kpgo.gcov.profile import check_for_build, read_profile_json

    if not profile.is_dir():
        raise UserError(f"profile directory {profile} not found", "pass a directory written by `kpgo collect` or `kpgo profile fix`")
    if next(profile.rglob("*.gcda"), None) is None:
        raise UserError(f"profile directory {profile} holds no .gcda files", "collect a profile first (`kpgo collect`)")
    info = check_for_build(profile)  # damaged files, impossible counts, mixed builds, no object summary
    want = gcov_version_prefix(gcc)
    if want and info["gcov_version"][:3] != want:
        # GCC compares the whole version word and ignores (with a warning) every file of another version.
        raise UserError(f"profile {profile} was written by another GCC (gcov version {info['gcov_version']}); this build "
                        f"compiles with GCC {gcc}, which ignores it", f"collect the profile from a kernel built with GCC {gcc}")
    if not read_profile_json(profile):
        raise UserError(f"profile directory {profile} has no profile.json, so kpgo cannot tell which kernel it was collected from",
                        "pass a profile written by `kpgo collect` and `kpgo profile fix` (or `kpgo profile merge`)")


def _check_profile_origin(req: BuildRequest) -> None:
    """A profile collected on another config or kernel version matches few objects: GCC drops their counters with a
    coverage-mismatch warning, and the build fails its proof at the end."""
    from kpgo.gcov.profile import origins, read_profile_json

    version = req.source.version
    for origin in origins(read_profile_json(req.profile)) if req.profile is not None else []:
        name, release = origin.get("config_name"), str(origin.get("kernel_release") or "")
        if name and name != req.config.name:
            raise UserError(f"profile {req.profile} was collected on a {name} kernel; this build is {req.config.name}",
                            f"build with the config it was collected on (--base {name} or --config FILE), or collect a profile on this one")
        if release and not req.stale_profile and not (release == version or (release.startswith(version) and not release[len(version)].isdigit())):
            raise UserError(f"profile {req.profile} was collected on kernel {release}; the source is {version}",
                            "build from the source it was collected on (--source), port it (`kpgo profile port`), collect a profile "
                            "from this one, or use it as it is with --stale-profile")


# The object summary of an all-zero .gcda as installed: GCC's code for an object that never ran does not depend
# on it (byte-identical objects for any sum_max: tests/test_reuse.py, docs/MEASUREMENTS.md), so one canonical
# value makes such files identical across workloads and their objects reusable (REUSE_CC).
ZERO_SUMMARY = (1, 1)
REUSE_CC = Path(__file__).with_name("reuse-cc.sh")
ZERO_MARK = ".kpgo-zero"


def _gcov_rekey(req: BuildRequest) -> ident.Rekey | None:
    """The re-keying req's gcov profile needs (req's source is the tree it compiles: the patched copy, if any)."""
    if req.profile is None or req.variant.autofdo or not req.variant.profile:
        return None
    return ident.profile_rekey(req.profile, req.source.path)


def _install_profile(profile: Path, out: Path, rekey: ident.Rekey | None) -> tuple[int, int, int]:
    """Put each .gcda beside the object it belongs to: GCC looks for <dumpdir>/<base>.gcda
    relative to the directory it compiles in, which for Kbuild is the O= directory; re-keyed for this build's source
    path when the profile's kernel compiled another (Rekey). An all-zero file gets the canonical summary and a marker
    (X.kpgo-zero) that lets REUSE_CC take X.o from ccache. Returns (files installed, all-zero files, functions
    re-keyed)."""
    from kpgo.gcov.gcda import read_gcda

    n = zero = moved = 0
    files = sorted(profile.rglob("*.gcda"))
    rekeyer = ident.Rekeyer(rekey, [f.relative_to(profile) for f in files]) if rekey is not None else None
    for src in files:
        rel = src.relative_to(profile)
        dst = out / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        g = read_gcda(src)
        if rekeyer is not None:
            g, k = rekeyer.apply(g, rel)
            moved += k
        if g.all_zero():
            dst.write_bytes(g.with_summary(*ZERO_SUMMARY).to_bytes())
            dst.with_suffix(ZERO_MARK).touch()
            zero += 1
        elif rekeyer is not None:
            dst.write_bytes(g.to_bytes())
        else:
            shutil.copyfile(src, dst)
        n += 1
    return n, zero, moved


def _make_vars(variant: Variant) -> tuple[list[str], dict[str, str]]:
    """make variables and environment of the build: the variant's compiler (CC=gcc-11, LLVM=-19), and the wrapper
    that sends reusable compiles through ccache: for a profile build its all-zero-profile objects, for a build with
    neither profile nor gcov (vanilla, compiler variants) every object, so a second run or study builds it from the
    cache. Not the instrumented kernel: its objects embed their build directory's .gcda paths. Depend mode: a miss
    costs about a plain compile (docs/ARCHITECTURE.md). Without ccache nothing is reused, and a profile build says so."""
    compiler = variant.compiler
    if variant.gcov or compiler.family != "gcc" or not proc.which("ccache"):  # (Clang builds: not tried with it)
        return list(compiler.make_args()), {}
    env = {"KPGO_REUSE": "zero" if variant.profile else "all", "CCACHE_DIR": str(cache_dir() / "ccache"),
           # Each build has its own O= directory, and Kbuild compiles in it: without this every build would miss.
           "CCACHE_NOHASHDIR": "1", "CCACHE_DEPEND": "1"}
    if compiler.command != "gcc":  # the wrapper is make's CC, so it is told the variant's (CC=gcc-11)
        env["KPGO_CC"] = compiler.command
    if variant.profile:
        env["KPGO_PT_CC"] = str(_partial_training_cc())
    return [f"CC=sh {REUSE_CC}"], env


def _partial_training_cc() -> Path:
    """An executable compiler that is $KPGO_CC (or gcc) with -fprofile-partial-training: ccache refuses that flag on
    the command line, so REUSE_CC hands it this compiler instead. ccache keys it apart from plain gcc by its name
    and by its `-v` output (the real compiler's version; CCACHE_COMPILERCHECK in REUSE_CC). Made once, in the cache."""
    path = cache_dir() / "tools" / "kpgo-pt-gcc"  # 'gcc' in the name: ccache then treats it as GCC
    text = ("#!/bin/sh\n# kpgo: the variant's GCC with partial training (kpgo.kernel.kbuild._partial_training_cc)\n"
            f'exec "${{KPGO_CC:-gcc}}" {PARTIAL_TRAINING} "$@"\n')
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.replace(path)
    return path


def _ccache_stats(env: dict[str, str]) -> dict[str, int]:
    if not env:
        return {}
    out = proc.capture(["ccache", "--print-stats"], env=env)
    stats = dict(line.split("\t", 1) for line in out.splitlines() if "\t" in line)
    return {k: int(v) for k, v in stats.items() if v.strip().isdigit()}


_STEP = re.compile(r"^\s+(CC|AS|LD|AR|HOSTCC|GEN|OBJCOPY|BUILD)\s+(?:\[M\]\s+)?(\S+)")  # "CC [M]  fs/x.o": a module's object
_ERROR = re.compile(r"(error:|Error \d+|undefined reference|fatal error|No space left)")


def _counts_file() -> Path:
    return cache_dir() / "build-counts.json"


def _remember_count(req: BuildRequest, compiled: int) -> None:
    if compiled < 100:  # an incremental rebuild says nothing about the total
        return
    path = _counts_file()
    try:
        counts = json.loads(path.read_text())
    except (OSError, ValueError):
        counts = {}
    key = f"{req.config.digest()}-{req.variant.name}"
    # the largest seen: a build resumed in a directory an interrupted one left compiles only the rest
    counts[key] = max(compiled, int(counts.get(key, 0)))
    atomic.write_json(path, counts)


def _expected_count(req: BuildRequest) -> int | None:
    try:
        return int(json.loads(_counts_file().read_text())[f"{req.config.digest()}-{req.variant.name}"])
    except (OSError, ValueError, KeyError):
        return None


def make_command(req: BuildRequest, out: Path, kcflags: list[str], make_args: list[str], modules: bool = False) -> list[str]:
    """make's argv of the build: the image, and the modules of a config that has them (--base debian). The path maps
    of reproducible() go after the flags, in KCFLAGS and KAFLAGS: they change no code, so build.json's `kcflags`
    (what tells kernels apart, extra_flags) leaves them out."""
    maps = prefix_maps(req.source.path, out)
    argv = ["make", "-C", str(req.source.path), f"O={out}", f"-j{req.jobs}", *make_args, "bzImage", *(["modules"] if modules else [])]
    argv.append("KCFLAGS=" + " ".join([*kcflags, *maps]))
    argv.append("KAFLAGS=" + " ".join(maps))
    return argv


# Reproducible builds (the kernel's Documentation/kbuild/reproducible-builds.rst): what a build would take from the
# moment, the machine and its directories is fixed, so two builds from the same inputs give the same vmlinux byte for
# byte (build.json's vmlinux_sha256; tests/test_reproducible_vm.py). None of it is a key input: same inputs, same key,
# so builds made before kept their keys (they lack build.json's "reproducible", and their vmlinux has the moment
# and the machine of its build in its version string).
REPRODUCIBLE_USER = REPRODUCIBLE_HOST = "kpgo"
# "#1" in `uname -v`: left to Kbuild it counts the links made in the build directory (.version), so a resumed build
# that links again, or a packaging run, would change the version string and so vmlinux.
REPRODUCIBLE_VERSION = "1"


def build_timestamp(source: Path) -> str:
    """KBUILD_BUILD_TIMESTAMP: $SOURCE_DATE_EPOCH when set (the reproducible-builds convention, e.g. a git tree's
    commit date), else the modification time of the source's top Makefile (Debian's tarball keeps its release's),
    in `LC_ALL=C date -u`'s format, which the initramfs's `date -d` parses again."""
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    t = int(epoch) if epoch.isdigit() else int((source / "Makefile").stat().st_mtime)
    return time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime(t))


def prefix_maps(source: Path, out: Path) -> list[str]:
    """-fdebug-prefix-map for the O= directory and the source: debug info names neither (Kbuild maps __FILE__ itself,
    -fmacro-prefix-map). GCC uses the last map that matches, so the longer path goes last (an O= inside the source).
    Not -ffile-prefix-map: it implies -fprofile-prefix-map, and an instrumented kernel writes its .gcda files under
    the O= directory's real path. ccache's reuse across O= directories stays (docs/ARCHITECTURE.md)."""
    paths = sorted({str(source.resolve()), str(out.resolve())}, key=len)
    return [f"-fdebug-prefix-map={p}=." for p in paths]


def reproducible_env(source: Path) -> dict[str, str]:
    """The environment Kbuild reads the version string's moment, user, host and build number from."""
    return {"KBUILD_BUILD_TIMESTAMP": build_timestamp(source), "KBUILD_BUILD_USER": REPRODUCIBLE_USER,
            "KBUILD_BUILD_HOST": REPRODUCIBLE_HOST, "KBUILD_BUILD_VERSION": REPRODUCIBLE_VERSION}


def vmlinux_identity(out: Path) -> dict[str, str]:
    """build.json's vmlinux_sha256 (the bytes two builds of the same inputs share) and build_id (what a booted kernel
    reports in /sys/kernel/notes: kpgo verify); nothing for a directory without a vmlinux."""
    vmlinux = out / "vmlinux"
    if not vmlinux.is_file():
        return {}
    return {"vmlinux_sha256": file_sha256(vmlinux), "build_id": branches.build_id_of(vmlinux)}


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _shell(argv: list[str], env: dict[str, str]) -> str:
    """The command as a shell line, its environment in front."""
    return shlex.join([*(f"{k}={v}" for k, v in env.items()), *argv])


def dry_run(req: BuildRequest) -> list[str]:
    """The shell lines a build of `req` would run (configure, profile installation, make), without running them."""
    v, out = req.variant, req.out.resolve()
    c = v.compiler
    lines = [f"# variant {v.name}: {v.summary()} ({v.path})"]
    missing = c.missing_tools()
    if not missing:  # the flags the compiler would reject fail the dry run as they would the build
        variants.check_flags(v, tuple(req.kcflags))
    lines.append(f"# compiler: {c.command} ({c.version_text()})" if not missing else
                 f"# compiler: {c.name} is not installed ({', '.join(missing)} not found): kpgo variants install {v.name}, "
                 f"or apt-get install {' '.join(c.packages)}")
    if not req.config.base_target:
        lines.append(shlex.join(["cp", str(req.config.files[0]), str(out / ".config")]))
    if req.values:
        lines.append(f"# the source: a copy of {req.source.path} with {values.PATCH.name} applied (in {cache_dir() / 'src'})")
        lines.append(f"# the GCC plugin: {values.PLUGIN_SOURCE.name} built for {c.name} (in {cache_dir() / 'plugins'})")
    if v.order or v.autofdo:
        lines.append(f"# the source: a copy of {req.source.path} with {order.PATCH.name} applied (in {cache_dir() / 'src'})")
    if v.order:
        lines.append(f"# the function order: C3 over {req.call_graph}, written to {out / order.FRAGMENT} (and {order.LIST})")
    lines += [shlex.join(argv) for argv in kconfig.configure_commands(req.source.path, out, req.config, req.fragments, c.make_args())]
    if v.bolt or v.bolt_base:
        lines.append(f"# the source: a copy of {req.source.path} with {bolt.PATCH.name} applied (in {cache_dir() / 'src'})")
    if v.bolt:
        lines.append(f"# BOLT's profile: perf2bolt -pa over {req.branches}, written to {out / bolt.FDATA}; after the link "
                     f"{out / bolt.STEP} runs {bolt.LLVM_BOLT} {' '.join(bolt.OPTIONS)} on vmlinux")
    if req.profile is not None and v.autofdo:
        lines.append(shlex.join([afdo.PROFDATA, "merge", "--sample", "--extbinary", str(req.profile.resolve() / afdo.PROFILE_FILE), "-o",
                                 str(afdo.installed(out))]))
    elif req.profile is not None:
        lines.append(f"# each .gcda of {req.profile.resolve()} copied to its object's place under {out}")
    make_args, env = _make_vars(v)
    env = reproducible_env(req.source.path) | env
    if v.autofdo and v.lto:
        make_args.append(f"{afdo.LDFLAGS_VAR}={' '.join(afdo.lto_ldflags(out if v.profile else None))}")
    if req.values:
        make_args.append(f"{values.PLUGIN_VAR}=<the plugin>")
    if v.order:
        make_args.append(f"{order.MAKE_VAR}={out / order.FRAGMENT}")
    if v.bolt:
        make_args += [f"{bolt.MAKE_VAR}={out / bolt.STEP}", f"{bolt.RESERVE_VAR}=<bytes>"]
    lines.append(_shell(make_command(req, out, kcflags(req), make_args, kconfig.sets_modules(req.config, req.fragments)), env))
    return lines


def _make(req: BuildRequest, out: Path, log: Path, argv: list[str], env: dict[str, str]) -> int:
    name = req.variant.name
    bar = Progress(f"build {name}: objects", _expected_count(req))
    compiled = 0

    def line(text: str) -> None:
        nonlocal compiled
        m = _STEP.match(text)
        if m and m.group(1) == "CC" and not m.group(2).startswith("/"):  # not the host tools (objtool)
            compiled += 1
            bar.step(note=m.group(2))

    res = proc.run(argv, log=log, on_line=line, check=False, keep_output=False, env=env or None)
    if res.returncode != 0:
        bar.close("failed")
        _report_failure(log)
        raise InfraError(f"kernel build of variant {name} failed (exit {res.returncode})", f"full log: {log}")
    bar.close(f"{compiled} objects")
    return compiled


def _report_failure(log: Path) -> None:
    lines = log.read_text(errors="replace").splitlines()
    hits = [ln for ln in lines if _ERROR.search(ln)]
    for ln in (hits or lines)[-8:]:
        print(f"  | {ln[:200]}", flush=True)


def text_sizes(out: Path) -> dict[str, int | None]:
    """Code size of the build in `out`, in bytes (the keys of build.json's "sizes"):
    - functions_size, functions, text_span, vmlinux_text: from vmlinux (codesize.measure: the function symbols'
      sizes summed; the span of .text in use; the .text section itself, padded to 2 MiB, for reference only);
    - bzimage: the size of arch/x86/boot/bzImage;
    - objects_text, text_hot, text_unlikely, objects: .text* / .text.hot* / .text.unlikely* (and Clang's .text.split*)
      summed over the objects linked into vmlinux (objects_text includes the other two; under Clang's LTO, whose
      objects are bitcode, over vmlinux.o). The kernel's linker script folds those
      input sections into the one output .text, so only the objects show the split.
    None (vmlinux keys) or 0 (object sums) for what the directory does not hold."""
    objects = {"objects_text": 0, "text_hot": 0, "text_unlikely": 0, "objects": 0}
    sizes = codesize.vmlinux_sizes(out)
    if not (out / "vmlinux").exists():
        return sizes | objects
    members = proc.capture(["ar", "t", out / "vmlinux.a"]).split() if (out / "vmlinux.a").exists() else []
    objs = [out / m for m in members if m.endswith(".o") and (out / m).exists()]
    objects["objects"] = len(objs)
    if objs and objs[0].read_bytes()[:4] == b"BC\xc0\xde":  # Clang's LTO: the objects are bitcode, the code is vmlinux.o's
        objs = [out / "vmlinux.o"]
    for i in range(0, len(objs), 400):
        for name, size in _section_sizes(objs[i : i + 400]):
            if name == ".text" or name.startswith(".text."):
                objects["objects_text"] += size
            if name.startswith(".text.hot"):
                objects["text_hot"] += size
            elif name.startswith((".text.unlikely", ".text.split")):  # Clang's split-off cold blocks are unlikely code too
                objects["text_unlikely"] += size
    return sizes | objects


def _section_sizes(files: list[Path]) -> list[tuple[str, int]]:
    out = proc.capture(["size", "-A", "-d", *files], timeout=120)
    rows = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0].startswith(".") and parts[1].isdigit():
            rows.append((parts[0], int(parts[1])))
    return rows
