"""kpgo.inputs, the one reader of the files kpgo is given, and the readers built on it: whatever sits at the path
(special files, binary garbage, cut files, JSON of any shape) gives a valid result or one UserError naming the
file, never another exception, a hang or an unbounded read. Property-based (hypothesis) over bytes and JSON values."""

from __future__ import annotations

import json
import os
import socket
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kpgo import bench, branches, inputs, variants
from kpgo.errors import UserError
from kpgo.gcov import ident
from kpgo.gcov.profile import PROFILE_SHAPE, origins, read_profile_json
from kpgo.kernel import kbuild, kconfig
from kpgo.report import load

DATA = Path(__file__).parent / "data"
RUN = DATA / "report" / "tiny-cross-sim"
SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4), max_leaves=20)


def _one_line(e: UserError, path: Path | str) -> None:
    """What the CLI prints of it: one line naming the file, with a next step."""
    assert "\n" not in str(e) and str(path) in e.message and e.hint, str(e)


# -- special files: refused at once, named for what they are -----------------------------------------------------


@pytest.fixture
def specials(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    fifo, sock, d = tmp_path / "fifo.json", tmp_path / "sock.json", tmp_path / "dir.json"
    os.mkfifo(fifo)
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(sock))
    d.mkdir()
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    (tmp_path / "broken.json").symlink_to(tmp_path / "nowhere")
    return {"fifo": (fifo, "is a FIFO"), "socket": (sock, "is a socket"), "directory": (d, "is a directory"),
            "device": (tmp_path / "zero.json", "is a character device"), "broken link": (tmp_path / "broken.json", "broken symbolic link"),
            "missing": (tmp_path / "nope.json", "does not exist"), "under a file": (tmp_path / "a-file" / "x.json", "is a file, not a directory")}


@pytest.mark.parametrize("kind", ["fifo", "socket", "directory", "device", "broken link", "missing", "under a file"])
def test_special_files_are_named_not_read(specials: dict[str, tuple[Path, str]], tmp_path: Path, kind: str) -> None:
    (tmp_path / "a-file").write_text("x")
    path, words = specials[kind]
    done = threading.Event()
    errors: list[UserError] = []

    def read() -> None:  # in a thread, so that a blocking open of the FIFO fails the test instead of hanging it
        try:
            inputs.read_json(path, "do this next")
        except UserError as e:
            errors.append(e)
        done.set()

    threading.Thread(target=read, daemon=True).start()
    assert done.wait(10), f"reading a {kind} hung"
    assert len(errors) == 1 and words in errors[0].message and errors[0].hint == "do this next", errors
    _one_line(errors[0], path)


def test_missing_ok_is_only_for_nothing_there(specials: dict[str, tuple[Path, str]]) -> None:
    assert inputs.read_json(specials["missing"][0], "h", missing_ok=True) is None
    with pytest.raises(UserError, match="broken symbolic link"):
        inputs.read_json(specials["broken link"][0], "h", missing_ok=True)
    with pytest.raises(UserError, match="is a FIFO"):
        inputs.read_json(specials["fifo"][0], "h", missing_ok=True)


def test_reads_are_bounded(tmp_path: Path) -> None:
    big = tmp_path / "big.json"
    big.write_bytes(b" " * 4097)
    with pytest.raises(UserError, match="more than the 4,096 kpgo reads"):
        inputs.read_json(big, "h", limit=4096)
    assert inputs.read_bytes(big, "h", limit=4097) == b" " * 4097


def test_deep_nesting_is_not_a_recursion_error(tmp_path: Path) -> None:
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    with pytest.raises(UserError, match="nested too deep|not valid JSON"):
        inputs.read_json(deep, "h")
    (tmp_path / "deep.toml").write_text("a = " + "[" * 100_000)
    with pytest.raises(UserError, match="TOML"):
        inputs.read_toml(tmp_path / "deep.toml", "h")


# -- shapes ------------------------------------------------------------------------------------------------------


def test_shape_messages_name_the_place() -> None:
    shape = {"a": {str: [{"x": int, "y?": (float, None)}]}}
    ok = {"a": {"k": [{"x": 1, "y": 2}, {"x": 2, "y": None}, {"x": 3}]}, "extra": "kept"}
    assert inputs.check(ok, shape, "f.json", "h") is ok
    for bad, where in (({"a": {"k": [{"x": 1}, {"x": True}]}}, "a.k[1].x is true, expected an integer"),
                       ({"a": {"k": [{"x": 1, "y": "2"}]}}, "a.k[0].y is the string '2', expected a number or null"),
                       ({"a": {"k": [{}]}}, "a.k[0] has no 'x'"), ({}, "has no 'a'"), ([], "does not hold a JSON object (it holds a list)")):
        with pytest.raises(UserError) as e:
            inputs.check(bad, shape, "f.json", "h")
        assert e.value.message.startswith("f.json: ") and where in e.value.message, e.value.message


@SETTINGS
@given(value=JSON)
def test_check_accepts_exactly_the_shape(value: Any) -> None:
    """check() on arbitrary JSON: a UserError, or the value back; and `object` takes anything."""
    assert inputs.check(value, object, "f", "h") is value
    for shape in (PROFILE_SHAPE, load.RESULTS_SHAPE, kbuild.BUILD_SHAPE, {str: [int]}, [(str, None)]):
        try:
            assert inputs.check(value, shape, "f", "h") is value
        except UserError as e:
            _one_line(e, "f")


