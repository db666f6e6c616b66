"""Clang AutoFDO profiles from the emulator's branch records (docs/CLANG.md), and the proof that Clang used one.

A sample profile is made from one or more branch profiles (`kpgo collect BUILD --branches`) of one training kernel,
a Clang kernel built as upstream's AutoFDO builds are (line tables, -fdebug-info-for-profiling, flow-sensitive
discriminators: the variants with autofdo = true): `llvm-profgen --kernel` turns each perf-script file into a
sample profile, `llvm-profdata merge --sample` merges them (weighted, or normalized to the same total first, as
`kpgo profile merge` does for gcov). The directory holds profile.afdo (LLVM's text format: readable, and the one
format kpgo parses) and profile.json naming the training kernel by its build id.

The proof reads Clang's own optimization records: an optimized build compiles every object with
-fsave-optimization-record restricted to the sample-profile pass, which writes an `AppliedSamples` remark into
OBJ.opt.yaml for each function that took samples from the profile. The share of the profile's sampled functions
(by samples) that got one is the proof; a build below PROOF_MIN fails, as a GCC build whose objects did not read
their .gcda does."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kpgo import atomic, inputs, proc
from kpgo.errors import InfraError, UserError

SAMPLE_KIND = "kernel-sample-profile"
PROFILE_FILE = "profile.afdo"
LLVM = 19  # Debian 12's llvm-19: llvm-profgen-19, llvm-profdata-19 (the clang-19 variants' toolchain)
PROFGEN = f"llvm-profgen-{LLVM}"
PROFDATA = f"llvm-profdata-{LLVM}"
# What upstream's AutoFDO kernel build adds to every object (6.13's scripts/Makefile.autofdo), the training kernel's
# and the optimized one's alike: line tables when the config has no debug info, the profile-friendly debug info,
# and discriminators that tell apart the copies of a line the backend makes.
TRAIN_FLAGS = ("-gmlt", "-fdebug-info-for-profiling", "-mllvm", "-enable-fs-discriminator=true", "-mllvm", "-improved-fs-discriminator=true")
# The optimized build's, beside -fprofile-sample-use=FILE: each function in its own section (hot and unlikely ones
# get .text.hot./.text.unlikely. prefixes the linker script groups), cold blocks split out of hot functions, and
# Clang's record of where it applied the profile (the proof) and which indirect calls it promoted. The passes'
# pattern (sample-profile-*, pgo-icall-prom) is a regex without | or parentheses: Kbuild hands KCFLAGS to a shell.
REMARK_PASSES = "[sp][ag][mo][p-][li]"
USE_FLAGS = ("-ffunction-sections", "-fsplit-machine-functions", "-fsave-optimization-record", f"-foptimization-record-passes={REMARK_PASSES}")
# Under ThinLTO the code is generated at the link, so the linker gets the profile and the discriminator options too,
# and writes the records of that code generation (one file per ThinLTO backend: LTO_REMARKS.thin.N.).
LTO_LDFLAGS = ("--mllvm=-enable-fs-discriminator=true", "--mllvm=-improved-fs-discriminator=true", "-plugin-opt=-split-machine-functions")
LTO_REMARKS = "kpgo-lto.opt.yaml"
PERF_SCRIPT = "perf.script"  # kpgo.branches.PERF_SCRIPT_FILE, named here so that a build need not import numpy
LDFLAGS_VAR = "KPGO_LDFLAGS"  # the make variable kpgo's text-sections patch adds to the kernel's linker options
RECIPE = 1  # of the flags below and the proof: part of an AutoFDO build's key
INSTALLED = "kpgo-sample.afdo"  # the profile's copy in the build directory (its path is in every object's flags)
PROOF_MIN = 0.9  # share of the profile's samples whose function Clang says it applied samples to
TOP = 10
REMARKS = "*.opt.yaml*"  # OBJ.opt.yaml of each compile, LTO_REMARKS.thin.N. of the link


@dataclass(frozen=True)
class SampleFunction:
    name: str
    total: int  # samples in the function and what was inlined into it
    head: int  # samples at its entry


def parse_text(text: str) -> list[SampleFunction]:
    """The top-level functions of a sample profile in LLVM's text format (`name:total:head` at the start of a line;
    indented lines are the function's body and inlinees). A line that is neither is a UserError."""
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line or line[0].isspace():
            continue
        m = re.fullmatch(r"(.+):(\d+):(\d+)", line)
        if not m:
            raise UserError(f"line {n} of the sample profile is not `name:total:head`: {line[:80]!r}", "make it again with `kpgo profile afdo`")
        out.append(SampleFunction(m[1], int(m[2]), int(m[3])))
    return out


