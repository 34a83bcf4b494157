"""Hosts for the failover tests (docs/failover.md): each host is a network
namespace with one veth to a bridge of the test's own (in the root
namespace, with an address, so the test process reaches every host as a
client would); etcd runs in hosts of its own.  A host can be cut off
(its veth down), made lossy (nftables) and killed (SIGKILL to every process
in its namespace: the machine dies).  Names are unique per test and
everything is removed at close(), also after a failure.  No traffic
leaves the machine: the bridge has no uplink and no route is added."""

import contextlib
import itertools
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from conftest import BUILD

REKINDLE = BUILD / "bin" / "rekindle"
RKV = BUILD / "examples" / "rkv"
ETCD_PORT = 2379
REPL_PORT = 7400
SERVE_PORT = 6379
_seq = itertools.count()


def sh(*cmd, check=True):
    return subprocess.run(list(map(str, cmd)), capture_output=True, text=True, check=check, timeout=30)


def _free_subnet():
    used = sh("ip", "-o", "-4", "addr").stdout
    for k in range(10, 250):
        if f"10.77.{k}." not in used:
            return f"10.77.{k}"
    raise RuntimeError("no free 10.77.k.0/24 subnet for the test bridge")


class Host:
    def __init__(self, net, index, name):
        self.net, self.index, self.name = net, index, name
        self.ns = f"{net.tag}{name}"
        self.ip = f"{net.subnet}.{index}"
        self.veth = f"{net.tag}{name}"[:15]  # root side
        self.procs = []

    def popen(self, cmd, log, env=None):
        full = dict(os.environ)
        for k in ("REKINDLE_MANIFEST_FD", "LISTEN_FDS", "LISTEN_PID", "NOTIFY_SOCKET"):
            full.pop(k, None)
        full.update(env or {})
        out = open(log, "ab")  # noqa: SIM115 - the child keeps it; closed with the test
        p = subprocess.Popen(
            ["ip", "netns", "exec", self.ns, *map(str, cmd)],
            stdout=out, stderr=subprocess.STDOUT, env=full, start_new_session=True,
        )  # fmt: skip
        out.close()
        self.procs.append(p)
        return p

    def pids(self):
        r = sh("ip", "netns", "pids", self.ns, check=False)
        return [int(x) for x in r.stdout.split()]

    def kill(self):
        """The machine dies: SIGKILL to every process in the namespace, at once."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        self.procs = []

    def isolate(self):
        """Cut the host off the network (its link to the bridge goes down)."""
        sh("ip", "link", "set", self.veth, "down")

    def heal(self):
        sh("ip", "link", "set", self.veth, "up")

    def block(self, other):
        """Partition this host from `other` only (both directions): a
        blackhole route to the other's address in each namespace."""
        for a, b in ((self, other), (other, self)):
            sh("ip", "netns", "exec", a.ns, "ip", "route", "add", "blackhole", f"{b.ip}/32")

    def unblock(self, other):
        for a, b in ((self, other), (other, self)):
            sh("ip", "netns", "exec", a.ns, "ip", "route", "del", "blackhole", f"{b.ip}/32", check=False)

    def lose(self, percent):
        """Drop `percent`% of the packets this host sends and of those it
        receives, at random (nftables in its namespace: this kernel has no
        tc netem).  Replaces an earlier loss."""
        self.restore()
        ns = ["ip", "netns", "exec", self.ns, "nft"]
        sh(*ns, "add", "table", "inet", "rkloss")
        for chain, hook in (("in", "input"), ("out", "output")):
            sh(*ns, "add", "chain", "inet", "rkloss", chain, f"{{ type filter hook {hook} priority 0; }}")
            sh(
                *ns,
                "add",
                "rule",
                "inet",
                "rkloss",
                chain,
                "numgen",
                "random",
                "mod",
                "100",
                "<",
                str(percent),
                "drop",
            )

    def restore(self):
        """No loss (undoes lose())."""
        sh("ip", "netns", "exec", self.ns, "nft", "delete", "table", "inet", "rkloss", check=False)


