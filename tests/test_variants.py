"""Compiler variants as data (issue 13, docs/COMPILERS.md): every variant file validated on load, each mistake one
line naming the file; `kpgo variants list`; `kpgo build --dry-run` showing the exact configure and make lines; and
the build keys of the builds made before variants were data, unchanged."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from conftest import assert_one_line_error, kpgo
from kpgo import variants
from kpgo.errors import UserError
from kpgo.kernel import kbuild, kconfig
from kpgo.kernel.source import KernelSource

GOOD = {"name": "mine", "description": "a test variant", "compiler": "gcc-12", "opt": "O2"}


def write_variant(path: Path, **spec: object) -> Path:
    """A variant file: GOOD with `spec` on top (a value None drops the key)."""
    merged = {k: v for k, v in (GOOD | spec).items() if v is not None}

    def toml(v: object) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list):
            return "[" + ", ".join(toml(x) for x in v) + "]"
        return f'"{v}"'

    path.write_text("".join(f"{k} = {toml(v)}\n" for k, v in merged.items()))
    return path


# (what is wrong, the file's keys on top of GOOD, what the one-line error says)
BAD = [
    ("unknown compiler", {"compiler": "icc"}, "unknown compiler 'icc'"),
    ("compiler without version", {"compiler": "gcc"}, "unknown compiler 'gcc'"),
    ("compiler older than the kernel takes", {"compiler": "clang-11"}, "unknown compiler 'clang-11'"),
    ("unknown key", {"optt": "O3"}, "unknown key 'optt'"),
    ("wrong type", {"flags": "-finline-functions"}, "flags should be of type list"),
    ("wrong type bool", {"profile": "yes"}, "profile should be of type bool"),
    ("missing key", {"opt": None}, "missing 'opt'"),
    ("unknown level", {"opt": "O1"}, "opt 'O1' should be one of O2, O3, Os"),
    ("clang with a profile", {"compiler": "clang-19", "profile": True}, "needs autofdo = true"),
    ("clang with gcov", {"compiler": "clang-19", "gcov": True}, "GCC's .gcda format"),
    ("profile and gcov", {"profile": True, "gcov": True}, "exclude each other"),
    ("level among the flags", {"flags": ["-O3"]}, "-O3 sets the optimization level"),
    ("partial training without a profile", {"flags": ["-fprofile-partial-training"]}, "only means something with a profile"),
    ("no partial training without a profile", {"flags": ["-fno-profile-partial-training"]}, "only means something with a profile"),
    ("profile flags are kpgo's", {"flags": ["-fprofile-use"], "profile": True}, "is kpgo's to set"),
    ("coverage flags are kpgo's", {"flags": ["--coverage"]}, "is kpgo's to set"),
    ("contradicting flags", {"flags": ["-freorder-blocks", "-fno-reorder-blocks"]}, "-freorder-blocks and -fno-reorder-blocks conflict"),
    ("one param twice", {"flags": ["--param=inline-unit-growth=80", "--param=inline-unit-growth=40"]}, "conflict"),
    ("a flag twice", {"flags": ["-fno-plt", "-fno-plt"]}, "-fno-plt is given twice"),
    ("two flags in one string", {"flags": ["-fno-plt -fno-pie"]}, "is not one compiler flag"),
    ("not a flag", {"flags": ["inline"]}, "is not one compiler flag"),
    ("bad name", {"name": "My Variant"}, "name 'My Variant' should be lower-case"),
    ("name of a shipped variant", {"name": "vanilla"}, "one of kpgo's own variants"),
]


@pytest.mark.parametrize(("what", "spec", "needle"), BAD, ids=[b[0] for b in BAD])
def test_bad_variant_file_is_one_line(tmp_path: Path, what: str, spec: dict, needle: str) -> None:
    f = write_variant(tmp_path / "v.toml", **spec)
    with pytest.raises(UserError) as e:
        variants.read(f)
    assert needle in str(e.value) and str(f) in str(e.value) and "\n" not in str(e.value)


CLI_CASES = [b for b in BAD if b[0] in ("unknown compiler", "unknown key", "wrong type", "clang with a profile", "level among the flags",
                                        "partial training without a profile", "contradicting flags")]


@pytest.mark.parametrize(("what", "spec", "needle"), CLI_CASES, ids=[b[0] for b in CLI_CASES])
def test_bad_variant_file_via_cli(tmp_path: Path, what: str, spec: dict, needle: str) -> None:
    """Through the command line, from both commands that take --variant-file: exit 1, one line, no traceback."""
    f = write_variant(tmp_path / "v.toml", **spec)
    assert_one_line_error(kpgo("variants", "list", "--variant-file", f), 1, needle, str(f))
    assert_one_line_error(kpgo("build", "--variant-file", f, "--dry-run", "-o", tmp_path / "b"), 1, needle)
    assert not (tmp_path / "b").exists()


def test_not_toml_and_missing_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n")
    assert_one_line_error(kpgo("variants", "list", "--variant-file", bad), 1, "bad.toml: not valid TOML")
    assert_one_line_error(kpgo("variants", "list", "--variant-file", tmp_path / "nope.toml"), 1, "nope.toml")


def test_unknown_variant_and_profile_rules(tmp_path: Path) -> None:
    assert_one_line_error(kpgo("build", "--variant", "o4", "--dry-run"), 1, "unknown variant 'o4'", "o3")
    assert_one_line_error(kpgo("build", "--variant", "pgo-o3", "--dry-run"), 1, "pgo-o3 variant needs a profile")
    assert_one_line_error(kpgo("build", "--variant", "o3", "--profile", tmp_path, "--dry-run"), 1, "--profile is only for --variant optimized", "o3 takes none")
    assert_one_line_error(kpgo("build", "--variant", "o3", "--partial-training", "--dry-run"), 1, "--partial-training is only for")
    assert_one_line_error(kpgo("build", "--variant", "pgo-no-pt", "--partial-training", "--dry-run"), 1,
                          "--partial-training contradicts the variant pgo-no-pt", "--variant optimized")


def test_every_shipped_variant_loads() -> None:
    """Each file validates, is named as its file, and the study's defaults all exist."""
    vs = variants.load_all()
    assert set(variants.STUDY_DEFAULTS) <= set(vs)
    assert list(vs)[:3] == ["vanilla", "instrumented", "optimized"]
    assert [v.kind for v in (vs["vanilla"], vs["instrumented"], vs["optimized"])] == ["vanilla", "instrumented", "optimized"]
    assert vs["os"].fragments == ("os",) and vs["os"].opt_flags == ()
    assert vs["o3"].opt_flags == ("-O3",) and vs["pgo-o3"].profile
    assert vs["clang"].compiler.make_args() == ("LLVM=-19",) and vs["clang"].compiler.packages == ("clang-19", "lld-19", "llvm-19")
    assert vs["gcc11"].compiler.packages == ("gcc-11",)


