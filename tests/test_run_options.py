"""The run request is one typed value: what `kpgo run` was asked is kept in run.json and read back exactly,
so `kpgo study` extends a run as it was started (no argparse namespace saved and re-parsed)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import MICRO_OPS
from kpgo import bench, pipeline, variants, vm
from kpgo.cli import make_parser
from kpgo.commands import run as run_cmd
from kpgo.errors import UserError
from kpgo.kernel import kconfig
from kpgo.kernel.source import KernelSource

DATA = Path(__file__).parent / "data" / "report"


def options(*argv: str) -> pipeline.RunOptions:
    return run_cmd.options_from(make_parser().parse_args(["run", *argv]))


def test_round_trip_through_json(tmp_path: Path) -> None:
    opts = options("--base", "tiny", "--workload", "redis,micro", "--set", "redis.requests=30000", "--boots", "2", "--seed", "7",
                   "--sim-opt", "boot=on", "--cpus", "1", "--client", "host", "--study", "cross", "--partial-training",
                   "--dir", str(tmp_path / "r"))
    again = pipeline.RunOptions.from_json(json.loads(json.dumps(opts.to_json())), tmp_path / "r")
    assert again == opts
    assert [w.name for w in again.workloads] == ["redis", "micro"] and again.workloads[0].params["requests"] == 30000
    assert again.workloads[0].client == "host" and again.sim.mode == "auto" and again.sim.config.boot
    assert again.design == bench.Design(2, 1, "random", 7) and again.guest == vm.Guest(1, "2G", 900.0)


def test_builds_with_a_profile_use_partial_training_by_default(tmp_path: Path) -> None:
    """Every build of a run that takes a profile gets -fprofile-partial-training (docs/COMPILERS.md "Partial training
    by default"), a variant that decides for itself (pgo-no-pt) keeps its choice; --no-partial-training is GCC's default."""
    src = KernelSource(tmp_path / "linux", "6.12.0", "x")
    spec = kconfig.resolve("tiny", None, [])

    def kcflags(opts: pipeline.RunOptions, variant: str) -> tuple[str, ...]:
        return opts.builder(spec, src).request(variant, variant, tmp_path / "prof" if variants.get(variant).profile else None).kcflags

    on, off = options("--workload", "redis"), options("--workload", "redis", "--no-partial-training")
    assert on.partial_training and on.to_json()["partial_training"] is True and not off.partial_training
    assert kcflags(on, "optimized") == kcflags(on, "pgo-o3") == variants.PARTIAL_TRAINING_FLAGS
    assert kcflags(on, "vanilla") == kcflags(on, "pgo-no-pt") == kcflags(off, "optimized") == kcflags(off, "pgo-o3") == ()


def recorded_request() -> dict:
    """The request of a recorded run (tests/data/report/tiny-cross-sim). It was made when micro ran each step for a
    time (--set micro.seconds=1); micro runs fixed counts now, so its --set names today's parameters instead."""
    req = json.loads((DATA / "tiny-cross-sim" / "run.json").read_text())["request"]
    return req | {"set": [o for s in req["set"] for o in ([f"micro.{m}" for m in MICRO_OPS] if s == "micro.seconds=1" else [s])]}


def test_a_request_with_micro_seconds_is_refused_in_one_line() -> None:
    """A run made with the time-based micro measured another workload: `kpgo study` cannot extend it."""
    req = json.loads((DATA / "tiny-cross-sim" / "run.json").read_text())["request"]
    with pytest.raises(UserError) as e:
        pipeline.RunOptions.from_json(req, Path("/r"))
    assert "--set micro.seconds=1: seconds is not a parameter of micro" in e.value.message


def test_reads_the_request_of_an_earlier_kpgo() -> None:
    """run.json files written before the request was typed (no client, no partial_training) read back, and
    write the same keys again."""
    old = recorded_request()
    opts = pipeline.RunOptions.from_json(old, Path("/r"))
    assert opts.client == "guest" and not opts.partial_training and opts.sim_mode == "on" and opts.studies == ("cross",)
    assert opts.to_json() == old | {"client": "guest", "partial_training": False}


def test_network_servers_are_driven_from_the_host_by_default() -> None:
    """No --client: the network servers' load generators run on the host (docs/WORKLOADS.md "Which placement");
    micro has no client. --client guest keeps them in the guest."""
    by_default = options("--base", "tiny", "--workload", "redis,micro,mysql")
    assert by_default.client == "host" and by_default.to_json()["client"] == "host"
    assert [w.client for w in by_default.workloads] == ["host", "guest", "host"]
    assert [w.client for w in options("--workload", "redis", "--client", "guest").workloads] == ["guest"]


def test_default_run_dir_names_the_workloads_once() -> None:
    assert options("--base", "tiny", "--workload", "redis, micro,redis").run_dir == Path("kpgo-runs/tiny-redis-micro")
    assert options("--workload", "all").run_dir == Path("kpgo-runs/server-all")


@pytest.mark.parametrize("change, needle", [
    ({"study": ["cross"], "workload": "redis", "set": []}, "needs two or more workloads"),
    ({"sim_opt": ["bogus=1"]}, "bogus=1"),
    ({"boots": None}, "request.boots is null, expected an integer"),
    ({"workload": "nosuch"}, "unknown workload"),
])
def test_a_damaged_request_is_refused_in_one_line(change: dict, needle: str) -> None:
    req = recorded_request() | change
    with pytest.raises(UserError) as e:
        pipeline.RunOptions.from_json(req, Path("/r"))
    assert needle in e.value.message


def test_extending_adds_the_study_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`kpgo study NAME RUN` runs the run's request with NAME added after the studies it has, once: what the command
    hands the run (its own code, run.execute stubbed), not a copy of its expression."""
    from kpgo import study
    from kpgo.commands import study as study_cmd

    recorded = options("--base", "tiny", "--workload", "redis,micro", "--study", "cross", "--dir", str(tmp_path))
    handed: list[pipeline.RunOptions] = []

    def run_options(run_dir: Path) -> pipeline.RunOptions:
        assert run_dir == tmp_path
        return recorded

    def execute(opts: pipeline.RunOptions, cluster: object) -> int:
        handed.append(opts)
        return 0

    monkeypatch.setattr(study, "run_options", run_options)
    monkeypatch.setattr(run_cmd, "execute", execute)

    def extend(name: str) -> pipeline.RunOptions:
        args = make_parser().parse_args(["study", name, str(tmp_path)])
        assert args.func is study_cmd.extend_run and study_cmd.extend_run(args) == 0
        return handed.pop()

    more = extend("universal")
    assert more == replace(recorded, studies=("cross", "universal"))  # nothing else of the request changes
    assert more.studies == ("cross", "universal") and more.to_json()["study"] == ["cross", "universal"]
    assert extend("cross") == recorded  # a study the run has: once, where it was
    recorded = more
    assert extend("cross").studies == ("cross", "universal") and extend("variability").studies == ("cross", "universal", "variability")


def test_every_study_of_a_run_is_a_choice_and_round_trips(tmp_path: Path) -> None:
    """The run's studies (pipeline.STUDIES) are what `kpgo run --study` and `kpgo study` offer, and a run asked for all
    of them reads back as it was asked."""
    parser = make_parser()
    for name in pipeline.STUDIES:
        assert parser.parse_args(["study", name, str(tmp_path)]).study_name == name
    opts = options("--base", "tiny", "--workload", "redis,micro", *(a for s in pipeline.STUDIES for a in ("--study", s)), "--dir", str(tmp_path))
    assert opts.studies == pipeline.STUDIES
    assert pipeline.RunOptions.from_json(json.loads(json.dumps(opts.to_json())), tmp_path) == opts
    with pytest.raises(SystemExit):
        make_parser().parse_args(["run", "--study", "nosuch"])


def test_a_share_experiment_has_a_directory_of_its_own(tmp_path: Path) -> None:
    from kpgo import study

    assert study.share_dir(tmp_path, [], None, None) == tmp_path / "studies" / "share"
    assert study.share_dir(tmp_path, [], "concurrency=1,32", None) == tmp_path / "studies" / "share-concurrency"
    assert study.share_dir(tmp_path, ["memcached.concurrency=1"], None, 4) == tmp_path / "studies" / "share-concurrency-1_4cpus"
    assert study.share_dir(tmp_path, ["a=x/y"], None, None) == tmp_path / "studies" / "share-a-x_y"
