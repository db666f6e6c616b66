"""Value profiling (issue 14, docs/VALUES.md), the parts that need no guest: the kernel patch on the real 6.12
source (applied to a cached copy, refused with the failing hunk on a tree it does not fit), the GCC plugin on real
GCC output (the thread-local tuple becomes per-CPU, a use it cannot rewrite stops the compile), and the proof's
value-transform counts from the dumps of a real profile-use compile of a program with known behaviour."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import assert_one_line_error, kpgo
from kpgo import variants
from kpgo.errors import UserError
from kpgo.kernel import kbuild, proof, source, values
from kpgo.kernel.source import KernelSource

GCC = variants.get("instrumented").compiler


@pytest.fixture(scope="module")
def kernel_source() -> KernelSource:
    return source.resolve(None)


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KPGO_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_patch_makes_a_patched_copy_and_leaves_the_source(kernel_source: KernelSource, cache: Path) -> None:
    before = {rel: (kernel_source.path / rel).read_bytes() for rel in values.patched_files() if (kernel_source.path / rel).exists()}
    patched = values.patched(kernel_source)
    assert patched.path.parent == cache / "src" and patched.version == kernel_source.version
    assert patched.ident != kernel_source.ident
    assert (patched.path / "kernel/gcov/values.c").is_file() and not (kernel_source.path / "kernel/gcov/values.c").exists()
    assert "GCOV_PROFILE_VALUES" in (patched.path / "kernel/gcov/Kconfig").read_text()
    for rel, data in before.items():  # the changed files were copied before patching, not changed through a hard link
        assert (kernel_source.path / rel).read_bytes() == data
        assert (patched.path / rel).read_bytes() != data
    assert values.patched(kernel_source) == patched  # made once


def test_patch_that_does_not_apply_names_the_hunk(kernel_source: KernelSource, cache: Path, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    for rel in ("Makefile", "Kconfig", "arch/x86/Makefile", *values.patched_files()):
        if (kernel_source.path / rel).exists():
            (tree / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(kernel_source.path / rel, tree / rel)
    gcc47 = tree / "kernel/gcov/gcc_4_7.c"
    text = gcc47.read_text()
    assert text.count("memset(ci_ptr->values, 0,") == 1
    gcc47.write_text(text.replace("memset(ci_ptr->values, 0,", "memset(ci_ptr->values, 0xff,"))  # another tree's reset
    snapshot = {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()}
    with pytest.raises(UserError) as e:
        values.patched(KernelSource(tree, "6.12.0", "foreign"))
    assert "kernel/gcov/gcc_4_7.c" in e.value.message and "FAILED" in e.value.message and "\n" not in e.value.message
    assert {p: p.read_bytes() for p in tree.rglob("*") if p.is_file()} == snapshot
    assert not [p for p in (cache / "src").iterdir() if p.name.startswith("values-")]


INDIRECT = """
typedef int (*fn_t)(int);
int run(fn_t *tab, int n) { int s = 0; for (int i = 0; i < n; i++) s += tab[i & 3](i); return s; }
"""


def kernel_like_asm(tmp_path: Path, code: str, plugin: Path) -> subprocess.CompletedProcess[str]:
    (tmp_path / "t.c").write_text(code)
    return subprocess.run([GCC.command, "-O2", "-mcmodel=kernel", "-fno-pic", "-fprofile-arcs", "-fprofile-values", "-fprofile-update=atomic",
                           f"-fplugin={plugin}", "-S", "-o", "t.s", "t.c"], cwd=tmp_path, capture_output=True, text=True)


def test_plugin_gives_the_indirect_call_tuple_a_per_cpu_home(tmp_path: Path, cache: Path) -> None:
    plugin = values.plugin(GCC)
    assert plugin.parent == cache / "plugins" and values.plugin(GCC) == plugin
    res = kernel_like_asm(tmp_path, INDIRECT, plugin)
    assert res.returncode == 0, res.stderr
    asm = (tmp_path / "t.s").read_text()
    assert "__gcov_indirect_call" not in asm.replace("__gcov_indirect_call_profiler", "") and "%fs" not in asm
    assert "%gs:__kpgo_indirect_call+8" in asm  # the call site's counters
    assert "%gs:__kpgo_indirect_call+0" in asm  # the callee, stored at the site and read at each entry
    # Without the plugin GCC reaches it through the user's TLS base, which is what the plugin is for.
    plain = subprocess.run([GCC.command, "-O2", "-mcmodel=kernel", "-fno-pic", "-fprofile-arcs", "-fprofile-values", "-S", "-o", "-", "t.c"],
                           cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert "%fs:" in plain and "__gcov_indirect_call@" in plain


def test_plugin_stops_on_a_use_it_cannot_rewrite(tmp_path: Path, cache: Path) -> None:
    code = INDIRECT + """
