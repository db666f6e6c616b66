"""kpgo's agent inside the guest (stdlib only; runs under the guest kernel over the host's root).

It reads its job (job.json in the shared run directory, a contract.Job carrying a contract.Workload)
and runs the workload on a fresh tmpfs: files, setup steps, the server (until its TCP port accepts),
prepare and warm-up steps, then (collect mode) resets the kernel's gcov counters, runs the measured
load steps and parses their output, (collect mode) snapshots every .gcda into one tar, and writes
result.json (a contract.Result, with the phase and the error on any exception). With simulated
counters (the job's `sim`), each measured run is one window of kpgo's QEMU plugin (kpgo-window).
One process reads all the .gcda files: under TCG each process spawn costs ~0.3 s and each file
written over 9p costs more, so a per-file loop would take minutes.

Usage: python3 agent.py JOB.json      (exit 0 on success; result.json holds the details)"""

import importlib.util
import io
import json
import math
import os
import re
import socket
import struct
import subprocess
import sys
import tarfile
import tempfile
import time
import traceback


def _load_contract():
    """contract.py beside this file: the Job and Result classes the host shares. Loaded by path, since in
    the guest this file runs as a plain script and kpgo is no package to import from there."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "contract.py")
    spec = importlib.util.spec_from_file_location("kpgo_guest_contract", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while they build a class
    spec.loader.exec_module(module)
    return module


contract = _load_contract()
GCOV_ROOT = "/sys/kernel/debug/gcov"
GCOV_VALUES = "/sys/kernel/debug/gcov_values"  # a value-profiled kernel's node pool (kpgo's kernel patch)
VULNERABILITIES = "/sys/devices/system/cpu/vulnerabilities"


class Failure(Exception):
    def __init__(self, message, output=""):
        super().__init__(message)
        self.output = output


_FIELD = re.compile(r"\{([a-z_][a-z0-9_]*)\}")


def fill(text, params):
    """Replace {name} by the parameter's value; other braces (nginx blocks, Lua) stay as they are."""
    return _FIELD.sub(lambda m: str(params[m[1]]) if m[1] in params else m[0], str(text))


def fill_all(argv, params):
    return [fill(a, params) for a in argv]


def expand(step, params):
    """One step, or one per value of the comma-separated parameter named by `each` ({each} bound)."""
    if step.each is None:
        return [(step.name, params)]
    values = [v.strip() for v in str(params[step.each]).split(",") if v.strip()]
    return [(f"{step.name}-{v}", dict(params, each=v)) for v in values]


def mount_rundir(data):
    """The run directory: its own tmpfs, so the workload's data never touches 9p, or with data "disk" the ext4 file
    system the host made on the guest's only disk (the root is the host's, over 9p: no other disk is attached)."""
    base = tempfile.mkdtemp(prefix="kpgo-")
    if data == "disk":
        disks = sorted(os.listdir("/sys/block"))
        disks = [d for d in disks if d.startswith(("vd", "sd"))]
        if len(disks) != 1:
            raise RuntimeError(f"the guest has {len(disks)} disks ({', '.join(disks) or 'none'}), not the one data disk")
        r = subprocess.run(["mount", "-t", "ext4", "-o", "noatime", "/dev/" + disks[0], base], capture_output=True, text=True)
        if r.returncode != 0:
            raise RuntimeError(f"cannot mount the data disk /dev/{disks[0]}: {(r.stderr or r.stdout).strip()}")
    else:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1g", "kpgo", base], check=False)
    os.chmod(base, 0o755)
    return base


def mounted_fs(path):
    """The file system type and source of the mount at `path` ("ext4 /dev/vda"), from /proc/mounts."""
    try:
        with open("/proc/mounts") as f:
            for line in f:
                source, target, fstype = line.split()[:3]
                if target == path:
                    return f"{fstype} {source}"
    except OSError:
        pass
    return None