def test_variants_list(tmp_path: Path) -> None:
    mine = write_variant(tmp_path / "mine.toml", compiler="gcc-11", opt="O3", flags=["-fno-plt"], description="my own")
    res = kpgo("variants", "list", "--variant-file", mine)
    assert res.returncode == 0, res.stderr
    rows = {ln.split()[0]: ln.split() for ln in res.stdout.splitlines()
            if ln.strip() and not ln.startswith(("name", "install", "(+")) and ":" not in ln.split()[0]}
    assert list(rows)[:3] == ["vanilla", "instrumented", "optimized"]
    assert set(variants.names()) | {"mine"} == set(rows)
    assert rows["vanilla"][1:4] == ["gcc-12", "-O2", "no"]
    assert rows["instrumented"][3] == "gcov" and rows["optimized"][3] == "yes"
    assert rows["o3"][1:3] == ["gcc-12", "-O3"] and rows["os"][2] == "-Os"
    assert rows["clang"][1] == "clang-19" and rows["gcc11"][1] == "gcc-11"
    assert rows["mine"][1:4] == ["gcc-11", "-O3", "no"] and rows["mine"][-1] == "-fno-plt"
    assert rows["vanilla"][4] == "yes"  # the compiler every test needs
    # partial training, which kpgo adds to a build with a profile, shows with those variants (not with pgo-no-pt,
    # whose file turns it off, nor with the ones without a profile)
    added = ["(+", "-fprofile-partial-training", "-Wno-error)"]
    assert rows["optimized"][-3:] == rows["pgo-o3"][-3:] == added and "(+" not in rows["pgo-no-pt"] + rows["o3"] + rows["mine"]
    assert "added by kpgo to a build with a profile unless --no-partial-training" in res.stdout
    assert f"mine: my own ({mine})" in res.stdout
    one = kpgo("variants", "list", "o3,vanilla")
    assert one.returncode == 0 and [ln.split()[0] for ln in one.stdout.splitlines()[1:3]] == ["o3", "vanilla"]
    assert_one_line_error(kpgo("variants", "list", "o4"), 1, "unknown variant 'o4'")


