"""kpgo profile compare and check on a small program with known behaviour; gcov's own JSON is the oracle for the
flow solver (function and branch execution counts)."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from gcov_fixtures import GccBuild, Profiles, gcc_build, gcda_files, profiles  # noqa: F401
from kpgo.analysis.characterize import build_model, compare_profiles, profile_vectors
from kpgo.analysis.similarity import cosine_matrix, taken_norms
from kpgo.errors import UserError
from kpgo.gcov.gcda import parse_gcda
from kpgo.gcov.profile import APPARATUS_WHY
from kpgo.gcov.validate import check_profile


def gcov_json(build: GccBuild, profile: Path, work: Path) -> dict[str, dict]:
    """gcov --json-format for every object of `profile`, run next to the build's .gcno files."""
    shutil.copytree(build.root, work, ignore=shutil.ignore_patterns("*.gcda"))
    out = {}
    for rel in gcda_files(profile):
        shutil.copyfile(profile / rel, work / rel)
        r = subprocess.run(["gcov", "-b", "--json-format", "--stdout", str(rel)], cwd=work, check=True,
                           capture_output=True, text=True)
        out[str(rel)] = json.loads(r.stdout)
    return out


@pytest.mark.parametrize("which", ["mode0", "mode1", "mode2"])
def test_flow_solver_matches_gcov(profiles: Profiles, tmp_path: Path, which: str) -> None:
    prof = getattr(profiles, which)
    ref = gcov_json(profiles.build, prof, tmp_path / "w")
    rels = [str(p) for p in gcda_files(prof)]
    model = build_model(profiles.build.root, rels)
    assert model.unsolved_functions == 0 and not model.skipped
    vec = profile_vectors(model, prof)
    ours_fn = dict(zip(model.function_names, vec["functions"].astype(int).tolist()))
    ours_br = sorted(vec["branches"].astype(int).tolist())
    # gcov lists a block's branches on its last line in *each* source file the block spans (here: main.c and the
    # inlined atoi of stdlib.h), so its list can repeat a block: ours must lie between the main-file list and all.
    main_br: Counter[int] = Counter()
    all_br: Counter[int] = Counter()
    for rel, doc in ref.items():
        for f in doc["files"]:
            own = f["file"] == rel[:-5] + ".c"
            for fn in f["functions"] if own else []:
                assert ours_fn[f"{rel[:-5]}:{fn['name']}"] == fn["execution_count"], fn["name"]
            for line in f["lines"]:
                for b in line["branches"]:
                    all_br[b["count"]] += 1
                    main_br[b["count"]] += own
    ours = Counter(ours_br)
    assert not (+main_br - ours) and not (ours - all_br)
    assert sum(ours.values()) >= 16


def expected_function_counts(mode: int, n: int, runs: int) -> dict[str, int]:
    """Function execution counts from the program's source (tests/gcov_fixtures.py)."""
    twice = sum(1 for i in range(n) if (mode + i) & 1 == 0)
    return {k: v * runs for k, v in {
        "main:main": 1, "main:twice": twice, "main:thrice": n - twice,
        "kernel/sched:sched_pick": n, "kernel/sched:helper": (n + 3) // 4, "kernel/sched:never_called": 0,
        "net/core:net_rx": 0 if mode == 1 else n,
    }.items()}


def test_compare_against_direct_computation(profiles: Profiles) -> None:
    dirs = [profiles.k0, profiles.k1, profiles.k2, profiles.mode0]
    res = compare_profiles(dirs, profiles.build.root, names=["m0", "m1", "m2", "m0-libgcov"])
    rels = [str(p) for p in gcda_files(profiles.k0)]
    model = build_model(profiles.build.root, rels)
    # Function vectors straight from the source's known behaviour.
    runs = [(0, 1000, 1), (1, 3000, 1), (2, 500, 2), (0, 1000, 1)]
    direct = np.array([[expected_function_counts(*r)[name] for name in model.function_names] for r in runs], float)
    vecs = [profile_vectors(model, d) for d in dirs]
    assert np.array_equal(np.stack([v["functions"] for v in vecs]), direct)

    def cos(a: np.ndarray, b: np.ndarray) -> float:
        return float(a @ b / math.sqrt((a @ a) * (b @ b)))

    fc = res["matrices"]["function_cosine"]
    for i in range(4):
        for j in range(4):
            assert fc[i][j] == pytest.approx(cos(direct[i], direct[j]), abs=1e-6)
    # Branch cosine, and L0/L1/L2 computed by explicit loops over the two-way branches.
    br = np.stack([v["branches"] for v in vecs])
    tk = np.stack([v["taken"] for v in vecs])
    ex = np.stack([v["executed"] for v in vecs])
    for i in range(4):
        for j in range(4):
            assert res["matrices"]["branch_cosine"][i][j] == pytest.approx(cos(br[i], br[j]), abs=1e-6)
            diffs = [tk[i, k] / ex[i, k] - tk[j, k] / ex[j, k] for k in range(tk.shape[1])
                     if ex[i, k] > 0 and ex[j, k] > 0]
            m = len(diffs)
            assert res["common_two_way_branches"][i][j] == m
            assert res["matrices"]["taken_l0"][i][j] == pytest.approx(sum(abs(d) > 0.01 for d in diffs) / m, abs=1e-6)
            assert res["matrices"]["taken_l1"][i][j] == pytest.approx(sum(abs(d) for d in diffs) / m, abs=1e-6)
            assert res["matrices"]["taken_l2"][i][j] == pytest.approx(math.sqrt(sum(d * d for d in diffs) / m),
                                                                      abs=1e-6)
    # Known behaviour: the kernel-shaped and the libgcov copy of one run are the same profile.
    assert fc[0][3] == pytest.approx(1.0) and res["matrices"]["taken_l1"][0][3] == 0.0
    # Mode 1 never runs net_rx: its branches leave the shared set; mode 2 flips the `mode == 2` test.
    assert res["common_two_way_branches"][0][1] < res["common_two_way_branches"][0][0]
    assert res["matrices"]["taken_l0"][0][2] > 0


