"""Workload data files, overrides, and the guest agent's parsing of real generator output
recorded in TCG guests (tests/data/workloads/<workload>/<step>.txt, from `kpgo collect
--workload all`; see the README there)."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace
from pathlib import Path

import pytest

from kpgo import workloads
from kpgo.errors import UserError
from kpgo.guest import contract

AGENT = Path(__file__).resolve().parent.parent / "src" / "kpgo" / "guest" / "agent.py"
RECORDED = Path(__file__).resolve().parent / "data" / "workloads"
ALL = ["apache", "leveldb", "memcached", "micro", "mysql", "nginx", "postgresql", "redis", "rocksdb"]


def agent():  # the agent is a stand-alone script (it runs inside the guest), so load it by path
    spec = importlib.util.spec_from_file_location("kpgo_agent", AGENT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_suite_is_complete() -> None:
    assert workloads.names() == ALL
    assert [w.name for w in workloads.load_many("all")] == ALL


@pytest.mark.parametrize("name", ALL)
def test_spec_is_valid(name: str) -> None:
    wl = workloads.load(name)
    assert workloads.validate(wl.to_json()) == []
    assert wl.packages and wl.unit and "params" in wl.to_json() and wl.paper is not None


def test_validate_catches_mistakes() -> None:
    wl = workloads.load("nginx").to_json()
    wl["load"][0]["argv"].append("{no_such_param}")
    wl["load"][0]["metric"] = "Requests/sec: ([0-9.]+)"  # no value group
    problems = " ".join(workloads.validate(wl))
    assert "{no_such_param} is not a parameter" in problems and "no (?P<value>...) group" in problems


def test_validate_catches_unknown_keys_and_types() -> None:
    wl = workloads.load("redis").to_json()
    wl["warmpu"] = wl.pop("warmup")  # a typo would have skipped the warm-up silently
    wl["load"][0]["timout"] = 60
    wl["server"]["ready_timeout"] = "soon"
    problems = workloads.validate(wl)
    assert "the file: unknown key 'warmpu'" in problems[0]
    assert any("load step 1: unknown key 'timout'" in p for p in problems)
    assert any("server: ready_timeout should be of type number" in p for p in problems)


def test_a_bad_workload_file_is_refused_when_it_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Validation runs on every load (not only in these tests): the command stops with one line naming the file."""
    (tmp_path / "redis.toml").write_text((workloads._dir() / "redis.toml").read_text().replace("[[warmup]]", "[[warmpu]]"))
    (tmp_path / "broken.toml").write_text("name = \"broken\"\nparams = {")
    monkeypatch.setattr(workloads, "_dir", lambda: tmp_path)
    with pytest.raises(UserError) as e:
        workloads.load("redis")
    assert "redis.toml: the file: unknown key 'warmpu'" in e.value.message and "docs/WORKLOADS.md" in e.value.hint
    with pytest.raises(UserError) as e:
        workloads.load("broken")
    assert "broken.toml: not valid TOML" in e.value.message


def test_overrides_plain_scoped_and_typed() -> None:
    specs = workloads.load_many("redis,nginx", ["port=7000", "redis.clients=8", "nginx.duration=5"])
    redis, nginx = specs
    assert redis.params["port"] == nginx.params["port"] == 7000  # plain: every workload that has it
    assert redis.params["clients"] == 8 and nginx.params["duration"] == 5
    with pytest.raises(UserError, match="not a parameter"):
        workloads.load_many("redis", ["nosuch=1"])
    with pytest.raises(UserError, match="not a parameter"):
        workloads.load_many("redis,nginx", ["nginx.clients=3"])  # redis has clients, nginx does not
    with pytest.raises(UserError, match="workload nginx is not chosen"):
        workloads.load_many("redis", ["nginx.port=1"])
    with pytest.raises(UserError, match="type int"):
        workloads.load("redis", ["clients=many"])
    with pytest.raises(UserError, match="unknown workload"):
        workloads.load_many("redis,nosuch")