def fake_tree(root: Path) -> Path:
    """A clean kernel tree as far as kpgo looks before running make: enough for a dry run."""
    (root / "arch" / "x86").mkdir(parents=True)
    (root / "Makefile").write_text("VERSION = 6\nPATCHLEVEL = 12\nSUBLEVEL = 0\n")
    (root / "Kconfig").write_text("")
    (root / "arch" / "x86" / "Makefile").write_text("")
    return root


def dry_run(tmp_path: Path, variant: str, *more: str | Path) -> list[str]:
    tree = fake_tree(tmp_path / "linux")
    res = kpgo("build", "--variant", variant, "--dry-run", "--source", tree, "--base", "tiny", "-j", "3", "-o", tmp_path / "out", *more)
    assert res.returncode == 0, res.stderr
    assert not (tmp_path / "out").exists()  # nothing built, nothing written
    return res.stdout.splitlines()


def without_reproducible(line: str, tree: Path, out: Path) -> str:
    """A build's make line without what makes it reproducible (checked here): Kbuild's version-string variables in
    front (kbuild.reproducible_env), the path maps after the flags in KCFLAGS and as KAFLAGS (kbuild.prefix_maps)."""
    words = shlex.split(line)
    assert [w.split("=", 1)[0] for w in words[:4]] == ["KBUILD_BUILD_TIMESTAMP", "KBUILD_BUILD_USER", "KBUILD_BUILD_HOST", "KBUILD_BUILD_VERSION"]
    maps = " ".join(kbuild.prefix_maps(tree, out))
    assert words[-1] == f"KAFLAGS={maps}" and words[-2].startswith("KCFLAGS=") and words[-2].endswith(maps), line
    flags = words[-2].removeprefix("KCFLAGS=").removesuffix(maps).strip()
    return shlex.join([*words[4:-2], *([f"KCFLAGS={flags}"] if flags else [])])