def private_home(base):
    """A writable, private HOME and TMPDIR on the run's tmpfs for every step. The guest runs over the
    host's root read-only, and tools that write into $HOME or TMPDIR would fail there, or pass only
    because the host happens to have the file. (memcaslap writes its default config to its user's
    passwd home, which no environment changes: memcached.toml gives it one with -F.)"""
    env = {"HOME": os.path.join(base, ".kpgo-home"), "TMPDIR": os.path.join(base, ".kpgo-tmp")}
    for path in env.values():
        os.makedirs(path, mode=0o1777, exist_ok=True)
        os.chmod(path, 0o1777)  # steps run as other users too (fork+exec as nobody)
    for key in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR"):
        os.environ.pop(key, None)
    os.environ.update(env)
    return env


def ensure_debugfs():
    if not os.path.isdir(GCOV_ROOT):
        subprocess.run(["mount", "-t", "debugfs", "debugfs", "/sys/kernel/debug"], check=False)


def wait_tcp(addr, timeout, server):
    host, port = addr.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise Failure(f"server exited with status {server.returncode} before it was ready")
        try:
            with socket.create_connection((host, int(port)), timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise Failure(f"server not ready on {addr} within {timeout} s")


def run(argv, timeout, what, cwd=None):
    try:
        cp = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout, cwd=cwd)
    except FileNotFoundError:
        raise Failure(f"{what}: program {argv[0]} not found in the guest") from None
    except subprocess.TimeoutExpired as e:
        raise Failure(f"{what} did not finish within {timeout:.0f} s", _text(e.stdout)) from None
    if cp.returncode != 0:
        raise Failure(f"{what} failed with status {cp.returncode}", cp.stdout)
    return cp.stdout


def _text(out):
    return out.decode(errors="replace") if isinstance(out, bytes) else (out or "")


def tail(text, n=8):
    return "\n".join(text.strip().splitlines()[-n:])


_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3}


def parse_step(text, step):
    """The step's metric (one value per match; `name` group, if any, names the part) and its
    secondary figures (first match each; a `unit` group of us/ms/s converts to milliseconds)."""
    parts = {}
    for m in re.finditer(step.metric, text, re.M):
        key = m.groupdict().get("name") or ""
        parts[key] = float(m.group("value"))
    secondary = {}
    for key, rx in step.secondary.items():
        m = re.search(rx, text, re.M)
        if m:
            unit = m.groupdict().get("unit")
            secondary[key] = float(m.group("value")) * (_MS[unit] if unit else 1.0)
    return parts, secondary


def op_count(text, step, parts, params):
    """The step's exact operation count, or None: the sum of its `ops` regex's matches (the count the
    generator reports: wrk's requests, ab's complete requests, sysbench's and pgbench's transactions,
    memcaslap's ops, stress-ng's bogo ops, db_bench's operations), or `ops_per_part` (the fixed count a
    generator runs for each test it reports, e.g. redis-benchmark -n for each of -t set,get) times the
    number of parts parsed. Steps without either are time-based with no count in their output."""
    if step.ops:
        found = [float(m.group("value")) for m in re.finditer(step.ops, text, re.M)]
        return sum(found) if found else None
    if step.ops_per_part:
        return float(fill(step.ops_per_part, params)) * len(parts)
    return None


def aggregate(values, how):
    if how == "sum":
        return sum(values)
    if how == "mean":
        return sum(values) / len(values)
    if any(v <= 0 for v in values):
        return 0.0
    if how == "hmean":
        return len(values) / sum(1.0 / v for v in values)
    # geomean: the mean ratio over unlike operations, each weighing the same
    return math.exp(sum(math.log(v) for v in values) / len(values))


