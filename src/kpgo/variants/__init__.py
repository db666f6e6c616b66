"""Compiler variants as data: one TOML file per variant in this package, or a user's own (--variant-file FILE).
A variant names the compiler (gcc-N, or clang-N built with LLVM=-N), the optimization level (O2, O3, Os), extra
flags for every kernel object, and whether it compiles with a profile (profile = true: GCC's .gcda, or with
autofdo = true Clang's sample profile) or is the gcov-instrumented kernel that collects one (gcov = true), whether
its functions are linked in the order a recorded call graph gives (order = true; kpgo.kernel.order), whether BOLT
rewrites its vmlinux from recorded branches (bolt = true; kpgo.kernel.bolt), whether it is built as upstream's Clang
AutoFDO kernels are (autofdo = true; kpgo.afdo), and with Clang's ThinLTO (lto = "thin"). Every file is validated on
every load: a mistake stops before a build starts, in one line naming the file. See docs/COMPILERS.md."""

from __future__ import annotations

import functools
import os
import re
import tempfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from kpgo import inputs, proc
from kpgo.errors import UserError

OPTS = ("O2", "O3", "Os")
# The compiler every build used before variants were data: a variant on it leaves the compiler out of its build key.
DEFAULT_COMPILER = "gcc-12"
# The oldest compilers kernel 6.12 accepts (scripts/min-tool-version.sh: GCC 5.1, LLVM 13.0.1).
MIN_MAJOR = {"gcc": 5, "clang": 13}
KEYS: dict[str, type] = {"name": str, "description": str, "compiler": str, "opt": str, "flags": list, "profile": bool, "gcov": bool,
                         "order": bool, "bolt": bool, "bolt_base": bool, "autofdo": bool, "lto": str}
LTO = ("thin",)  # Clang's LTO kinds a variant may name (CONFIG_LTO_CLANG_THIN; full LTO takes hours on 2 cores)
REQUIRED = ("name", "description", "compiler", "opt")
HINT = "fix the file (docs/COMPILERS.md)"
PARTIAL_TRAINING = "-fprofile-partial-training"
NO_PARTIAL_TRAINING = "-fno-profile-partial-training"  # a variant that keeps GCC's default (pgo-no-pt)
# With partial training GCC 12 warns on the server kernel where the profile-optimized build does not
# (drivers/acpi/property.c: -Wstringop-overread), and the defconfig's CONFIG_WERROR fails the build; a warning
# does not change the code (docs/COMPILERS.md, "Why -Wno-error").
PARTIAL_TRAINING_FLAGS = (PARTIAL_TRAINING, "-Wno-error")
# A function order places each function's own section (kpgo.kernel.order): order = true needs it among the flags, and
# the flag needs order = true, since 6.12's linker script leaves those sections as orphans after the kernel's text.
FUNCTION_SECTIONS = "-ffunction-sections"
# GCC splits a function it has a profile of into a hot part and NAME.cold; BOLT 19 runs on the kernel without relocation
# mode, where such a function is not "simple" and keeps its code and takes no profile (28% of the server kernel's
# records under redis sat in the 152 functions the PGO kernel split). A BOLT variant with a profile builds without the
# split, and so does the kernel its records come from (pgo-nosplit; docs/LAYOUT.md "BOLT on a PGO kernel").
NO_SPLIT = "-fno-reorder-blocks-and-partition"
# What the profile is kpgo's business: profile = true adds the profile-use flags, gcov = true the instrumentation.
_PROFILE_FLAGS = ("-fprofile", "-fauto-profile", "--coverage", "-fprofile-arcs", "-ftest-coverage", "-fbranch-probabilities")
_NAME = re.compile(r"[a-z0-9][a-z0-9._-]*")
_COMPILER = re.compile(r"(gcc|clang)-([0-9]+)")
# The LLVM tools LLVM=-N makes Kbuild use (Documentation/kbuild/llvm.rst), each with the -N suffix.
_LLVM_TOOLS = ("clang", "ld.lld", "llvm-ar", "llvm-nm", "llvm-objcopy", "llvm-objdump", "llvm-readelf", "llvm-strip")


@functools.cache
def host_gcc_major() -> int | None:
    """The major version of the plain `gcc` on PATH (None without one)."""
    if proc.which("gcc") is None:
        return None
    text = proc.capture(["gcc", "-dumpversion"]).strip()
    major = text.partition(".")[0]
    return int(major) if major.isdigit() else None