def test_dry_run_make_lines(tmp_path: Path) -> None:
    cc11 = "" if variants.host_gcc_major() == 11 else " CC=gcc-11"
    gcc12 = "" if variants.host_gcc_major() == 12 else " CC=gcc-12"
    tiny = Path(kconfig.__file__).parent / "configs" / "tiny.config"
    cases = {
        # variant: (configure's make variables, fragments merged after tiny's, KCFLAGS)
        "vanilla": (gcc12, "", None),
        "o3": (gcc12, "", "'KCFLAGS=-O3 -Wno-error'"),
        "os": (gcc12, f" {tiny.parent / 'os.config'}", "KCFLAGS=-Wno-error"),
        "gcc11": (cc11, "", "KCFLAGS=-Wno-error"),
        "clang": (" LLVM=-19", "", "KCFLAGS=-Wno-error"),
        "inline": (gcc12, "", "'KCFLAGS=-finline-functions --param=max-inline-insns-single=400 --param=max-inline-insns-auto=60 "
                   "--param=inline-unit-growth=80 -Wno-error'"),
        "noreorder": (gcc12, "", "'KCFLAGS=-fno-reorder-blocks -fno-reorder-blocks-and-partition -fno-reorder-functions -Wno-error'"),
    }
    for variant, (make_vars, frags, kcflags) in cases.items():
        d = tmp_path / variant
        d.mkdir()
        lines = [ln for ln in dry_run(d, variant) if not ln.startswith("#")]
        tree, out = d / "linux", d / "out"
        kc = f" {kcflags}" if kcflags else ""
        if variant == "clang" or not shutil.which("ccache"):
            build = f"make -C {tree} O={out} -j3{make_vars} bzImage{kc}"
        else:  # every object through the ccache wrapper, which runs the variant's GCC (KPGO_CC)
            cc = f" KPGO_CC={make_vars.removeprefix(' CC=')}" if make_vars else ""
            build = f"KPGO_REUSE=all CCACHE_DIR=<cache> CCACHE_NOHASHDIR=1 CCACHE_DEPEND=1{cc} make -C {tree} O={out} -j3 'CC=sh {kbuild.REUSE_CC}' bzImage{kc}"
        lines[-1] = without_reproducible(lines[-1], tree, out)
        assert [re.sub(r"CCACHE_DIR=\S+", "CCACHE_DIR=<cache>", ln) for ln in lines] == [
            f"make -C {tree} O={out}{make_vars} allnoconfig",
            f"{tree}/scripts/kconfig/merge_config.sh -m -O {out} {out}/.config {tiny}{frags}",
            f"make -C {tree} O={out}{make_vars} olddefconfig",
            build,
        ], variant
    # the gcov kernel never: its objects embed their own build directory's .gcda paths
    instr = tmp_path / "instr"
    line = without_reproducible(dry_run(instr, "instrumented")[-1], instr / "linux", instr / "out")
    assert line == f"make -C {instr / 'linux'} O={instr / 'out'} -j3{gcc12} bzImage"


def test_dry_run_says_what_is_missing(tmp_path: Path) -> None:
    """A dry run of a variant whose compiler is not installed still shows the lines, and how to install it."""
    mine = write_variant(tmp_path / "mine.toml", compiler="gcc-6")  # not in Debian 12: never installed
    lines = dry_run(tmp_path, "mine", "--variant-file", mine)
    assert "gcc-6 is not installed" in lines[1] and "apt-get install gcc-6" in lines[1]
    last = without_reproducible(lines[-1], tmp_path / "linux", tmp_path / "out")
    if shutil.which("ccache"):  # the wrapper runs the variant's GCC
        assert "KPGO_CC=gcc-6" in last and last.endswith(f"-j3 'CC=sh {kbuild.REUSE_CC}' bzImage")
    else:
        assert last.endswith("-j3 CC=gcc-6 bzImage")


def test_missing_compiler_is_refused(tmp_path: Path) -> None:
    mine = write_variant(tmp_path / "mine.toml", compiler="gcc-6")
    res = kpgo("build", "--variant-file", mine, "-o", tmp_path / "b")
    assert_one_line_error(res, 1, "variant mine needs gcc-6", "kpgo variants install mine", "apt-get install gcc-6")


def test_rejected_flag_is_one_line(tmp_path: Path) -> None:
    """A flag the compiler does not know fails before configure, naming the flag (not in the first object of the build)."""
    mine = write_variant(tmp_path / "mine.toml", flags=["-fkpgo-no-such-flag"])
    tree = fake_tree(tmp_path / "linux")
    res = kpgo("build", "--variant-file", mine, "--dry-run", "--source", tree)
    assert_one_line_error(res, 1, "gcc-12 rejects its flags", "-fkpgo-no-such-flag", str(mine))
    res = kpgo("build", "--variant", "vanilla", "--kcflags=--param=kpgo-no-such=1", "--dry-run", "--source", tree)
    assert_one_line_error(res, 1, "rejects its flags", "kpgo-no-such", "--kcflags")


