"""`kpgo profile compare`: pairwise similarity of kernel profiles of one build (I/O and plots; the metrics are in
kpgo.analysis.similarity).

The instrumented build's .gcno files give each function's CFG; kpgo.gcov.flow turns it, once, into sparse linear
maps from the arc counters to
    function execution counts       (entry block count of every function with a solvable CFG)
    branch execution counts         (every non-fake arc leaving a block with two or more non-fake successors)
    two-way branches                (blocks with exactly two non-fake successors, one of them the fall-through):
                                    taken = count of the non-fall-through arc, executed = block count
Each profile is then one sparse product per map.

API
    build_model(build, rels) -> Model
    profile_vectors(model, src) -> dict[str, np.ndarray]
    compare_profiles(dirs, build, names=None, plot_prefix=None, threshold=0.01) -> dict
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from kpgo.analysis.similarity import DEFAULT_L0_THRESHOLD, cosine_matrix, taken_norms
from kpgo.errors import UserError
from kpgo.gcov.gcda import ARCS, GcovFormatError
from kpgo.gcov.gcno import ARC_FAKE, ARC_FALLTHROUGH, parse_gcno
from kpgo.gcov.profile import gcda_list, read_profile_file
from kpgo.gcov.validate import function_signature

METRICS = ("function_cosine", "branch_cosine", "taken_l0", "taken_l1", "taken_l2")


@dataclass
class SparseMap:
    rows: list[int] = field(default_factory=list)
    cols: list[int] = field(default_factory=list)
    vals: list[int] = field(default_factory=list)
    n: int = 0

    def add_row(self, expr: dict[int, int], base: int) -> int:
        for k, v in expr.items():
            self.rows.append(self.n)
            self.cols.append(base + k)
            self.vals.append(v)
        self.n += 1
        return self.n - 1

    def freeze(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (np.asarray(self.rows, dtype=np.int64), np.asarray(self.cols, dtype=np.int64),
                np.asarray(self.vals, dtype=np.float64))


@dataclass
class Model:
    files: list[str]
    stamps: dict[str, int]
    file_base: dict[str, int]
    funcs: dict[str, dict[int, tuple[int, int]]]  # file -> ident -> (offset in file, counters)
    n_cols: int
    maps: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]
    sizes: dict[str, int]
    function_names: list[str]
    skipped: dict[str, str]
    unsolved_functions: int


def _sum_exprs(exprs: list[dict[int, int]]) -> dict[int, int]:
    acc: dict[int, int] = {}
    for e in exprs:
        for k, v in e.items():
            acc[k] = acc.get(k, 0) + v
    return {k: v for k, v in acc.items() if v}


def build_model(build: Path, rels: list[str]) -> Model:
    from kpgo.gcov.flow import solve_function

    fmap, bmap, tmap, emap = SparseMap(), SparseMap(), SparseMap(), SparseMap()
    files: list[str] = []
    stamps: dict[str, int] = {}
    file_base: dict[str, int] = {}
    funcs: dict[str, dict[int, tuple[int, int]]] = {}
    names: list[str] = []
    skipped: dict[str, str] = {}
    unsolved = 0
    col = 0
    for rel in rels:
        note = os.path.join(build, rel[: -len(".gcda")] + ".gcno")
        try:
            with open(note, "rb") as f:
                notes = parse_gcno(f.read(), note)
        except FileNotFoundError:
            skipped[rel] = "no .gcno in the build directory"
            continue
        except GcovFormatError as e:
            skipped[rel] = f"unreadable .gcno: {e.problem}"
            continue
        files.append(rel)
        stamps[rel] = notes.stamp
        file_base[rel] = col
        table: dict[int, tuple[int, int]] = {}
        off = 0
        for fn in notes.functions:
            n_ctr = fn.n_counters
            table[fn.ident] = (off, n_ctr)
            base = col + off
            off += n_ctr
            arcs = solve_function(fn)
            if arcs is None:
                unsolved += 1
                continue
            src = fn.arc_src.tolist()
            flags = fn.arc_flags.tolist()
            fmap.add_row(_sum_exprs([arcs[a] for a in range(len(src)) if src[a] == 0]), base)
            names.append(f"{rel[:-5]}:{fn.name or fn.ident}")
            by_block: dict[int, list[int]] = {}
            for a, s in enumerate(src):
                if not flags[a] & ARC_FAKE:
                    by_block.setdefault(s, []).append(a)
            for b, out in by_block.items():
                if len(out) < 2 or b == 0:
                    continue
                for a in out:
                    bmap.add_row(arcs[a], base)
                if len(out) == 2:
                    fall = [a for a in out if flags[a] & ARC_FALLTHROUGH]
                    if len(fall) == 1:
                        taken = out[0] if out[1] == fall[0] else out[1]
                        tmap.add_row(arcs[taken], base)
                        emap.add_row(_sum_exprs([arcs[out[0]], arcs[out[1]]]), base)
        funcs[rel] = table
        col += off
    maps = {"functions": fmap.freeze(), "branches": bmap.freeze(), "taken": tmap.freeze(),
            "executed": emap.freeze()}
    sizes = {"functions": fmap.n, "branches": bmap.n, "taken": tmap.n, "executed": emap.n}
    return Model(files=files, stamps=stamps, file_base=file_base, funcs=funcs, n_cols=col, maps=maps, sizes=sizes,
                 function_names=names, skipped=skipped, unsolved_functions=unsolved)


def counter_vector(model: Model, src: Path) -> np.ndarray:
    """All arc counters of a profile laid out in the model's column order (missing files count zero)."""
    x = np.zeros(model.n_cols, dtype=np.float64)
    for rel in model.files:
        if not os.path.exists(os.path.join(src, rel)):
            continue
        g = read_profile_file(src, rel)
        if g.stamp != model.stamps[rel]:
            raise UserError(f"{os.path.join(src, rel)}: stamp {g.stamp:#x} does not match the build's .gcno "
                            f"({model.stamps[rel]:#x})", "compare profiles collected from this build (--build)")
        values = g.counters(ARCS).astype(np.float64)
        table = model.funcs[rel]
        base = model.file_base[rel]
        pos = 0
        for ident, _lcs, _ccs, n in function_signature(g):
            slot = table.get(ident)
            if slot is None or slot[1] != n:
                raise UserError(f"{os.path.join(src, rel)}: function {ident} does not match the build's .gcno",
                                "run `kpgo profile check` to see which files are stale")
            x[base + slot[0] : base + slot[0] + n] = values[pos : pos + n]
            pos += n
    return x