def cpu_ticks():
    """Guest CPU time so far (USER_HZ ticks): user (user+nice) and kernel (system+irq+softirq)."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    return {"user": v[0] + v[1], "kernel": v[2] + v[5] + v[6], "idle": v[3] + v[4]}


def measured_run(wl, params, i, outdir, server, window=None):
    """All load steps once: the primary value over the parts, secondary figures, the guest's
    kernel share of busy CPU time over the steps, and `ops`, the operation count that simulated
    counters are divided by (per-op figures, docs/SIM.md), with each step's own in `step_ops`.
    Each step's count is exact where the generator reports it or runs a fixed number (op_count);
    otherwise it is estimated as the step's wall seconds times the harmonic mean of its parts'
    rates, which is high by the generator's start-up and exit. `ops_method` says which: count,
    estimate, or mixed (steps of both kinds); `ops_estimate` is the time x rate figure for every
    step, for comparison.

    `window`: the guest's kpgo-window program; the simulator's window is open exactly around
    the load steps (warm-up and setup stay outside): one window per measured run, or with the
    workload's `windows = "step"` one per load step, in the order of `step_ops`."""
    parts, secondary, seconds, step_ops = {}, {}, {}, {}
    ops, ops_estimate, methods = 0.0, 0.0, set()
    per_step = bool(window) and wl.windows == "step"
    ticks = {"user": 0, "kernel": 0, "idle": 0}
    if window and not per_step:
        run([window, "open"], 60, "opening the simulator window")
    try:
        for step in wl.load:
            for name, p in expand(step, params):
                if per_step:
                    run([window, "open"], 60, f"opening the simulator window of load step {name}")
                try:
                    # CPU time summed over the steps only: per-step windows spawn kpgo-window between them
                    before = cpu_ticks()
                    t = time.monotonic()
                    out = run_step(step, name, p, "load")
                    took = time.monotonic() - t
                    after = cpu_ticks()
                finally:
                    if per_step:
                        run([window, "close"], 60, f"closing the simulator window of load step {name}")
                for k in ticks:
                    ticks[k] += after[k] - before[k]
                seconds[name] = round(took, 2)
                with open(os.path.join(outdir, f"load-{i}-{name}.txt"), "w") as f:
                    f.write(out)
                got, sec = parse_step(out, step)
                if not got:
                    raise Failure(f"load step {name}: no line of its output matches the metric regex", out)
                for key, value in got.items():
                    label = f"{name}.{key}" if key else name
                    if value <= 0:
                        raise Failure(f"load step {name} reported zero throughput ({label})", out)
                    parts[label] = value
                estimate = took * aggregate(list(got.values()), "hmean")
                count = op_count(out, step, got, p)
                if count is not None and count <= 0:
                    raise Failure(f"load step {name} reported {count:.0f} operations", out)
                step_ops[name] = round(estimate if count is None else count, 1)
                ops += estimate if count is None else count
                ops_estimate += estimate
                methods.add("estimate" if count is None else "count")
                secondary.update({f"{name}.{k}": v for k, v in sec.items()})
                if server is not None and server.poll() is not None:
                    raise Failure(f"the server exited with status {server.returncode} during load step {name}")
    finally:
        if window and not per_step:
            run([window, "close"], 60, "closing the simulator window")
    user, kernel = ticks["user"], ticks["kernel"]
    value = aggregate(list(parts.values()), wl.aggregate)
    return contract.Run(
        value=value,
        parts=parts,
        secondary=secondary,
        seconds=round(sum(seconds.values()), 2),
        step_seconds=seconds,
        ops=round(ops, 1),
        ops_method=methods.pop() if len(methods) == 1 else "mixed",
        ops_estimate=round(ops_estimate, 1),
        kernel_share=round(kernel / (user + kernel), 4) if user + kernel else None,
        cpu_ticks=dict(ticks),
        step_ops=step_ops,
    )


def gcov_reset():
    with open(os.path.join(GCOV_ROOT, "reset"), "w") as f:
        f.write("1")


def gcda_paths(root):
    """Every .gcda under root. Never follow or stat symlinks: the gcov tree links each .gcno
    to the build directory on the host, and a stat over 9p per link took 17-33 s in all."""
    found = []
    stack = [root]
    while stack:
        d = stack.pop()
        with os.scandir(d) as it:
            for e in it:
                if e.is_dir(follow_symlinks=False):
                    stack.append(e.path)
                elif e.name.endswith(".gcda") and not e.is_symlink():
                    found.append(e.path)
    return found


def read_all(path):
    # debugfs seq_files report size 0, so read until EOF
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = []
        while True:
            b = os.read(fd, 1 << 20)
            if not b:
                return b"".join(chunks)
            chunks.append(b)
    finally:
        os.close(fd)


def read_key_values(path):
    """A file of "name value" lines (debugfs gcov_values) as a dict of ints; None when the kernel has no such file."""
    try:
        with open(path) as f:
            return {k: int(v) for k, v in (line.split() for line in f if line.strip())}
    except OSError:
        return None