def test_templates_fill_only_known_names() -> None:
    a = agent()
    assert a.fill("events { worker_connections 1024; } listen {port};", {"port": 80}) == "events { worker_connections 1024; } listen 80;"
    step = contract.Step(name="tcp", argv=("true",), each="procs")
    assert [n for n, _ in a.expand(step, {"procs": "1, 4,16"})] == ["tcp-1", "tcp-4", "tcp-16"]
    assert a.expand(step, {"procs": "2"})[0][1]["each"] == "2"


def test_aggregates() -> None:
    a = agent()
    assert a.aggregate([2.0, 8.0], "geomean") == pytest.approx(4.0)
    assert a.aggregate([1.0, 3.0], "hmean") == pytest.approx(1.5)
    assert a.aggregate([1.0, 3.0], "mean") == 2.0 and a.aggregate([1.0, 3.0], "sum") == 4.0
    assert a.aggregate([0.0, 3.0], "geomean") == 0.0


def recorded_steps(name: str) -> list[tuple[contract.Step, str, Path]]:
    wl = workloads.load(name)
    a = agent()
    out = []
    for step in wl.load:
        for step_name, _ in a.expand(step, wl.params):
            out.append((step, step_name, RECORDED / name / f"{step_name}.txt"))
    return out


@pytest.mark.parametrize("name", ALL)
def test_recorded_output_parses(name: str) -> None:
    """Every load step of every workload parses from real output into the recorded figures."""
    a = agent()
    expected = json.loads((RECORDED / name / "expected.json").read_text())
    got_parts, got_secondary = {}, {}
    for step, step_name, path in recorded_steps(name):
        assert path.is_file(), f"no recorded output for {name} step {step_name}"
        parts, secondary = a.parse_step(path.read_text(), step)
        assert parts and all(v > 0 for v in parts.values()), step_name
        got_parts.update({f"{step_name}.{k}" if k else step_name: v for k, v in parts.items()})
        got_secondary.update({f"{step_name}.{k}": v for k, v in secondary.items()})
    assert got_parts == expected["parts"]
    assert got_secondary == pytest.approx(expected["secondary"])
    # The exact operation count the per-op simulated figures are divided by (every generator of the
    # suite reports one or runs a fixed number).
    ops = 0.0
    for step, step_name, path in recorded_steps(name):
        text = path.read_text()
        parts, _ = a.parse_step(text, step)
        count = a.op_count(text, step, parts, dict(workloads.load(name).params, each=step_name.rsplit("-", 1)[-1]))
        assert count is not None and count > 0, f"{name} step {step_name}: no exact operation count"
        ops += count
    assert ops == expected["ops"]
    wl = workloads.load(name)
    assert a.aggregate(list(got_parts.values()), wl.aggregate) == pytest.approx(expected["value"])


def test_hand_checked_figures() -> None:
    """A few figures read off the recorded files by eye, so the golden files are not only the code's own word."""
    exp = {n: json.loads((RECORDED / n / "expected.json").read_text()) for n in ALL}
    for name, key, value in HAND_CHECKED:
        assert exp[name]["parts"].get(key, exp[name]["secondary"].get(key)) == pytest.approx(value), (name, key)


HAND_CHECKED: list[tuple[str, str, float]] = [
    ("nginx", "wrk", 2252.11), ("nginx", "wrk.p50_ms", 11.74),                 # Requests/sec:   2252.11 / 50%   11.74ms
    ("apache", "ab", 343.61),                                                   # Requests per second:    343.61 [#/sec]
    ("memcached", "memcaslap", 7148),                                           # ... TPS: 7148 Net_rate: 8.0M/s
    ("mysql", "read_write", 33.27), ("mysql", "read_write.p99_ms", 227.40),     # (33.27 per sec.) / 99th percentile: 227.40
    ("postgresql", "tpcb_like", 12.864779), ("postgresql", "tpcb_like.latency_avg_ms", 621.853),
    ("rocksdb", "db_bench.readrandom", 28147), ("leveldb", "leveldb_bench.readrandom", 50027),
    ("redis", "bench.GET", 7057.99), ("redis", "bench.get_p99_ms", 8.351),      # "GET","7057.99",...,"8.351","19.567"
    ("micro", "fork", 278.55),                                                  # fork  480  1.72  0.65  1.13  278.55  269.63
]