def base_name(symbol: str) -> str:
    """A function's name without the suffixes compilers add to its clones and parts (foo.llvm.123, foo.cold,
    foo.isra.0, foo.part.1): the profile keys functions by their source name."""
    return symbol.split(".", 1)[0] if not symbol.startswith(".") else symbol


HINT = "make the profile with `kpgo profile afdo BRANCH_DIR... -o DIR`"
# profile.json of a sample profile as make() writes it (what the build and stats read of it)
MANIFEST_SHAPE = {"kind": str, "build_id?": (str, None), "vmlinux?": str, "functions?": int, "samples?": int, "normalized?": bool,
                  "inputs?": [{"dir": str, "workload?": (str, dict, None), "weight": (int, float), "llvm_weight?": int, "samples?": int,
                              "collected_at?": (str, None)}],
                  "tools?": {str: str}, "hot_functions?": [{"function": str, "samples": int}]}


def read_functions(path: Path) -> list[SampleFunction]:
    return parse_text(inputs.read_text(path, HINT, inputs.BINARY_LIMIT))  # the server kernel's is tens of MiB


def read_profile(path: Path) -> dict[str, Any]:
    """A sample profile directory's manifest, checked: its kind, and the profile file beside it."""
    path = Path(path)
    if not (path / "profile.json").exists():
        raise UserError(f"{path} holds no profile.json", HINT)
    manifest = inputs.read_json(path / "profile.json", HINT, dict)
    if manifest.get("kind") != SAMPLE_KIND:
        raise UserError(f"{path} is not a Clang sample profile (profile.json kind {manifest.get('kind')!r})", HINT)
    inputs.check(manifest, MANIFEST_SHAPE, path / "profile.json", HINT)
    if not (path / PROFILE_FILE).is_file():
        raise UserError(f"the sample profile {path} lacks {PROFILE_FILE}", HINT)
    return manifest


def check_for_build(path: Path) -> dict[str, Any]:
    """A sample profile a build can use: its manifest and a profile that parses with samples in it."""
    manifest = read_profile(path)
    if not any(f.total for f in read_functions(Path(path) / PROFILE_FILE)):
        raise UserError(f"the sample profile {path} holds no samples", "record the branches under a workload and make it again")
    return manifest


def installed(out: Path) -> Path:
    return Path(out).resolve() / INSTALLED


def install(profile: Path, out: Path) -> tuple[int, int]:
    """The profile in the build directory (the flags name it there), in LLVM's extensible binary format: every
    object's compile reads the whole profile, and the text takes several times as long to parse (0.10 s against
    0.02 s of CPU per object for a tiny kernel's 2 MB profile). (files installed, all-zero files), as the gcov
    installation counts them."""
    proc.run([PROFDATA, "merge", "--sample", "--extbinary", Path(profile) / PROFILE_FILE, "-o", installed(out)], what=f"{PROFDATA} merge",
             timeout=600)
    return 1, 0


def lto_ldflags(out: Path | None) -> list[str]:
    """The linker's options under ThinLTO: the discriminators always, the profile for an optimized build (`out`)."""
    if out is None:
        return list(LTO_LDFLAGS)
    # the -plugin-opt= spellings: ld.lld-19 takes --opt-remarks-* only as two words, which make's variable would split
    remarks = (f"-plugin-opt=opt-remarks-filename={Path(out).resolve() / LTO_REMARKS}", f"-plugin-opt=opt-remarks-passes={REMARK_PASSES}")
    return [f"--lto-sample-profile={installed(out)}", *LTO_LDFLAGS, *remarks]


def is_sample_profile(path: Path) -> bool:
    """Whether `path` says it is a sample profile (its profile.json's kind); anything unreadable is not."""
    try:
        manifest = inputs.read_json(Path(path) / "profile.json", HINT, missing_ok=True)
    except UserError:
        return False
    return isinstance(manifest, dict) and manifest.get("kind") == SAMPLE_KIND


def _weights(totals: Sequence[int], weights: Sequence[float], normalize: bool) -> list[int]:
    """llvm-profdata takes integer weights: the wanted ones (times 1/total with normalize, so each input counts as
    much as the others) scaled so that the smallest is 100, which keeps their ratios to within 1%; all 1 when they
    are equal."""
    want = [w / t if normalize else w for w, t in zip(weights, totals)]
    if len(set(want)) == 1:  # nothing to weigh: the counts stay as recorded
        return [1] * len(want)
    low = min(want)
    return [max(1, round(100 * w / low)) for w in want]