def test_similarity_edge_cases() -> None:
    c = cosine_matrix(np.array([[0, 0], [1, 0], [2, 0], [0, 3]], float))
    assert c[0, 0] == 1 and c[0, 1] == 0 and c[1, 2] == pytest.approx(1) and c[1, 3] == 0
    big = cosine_matrix(np.array([[1e15, 1], [1e15, 1]]))
    assert big[0, 1] == pytest.approx(1.0)
    n = taken_norms(np.array([[1, 0], [0, 0]]), np.array([[2, 0], [0, 0]]))
    assert math.isnan(n["l1"][0, 1]) and n["common"][0, 0] == 1


def test_compare_plots(profiles: Profiles, tmp_path: Path) -> None:
    res = compare_profiles([profiles.k0, profiles.k1], profiles.build.root, plot_prefix=str(tmp_path / "fig"))
    assert len(res["plots"]) == 5
    for p in res["plots"]:
        assert Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_compare_refuses_other_build(profiles: Profiles, tmp_path: Path) -> None:
    other = tmp_path / "other"
    shutil.copytree(profiles.k1, other)
    p = other / "main.gcda"
    g = parse_gcda(p.read_bytes(), "x")
    g.stamp += 1
    p.write_bytes(g.to_bytes())
    with pytest.raises(UserError, match="main.gcda: stamp"):
        compare_profiles([profiles.k0, other], profiles.build.root)


def test_compare_skips_the_gcov_code_of_an_older_profile(profiles: Profiles, tmp_path: Path) -> None:
    """Profiles collected before `kpgo collect` left out the kernel's gcov code (its counters are the reset and the
    snapshot) still hold kernel/gcov/*.gcda: compare skips them, with the reason, and gives what it gives without."""
    build = tmp_path / "build"
    shutil.copytree(profiles.build.root, build)
    (build / "kernel" / "gcov").mkdir()
    shutil.copyfile(build / "kernel" / "sched.gcno", build / "kernel" / "gcov" / "base.gcno")  # a .gcno that matches
    older = []
    for name, src in (("a", profiles.k0), ("b", profiles.k2)):
        d = tmp_path / name
        shutil.copytree(src, d)
        (d / "kernel" / "gcov").mkdir()
        shutil.copyfile(profiles.k1 / "kernel" / "sched.gcda", d / "kernel" / "gcov" / "base.gcda")  # the same in both
        older.append(d)
    res = compare_profiles(older, build)
    assert res["skipped_files"] == {"kernel/gcov/base.gcda": APPARATUS_WHY}
    assert res["matrices"] == compare_profiles([profiles.k0, profiles.k2], build)["matrices"]


def test_check_matched_stale_missing(profiles: Profiles, tmp_path: Path) -> None:
    res = check_profile(profiles.k0, profiles.build.root)
    assert res["total"] == {"files": 3, "matched": 3, "stale": 0, "missing": 0} and res["all_matched"]
    build = tmp_path / "build"
    shutil.copytree(profiles.build.root, build)
    (build / "net" / "core.gcno").unlink()
    # Rebuild one object from changed source: new stamp and checksums.
    src = build / "kernel" / "sched.c"
    src.write_text(src.read_text().replace("r += 5", "r += 6; if (i > 100) r--"))
    subprocess.run(["gcc", "-O1", "--coverage", "-c", "kernel/sched.c", "-o", "kernel/sched.o"], cwd=build,
                   check=True)
    res = check_profile(profiles.k0, build)
    assert res["total"] == {"files": 3, "matched": 1, "stale": 1, "missing": 1}
    assert res["directories"]["net"]["missing"] == 1 and res["directories"]["kernel"]["stale"] == 1
    reasons = {p["file"]: p["reason"] for p in res["problems"]}
    assert "stamp" in reasons["kernel/sched.gcda"]


def test_check_cli(profiles: Profiles, capsys: pytest.CaptureFixture[str]) -> None:
    from test_profile_cli import kpgo

    assert kpgo(["profile", "check", str(profiles.k0), "--build", str(profiles.build.root)]) == 0
    assert "3 matched, 0 stale, 0 missing" in capsys.readouterr().out
    assert kpgo(["profile", "compare", str(profiles.k0), str(profiles.k1), "--build", str(profiles.build.root),
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["matrices"]) == {"function_cosine", "branch_cosine", "taken_l0", "taken_l1", "taken_l2"}
