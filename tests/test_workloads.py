"""Workload data files and the guest agent's metric parsing on recorded generator output."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from kpgo import workloads
from kpgo.errors import UserError

AGENT = Path(__file__).resolve().parent.parent / "src" / "kpgo" / "guest" / "agent.py"

# recorded from redis-benchmark 7.0 --csv in a tiny TCG guest
REDIS_CSV = '''"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
"SET","6548.79","4.775","0.768","4.527","7.095","9.263","22.095"
"GET","7102.27","4.402","0.720","4.191","6.519","8.439","14.863"
'''


def agent():  # the agent is a stand-alone script (it runs inside the guest), so load it by path
    spec = importlib.util.spec_from_file_location("kpgo_agent", AGENT)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_redis_spec_and_overrides() -> None:
    wl = workloads.load("redis", ["requests=1000", "clients=8"])
    assert wl["params"]["requests"] == 1000 and wl["params"]["clients"] == 8
    assert wl["unit"] == "requests/s" and wl["higher_is_better"]
    with pytest.raises(UserError):
        workloads.load("redis", ["nosuch=1"])


def test_redis_metric_is_harmonic_mean() -> None:
    wl = workloads.load("redis")
    value, parts = agent().parse_metric(REDIS_CSV, wl["metric"])
    assert parts == {"SET": 6548.79, "GET": 7102.27}
    assert value == pytest.approx(2 / (1 / 6548.79 + 1 / 7102.27))


def test_metric_missing_is_an_error() -> None:
    a = agent()
    with pytest.raises(a.Failure):
        a.parse_metric("ERROR: connection refused\n", workloads.load("redis")["metric"])


def test_argv_templates_fill() -> None:
    wl = workloads.load("redis")
    argv = agent().fill(wl["load"]["argv"], dict(wl["params"], rundir="/x"))
    assert "-n" in argv and argv[argv.index("-n") + 1] == "20000"