@dataclass(frozen=True)
class Compiler:
    name: str  # "gcc-12", "clang-19"
    family: str  # "gcc" | "clang"
    major: int

    @property
    def command(self) -> str:
        """What compiles the kernel's objects. gcc-N is the plain `gcc` when that is version N: CC=gcc-12 for the same
        GCC would change every object's command line (Kbuild recompiles them all) and the kernel's version banner
        (CONFIG_CC_VERSION_TEXT), so a build under the same key as those made before variants existed would differ."""
        if self.family == "gcc" and host_gcc_major() == self.major:
            return "gcc"
        return self.name

    def make_args(self) -> tuple[str, ...]:
        """make variables that select the compiler, for configure and build alike (HOSTCC stays gcc for GCC;
        LLVM=-N switches the whole toolchain, host tools included, to clang-N, ld.lld-N, llvm-ar-N, ...)."""
        if self.family == "clang":
            return (f"LLVM=-{self.major}",)
        return () if self.command == "gcc" else (f"CC={self.command}",)

    @property
    def tools(self) -> tuple[str, ...]:
        if self.family == "clang":
            return tuple(f"{t}-{self.major}" for t in _LLVM_TOOLS)
        return (self.command,)

    @property
    def packages(self) -> tuple[str, ...]:
        """The Debian packages that hold `tools`."""
        if self.family == "clang":
            return (f"clang-{self.major}", f"lld-{self.major}", f"llvm-{self.major}")
        return (f"gcc-{self.major}",)

    def missing_tools(self) -> list[str]:
        return [t for t in self.tools if proc.which(t) is None]

    def installed(self) -> bool:
        return not self.missing_tools()

    def version(self) -> str:
        return _version(self.command, self.family)

    def version_text(self) -> str:
        return _version_text(self.command)


@functools.cache
def _version(command: str, family: str) -> str:
    # GCC's -dumpversion may print only the major; clang has no -dumpfullversion but prints all of it.
    return proc.capture([command, "-dumpfullversion" if family == "gcc" else "-dumpversion"]).strip()


@functools.cache
def _version_text(command: str) -> str:
    return (proc.capture([command, "--version"]).splitlines() or [""])[0].strip()


def _unknown_compiler(name: str) -> str | None:
    m = _COMPILER.fullmatch(name)
    if m and int(m[2]) >= MIN_MAJOR[m[1]]:
        return None
    return f"unknown compiler '{name}' (gcc-N with N ≥ {MIN_MAJOR['gcc']}, clang-N with N ≥ {MIN_MAJOR['clang']}: e.g. gcc-12, gcc-11, clang-19)"


def compiler(name: str) -> Compiler:
    """The compiler named gcc-N or clang-N (a UserError for anything else, or one older than the kernel accepts)."""
    problem = _unknown_compiler(name)
    if problem:
        raise UserError(problem, "see docs/COMPILERS.md")
    m = _COMPILER.fullmatch(name)
    assert m  # _unknown_compiler said so
    return Compiler(name, m[1], int(m[2]))