class Net:
    """The test's hosts and its bridge; close() removes everything."""

    def __init__(self, tmp_path):
        self.tmp = Path(tmp_path)
        self.tag = f"rk{os.getpid() % 1000:03d}{next(_seq) % 100:02d}"
        self.bridge = f"{self.tag}br"
        self.subnet = _free_subnet()
        self.hosts = {}
        # A fixed address: a bridge otherwise takes the lowest of its ports'
        # and changes it when a host is added, and the hosts' ARP entries for
        # the test process then point nowhere for seconds (TCP stalls).
        k = int(self.subnet.rsplit(".", 1)[1])
        sh("ip", "link", "add", self.bridge, "address", f"02:72:6b:77:{k:02x}:fe", "type", "bridge")
        sh("ip", "addr", "add", f"{self.subnet}.254/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")

    def host(self, name):
        h = Host(self, len(self.hosts) + 1, name)
        peer = f"{self.tag}{name}p"[:15]
        try:
            sh("ip", "netns", "add", h.ns)
            sh("ip", "link", "add", h.veth, "type", "veth", "peer", "name", peer)
            sh("ip", "link", "set", peer, "netns", h.ns)
            sh("ip", "link", "set", h.veth, "master", self.bridge, "up")
            ns = ["ip", "netns", "exec", h.ns]
            sh(*ns, "ip", "addr", "add", f"{h.ip}/24", "dev", peer)
            sh(*ns, "ip", "link", "set", peer, "up")
            sh(*ns, "ip", "link", "set", "lo", "up")
        finally:
            self.hosts[name] = h  # removed at close() even half made
        return h

    def close(self):
        for h in self.hosts.values():
            h.kill()
            sh("ip", "link", "del", h.veth, check=False)
            sh("ip", "netns", "del", h.ns, check=False)
        sh("ip", "link", "del", self.bridge, check=False)


def _start_etcd(host, log, data_dir, initial_cluster):
    ip = host.ip
    url = f"http://{ip}:{ETCD_PORT}"
    host.popen([
        "etcd", "--name", host.name, "--data-dir", data_dir,
        "--listen-client-urls", url, "--advertise-client-urls", url,
        "--listen-peer-urls", f"http://{ip}:2380", "--initial-advertise-peer-urls", f"http://{ip}:2380",
        "--initial-cluster", initial_cluster, "--initial-cluster-state", "new",
        "--heartbeat-interval", "50", "--election-timeout", "500",
    ], log)  # fmt: skip
    return url


def _wait_etcd_healthy(url, log):
    deadline = time.monotonic() + 20
    while True:
        r = sh("etcdctl", "--endpoints", url, "--dial-timeout", "1s", "endpoint", "health", check=False)
        if r.returncode == 0:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"etcd did not become healthy: {r.stderr}\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


class Etcd:
    """One etcd member (etcd-server 3.4) on its own host, short election
    timeout so that a 1-2 s lease is allowed."""

    def __init__(self, net, host):
        self.host = host
        self.dir = net.tmp / f"etcd-{host.name}"
        self.log = net.tmp / f"etcd-{host.name}.log"
        self.url = _start_etcd(host, self.log, self.dir, f"{host.name}=http://{host.ip}:2380")
        _wait_etcd_healthy(self.url, self.log)

    def get(self, key):
        r = sh("etcdctl", "--endpoints", self.url, "get", key, "--print-value-only", check=False)
        return r.stdout.strip() or None


class EtcdCluster:
    """Three etcd members, each on a host of its own; `url` lists every
    member's client URL (comma-separated, as --cluster takes them)."""

    def __init__(self, net, names=("e1", "e2", "e3")):
        self.hosts = {n: net.host(n) for n in names}
        initial = ",".join(f"{h.name}=http://{h.ip}:2380" for h in self.hosts.values())
        self.urls = {}
        logs = {}
        for n, h in self.hosts.items():
            logs[n] = net.tmp / f"etcd-{n}.log"
            self.urls[n] = _start_etcd(h, logs[n], net.tmp / f"etcd-{n}", initial)
        for n in names:  # each waits for a quorum: started together, then checked
            _wait_etcd_healthy(self.urls[n], logs[n])
        self.url = ",".join(self.urls.values())

    def leader(self):
        """The name of the member that leads etcd now."""
        r = sh("etcdctl", "--endpoints", self.url, "endpoint", "status", "-w", "json")
        for st in json.loads(r.stdout):
            s = st["Status"]
            if s["header"]["member_id"] == s["leader"]:
                return next(n for n, u in self.urls.items() if u == st["Endpoint"])
        raise AssertionError(f"no etcd member leads: {r.stdout}")

    def get(self, key):
        r = sh("etcdctl", "--endpoints", self.url, "get", key, "--print-value-only", check=False)
        return r.stdout.strip() or None