def kernel_build_id():
    """The running kernel's GNU build id, from its notes (/sys/kernel/notes), in hex: which vmlinux really booted
    (a BOLTed kernel has a build id of its own). None where the kernel exposes no notes."""
    try:
        with open("/sys/kernel/notes", "rb") as f:
            notes = f.read()
    except OSError:
        return None
    at = 0
    while at + 12 <= len(notes):
        namesz, descsz, kind = struct.unpack_from("<3I", notes, at)
        name_at = at + 12
        desc_at = name_at + (namesz + 3) // 4 * 4
        if kind == 3 and notes[name_at:name_at + namesz].rstrip(b"\0") == b"GNU":  # NT_GNU_BUILD_ID
            return notes[desc_at:desc_at + descsz].hex()
        at = desc_at + (descsz + 3) // 4 * 4
    return None


def mitigations():
    """What the guest kernel chose against each CPU vulnerability (retpolines and the like change what an indirect
    call costs, so they are recorded beside every figure)."""
    try:
        names = sorted(os.listdir(VULNERABILITIES))
    except OSError:
        return None
    state = {}
    for name in names:
        try:
            with open(os.path.join(VULNERABILITIES, name)) as f:
                state[name] = f.read().strip()
        except OSError:
            pass
    return state


def gcov_root(prefix):
    root = os.path.join(GCOV_ROOT, prefix.lstrip("/"))
    if not os.path.isdir(root):
        raise Failure(f"no gcov data for build directory {prefix} under {GCOV_ROOT} (is this the instrumented kernel?)")
    return root


def snapshot_order(prefix, timings):
    """The .gcda files in the order the snapshot reads them, found before the window (the walk of debugfs runs
    kernel code too). Opening a .gcda copies its counters, one kvmalloc per function and counter kind, and reading it
    runs seq_file, slab and VFS code: each file read counts in the files read after it (a tiny kernel's redis profile
    held 150,000 kvmalloc calls the workload never made, 5% of its counts; read in this order, 10,000 remain, as
    the branch records of the same workload on the same kernel count 413). First go the files a single read of
    themselves changes (the read path's own, and the busiest of the idle system), then the others two reads of the whole
    tree in a row change, then the rest, which no read changes."""
    root = gcov_root(prefix)
    t = time.monotonic()
    paths = gcda_paths(root)
    before = [read_all(p) for p in paths]
    moved = [p for p, a in zip(paths, before) if read_all(p) != a]
    own = [p for p in moved if read_all(p) != read_all(p)]
    first = set(own)
    changed = set(moved)
    order = own + [p for p in moved if p not in first] + [p for p in paths if p not in changed]
    timings["snapshot_order"] = round(time.monotonic() - t, 2)
    return order, [len(own), len(moved)]


def snapshot(prefix, paths, tar_path, timings):
    """The .gcda files `paths` (in this order), into one tar, named relative to the kernel build directory."""
    root = gcov_root(prefix)
    t = time.monotonic()
    data = [read_all(p) for p in paths]
    timings["snapshot_read"] = round(time.monotonic() - t, 2)
    now = int(time.time())
    with tarfile.open(tar_path, "w") as tf:
        for path, blob in zip(paths, data):
            info = tarfile.TarInfo(os.path.relpath(path, root))
            info.size = len(blob)
            info.mtime = now
            tf.addfile(info, io.BytesIO(blob))
    return len(paths), sum(len(b) for b in data)