def test_dry_run_profile_variant(tmp_path: Path) -> None:
    """A profile build's make line: the profile-use flags first, then the level's and the variant's; the ccache
    wrapper as make's CC when ccache is there. (In-process: the CLI's dry run checks the profile as a build would.)"""
    tree, prof = fake_tree(tmp_path / "linux"), tmp_path / "prof"
    src = KernelSource(tree, "6.12.0", "x")
    spec = kconfig.resolve("tiny", None, [])
    lines = kbuild.dry_run(kbuild.BuildRequest(src, spec, variants.get("pgo-o3"), tmp_path / "out", prof, 3))
    assert f"# each .gcda of {prof} copied to its object's place under {tmp_path / 'out'}" in lines
    assert without_reproducible(lines[-1], tree, tmp_path / "out").endswith(f"bzImage 'KCFLAGS={' '.join(kbuild.PROFILE_USE_FLAGS)} -O3 -Wno-error'")
    assert ("KPGO_REUSE=zero" in lines[-1] and f"'CC=sh {kbuild.REUSE_CC}'" in lines[-1]) == bool(shutil.which("ccache"))


# build_key of a fixed request, GCC 12.2.0: an existing build directory of these variants stays up to date while
# nothing it is built from changes. All five changed on purpose when the key came to hold the bytes of the variant's
# file and of the fragments it adds (kbuild._files_digest; issue 38): before, an edited gcov.config or variant file
# reused the build made from the old one. (optimized_pt had changed before, when partial training added -Wno-error.)
# So these values also change whenever vanilla.toml, instrumented.toml, optimized.toml or gcov.config is edited.
GOLDEN = {"vanilla": "cd8ef47b44656b815318", "instrumented": "c23c123ab3f83bc804c9", "optimized": "e105ac9d365bc919a1b7",
          "optimized_pt": "e04a235497b2478c22c6", "vanilla_g": "811f4208c5b119d44a5a"}


def test_build_keys_of_existing_builds_unchanged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(variants, "_version", lambda command, family: "12.2.0")
    cfg = tmp_path / "base.config"
    cfg.write_bytes(b"# kpgo-base: x86_64_defconfig\nCONFIG_X=y\n")
    (tmp_path / "prof" / "kernel").mkdir(parents=True)
    (tmp_path / "prof" / "kernel" / "fork.gcda").write_bytes(b"\x00gcda-fixed")
    src = KernelSource(Path("/nonexistent"), "6.12.117", "0123456789abcdef")
    spec = kconfig.ConfigSpec("server", "x86_64_defconfig", (cfg,))

    def key(name: str, profile: bool = False, kcflags: tuple[str, ...] = ()) -> str:
        req = kbuild.BuildRequest(src, spec, variants.get(name), tmp_path / "out", tmp_path / "prof" if profile else None, 3, kcflags)
        return kbuild.build_key(req)

    assert key("vanilla") == GOLDEN["vanilla"]
    assert key("instrumented") == GOLDEN["instrumented"]
    assert key("optimized", True) == GOLDEN["optimized"]
    assert key("optimized", True, kbuild.partial_training_flags(variants.get("optimized"))) == GOLDEN["optimized_pt"]
    assert key("vanilla", kcflags=("-g",)) == GOLDEN["vanilla_g"]
    # pgo-no-pt decides for itself: partial training adds nothing to it, and it is a build of its own
    assert kbuild.partial_training_flags(variants.get("pgo-no-pt")) == ()
    # every other variant is a build of its own
    others = [key(n, variants.get(n).profile) for n in variants.names() if n not in ("vanilla", "instrumented", "optimized")]
    assert len(set(others) | set(GOLDEN.values())) == len(others) + len(GOLDEN)