class Node:
    """`rekindle run --cluster` with rkv on one host."""

    def __init__(self, net, host, etcd, node_id, *, replication="sync", durability="sync",
                 lease_ttl=2, snapshot_interval="0", clock_offset_s=0, extra=()):  # fmt: skip
        self.host, self.id, self.etcd = host, node_id, etcd
        self.dir = net.tmp / node_id
        self.dir.mkdir(exist_ok=True)
        self.store = self.dir / "snaps"
        self.events_path = self.dir / "events.jsonl"
        self.log = self.dir / "node.log"
        self.port = SERVE_PORT
        # A time namespace: this host's CLOCK_MONOTONIC (and every t_ns it
        # logs) is ahead of the others' by clock_offset_s.
        self.clock_offset_ns = clock_offset_s * 1_000_000_000
        timens = ["unshare", "--time", "--monotonic", clock_offset_s, "--boottime", clock_offset_s]
        self.cmd = [*(timens if clock_offset_s else []),
            REKINDLE, "run", "--name", "rkv", "--events", self.events_path,
            "--cluster", etcd.url, "--node", node_id, "--cluster-addr", f"{host.ip}:{REPL_PORT}",
            "--cluster-name", "rkv", "--replication", replication, "--lease-ttl", lease_ttl,
            "--snapshot-dir", self.store, "--snapshot-interval", snapshot_interval,
            "--listen", f"{host.ip}:{SERVE_PORT}", *extra,
            "--", RKV, "--port", SERVE_PORT, "--dir", self.dir, "--durability", durability,
        ]  # fmt: skip
        self.start()

    def start(self):
        self.proc = self.host.popen(self.cmd, self.log, env={"REKINDLE_RUNTIME_DIR": str(self.dir / "run")})

    def events(self, kind=None):
        if not self.events_path.exists():
            return []
        out = []
        for line in self.events_path.read_text().splitlines():
            try:
                e = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line being written
            if kind is None or e.get("supervisor") == kind:
                out.append(e)
        return out

    def wait_event(self, kind, pred=lambda e: True, timeout=20.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in self.events(kind):
                if pred(e):
                    return e
            if self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise AssertionError(
            f"{self.id}: no {kind!r} event; events:\n"
            + "\n".join(json.dumps(e) for e in self.events()[-30:])
            + f"\nlog:\n{self.log.read_text()[-3000:] if self.log.exists() else ''}"
        )

    def client(self, timeout=5):
        return redis.Redis(host=self.host.ip, port=self.port, socket_timeout=timeout,
                           socket_connect_timeout=1, retry=Retry(NoBackoff(), 0))  # fmt: skip


def cluster_status(etcd, name="rkv"):
    r = sh(REKINDLE, "cluster", "status", "--cluster", etcd.url, name, "--json", check=False)
    assert r.returncode == 0, r.stdout + r.stderr
    return json.loads(r.stdout)


# ---- a sync cluster under load (test_early_takeover.py, test_insync.py)


def leader_lease(etcd):
    """The lease (decimal id) the leader key is attached to."""
    r = sh("etcdctl", "--endpoints", etcd.url, "get", "/rekindle/rkv/leader", "-w", "json")
    kvs = json.loads(r.stdout).get("kvs") or []
    assert kvs, "no leader key"
    return int(kvs[0]["lease"])


def lease_ttl_left(etcd, lease):
    """etcd's remaining TTL of a lease in seconds; -1 once it is gone."""
    r = sh("etcdctl", "--endpoints", etcd.url, "lease", "timetolive", format(lease, "x"), "-w", "json")
    return int(json.loads(r.stdout)["ttl"])


def writers(node, hist, stop, n=3, per_writer=3000, seconds=30, prefix="w"):
    """Each writer SETs <prefix><t>:<i> on its own connection to `node`
    until an error (the connection's server is gone), stop, or its bounds."""
    addr = f"{node.host.ip}:{node.port}"

    def run(t):
        c = node.client(timeout=5)
        deadline = time.monotonic() + seconds
        for i in range(per_writer):
            if stop.is_set() or time.monotonic() > deadline:
                return
            if not hist.write(f"{prefix}{t}", c, f"{prefix}{t}:{i}", str(i), addr=addr):
                return

    threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in range(n)]
    for th in threads:
        th.start()
    return threads


def wait_acks(hist, n, timeout=30):
    deadline = time.monotonic() + timeout
    while hist.count() < n:
        assert time.monotonic() < deadline, f"only {hist.count()} acknowledgements"
        time.sleep(0.01)


def insync(etcd):
    """The in-sync set etcd holds ({"epoch", "standbys", "primary"}), or None."""
    v = etcd.get("/rekindle/rkv/insync")
    return json.loads(v) if v else None


def wait_insync(etcd, pred, timeout=30):
    deadline = time.monotonic() + timeout
    while True:
        s = insync(etcd)
        if s is not None and pred(s):
            return s
        assert time.monotonic() < deadline, f"in-sync set never matched: {s}"
        time.sleep(0.05)