def make(inputs: Sequence[Path], out: Path, weights: Sequence[float] | None = None, normalize: bool = False) -> dict[str, Any]:
    """Write the sample profile of the branch profiles `inputs` (all of one training kernel) into the new directory
    `out`; its manifest is returned."""
    from kpgo import branches  # numpy: only where records are read

    manifests, weights, vmlinux, build_id = branches.read_inputs(inputs, out, weights, "training kernel")
    check_training(vmlinux)
    for tool in (PROFGEN, PROFDATA):
        if proc.which(tool) is None:
            raise UserError(f"{tool} not found", f"apt-get install llvm-{LLVM} (or run `make setup`)")
    with atomic.output_dir(out) as tmp, tempfile.TemporaryDirectory(prefix="kpgo-afdo-") as work:
        parts = []
        for i, p in enumerate(inputs):
            part = Path(work) / f"{i}.afdo"
            log = tmp / "profgen.log"
            # --kernel: the samples are the kernel's, mapped by the [kernel.kallsyms]_text mmap kpgo writes
            proc.run([PROFGEN, "--kernel", f"--perfscript={Path(p) / PERF_SCRIPT}", f"--binary={vmlinux}", "--format=text",
                      f"--output={part}"], log=log, what=f"{PROFGEN} on {p}", timeout=3600)
            if not part.is_file() or not read_functions(part):
                raise InfraError(f"{PROFGEN} made no samples from {p} (log: {log})",
                                 "check that the branch profile was recorded on a kernel with line tables (an autofdo variant)")
            parts.append(part)
        totals = [sum(f.total for f in read_functions(part)) for part in parts]
        ints = _weights(totals, weights, normalize)
        proc.run([PROFDATA, "merge", "--sample", "--text", *[f"--weighted-input={w},{part}" for w, part in zip(ints, parts)],
                  "-o", tmp / PROFILE_FILE], log=tmp / "profgen.log", what=f"{PROFDATA} merge", timeout=3600)
        funcs = sorted(read_functions(tmp / PROFILE_FILE), key=lambda f: -f.total)
        manifest = {
            "kind": SAMPLE_KIND,
            "build_id": build_id,
            "vmlinux": str(vmlinux),
            "tools": {PROFGEN: _version(PROFGEN), PROFDATA: _version(PROFDATA)},
            "inputs": [{"dir": str(Path(p).resolve()), "workload": m.get("workload"), "weight": w, "llvm_weight": iw, "samples": t,
                        "collected_at": m.get("collected_at")}
                       for p, m, w, iw, t in zip(inputs, manifests, weights, ints, totals)],
            "normalized": normalize,
            "functions": len(funcs),
            "samples": sum(f.total for f in funcs),
            "hot_functions": [{"function": f.name, "samples": f.total} for f in funcs[:TOP]],
        }
        atomic.write_json(tmp / "profile.json", manifest)
    return manifest


def _version(tool: str) -> str:
    text = proc.capture([tool, "--version"])
    m = re.search(r"LLVM version (\S+)", text)
    return m[1] if m else text.strip().splitlines()[0] if text.strip() else "?"


def check_training(vmlinux: Path) -> None:
    """The training kernel has line tables (llvm-profgen attributes samples to source lines; without them every sample
    is dropped)."""
    sections = proc.capture(["readelf", "-SW", str(vmlinux)], timeout=120)
    if ".debug_line" not in sections:
        raise UserError(f"{vmlinux} has no line tables, so its branch records cannot become a sample profile",
                        "record on a Clang kernel built for profiling: `kpgo build --variant clang-train`")


# ---- proof ----

@dataclass(frozen=True)
class Promotion:
    caller: str
    callee: str
    count: int
    total: int


def _value(line: str) -> str:
    return line.split(":", 1)[1].strip().strip("'\"")


def _remarks(path: Path) -> tuple[set[str], list[Promotion]]:
    """What one optimization-record file says: the functions its AppliedSamples remarks name, and the indirect calls
    its Promoted remarks turned into direct ones. The YAML documents have a fixed shape and are read line by line (a
    full YAML parse of the kernel's records takes minutes)."""
    applied: set[str] = set()
    promoted: list[Promotion] = []
    doc: dict[str, str] = {}

    def flush() -> None:
        if doc.get("Name") == "AppliedSamples" and "Function" in doc:
            applied.add(doc["Function"])
        elif doc.get("Name") == "Promoted" and {"Function", "DirectCallee", "Count", "TotalCount"} <= doc.keys():
            promoted.append(Promotion(doc["Function"], doc["DirectCallee"], int(doc["Count"]), int(doc["TotalCount"])))

    with open(path, errors="replace") as f:
        for line in f:
            if line.startswith("--- "):
                flush()
                doc = {}
            elif line.startswith(("Name:", "Function:")):
                doc[line.split(":", 1)[0]] = _value(line)
            elif line.lstrip().startswith(("- DirectCallee:", "- Count:", "- TotalCount:")):
                key = line.strip()[2:].split(":", 1)[0]
                doc.setdefault(key, _value(line.strip()[2:]))
    flush()
    return applied, promoted


