"""`kpgo profile compare`: pairwise similarity of kernel profiles of one build (I/O and plots; the metrics are in
kpgo.analysis.similarity).

The instrumented build's .gcno files give each function's CFG. From the arc counters of a profile kpgo computes
    function execution counts       (entry block count of every function with a solvable CFG)
    branch execution counts         (every non-fake arc leaving a block with two or more non-fake successors)
    two-way branches                (blocks with exactly two non-fake successors, one of them the fall-through):
                                    taken = count of the non-fall-through arc, executed = block count
The model of the build is made once per call (see Model: flow conservation as subtree sums over GCC's spanning
trees, all functions at once; kpgo.gcov.flow's symbolic solver for the rare function that needs it); each profile
is then a few vectorized passes. Memory: the model (about 16 bytes of arrays per arc of the build) plus one
profile at a time plus the metric vectors of all profiles (8 bytes per function, branch arc and two-way branch each).

API
    workload_files(dirs) -> (rels, skipped)         the profiles' .gcda paths but the measurement apparatus's
    build_model(build, rels) -> Model
    profile_vectors(model, src) -> dict[str, np.ndarray]
    compare_profiles(dirs, build, names=None, plot_prefix=None, threshold=0.01) -> dict
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kpgo.analysis.similarity import DEFAULT_L0_THRESHOLD, cosine_matrix, taken_norms
from kpgo.errors import UserError
from kpgo.gcov.gcda import ARCS, TAG_FUNCTION, _ranges, parse_gcda
from kpgo.gcov.gcno import ARC_FAKE, ARC_FALLTHROUGH, ARC_ON_TREE
from kpgo.gcov.profile import APPARATUS_WHY, gcda_list, is_apparatus
from kpgo.gcov.validate import function_signature

METRICS = ("function_cosine", "branch_cosine", "taken_l0", "taken_l1", "taken_l2")
VECTORS = ("functions", "branches", "taken", "executed")


@dataclass
class Model:
    """What a build's .gcno files say, arranged for evaluating any number of profiles of that build.

    Counters: the arc counters of all files in one vector (files in order, functions in .gcno order, counters in
    arc order); `key` (file index << 32 | function ident, sorted) finds each function's columns.

    Flow: with EXIT merged into ENTRY, the arcs on GCC's spanning tree form a tree over each function's blocks.
    What enters a set of blocks leaves it, so the count of a tree arc is the net count leaving the subtree below
    it through instrumented arcs: with the blocks numbered in preorder (a subtree is a range), a difference of two
    prefix sums of the per-block net counts. A profile is then a few vectorized passes over its counters. Only
    the arcs the metrics use are kept (`arc_*`). Functions whose tree arcs do not form such a tree go through the
    symbolic solver of kpgo.gcov.flow (`fb_*`: sparse rows, used arc <- counter). Indices are int32."""

    files: list[str]
    stamps: dict[str, int]
    n_cols: int
    sizes: dict[str, int]
    function_names: list[str]
    skipped: dict[str, str]
    unsolved_functions: int
    key: np.ndarray  # int64, sorted
    key_col: np.ndarray  # first column of each function's counters
    key_n: np.ndarray  # its number of counters
    n_pre: int  # blocks of tree-solved functions (preorder positions 0..n_pre-1)
    nt_col: np.ndarray  # instrumented arcs of tree-solved functions: counter column,
    nt_src: np.ndarray  # preorder position of the source block,
    nt_dst: np.ndarray  # and of the destination block
    arc_col: np.ndarray  # used arcs: counter column of an instrumented arc, else -1;
    arc_lo: np.ndarray  # for a tree arc: the preorder range [lo, hi) of the subtree below it,
    arc_hi: np.ndarray
    arc_sign: np.ndarray  # +1 when the arc enters that subtree, -1 when it leaves it (0: fallback solver)
    fb_row: np.ndarray  # fallback solver: used arc,
    fb_col: np.ndarray  # counter column,
    fb_val: np.ndarray  # coefficient
    fn_use: np.ndarray  # used arcs leaving ENTRY of solved functions ...
    fn_row: np.ndarray  # ... and the function row each adds to
    br_use: np.ndarray  # branch arcs (non-fake arcs out of a block other than ENTRY with >= 2 of them)
    tk_use: np.ndarray  # the taken arc of each two-way branch
    ex_use: np.ndarray  # its other arc (executed = both)


I32 = np.int32
TREE_SOLVER = True  # False: every function through the symbolic solver (tests check both agree)


def _model_part(notes: Any, file0: int) -> dict[str, Any]:
    """The model of one batch of .gcno files (indices local to the batch; build_model shifts and joins them)."""
    from kpgo.gcov.flow import solve_function
    from kpgo.gcov.gcno import GcnoFunction

    files = notes.names
    nfiles, nfunc = len(files), len(notes.ident)
    file_of_fn = np.repeat(np.arange(nfiles, dtype=np.int64), np.diff(notes.func_first))
    fn_of_arc = np.repeat(np.arange(nfunc, dtype=I32), np.diff(notes.arc_first))
    flags, src, dst = notes.arc_flags, notes.arc_src, notes.arc_dst
    on_tree = (flags & ARC_ON_TREE) != 0

    # Counter columns: one per instrumented arc, in order.
    col = np.cumsum(~on_tree, dtype=np.int64).astype(I32) - 1
    n_cols = int(len(on_tree) - np.count_nonzero(on_tree))
    n_ctr = np.bincount(fn_of_arc[~on_tree], minlength=nfunc)
    first_col = np.cumsum(n_ctr) - n_ctr
    key = ((file_of_fn + file0) << 32) | notes.ident
    order = np.argsort(key, kind="stable")
    key, key_col, key_n = key[order], first_col[order], n_ctr[order]
    del order, file_of_fn

    # Which arcs the metrics use, per solvable function (decided below), in output order.
    nb2 = np.maximum(notes.n_blocks, 2)
    block_base = (np.cumsum(nb2) - nb2).astype(np.int64)
    gblock = block_base[fn_of_arc] + src  # global block id of each arc's source
    nonfake = (flags & ARC_FAKE) == 0
    deg = np.bincount(gblock[nonfake], minlength=int(nb2.sum()))
    multi = nonfake & (src != 0) & (deg[gblock] >= 2)
    two = multi & (deg[gblock] == 2)
    fall = two & ((flags & ARC_FALLTHROUGH) != 0)
    two &= np.bincount(gblock[fall], minlength=len(deg))[gblock] == 1
    del deg
    used = multi | (src == 0)
    use = np.flatnonzero(used).astype(I32)  # arcs the metrics may use
    del used

    # Nodes: blocks with EXIT (1) merged into ENTRY (0); tree-solvable functions.
    nn = nb2 - 1
    node_base = np.cumsum(nn) - nn
    n_nodes = int(nn.sum())
    src_node = (node_base[fn_of_arc] + np.maximum(src - 1, 0)).astype(I32)
    dst_node = (node_base[fn_of_arc] + np.maximum(dst - 1, 0)).astype(I32)
    n_tree = np.bincount(fn_of_arc[on_tree], minlength=nfunc)
    loops = np.bincount(fn_of_arc[on_tree & (src_node == dst_node)], minlength=nfunc)
    tree_fn = (n_tree == nn - 1) & (loops == 0) & (notes.n_blocks >= 2) & TREE_SOLVER
    del n_tree, loops
    tin, tsize, parent_arc = _preorder(n_nodes, node_base, tree_fn, src_node, dst_node, on_tree, fn_of_arc)
    node_fn = np.repeat(np.arange(nfunc, dtype=I32), nn)
    tree_fn &= np.bincount(node_fn[tin >= 0], minlength=nfunc) == nn
    in_tree = tree_fn[node_fn]
    del node_fn
    n_pre = int(np.count_nonzero(tin >= 0))  # blocks of functions that failed stay in, with nothing flowing

    # Instrumented arcs of tree-solved functions: where their counts enter and leave.
    nt = np.flatnonzero(~on_tree & tree_fn[fn_of_arc])
    nt_col, nt_src, nt_dst = col[nt], tin[src_node[nt]].astype(I32), tin[dst_node[nt]].astype(I32)
    del nt

    # Used arcs: a counter, or the subtree below a tree arc.
    uf = fn_of_arc[use]
    arc_col = np.where(on_tree[use] | ~tree_fn[uf], -1, col[use]).astype(I32)
    arc_lo = np.zeros(len(use), dtype=I32)
    arc_hi = np.zeros(len(use), dtype=I32)
    arc_sign = np.where(tree_fn[uf], 1, 0).astype(np.int8)
    child_of_arc = np.full(len(on_tree), -1, dtype=I32)
    kids = np.flatnonzero((parent_arc >= 0) & in_tree)
    child_of_arc[parent_arc[kids]] = kids
    del kids, parent_arc, in_tree
    tu = np.flatnonzero(on_tree[use] & tree_fn[uf])
    kid = child_of_arc[use[tu]]
    del child_of_arc
    arc_lo[tu] = tin[kid]
    arc_hi[tu] = tin[kid] + tsize[kid]
    arc_sign[tu] = np.where(dst_node[use[tu]] == kid, 1, -1)
    del tu, kid, tsize, tin, src_node, dst_node

    # Functions whose tree arcs are not a spanning tree: the general (symbolic) solver.
    solved = tree_fn.copy()
    fb_row: list[int] = []
    fb_col: list[int] = []
    fb_val: list[int] = []
    unsolved = 0
    use_of_arc: dict[int, int] = {}
    for f in np.flatnonzero(~tree_fn).tolist():
        a, b = int(notes.arc_first[f]), int(notes.arc_first[f + 1])
        fn = GcnoFunction(ident=int(notes.ident[f]), lineno_checksum=0, cfg_checksum=0, name=None, source=None,
                          start_line=0, n_blocks=int(notes.n_blocks[f]), arc_src=src[a:b], arc_dst=dst[a:b],
                          arc_flags=flags[a:b])
        exprs = solve_function(fn)
        if exprs is None:
            unsolved += 1
            continue
        solved[f] = True
        if not use_of_arc:
            use_of_arc = {int(x): i for i, x in enumerate(use.tolist())}
        base = int(first_col[f])
        for k, e in enumerate(exprs):
            u = use_of_arc.get(a + k)
            if u is None:
                continue
            for c, v in e.items():
                fb_row.append(u)
                fb_col.append(base + c)
                fb_val.append(v)

    # Output rows, function by function (only solved functions count).
    live = solved[uf]
    fn_row_of = np.cumsum(solved) - 1
    fn_use = np.flatnonzero(live & (src[use] == 0))
    gb = gblock[use]
    br_use = np.flatnonzero(live & multi[use])
    br_use = br_use[np.lexsort((br_use, gb[br_use]))]
    tk_use = np.flatnonzero(live & two[use] & ~fall[use])
    ex_use = np.flatnonzero(live & two[use] & fall[use])
    tk_use = tk_use[np.argsort(gb[tk_use], kind="stable")]
    ex_use = ex_use[np.argsort(gb[ex_use], kind="stable")]

    names = []
    fof = np.repeat(np.arange(nfiles), np.diff(notes.func_first))
    for f in np.flatnonzero(solved).tolist():
        rel = files[int(fof[f])]
        names.append(f"{rel[:-5]}:{notes.fname[f] or int(notes.ident[f])}")
    return {
        "names": names, "unsolved": unsolved, "n_cols": n_cols, "n_pre": n_pre, "n_use": len(use),
        "n_fn": int(solved.sum()),
        "key": key, "key_col": key_col, "key_n": key_n, "nt_col": nt_col, "nt_src": nt_src, "nt_dst": nt_dst,
        "arc_col": arc_col, "arc_lo": arc_lo, "arc_hi": arc_hi, "arc_sign": arc_sign,
        "fb_row": np.array(fb_row, dtype=np.int64), "fb_col": np.array(fb_col, dtype=np.int64),
        "fb_val": np.array(fb_val, dtype=np.int64),
        "fn_use": fn_use.astype(I32), "fn_row": fn_row_of[uf[fn_use]].astype(I32), "br_use": br_use.astype(I32),
        "tk_use": tk_use.astype(I32), "ex_use": ex_use.astype(I32),
    }


# How each part's arrays shift when parts are joined: by the columns, preorder positions, used arcs or function
# rows of the parts before it (-1 entries of arc_col stay -1).
_SHIFT = {
    "key_col": "n_cols", "nt_col": "n_cols", "arc_col": "n_cols", "fb_col": "n_cols",
    "nt_src": "n_pre", "nt_dst": "n_pre", "arc_lo": "n_pre", "arc_hi": "n_pre",
    "fb_row": "n_use", "fn_use": "n_use", "br_use": "n_use", "tk_use": "n_use", "ex_use": "n_use",
    "fn_row": "n_fn", "key": None, "key_n": None, "arc_sign": None, "fb_val": None,
}


def build_model(build: Path, rels: list[str]) -> Model:
    """Read the build's .gcno files for the profile files `rels` (batch by batch: memory is the model plus one
    batch) and arrange them for profile_vectors."""
    from kpgo.gcov.gcno import iter_notes

    rels = [str(r) for r in rels]
    paths = [os.path.join(build, r[: -len(".gcda")] + ".gcno") for r in rels]
    files: list[str] = []
    stamps: dict[str, int] = {}
    why: dict[str, str] = {}
    names: list[str] = []
    unsolved = 0
    arrays: dict[str, list[np.ndarray]] = {k: [] for k in _SHIFT}
    base = {"n_cols": 0, "n_pre": 0, "n_use": 0, "n_fn": 0}
    for notes in iter_notes(paths, rels):
        why.update(notes.errors)
        if not notes.names:
            continue
        part = _model_part(notes, len(files))
        files += notes.names
        stamps.update(zip(notes.names, notes.stamps))
        names += part["names"]
        unsolved += part["unsolved"]
        for k, by in _SHIFT.items():
            a = part[k]
            if by is not None and base[by]:
                a = np.where(a >= 0, a + base[by], a) if k == "arc_col" else a + base[by]
            arrays[k].append(a)
        for by in base:
            base[by] += part[by]
        del part, notes
    cat = {k: np.concatenate(v) if v else np.zeros(0, dtype=np.int64) for k, v in arrays.items()}
    skipped = {r: "no .gcno in the build directory" if why[r] == "missing" else f"unreadable .gcno: {why[r]}"
               for r in rels if r in why}
    sizes = {"functions": base["n_fn"], "branches": len(cat["br_use"]), "taken": len(cat["tk_use"]),
             "executed": len(cat["tk_use"])}
    return Model(files=files, stamps=stamps, n_cols=base["n_cols"], sizes=sizes, function_names=names,
                 skipped=skipped, unsolved_functions=unsolved, n_pre=base["n_pre"], **cat)


def _preorder(n_nodes: int, node_base: np.ndarray, tree_fn: np.ndarray, src_node: np.ndarray,
              dst_node: np.ndarray, on_tree: np.ndarray, fn_of_arc: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Breadth-first search over the tree arcs of the candidate functions (all functions at once, one level per
    step), then subtree sizes and preorder positions. Returns tin (-1 for nodes not reached), size, parent_arc."""
    arcs = np.flatnonzero(on_tree & tree_fn[fn_of_arc]).astype(I32)
    ends = np.concatenate([src_node[arcs], dst_node[arcs]])
    order = np.argsort(ends, kind="stable")
    other = np.concatenate([dst_node[arcs], src_node[arcs]])[order]
    aid = np.concatenate([arcs, arcs])[order]
    del order, arcs
    indptr = np.zeros(n_nodes + 1, dtype=np.int64)
    np.cumsum(np.bincount(ends, minlength=n_nodes), out=indptr[1:])
    del ends
    visited = np.zeros(n_nodes, dtype=bool)
    parent = np.full(n_nodes, -1, dtype=I32)
    parent_arc = np.full(n_nodes, -1, dtype=I32)
    roots = node_base[tree_fn].astype(I32)
    visited[roots] = True
    levels = [roots]
    frontier = roots
    while len(frontier):
        starts = indptr[frontier]
        counts = indptr[frontier + 1] - starts
        idx = _ranges(starts, counts)
        nxt = other[idx]
        new = ~visited[nxt]
        nxt, via, frm = nxt[new], aid[idx][new], np.repeat(frontier, counts)[new]
        nxt, first = np.unique(nxt, return_index=True)  # a node reached twice: a cycle (the function fails)
        via, frm = via[first], frm[first]
        visited[nxt] = True
        parent[nxt] = frm
        parent_arc[nxt] = via
        if len(nxt):
            levels.append(nxt)
        frontier = nxt
    del other, aid, indptr
    size = visited.astype(I32)
    for lev in reversed(levels[1:]):
        np.add.at(size, parent[lev], size[lev])
    tin = np.full(n_nodes, -1, dtype=np.int64)
    tin[roots] = np.cumsum(size[roots], dtype=np.int64) - size[roots]
    for lev in levels[1:]:
        par = parent[lev]
        o = np.argsort(par, kind="stable")
        kids, par = lev[o], par[o]
        sz = size[kids].astype(np.int64)
        excl = np.cumsum(sz) - sz
        starts = np.flatnonzero(np.r_[True, par[1:] != par[:-1]])
        lens = np.diff(np.r_[starts, len(kids)])
        tin[kids] = tin[par] + 1 + excl - np.repeat(excl[starts], lens)
    return tin, size, parent_arc