struct tuple { void *callee; long *counters; };
extern __thread struct tuple __gcov_indirect_call;
void *where(void) { return &__gcov_indirect_call; }
"""
    res = kernel_like_asm(tmp_path, code, values.plugin(GCC))
    assert res.returncode != 0 and "cannot make per-CPU" in res.stderr


PROGRAM = {
    "t.c": """
typedef int (*fn_t)(int);
static int f(int x) { return x + 1; }
static int g(int x) { return x * 2; }
int ext(int x);
__attribute__((noinline)) fn_t pick(int i, int odd) { return i % 10 == 9 && odd ? g : f; }
int run(int n, int d, char *dst, const char *src, int sz, fn_t other) {
  int s = 0;
  for (int i = 0; i < n; i++) s += pick(i, n > 1)(i) / d;  /* f 90% of the time: promoted, f is in this object */
  for (int i = 0; i < n; i++) s += other(i);                 /* always ext, defined in another object */
  __builtin_memcpy(dst, src, sz);                            /* always 16 bytes */
  return s % d;                                              /* always 7 */
}
""",
    "main.c": """
typedef int (*fn_t)(int);
int run(int n, int d, char *dst, const char *src, int sz, fn_t other);
int ext(int x) { return x - 1; }
int main(int argc, char **argv) {
  char a[64], b[64] = "hello";
  int s = 0;
  for (int k = 0; k < 2000; k++) s += run(20, 7 + (argc > 9), a, b, 16 + (argc > 9), ext);
  return s == 42;
}
""",
}


def test_proof_counts_the_value_transforms_gcc_applied(tmp_path: Path) -> None:
    for name, text in PROGRAM.items():
        (tmp_path / name).write_text(text)
    # Each object compiled on its own, like Kbuild does (a static function's profile id depends on the object's name).
    gen = ["-O2", "-fprofile-generate", "-fprofile-update=atomic"]
    for name in PROGRAM:
        subprocess.run([GCC.command, *gen, "-c", name, "-o", name[:-2] + ".o"], cwd=tmp_path, check=True)
    subprocess.run([GCC.command, "-fprofile-generate", "-o", "prog", "t.o", "main.o"], cwd=tmp_path, check=True)
    subprocess.run(["./prog"], cwd=tmp_path, check=False)
    (tmp_path / "use").mkdir()
    shutil.copyfile(tmp_path / "t.gcda", tmp_path / "use" / "t.gcda")
    shutil.copyfile(tmp_path / "t.c", tmp_path / "use" / "t.c")
    subprocess.run([GCC.command, "-O2", *kbuild.PROFILE_USE_FLAGS, "-c", "t.c", "-o", "t.o"], cwd=tmp_path / "use", check=True)
    dump = next((tmp_path / "use").glob("t.c.*i.profile")).read_text()
    estimate = next((tmp_path / "use").glob("t.c.*i.profile_estimate")).read_text()
    counts, sites = proof.value_transforms(dump, estimate, "t.o")
    assert counts == {"indirect_calls_trained": 2, "indirect_calls_promoted": 1, "indirect_targets_elsewhere": 1,
                      "divmod": 2, "stringop": 1}
    assert sites == [{"object": "t.o", "caller": "run", "target": "f", "count": 36000, "all": 40000, "promoted": True}]
    assert "1 of 2 profiled indirect calls promoted" in proof.format_values({"totals": counts})
    assert "arc counters only" in proof.format_values(None)


def test_values_only_for_the_instrumented_variant() -> None:
    res = kpgo("build", "--variant", "vanilla", "--values", "--dry-run")
    assert_one_line_error(res, 1, "--values is for the instrumented variant")
    res = kpgo("build", "--variant", "gcc11", "--values", "--dry-run")
    assert_one_line_error(res, 1, "--values is for the instrumented variant")


def test_values_dry_run_says_what_it_would_do() -> None:
    res = kpgo("build", "--variant", "instrumented", "--values", "--dry-run", "--base", "tiny")
    assert res.returncode == 0, res.stderr
    assert "gcov-values.patch applied" in res.stdout and "KPGO_GCOV_PLUGIN=<the plugin>" in res.stdout
    assert "values.config" in res.stdout