def defining_objects(out: Path) -> dict[str, set[str]]:
    """Function name (without the suffixes of clones and parts) -> the objects of vmlinux.a that define one of that
    name (llvm-nm reads Clang's objects and its LTO bitcode alike)."""
    archive = Path(out) / "vmlinux.a"
    if not archive.is_file():
        return {}
    members = [m for m in proc.capture(["ar", "t", archive], timeout=120).split() if m.endswith(".o") and (Path(out) / m).is_file()]
    where: dict[str, set[str]] = {}
    for i in range(0, len(members), 400):
        chunk = members[i:i + 400]
        text = proc.capture([f"llvm-nm-{LLVM}", "--defined-only", *chunk], cwd=Path(out), timeout=600)
        obj = chunk[0] if len(chunk) == 1 else ""
        for line in text.splitlines():
            if line.endswith(".o:") and not line.startswith(" "):
                obj = line[:-1]
                continue
            parts = line.split()
            if len(parts) == 3 and parts[1] in "tTwW":
                where.setdefault(base_name(parts[2]), set()).add(obj)
    return where


def across_objects(c: Promotion, where: dict[str, set[str]]) -> bool:
    """The target is defined in none of the objects that define the caller: a call only optimization across objects
    (ThinLTO's imports) could promote. Unknown names count as not across."""
    a, b = where.get(base_name(c.caller), set()), where.get(base_name(c.callee), set())
    return bool(a and b) and not (a & b)


def check(out: Path, profile: Path) -> dict[str, Any]:
    """The proof record of an optimized Clang build in `out` made with the sample profile `profile`."""
    funcs = read_functions(Path(profile) / PROFILE_FILE)
    applied: set[str] = set()
    promoted: list[Promotion] = []
    objects = with_remarks = 0
    for f in Path(out).rglob(REMARKS):
        objects += 1
        names, calls = _remarks(f)
        with_remarks += bool(names)
        applied |= {base_name(n) for n in names}
        promoted += calls
    where = defining_objects(out) if promoted else {}
    sampled = [f for f in funcs if f.total > 0]
    total = sum(f.total for f in sampled)
    got = [f for f in sampled if base_name(f.name) in applied]
    share = sum(f.total for f in got) / total if total else 0.0
    missing = [f for f in sampled if base_name(f.name) not in applied][:TOP]
    return {
        "ok": bool(total) and share >= PROOF_MIN,
        "threshold": PROOF_MIN,
        "functions_sampled": len(sampled),
        "functions_applied": len(got),
        "share_samples": round(share, 4),
        "share_functions": round(len(got) / len(sampled), 4) if sampled else 0.0,
        "records": objects,
        "records_with_samples": with_remarks,
        "missing_hottest": [{"function": f.name, "samples": f.total} for f in missing],
        "promoted_calls": len(promoted),
        "promoted_across_objects": sum(across_objects(c, where) for c in promoted),
        "promoted_hottest": [{"caller": c.caller, "callee": c.callee, "count": c.count, "of": c.total, "across_objects": across_objects(c, where)}
                             for c in sorted(promoted, key=lambda c: -c.count)[:TOP]],
    }


def enforce(record: dict[str, Any], out: Path) -> None:
    if not record["ok"]:
        raise InfraError(f"Clang applied the sample profile to functions holding {record['share_samples']:.1%} of its samples "
                         f"(below {record['threshold']:.0%}; {record['functions_applied']} of {record['functions_sampled']} functions)",
                         f"see {out / 'build.json'} (proof.missing_hottest) and the objects' .opt.yaml records")


def summary_line(record: dict[str, Any]) -> str:
    promoted = (f"; {record['promoted_calls']:,} indirect calls promoted ({record.get('promoted_across_objects', 0):,} to a target in "
                "another object)") if record.get("promoted_calls") else ""
    return (f"Clang applied the profile to {record['functions_applied']:,} of {record['functions_sampled']:,} sampled functions "
            f"({record['share_samples']:.1%} of the samples){promoted}")