def counter_vector(model: Model, src: Path, values: dict[str, dict[str, int]] | None = None) -> np.ndarray:
    """All arc counters of a profile laid out in the model's column order (missing files count zero), int64.

    The profile is read as one image (kpgo.gcov.image) and indexed at once (kpgo.gcov.gcda); files that fail its
    check are parsed one by one. The first
    file (in order) whose stamp or functions do not match the build is a one-line error. values: filled with the
    value counters of those files by kind (kpgo.gcov.profile.value_counters), from the same index."""
    from kpgo.gcov.gcda import ARCS_TAG, counter_values, index_image, pair_positions
    from kpgo.gcov.image import gcda_rels, read_image
    from kpgo.gcov.profile import value_counters

    x = np.zeros(model.n_cols, dtype=np.int64)
    have = set(gcda_rels(src)) if os.path.isdir(src) else set()
    rels = [r for r in model.files if r in have]
    if not rels:
        return x
    idx = index_image(read_image(src, rels))
    if values is not None:
        values.update(value_counters(idx))
    img = idx.image
    pos_of = {r: i for i, r in enumerate(model.files)}
    mfile = np.array([pos_of[r] for r in rels], dtype=np.int64)
    stamps = np.array([model.stamps[r] for r in rels], dtype=np.int64)
    tag, fid = idx.rec_tag, idx.rec_fid
    is_fn = tag == TAG_FUNCTION
    fn_rec = np.flatnonzero(is_fn)
    owner = np.cumsum(is_fn) - 1  # each record's function: the last FUNCTION record before it in its file
    arc = np.flatnonzero((tag == ARCS_TAG) & (owner >= 0))
    arc = arc[fid[fn_rec[owner[arc]]] == fid[arc]]
    with_id = idx.rec_len[fn_rec] >= 3  # an empty FUNCTION record: its counters are not compared
    arc = arc[with_id[owner[arc]]]
    fn_of_arc = owner[arc]
    pairs = idx.rec_len[arc] // 2
    n_fn = np.bincount(fn_of_arc, weights=pairs, minlength=len(fn_rec)).astype(np.int64)
    ident = img.words[idx.rec_pos[fn_rec] + 2].astype(np.int64)
    fkey = (mfile[fid[fn_rec]] << 32) | ident
    j = np.maximum(np.searchsorted(model.key, fkey, side="right") - 1, 0)
    mismatch = with_id & ((model.key[j] != fkey) | (model.key_n[j] != n_fn)) if len(model.key) else with_id
    bad = idx.fast & (idx.stamp.astype(np.int64) != stamps)
    bad[fid[fn_rec[mismatch]]] = True
    problem = np.flatnonzero(bad)
    first_bad = int(problem[0]) if len(problem) else len(rels)
    for k in idx.slow():  # in file order, up to the first defective file of the fast path
        if k > first_bad:
            break
        path = img.path(k)
        g = parse_gcda(img.file_bytes(k), path)
        _check_stamp(model, rels[k], path, g.stamp)
        _place_parsed(model, g, int(mfile[k]), x, path)
    if first_bad < len(rels):
        k = first_bad
        _check_stamp(model, rels[k], img.path(k), int(idx.stamp[k]))
        r = fn_rec[mismatch & (fid[fn_rec] == k)][0]
        raise UserError(f"{img.path(k)}: function {int(img.words[idx.rec_pos[r] + 2])} does not match the build's "
                        ".gcno", "run `kpgo profile check` to see which files are stale")
    # Each arc record's counters follow those of the earlier records of its function.
    cum = np.cumsum(pairs) - pairs
    starts = np.flatnonzero(np.r_[True, fn_of_arc[1:] != fn_of_arc[:-1]]) if len(arc) else np.zeros(0, np.int64)
    within = cum - np.repeat(cum[starts], np.diff(np.r_[starts, len(arc)]))
    dst_col = model.key_col[j[fn_of_arc]] + within
    lo = pair_positions(idx.rec_pos[arc] + 2, pairs)
    x[_ranges(dst_col, pairs)] = counter_values(img.words, lo).astype(np.int64)
    return x