# Exact operation counts read off the recorded files by eye (per step).
HAND_COUNTED: list[tuple[str, str, float]] = [
    ("apache", "ab", 5158),                  # Complete requests:      5158
    ("nginx", "wrk", 33940),                 # 33940 requests in 15.07s
    ("memcached", "memcaslap", 107659),      # Run time: 15.1s Ops: 107659 TPS: 7148
    ("mysql", "read_write", 337),            # transactions:  337    (33.27 per sec.)
    ("postgresql", "tpcb_like", 160),        # number of transactions actually processed: 160/160 (-t 20, 8 clients)
    ("rocksdb", "db_bench", 363218),         # 100000 operations x 3 + readseq 63218 operations
    ("leveldb", "leveldb_bench", 363168),    # 100000 x 3 + 63168
    ("redis", "bench", 200000),              # -n 100000 for each of SET and GET (the CSV has no count)
    ("micro", "fork", 480),                  # fork  480 bogo ops (--fork-ops 480)
    ("micro", "tcp-4", 112),                 # sock  112 bogo ops (--sock-ops 112 over 4 instances)
]


def test_hand_counted_operations() -> None:
    a = agent()
    for name, step_name, value in HAND_COUNTED:
        step, path = next((s, p) for s, n, p in recorded_steps(name) if n == step_name)
        text = path.read_text()
        parts, _ = a.parse_step(text, step)
        params = dict(workloads.load(name).params, each=step_name.rsplit("-", 1)[-1])
        assert a.op_count(text, step, parts, params) == value, (name, step_name)


def test_time_based_step_without_count_is_estimated() -> None:
    """A step with neither `ops` nor `ops_per_part` has no exact count: the agent estimates it."""
    a = agent()
    step = contract.Step(name="x", argv=("true",), metric=r"^rate (?P<value>[0-9.]+)")
    assert a.op_count("rate 10\n", step, {"": 10.0}, {}) is None
    assert a.op_count("nothing", replace(step, ops=r"^n (?P<value>[0-9]+)"), {"": 10.0}, {}) is None


GUEST = "".join(f"CONFIG_{o}=y\n" for o in workloads.GUEST_BUILTIN)


def test_kernel_config_requirements(tmp_path: Path) -> None:
    pg = workloads.load("postgresql")
    (tmp_path / ".config").write_text(GUEST + "CONFIG_64BIT=y\n# CONFIG_SYSVIPC is not set\n")
    with pytest.raises(UserError, match="needs CONFIG_SYSVIPC=y"):
        workloads.check_kernel([pg], tmp_path)
    (tmp_path / ".config").write_text(GUEST + "CONFIG_64BIT=y\nCONFIG_SYSVIPC=y\n")
    workloads.check_kernel([pg], tmp_path)


def test_a_kernel_without_built_in_9p_is_refused_before_a_boot(tmp_path: Path) -> None:
    """Debian's cloud config has no 9p, its amd64 config builds it as a module: virtme-ng's guest could not mount its root."""
    (tmp_path / ".config").write_text(GUEST.replace("CONFIG_9P_FS=y", "CONFIG_9P_FS=m").replace("CONFIG_NET_9P_VIRTIO=y\n", ""))
    with pytest.raises(UserError) as e:
        workloads.check_kernel([workloads.load("redis")], tmp_path)
    assert "needs CONFIG_NET_9P_VIRTIO=y CONFIG_9P_FS=y" in str(e.value) and "--fragment" in (e.value.hint or "")


def test_failed_generator_output_is_no_metric() -> None:
    a = agent()
    step = workloads.load("redis").load[0]
    parts, _ = a.parse_step("Could not connect to Redis at 127.0.0.1:6379: Connection refused\n", step)
    assert parts == {}