class Control:
    """The control connection to the host client (the job's `client`: the load generator runs on the host,
    kpgo/client.py): the agent sends each client step's command line and gets its status and output."""

    def __init__(self, spec):
        self.rundir = spec.rundir  # the client's run dir on the host
        bring_up_network(spec.guest_addr, spec.gateway)
        server = socket.create_server((spec.guest_addr, spec.control_port))
        server.settimeout(120)
        print("kpgo-agent: control ready", flush=True)  # the host connects on this line
        try:
            conn, _ = server.accept()
        except socket.timeout:  # noqa: UP041 -- the guest's python3 may predate 3.10, where this is not yet TimeoutError
            raise Failure("the host client did not connect to the control port within 120 s") from None
        finally:
            server.close()
        conn.settimeout(None)
        self.file = conn.makefile("rw", encoding="utf-8", newline="\n")
        # The host speaks first (passt completes a forwarded connection's handshake with the guest
        # only when the host sends), and waits for the answer to know its connection reached the agent.
        line = self.file.readline()
        if not line or json.loads(line).get("op") != "hello":
            raise Failure("the host client's control connection did not start with its hello")
        self.file.write(json.dumps({"op": "hello"}) + "\n")
        self.file.flush()

    def call(self, msg):
        self.file.write(json.dumps(msg) + "\n")
        self.file.flush()
        line = self.file.readline()
        if not line:
            raise Failure("the host client closed the control connection")
        return json.loads(line)

    def run(self, argv, timeout, what):
        reply = self.call({"op": "run", "argv": argv, "timeout": timeout, "what": what})
        if reply.get("timed_out"):
            raise Failure(f"{what} (on the host) did not finish within {timeout:.0f} s", reply.get("output", ""))
        if reply["status"] != 0:
            raise Failure(f"{what} (on the host) failed with status {reply['status']}", reply.get("output", ""))
        return reply["output"]

    def close(self):
        try:
            self.file.write(json.dumps({"op": "bye"}) + "\n")
            self.file.flush()
        except OSError:
            pass


CONTROL = None  # set in main() when the job's client runs on the host


def bring_up_network(addr, gateway):
    """The virtio NIC on passt (kpgo/client.py): a fixed address, no DHCP, and a route to the gateway
    only, where the host's forwarded connections come from. passt learns the guest's MAC address
    from the guest's first frame, and until then cannot deliver a connection to it: one datagram to
    the gateway (which passt drops) sends that frame, an ARP request, and passt's ARP reply shows
    it arrived."""
    nics = sorted(n for n in os.listdir("/sys/class/net") if n != "lo")
    if not nics:
        raise Failure("the guest has no network device (the kernel needs CONFIG_VIRTIO_NET for --client host)")
    for argv in (["ip", "link", "set", "lo", "up"], ["ip", "addr", "add", f"{addr}/32", "dev", nics[0]], ["ip", "link", "set", nics[0], "up"],
                 ["ip", "route", "add", f"{gateway}/32", "dev", nics[0]]):
        run(argv, 30, "network setup")
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(b"kpgo", (gateway, 9))
    deadline = time.monotonic() + 60
    while not gateway_resolved(gateway):
        if time.monotonic() > deadline:
            raise Failure(f"the host's network (passt) did not answer the guest's ARP request for {gateway} within 60 s")
        time.sleep(0.1)


def gateway_resolved(gateway):
    """The ARP entry of `gateway` is complete (flags 0x2 in /proc/net/arp)."""
    with open("/proc/net/arp") as f:
        return any(ln.split()[0] == gateway and int(ln.split()[2], 16) & 0x2 for ln in list(f)[1:] if len(ln.split()) >= 3)


def run_step(step, name, params, what):
    """One (expanded) step in the run dir; its combined output. A client step runs on the host when
    the job says so, with the host's run dir in place of the guest's."""
    timeout = float(600 if step.timeout is None else step.timeout)
    if step.client and CONTROL is not None:
        return CONTROL.run(fill_all(step.argv, dict(params, rundir=CONTROL.rundir)), timeout, f"{what} step {name}")
    return run(fill_all(step.argv, params), timeout, f"{what} step {name}", cwd=params["rundir"])


def run_steps(steps, params, what):
    for step in steps:
        for name, p in expand(step, params):
            run_step(step, name, p, what)


def write_files(files, params):
    for f in files:
        path = os.path.join(params["rundir"], fill(f.path, params))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as out:
            out.write(fill(f.text, params))
        os.chmod(path, 0o644)  # a workload file has no mode of its own: plain readable data, whatever the umask


def start_server(server, params):
    log = open(os.path.join(params["rundir"], "server.log"), "w")
    try:
        return subprocess.Popen(fill_all(server.argv, params), stdout=log, stderr=subprocess.STDOUT, cwd=params["rundir"])
    except FileNotFoundError:
        raise Failure(f"server program {server.argv[0]} not found in the guest") from None