# -- the readers, on garbage bytes and on JSON of random shapes ----------------------------------------------------


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


@SETTINGS
@given(data=st.binary(max_size=300))
def test_readers_on_garbage_bytes(tmp_path: Path, data: bytes) -> None:
    """Each reader on arbitrary bytes: its result or one UserError naming the file."""
    readers = {
        "profile.json": lambda p: read_profile_json(p.parent),
        "build.json": lambda p: kbuild.load_build(p.parent, "build it"),
        "run.json": lambda p: load.load(p.parent),
        "v.toml": lambda p: variants.read(p),
        "f.config": lambda p: kconfig.read_options(p, "config fragment"),
        "branches.rec": lambda p: branches.read_records(p),
        "callgraph.tsv": lambda p: branches.read_call_graph(p),
    }
    for name, read in readers.items():
        path = _write(tmp_path / "g" / name, data)
        try:
            read(path)
        except UserError as e:
            _one_line(e, tmp_path / "g")
        path.unlink()


def _mutate(doc: Any, path: list[int], value: Any) -> Any:
    """doc with the node that `path` picks (each step an index into a container's items, modulo its size) replaced."""
    if not path or not isinstance(doc, (dict, list)) or not doc:
        return value
    if isinstance(doc, dict):
        k = list(doc)[path[0] % len(doc)]
        return {**doc, k: _mutate(doc[k], path[1:], value)}
    i = path[0] % len(doc)
    return [*doc[:i], _mutate(doc[i], path[1:], value), *doc[i + 1:]]


RESULTS = json.loads((RUN / "bench" / "results.json").read_text())
RUN_JSON = json.loads((RUN / "run.json").read_text())


@SETTINGS
@given(where=st.lists(st.integers(min_value=0, max_value=50), min_size=0, max_size=8), value=JSON, which=st.sampled_from(["results", "run"]))
def test_report_load_on_json_of_any_shape(tmp_path: Path, where: list[int], value: Any, which: str) -> None:
    """A run directory whose run.json or results.json has one node (at any depth) replaced by arbitrary JSON: the
    report's loader gives data the sections can trust, or one UserError naming the file."""
    run = tmp_path / "run"
    doc = _mutate(RESULTS if which == "results" else RUN_JSON, where, value)
    _write(run / "bench" / "results.json", json.dumps(RESULTS if which == "run" else doc).encode())
    _write(run / "run.json", json.dumps(RUN_JSON if which == "results" else doc).encode())
    try:
        data = load.load(run)
    except UserError as e:
        _one_line(e, run)
        return
    assert data.results is not None and isinstance(data.results.workloads, dict)


@SETTINGS
@given(where=st.lists(st.integers(min_value=0, max_value=20), min_size=0, max_size=4), value=JSON)
def test_build_and_profile_records_of_any_shape(tmp_path: Path, where: list[int], value: Any) -> None:
    """build.json and profile.json with a node replaced: a record of the shape their users read, or a UserError."""
    build = tmp_path / "b"
    (build / "arch" / "x86" / "boot").mkdir(parents=True, exist_ok=True)
    (build / "arch" / "x86" / "boot" / "bzImage").write_bytes(b"image")
    good = {"ok": True, "key": "k", "variant": "vanilla", "kernel_release": "6.12.0", "build_dir": str(build), "config_name": "tiny",
            "config_hash": "0", "gcc": "12.2.0", "gcov": False}
    _write(build / "build.json", json.dumps(_mutate(good, where, value)).encode())
    try:
        rec = kbuild.load_build(build, "build it")
        assert rec["ok"] is True and isinstance(rec["key"], str) and isinstance(rec["kernel_release"], str)
    except UserError as e:
        _one_line(e, build)
    prof = tmp_path / "p"
    meta = {"kind": "kernel-gcov-profile", "config_name": "tiny", "kernel_release": "6.12.0", "fixed": {"runs": 1}, "build_dir": "/nonexistent",
            "merged": {"inputs": [{"profile": {"config_name": "tiny"}}]}}
    _write(prof / "profile.json", json.dumps(_mutate(meta, where, value)).encode())
    try:
        info = read_profile_json(prof)
        assert isinstance(info, dict)
        origins(info)  # what the optimized build reads of it
        ident.profile_rekey(prof, tmp_path)  # and whether it re-keys it
    except UserError as e:
        _one_line(e, prof)


@SETTINGS
@given(value=JSON)
def test_bench_reuses_only_samples_and_plans_it_can_read(tmp_path: Path, value: Any) -> None:
    """A bench directory's own files of any content are measured or planned again, never an exception."""
    out = tmp_path / "bench"
    _write(out / "plan.json", json.dumps(value).encode())
    _write(out / "results.json", json.dumps({"design": value}).encode())
    plan = bench._earlier_plan(out)
    assert plan == {} or isinstance(plan["seed"], int)
    step = {"round": 0, "workload": "redis", "kernel": "vanilla"}
    sample = {**step, "cell_key": "key", "values": [1.0], "mean": 1.0, "block": "block"}
    for rec, kept in ((sample, True), (value, False), ({**sample, "mean": value}, isinstance(value, (int, float)) and not isinstance(value, bool)),
                      ({**sample, "values": value}, isinstance(value, list) and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value))):
        _write(out / "boots" / "00-redis-vanilla" / "sample.json", json.dumps(rec).encode())
        boots, _ = bench._boots_of(out, [step], {("vanilla", "redis"): "key"}, "block")
        assert (boots[0].kept is not None) == kept, rec