@dataclass(frozen=True)
class Variant:
    name: str
    description: str
    compiler: Compiler
    opt: str  # OPTS
    flags: tuple[str, ...]
    profile: bool
    gcov: bool
    path: Path  # the file it was read from
    shipped: bool  # one of kpgo's own files (else --variant-file)
    order: bool = False  # link the functions in the order of a recorded call graph (--call-graph; kpgo.kernel.order)
    bolt: bool = False  # BOLT rewrites vmlinux from recorded branch records (--branches; kpgo.kernel.bolt)
    autofdo: bool = False  # Clang, built as upstream's AutoFDO kernels are; with profile = true, from a sample profile (kpgo.afdo)
    lto: str | None = None  # Clang's LTO: "thin" or None
    # the kernel a BOLT variant rewrites, without BOLT: built from the same patched source (inert without BOLT's make
    # variables), since GCC's code with a profile changes with the source's path, and BOLT's profile must match it
    bolt_base: bool = False

    @property
    def kind(self) -> str:
        """What sort of build this is, as the build key has named it since before variants were data: instrumented
        (gcov config), optimized (compiled with a profile, proven), or vanilla (neither)."""
        return "instrumented" if self.gcov else "optimized" if self.profile else "vanilla"

    @property
    def opt_flags(self) -> tuple[str, ...]:
        """KCFLAGS for the level: the kernel has a Kconfig choice for -O2 (its default) and -Os, none for -O3 on x86
        since 6.0, so -O3 goes into KCFLAGS, which Kbuild puts after its own -O2."""
        return ("-O3",) if self.opt == "O3" else ()

    @property
    def fragments(self) -> tuple[str, ...]:
        """Config fragments (kernel/configs/NAME.config) the variant adds to every base config."""
        return (("gcov",) if self.gcov else ()) + (("os",) if self.opt == "Os" else ()) + (("thinlto",) if self.lto == "thin" else ())

    def summary(self) -> str:
        """One line: compiler, level, flags (what `variants list` and a dry run show)."""
        what = ("gcov-instrumented" if self.gcov else "with a sample profile (AutoFDO)" if self.profile and self.autofdo
                else "with a profile" if self.profile else "built for AutoFDO profiling, no profile" if self.autofdo else "no profile")
        placed = ", functions in a call graph's order" if self.order else ", BOLTed from branch records" if self.bolt else ""
        lto = ", ThinLTO" if self.lto == "thin" else ""
        return f"{self.compiler.name} -{self.opt} {' '.join(self.flags) or '(no extra flags)'}, {what}{placed}{lto}"


def _dir() -> Path:
    return Path(str(resources.files("kpgo.variants")))


# The variants `kpgo study compiler` builds and measures unless told otherwise (issue 13's list), baseline first.
STUDY_DEFAULTS = ("vanilla", "o3", "os", "gcc11", "clang", "inline", "noreorder", "optimized", "pgo-o3", "pgo-no-pt")
# Listed in this order: the three builds of the PGO loop, then the study's others.
_ORDER = tuple(dict.fromkeys(("vanilla", "instrumented", "optimized", *STUDY_DEFAULTS, "order", "pgo-order", "bolt", "pgo-nosplit", "pgo-bolt",
                                "clang-train", "clang-afdo", "clang-thinlto", "clang-afdo-thinlto")))


def names() -> list[str]:
    """kpgo's own variants in _ORDER, others by name."""
    found = [p.stem for p in _dir().glob("*.toml")]
    return sorted(found, key=lambda n: (_ORDER.index(n) if n in _ORDER else len(_ORDER), n))