def main(job_path):
    global CONTROL
    print("kpgo-agent: started", flush=True)  # the host tells boot failures from workload failures by this line
    with open(job_path) as f:
        job = contract.Job.from_json(json.load(f))
    if job.sim_boot:
        # The simulator's first window has been open since power-on: the boot ends here.
        subprocess.run([os.path.join(job.tools_dir, "kpgo-window"), "close"], check=False)
    outdir = os.path.dirname(os.path.abspath(job_path))
    result = contract.Result(ok=False, mode=job.mode, kernel=os.uname().release)
    t0 = time.monotonic()
    server = None
    rundir = None
    phase = "setup"
    try:
        wl = job.workload
        result.mitigations = mitigations()
        result.build_id = kernel_build_id()
        rundir = mount_rundir(job.data)
        result.rundir_fs = mounted_fs(rundir)
        result.env = private_home(rundir)
        host_client = job.client is not None and job.client.where == "host"
        # {listen}: the servers' bind address; a host client arrives through the NIC, not loopback.
        params = dict(wl.params, rundir=rundir, tools=job.tools_dir, cpus=os.cpu_count() or 1,
                      listen="0.0.0.0" if host_client else "127.0.0.1")
        write_files(wl.files, params)
        run_steps(wl.setup, params, "setup")
        if wl.server is not None:
            phase = "server start"
            server = start_server(wl.server, params)
            wait_tcp(fill(wl.server.ready_tcp, params), float(60 if wl.server.ready_timeout is None else wl.server.ready_timeout), server)
        result.timings["ready"] = round(time.monotonic() - t0, 2)
        phase = "prepare"
        t = time.monotonic()
        run_steps(wl.prepare, params, "prepare")
        result.timings["prepare"] = round(time.monotonic() - t, 2)
        if host_client:
            phase = "host client"
            CONTROL = Control(job.client)
        phase = "warm-up"
        t = time.monotonic()
        run_steps(wl.warmup, params, "warm-up")
        result.timings["warmup"] = round(time.monotonic() - t, 2)
        if job.mode == "collect":
            ensure_debugfs()
            order, result.gcda_read_first = snapshot_order(job.build_dir, result.timings)
            gcov_reset()
        phase = "load"
        window = os.path.join(job.tools_dir, "kpgo-window") if job.sim else None
        for i in range(job.runs):
            result.runs.append(measured_run(wl, params, i, outdir, server, window))
        if job.mode == "collect":
            phase = "snapshot"
            t = time.monotonic()
            tar_tmp = os.path.join(rundir, "gcda.tar")
            n, nbytes = snapshot(job.build_dir, order, tar_tmp, result.timings)
            with open(tar_tmp, "rb") as src, open(os.path.join(outdir, "gcda.tar.partial"), "wb") as dst:
                while True:
                    chunk = src.read(1 << 20)
                    if not chunk:
                        break
                    dst.write(chunk)
            os.rename(os.path.join(outdir, "gcda.tar.partial"), os.path.join(outdir, "gcda.tar"))
            result.gcda_files = n
            result.gcda_bytes = nbytes
            result.gcov_values = read_key_values(GCOV_VALUES)
            result.timings["snapshot"] = round(time.monotonic() - t, 2)
        result.ok = True
    except Exception as e:
        # Whatever the exception, the host gets its phase and text in result.json. One the agent did not
        # foresee (not a Failure) is named by its type, its traceback is the output, and the console has it whole.
        if isinstance(e, Failure):
            result.error, output = str(e), e.output
        else:
            result.error, output = f"{type(e).__name__}: {e}", traceback.format_exc()
            print(output, file=sys.stderr, end="", flush=True)
        result.phase = phase
        result.output_tail = tail(output, 15)
        try:
            result.server_log_tail = tail(open(os.path.join(rundir, "server.log"), errors="replace").read(), 15)
        except Exception:
            pass
    finally:
        if CONTROL is not None:
            CONTROL.close()
        if server is not None and server.poll() is None:
            server.terminate()
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()
        result.timings["total"] = round(time.monotonic() - t0, 2)
        with open(os.path.join(outdir, "result.json.partial"), "w") as f:
            json.dump(result.to_json(), f, indent=2)
        os.rename(os.path.join(outdir, "result.json.partial"), os.path.join(outdir, "result.json"))
    print("kpgo-agent: " + ("ok" if result.ok else "error: " + (result.error or "")), flush=True)
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