def _check_stamp(model: Model, rel: str, path: str, stamp: int) -> None:
    if stamp != model.stamps[rel]:
        raise UserError(f"{path}: stamp {stamp:#x} does not match the build's .gcno ({model.stamps[rel]:#x})",
                        "compare profiles collected from this build (--build)")


def _place_parsed(model: Model, g: Any, mfile: int, x: np.ndarray, path: str) -> None:
    """Counters of one fully parsed file into x (the per-file path)."""
    values = g.counters(ARCS).astype(np.int64)
    pos = 0
    for ident, _lcs, _ccs, n in function_signature(g):
        k = (mfile << 32) | ident
        j = int(np.searchsorted(model.key, k, side="right")) - 1
        if j < 0 or int(model.key[j]) != k or int(model.key_n[j]) != n:
            raise UserError(f"{path}: function {ident} does not match the build's .gcno",
                            "run `kpgo profile check` to see which files are stale")
        c = int(model.key_col[j])
        x[c : c + n] = values[pos : pos + n]
        pos += n


def arc_values(model: Model, x: np.ndarray) -> np.ndarray:
    """Execution count of every used arc from the counter vector x (int64)."""
    pre = np.zeros(model.n_pre + 1, dtype=np.int64)
    c = x[model.nt_col]
    np.add.at(pre, model.nt_src + 1, c)
    np.add.at(pre, model.nt_dst + 1, -c)
    del c
    np.cumsum(pre, out=pre)
    val = pre[model.arc_hi]
    val -= pre[model.arc_lo]
    val *= model.arc_sign
    counted = model.arc_col >= 0
    val[counted] = x[model.arc_col[counted]]
    if len(model.fb_row):
        np.add.at(val, model.fb_row, model.fb_val * x[model.fb_col])
    return val