def validate(spec: Any) -> list[str]:
    """Problems of a variant spec (empty if none): known keys of the right types, a known compiler and level,
    and flags that neither contradict each other nor do what a key does."""
    if not isinstance(spec, dict):
        return ["the file is not a table"]
    problems = [f"unknown key '{k}' (known: {', '.join(KEYS)})" for k in spec if k not in KEYS]
    problems += [f"missing '{k}'" for k in REQUIRED if k not in spec]
    problems += [f"{k} should be of type {KEYS[k].__name__}" for k, v in spec.items() if k in KEYS and not isinstance(v, KEYS[k])]
    if problems:
        return problems
    if not _NAME.fullmatch(spec["name"]):
        problems.append(f"name '{spec['name']}' should be lower-case letters, digits, '.', '_', '-' (it names build directories)")
    unknown = _unknown_compiler(spec["compiler"])
    if unknown:
        problems.append(unknown)
    clang = spec["compiler"].startswith("clang-")
    if spec["opt"] not in OPTS:
        problems.append(f"opt '{spec['opt']}' should be one of {', '.join(OPTS)}")
    profile, gcov = spec.get("profile", False), spec.get("gcov", False)
    if profile and gcov:
        problems.append("profile = true (compile with a profile) and gcov = true (collect one) exclude each other")
    autofdo, lto = spec.get("autofdo", False), spec.get("lto")
    if clang and profile and not autofdo:
        problems.append("profile = true with clang needs autofdo = true: Clang's kernel profile is a sample profile (AutoFDO); the kernel has "
                        "no instrumented Clang PGO upstream")
    if autofdo and not clang:
        problems.append("autofdo = true is for clang-N compilers (GCC's profile is gcov's: profile = true)")
    if autofdo and gcov:
        problems.append("autofdo = true with gcov = true: an AutoFDO kernel is trained from branch records, not instrumented")
    if lto is not None and lto not in LTO:
        problems.append(f"lto '{lto}' should be one of {', '.join(LTO)}")
    elif lto is not None and not clang:
        problems.append("lto is Clang's (the kernel supports LTO only with Clang): use a clang-N compiler")
    if clang and gcov:
        problems.append("gcov = true with clang: kpgo reads GCC's .gcda format only")
    order = spec.get("order", False)
    if order and gcov:
        problems.append("order = true with gcov = true: the instrumented kernel collects a profile, an order is for the kernels that use one")
    if order and clang:
        problems.append("order = true with clang: kpgo places the functions with GNU ld's linker script (ld.lld has --symbol-ordering-file; not done)")
    if profile and clang and any(f == FUNCTION_SECTIONS for f in spec.get("flags", [])):
        problems.append(f"flags: {FUNCTION_SECTIONS} is added by kpgo to an AutoFDO build with a profile")
    bolt = spec.get("bolt", False)
    if bolt and gcov:
        problems.append("bolt = true with gcov = true: the instrumented kernel collects a profile, BOLT is for the kernels that use one")
    if bolt and order:
        problems.append("bolt = true with order = true: kpgo's BOLT and function-order patches change the same build scripts (not combined)")
    if bolt and clang:
        problems.append("bolt = true with clang: kpgo runs BOLT on GNU ld's vmlinux only (not tried with ld.lld)")
    if spec.get("bolt_base", False) and (bolt or gcov or order or clang):
        problems.append("bolt_base = true is for the GCC kernel a BOLT variant rewrites, built without BOLT: not with bolt, gcov, order or clang")
    flags = spec.get("flags", [])
    if bolt and profile and not clang and NO_SPLIT not in flags:  # (the types were checked above)
        problems.append(f"bolt = true with a GCC profile: flags need {NO_SPLIT} (BOLT leaves the functions GCC splits alone on the kernel)")
    bad = [f for f in flags if not isinstance(f, str) or not f.startswith("-") or any(c.isspace() for c in f)]
    if bad:
        return [*problems, f"flags: {bad[0]!r} is not one compiler flag (a string starting with '-', no spaces)"]
    if order and FUNCTION_SECTIONS not in flags:
        problems.append(f"order = true places each function's own section: flags need {FUNCTION_SECTIONS}")
    if not order and FUNCTION_SECTIONS in flags:
        problems.append(f"flags: {FUNCTION_SECTIONS} without order = true: Linux 6.12's linker script leaves the function sections "
                        "as orphans after the kernel's text (docs/LAYOUT.md)")
    for f in flags:
        if re.fullmatch(r"-O.*", f):
            problems.append(f"flags: {f} sets the optimization level, which is opt's to say (opt = \"O2\" | \"O3\" | \"Os\")")
        elif f in (PARTIAL_TRAINING, NO_PARTIAL_TRAINING):
            if not profile:
                problems.append(f"flags: {f} only means something with a profile (profile = true)")
            elif clang:
                problems.append(f"flags: {f} is GCC's")
        elif f.startswith(_PROFILE_FLAGS):
            problems.append(f"flags: {f} is kpgo's to set (profile = true compiles with the profile, gcov = true instruments)")
    problems += _contradictions(flags)
    return problems


def _contradictions(flags: list[str]) -> list[str]:
    """-fX with -fno-X (and -m), a flag given twice, one --param with two values: the compiler would silently take
    the last, so the file would not say what the build does."""
    out: list[str] = []
    seen: dict[str, str] = {}
    for f in flags:
        m = re.fullmatch(r"-([fm])(no-)?(.+?)(=.*)?", f)
        p = re.fullmatch(r"--param=([^=]+)=(.*)", f)
        key = f"-{m[1]}{m[3]}" if m else f"--param={p[1]}" if p else f
        if key in seen:
            out.append(f"flags: {seen[key]} and {f} conflict" if seen[key] != f else f"flags: {f} is given twice")
        seen[key] = f
    return out


def _from_spec(spec: dict[str, Any], path: Path, shipped: bool) -> Variant:
    return Variant(spec["name"], spec["description"], compiler(spec["compiler"]), spec["opt"], tuple(spec.get("flags", [])),
                   spec.get("profile", False), spec.get("gcov", False), path, shipped, spec.get("order", False),
                   spec.get("bolt", False), spec.get("autofdo", False), spec.get("lto"), spec.get("bolt_base", False))