def test_build_key_holds_the_bytes_of_every_file_applied(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same names and paths with other bytes are another build: a user's fragment, the variant's file, and the
    shipped fragment the variant adds (gcov.config for the instrumented kernel)."""
    monkeypatch.setattr(variants, "_version", lambda command, family: "12.2.0")
    configs = tmp_path / "configs"
    shutil.copytree(kconfig._configs_dir(), configs)
    monkeypatch.setattr(kconfig, "_configs_dir", lambda: configs)
    frag, vfile = tmp_path / "net.config", tmp_path / "mine.toml"
    frag.write_text("CONFIG_NET=y\n")
    vfile.write_text((variants._dir() / "o3.toml").read_text().replace('name = "o3"', 'name = "mine"'))
    src = KernelSource(Path("/nonexistent"), "6.12.117", "0123456789abcdef")

    def keys() -> tuple[str, str, str]:
        spec = kconfig.ConfigSpec("tiny", "tinyconfig", (configs / "tiny.config", frag))
        return tuple(kbuild.build_key(kbuild.BuildRequest(src, spec, variants.get(n, [vfile]), tmp_path / "out")) for n in ("vanilla", "mine", "instrumented"))  # type: ignore[return-value]

    before = keys()
    assert len(set(before)) == 3
    frag.write_text("CONFIG_NET=m\n")  # the user's fragment: every build
    after_frag = keys()
    assert all(a != b for a, b in zip(before, after_frag))
    with vfile.open("a") as f:  # the variant file (a comment: nothing else differs)
        f.write("# edited\n")
    after_variant = keys()
    assert [a != b for a, b in zip(after_frag, after_variant)] == [False, True, False]
    with (configs / "gcov.config").open("a") as f:  # the fragment only the instrumented variant adds
        f.write("CONFIG_GCOV_FORMAT_AUTODETECT=y\n")
    assert [a != b for a, b in zip(after_variant, keys())] == [False, False, True]


def test_build_json_compiler_record() -> None:
    """What build.json says of the compiler (also filled into the record of a build made before variants were data)."""
    rec = kbuild._compiler_record(variants.get("o3"))
    assert rec["compiler"]["name"] == "gcc-12" and rec["compiler"]["version"][:2] == "12" and "12." in rec["compiler"]["version_text"]
    assert rec["opt"] == "O3" and rec["flags"] == ["-Wno-error"] and rec["variant_file"].endswith("o3.toml")


FAKE_MAKE = r"""#!/bin/sh
# make as far as kpgo's build step sees it: every call logged, configure targets write .config, bzImage an image
# (after KPGO_FAKE_MAKE_SECONDS, default none).
{ printf 'make'; printf '\t%s' "$@"; echo; } >> "$KPGO_FAKE_LOG"  # one call a line, its arguments tab-separated
out=; target=
for a in "$@"; do
  case "$a" in O=*) out=${a#O=} ;; -*|*=*) ;; *) target=$a ;; esac
done
case "$target" in
  allnoconfig|x86_64_defconfig) : > "$out/.config" ;;
  bzImage) echo "  CC      kernel/fork.o"; sleep "${KPGO_FAKE_MAKE_SECONDS:-0}"; mkdir -p "$out/arch/x86/boot"; echo image > "$out/arch/x86/boot/bzImage" ;;
  kernelrelease) echo 6.12.0 ;;