def profile_vectors(model: Model, src: Path, out: dict[str, np.ndarray] | None = None,
                    values: dict[str, dict[str, int]] | None = None) -> dict[str, np.ndarray]:
    """The metric vectors of one profile: functions, branches, taken, executed (float64); written into `out`
    (arrays of the right sizes, e.g. rows of a matrix) when given. values: see counter_vector."""
    val = arc_values(model, counter_vector(model, src, values)).astype(np.float64)
    out = out if out is not None else {k: np.empty(model.sizes[k]) for k in VECTORS}
    out["functions"][:] = np.bincount(model.fn_row, weights=val[model.fn_use], minlength=model.sizes["functions"])
    np.take(val, model.br_use, out=out["branches"])
    np.take(val, model.tk_use, out=out["taken"])
    np.add(out["taken"], val[model.ex_use], out=out["executed"])
    return out


def workload_files(dirs: Iterable[Path]) -> tuple[list[str], dict[str, str]]:
    """The .gcda paths of the profiles in dirs, sorted, without those of the measurement apparatus (kernel/gcov, in
    profiles collected before `kpgo collect` left it out), which are returned apart with the reason."""
    rels = sorted(set().union(*[{str(p) for p in gcda_list(d)} for d in dirs]))
    return [r for r in rels if not is_apparatus(r)], {r: APPARATUS_WHY for r in rels if is_apparatus(r)}


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
    rels, apparatus = workload_files(dirs)
    model = build_model(build, rels)
    if not model.files:
        raise UserError(f"{build}: no .gcno matches the profiles' .gcda files",
                        "give the build directory the profiles were collected from")
    stack = {k: np.empty((len(dirs), model.sizes[k])) for k in VECTORS}
    values: list[dict[str, dict[str, int]]] = [{} for _ in dirs]
    for i, d in enumerate(dirs):
        profile_vectors(model, d, out={k: stack[k][i] for k in VECTORS}, values=values[i])
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
            "functions": [int(n) for n in np.count_nonzero(stack["functions"], axis=1)],
            "two_way_branches": [int(n) for n in np.count_nonzero(stack["executed"], axis=1)],
        },
        "skipped_files": apparatus | model.skipped,
        "unsolved_functions": model.unsolved_functions,
        "values": values,
    }
    if plot_prefix:
        result["plots"] = plot_matrices(mats, labels, plot_prefix)
    return result


def _num(v: float) -> float | None:
    return None if np.isnan(v) else round(float(v), 6)


def plot_matrices(mats: dict[str, np.ndarray], labels: list[str], prefix: str) -> list[str]:
    """One heatmap PNG per metric, PREFIX-<metric>.png, drawn as the report draws them."""
    from kpgo.atomic import write_bytes
    from kpgo.report import figures, present

    out = []
    for key, m in mats.items():
        path = Path(f"{prefix}-{key}.png")
        write_bytes(path, figures.matrices(labels, [(present.similarity_title(key, short=True), m.tolist(), present.SIMILARITY[key][1])]))
        out.append(str(path))
    return out