def read(path: Path, shipped: bool = False) -> Variant:
    """The variant in `path`, validated (a UserError naming the file and its first problem)."""
    what = "variant file"
    if not os.path.lexists(path):
        raise UserError(f"{what} {path} does not exist", "pass an existing variant file (docs/COMPILERS.md)")
    spec = inputs.read_toml(path, HINT)
    problems = validate(spec)
    if not problems and shipped and spec["name"] != path.stem:
        problems.append(f"name '{spec['name']}' differs from the file's name")
    if not problems and not shipped and spec["name"] in names():
        problems.append(f"name '{spec['name']}' is one of kpgo's own variants (see `kpgo variants list`); choose another")
    if problems:  # checked on every load, so a mistake stops before any build
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UserError(f"{what} {path}: {problems[0]}{more}", HINT)
    return _from_spec(spec, path, shipped)


def load_all(files: list[Path] | tuple[Path, ...] = ()) -> dict[str, Variant]:
    """kpgo's variants, then the user's files (--variant-file), by name."""
    out = {n: read(_dir() / f"{n}.toml", shipped=True) for n in names()}
    for f in files:
        v = read(f)
        if v.name in out:
            raise UserError(f"variant files {out[v.name].path} and {f} both name '{v.name}'", "give each variant a name of its own")
        out[v.name] = v
    return out


def get(name: str, files: list[Path] | tuple[Path, ...] = ()) -> Variant:
    """The variant called `name`: kpgo's own or one of the user's files."""
    known = load_all(files)
    if name not in known:
        raise UserError(f"unknown variant '{name}'", f"choose from: {', '.join(known)} (`kpgo variants list`), or add one with --variant-file FILE")
    return known[name]


def parse_names(text: str, files: list[Path] | tuple[Path, ...] = (), what: str = "--variants") -> list[Variant]:
    """The variants named by 'a,b' (each once, in order), or all of them for 'all'."""
    known = load_all(files)
    wanted = list(known) if text.strip() == "all" else [w.strip() for w in text.split(",") if w.strip()]
    if not wanted:
        raise UserError(f"{what} {text!r} names no variant", f"choose from: {', '.join(known)} (or all)")
    for w in wanted:
        if w not in known:
            raise UserError(f"{what}: unknown variant '{w}'", f"choose from: {', '.join(known)} (or all), or add one with --variant-file FILE")
    return [known[w] for w in dict.fromkeys(wanted)]


def require(v: Variant) -> None:
    """The variant's compiler is installed, or a one-line UserError naming its packages."""
    missing = v.compiler.missing_tools()
    if missing:
        pkgs = " ".join(v.compiler.packages)
        raise UserError(f"variant {v.name} needs {v.compiler.name} ({', '.join(missing)} not found)",
                        f"run `kpgo variants install {v.name}` (root or sudo), or apt-get install {pkgs}")


def check_flags(v: Variant, extra: tuple[str, ...] = ()) -> None:
    """Compile a small function with the variant's level and flags (and `extra`) under -Werror: a flag the compiler
    rejects, or ignores with a warning (clang on GCC's optimization flags), stops here in one line instead of in the
    first kernel object, deep in the build log."""
    # -Werror last, so that a -Wno-error among the flags does not hide a flag the compiler ignores
    flags = [f"-{v.opt}", *v.flags, *extra, "-Werror"]
    with tempfile.TemporaryDirectory(prefix="kpgo-flags-") as tmp:
        src = Path(tmp) / "probe.c"
        src.write_text("int kpgo_probe(int x) { return x * 3 + 1; }\n")
        res = proc.run([v.compiler.command, *flags, "-c", src, "-o", Path(tmp) / "probe.o"], check=False, keep_output=True, timeout=60,
                       env={"LC_ALL": "C"})  # plain quotes in the message
    if res.returncode != 0:
        lines = [ln.strip() for ln in res.output.splitlines() if "error" in ln] or res.output.strip().splitlines() or ["(no output)"]
        where = f"the flags in {v.path}" + (" or --kcflags" if extra else "")
        raise UserError(f"variant {v.name}: {v.compiler.name} rejects its flags: {lines[0][:200]}", f"fix {where}")