def test_missing_package_is_named() -> None:
    from kpgo.workloads import install

    wl = workloads.load("redis")
    assert install.missing_packages([wl]) == {}  # setup installed them
    wl = replace(wl, packages=("redis-server", "kpgo-no-such-package"))
    with pytest.raises(UserError) as e:
        install.require([wl])
    assert "redis needs kpgo-no-such-package" in str(e.value) and "kpgo workloads install redis" in str(e.value)


def test_leveldb_bench_is_built_and_runs(tmp_path: Path) -> None:
    """kpgo's own LevelDB benchmark, built against the real library, writes what the metric regex reads."""
    import subprocess

    from kpgo.workloads import install

    wl = workloads.load("leveldb")
    install.build_tools([wl])
    exe = install.tools_dir() / "leveldb-bench"
    out = subprocess.run([str(exe), f"--db={tmp_path / 'db'}", "--num=2000"], capture_output=True, text=True, check=True).stdout
    parts, secondary = agent().parse_step(out, wl.load[0])
    assert set(parts) == {"fillseq", "fillrandom", "readrandom", "readseq"} and all(v > 0 for v in parts.values())
    bad = subprocess.run([str(exe), f"--db={tmp_path / 'db'}", "--benchmarks=nosuch"], capture_output=True, text=True)
    assert bad.returncode == 1 and "unknown benchmark" in bad.stderr


def test_cli_list_and_install_are_idempotent() -> None:
    from conftest import kpgo

    res = kpgo("workloads", "list")
    assert res.returncode == 0
    for name in ALL:
        assert f"{name}  —  " in res.stdout
    assert res.stdout.count("[ready]") == len(ALL)  # setup installed every workload's packages
    assert "port=6379" in res.stdout and "real hardware:" in res.stdout
    again = kpgo("workloads", "install", "redis,leveldb")
    assert again.returncode == 0 and "all Debian packages present" in again.stderr and "building" not in again.stderr


def test_guest_steps_get_a_private_writable_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every guest step runs with HOME and TMPDIR on the run's tmpfs (the guest's root is the host's,
    read-only): a tool that writes into $HOME works on a fresh machine."""
    import os
    import subprocess

    a = agent()
    for key in ("HOME", "TMPDIR", "XDG_CONFIG_HOME"):
        monkeypatch.setenv(key, "/nonexistent-read-only")
    env = a.private_home(str(tmp_path))
    assert os.environ["HOME"] == env["HOME"] and os.environ["TMPDIR"] == env["TMPDIR"]
    assert "XDG_CONFIG_HOME" not in os.environ
    for path in env.values():
        assert Path(path).resolve().is_relative_to(tmp_path.resolve())
    cp = subprocess.run(["sh", "-c", 'echo x > "$HOME/.toolrc" && mktemp'], capture_output=True, text=True)
    assert cp.returncode == 0, cp.stderr
    assert (Path(env["HOME"]) / ".toolrc").read_text() == "x\n"
    assert Path(cp.stdout.strip()).parent == Path(env["TMPDIR"])


def test_memcaslap_gets_its_config_file() -> None:
    """memcaslap writes a default config into its user's passwd home unless given one (-F): the workload
    ships memcaslap's own defaults (set and get weighted 1:9, the mix a parameter) and passes them to every memcaslap
    step."""
    from kpgo.guest.agent import fill

    wl = workloads.load("memcached")
    [cnf] = [f for f in wl.files if f.path == "memslap.cnf"]
    text = fill(cnf.text, {**wl.params, "rundir": "/r"})
    assert text.split() == ["key", "64", "64", "1", "value", "1024", "1024", "1", "cmd", "0", "1", "1", "9"]
    assert fill(cnf.text, {**wl.params, "set_weight": 81}).split()[-3:] == ["81", "1", "9"]
    for step in wl.warmup + wl.load:
        assert step.argv[0] == "memcaslap" and "-F" in step.argv and step.argv[step.argv.index("-F") + 1] == "{rundir}/memslap.cnf"