def apply_map(m: tuple[np.ndarray, np.ndarray, np.ndarray], n: int, x: np.ndarray) -> np.ndarray:
    rows, cols, vals = m
    return np.bincount(rows, weights=vals * x[cols], minlength=n) if n else np.zeros(0)


def profile_vectors(model: Model, src: Path) -> dict[str, np.ndarray]:
    x = counter_vector(model, src)
    return {k: apply_map(model.maps[k], model.sizes[k], x) for k in model.maps}


def compare_profiles(
    dirs: list[Path], build: Path, names: list[str] | None = None, plot_prefix: str | None = None,
    threshold: float = DEFAULT_L0_THRESHOLD,
) -> dict[str, Any]:
    dirs = [Path(d) for d in dirs]
    build = Path(build)
    if len(dirs) < 2:
        raise UserError("compare needs two or more profiles", "give several profile directories")
    if not build.is_dir():
        raise UserError(f"build directory {build} does not exist", "give the instrumented kernel's build directory")
    labels = names or [d.name for d in dirs]
    if len(labels) != len(dirs):
        raise UserError(f"--names has {len(labels)} labels for {len(dirs)} profiles", "give one label per profile")
    rels = sorted(set().union(*[{str(p) for p in gcda_list(d)} for d in dirs]))
    model = build_model(build, rels)
    if not model.files:
        raise UserError(f"{build}: no .gcno matches the profiles' .gcda files",
                        "give the build directory the profiles were collected from")
    vecs = [profile_vectors(model, d) for d in dirs]
    stack = {k: np.stack([v[k] for v in vecs]) for k in model.maps}
    norms = taken_norms(stack["taken"], stack["executed"], threshold)
    mats = {
        "function_cosine": cosine_matrix(stack["functions"]),
        "branch_cosine": cosine_matrix(stack["branches"]),
        "taken_l0": norms["l0"], "taken_l1": norms["l1"], "taken_l2": norms["l2"],
    }
    result: dict[str, Any] = {
        "names": labels,
        "profiles": [str(d) for d in dirs],
        "build": str(build),
        "matrices": {k: [[_num(v) for v in row] for row in m.tolist()] for k, m in mats.items()},
        "common_two_way_branches": norms["common"].tolist(),
        "l0_threshold": threshold,
        "sizes": {"functions": model.sizes["functions"], "branch_arcs": model.sizes["branches"],
                  "two_way_branches": model.sizes["taken"], "files": len(model.files)},
        "executed": {
            "functions": [int(np.count_nonzero(v["functions"])) for v in vecs],
            "two_way_branches": [int(np.count_nonzero(v["executed"])) for v in vecs],
        },
        "skipped_files": model.skipped,
        "unsolved_functions": model.unsolved_functions,
    }
    if plot_prefix:
        result["plots"] = plot_matrices(mats, labels, plot_prefix)
    return result


def _num(v: float) -> float | None:
    return None if np.isnan(v) else round(float(v), 6)


def plot_matrices(mats: dict[str, np.ndarray], labels: list[str], prefix: str) -> list[str]:
    """One heatmap PNG per metric, annotated like the confusion matrices of the paper."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from kpgo.atomic import write_bytes

    titles = {
        "function_cosine": "Cosine similarity of function execution counts",
        "branch_cosine": "Cosine similarity of branch execution counts",
        "taken_l0": "L0 of taken-probability differences",
        "taken_l1": "L1 of taken-probability differences",
        "taken_l2": "L2 of taken-probability differences",
    }
    out = []
    for key, m in mats.items():
        n = len(labels)
        size = max(4.0, 0.8 * n + 2)
        fig, ax = plt.subplots(figsize=(size, size * 0.85))
        cmap = "viridis" if key.endswith("cosine") else "magma_r"
        im = ax.imshow(m, vmin=0.0, vmax=1.0, cmap=cmap)
        ax.set_xticks(range(n), labels, rotation=45, ha="right")
        ax.set_yticks(range(n), labels)
        for i in range(n):
            for j in range(n):
                v = m[i, j]
                txt = "–" if np.isnan(v) else f"{v:.2f}"
                ax.text(j, i, txt, ha="center", va="center", fontsize=8,
                        color="white" if (not np.isnan(v) and (v < 0.5) == key.endswith("cosine")) else "black")
        ax.set_title(titles[key], fontsize=10)
        fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
        fig.tight_layout()
        import io

        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        plt.close(fig)
        path = Path(f"{prefix}-{key}.png")
        write_bytes(path, buf.getvalue())
        out.append(str(path))
    return out