esac
"""
# merge_config.sh -m -O OUT DOTCONFIG FILES...: the options appended, the last one of a symbol wins when read back
FAKE_MERGE = """#!/bin/sh
shift 3; dot=$1; shift; cat "$@" >> "$dot"
"""
# A GCC 11 that answers what kpgo asks it (no test may depend on gcc-11 being installed)
FAKE_GCC11 = """#!/bin/sh
case "$1" in -dumpfullversion) echo 11.3.0 ;; --version) echo "gcc-11 (fake) 11.3.0" ;; *) exit 0 ;; esac
"""


def fake_buildable_tree(root: Path) -> Path:
    """fake_tree with the config merge script a build runs (FAKE_MERGE); make itself is FAKE_MAKE on the PATH."""
    tree = fake_tree(root)
    (tree / "scripts" / "kconfig").mkdir(parents=True)
    (tree / "scripts" / "kconfig" / "merge_config.sh").write_text(FAKE_MERGE)
    (tree / "scripts" / "kconfig" / "merge_config.sh").chmod(0o755)
    return tree


@pytest.fixture
def fake_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("make", FAKE_MAKE), ("gcc-11", FAKE_GCC11)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setenv("KPGO_FAKE_LOG", str(tmp_path / "make.log"))
    yield tmp_path / "make.log"
    variants._version.cache_clear()
    variants._version_text.cache_clear()


@pytest.mark.parametrize("name", ["o3", "os", "gcc11"])
def test_build_runs_the_dry_run_lines(tmp_path: Path, fake_tools: Path, name: str) -> None:
    """A build (with make faked) runs exactly the make lines its dry run prints, and build.json says which compiler,
    level and flags it used."""
    tree = fake_buildable_tree(tmp_path / "linux")
    req = kbuild.BuildRequest(KernelSource(tree, "6.12.0", "x"), kconfig.resolve("tiny", None, []), variants.get(name), tmp_path / "out", None, 3)
    planned = [ln for ln in kbuild.dry_run(req) if not ln.startswith("#") and "make -C" in ln]
    record = kbuild.build(req)
    ran = [ln.split("\t") for ln in fake_tools.read_text().splitlines() if not ln.endswith("\tkernelrelease")]
    # the make lines as run; the build's environment (the ccache wrapper's) in front of the last
    assert ran == [shlex.split(ln)[shlex.split(ln).index("make"):] for ln in planned]
    v = variants.get(name)
    assert record["variant"] == name and record["opt"] == v.opt and record["flags"] == list(v.flags)
    assert record["compiler"]["name"] == v.compiler.name and record["make_command"] == planned[-1]
    assert record["kcflags"] == [*v.opt_flags, *v.flags]
    assert (record["compiler"]["version"], record["gcc"]) == (("11.3.0",) * 2 if name == "gcc11" else (kbuild.gcc_version(),) * 2)
    if name == "os":
        assert kconfig.parse((tmp_path / "out" / ".config").read_text())["CONFIG_CC_OPTIMIZE_FOR_SIZE"] == "y"
    # built once: the same request is up to date, without a make
    fake_tools.unlink()
    assert kbuild.build(req)["key"] == record["key"] and not fake_tools.exists()



def test_progress_total_is_the_largest_build_seen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The progress bar's expected object count: a build resumed in a directory an interrupted one left (fewer
    objects compiled) does not lower it."""
    monkeypatch.setenv("KPGO_CACHE", str(tmp_path / "cache"))
    src = KernelSource(Path("/nonexistent"), "6.12.117", "0123456789abcdef")
    req = kbuild.BuildRequest(src, kconfig.resolve("tiny", None, []), variants.get("vanilla"), tmp_path / "out", None, 3)
    assert kbuild._expected_count(req) is None
    kbuild._remember_count(req, 1846)
    kbuild._remember_count(req, 699)
    kbuild._remember_count(req, 12)
    assert kbuild._expected_count(req) == 1846


REORDER_C = """
int g(int);
int f(int *a, int n) {
    int s = 0;
    for (int i = 0; i < n; i++) {
        if (__builtin_expect(a[i] < 0, 0))
            s -= g(a[i]) * 3 + g(i);
        else
            s += a[i];
    }
    return s;
}
"""


def test_noreorder_changes_the_code(tmp_path: Path) -> None:
    """noreorder's flags lay a function's blocks out otherwise than -O2 (the unlikely branch stays in source order),
    checked with the variant's GCC; -fno-reorder-blocks alone would not: GCC runs the pass while
    -freorder-blocks-and-partition (on at -O2) is on, so that flag is part of the variant."""
    v = variants.get("noreorder")
    cc = v.compiler.command
    if not shutil.which(cc):
        pytest.fail(f"{cc} missing: kpgo's default compiler")
    src = tmp_path / "f.c"
    src.write_text(REORDER_C)

    def asm(*flags: str) -> str:
        out = subprocess.run([cc, "-O2", "-S", "-o", "-", *flags, str(src)], capture_output=True, text=True, check=True).stdout
        return "\n".join(ln for ln in out.splitlines() if "f.c" not in ln and ".ident" not in ln)

    assert asm(*v.flags) != asm()
    assert asm("-fno-reorder-blocks", "-fno-reorder-functions") == asm()
