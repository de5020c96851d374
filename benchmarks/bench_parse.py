"""Micro-benchmark: what nats-py's protocol parser alone costs per frame on member-job traffic.

Feeds nats-py's ``Parser`` the frames a member job receives, in 64 KiB reads: for each
message one ``HMSG`` delivery (``Nats-Stream-Source`` and ``Nats-Pin-Id`` headers, a 200-byte
payload, an ack reply subject) and one empty ``MSG`` double-ack reply. ``_process_msg`` is a
no-op, so the figure is the parse alone. Compare with the job's time per message
(1 / its msg/s from bench_member_job.py) to see the parser's share.

    .venv/bin/python benchmarks/bench_parse.py [--messages 100000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from nats.protocol.parser import Parser


class _Sink:
    def __init__(self) -> None:
        self.frames = 0

    async def _process_msg(self, sid, subject, reply, data, headers) -> None:
        self.frames += 1


def member_job_frames(n: int, size: int = 200) -> bytes:
    out = []
    payload = b"x" * size
    for i in range(1, n + 1):
        hdr = b"NATS/1.0\r\nNats-Stream-Source: O %d $G\r\nNats-Pin-Id: 4Fh2kEXAMPLEpin0\r\n\r\n" % i
        reply = b"$JS.ACK.O-g.m1.1.%d.%d.1795300000000000000.%d" % (i, i, n - i)
        out.append(b"HMSG _INBOX.q8Zk2.P.7 5 %b %d %d\r\n%b%b\r\n" % (reply, len(hdr), len(hdr) + size, hdr, payload))
        out.append(b"MSG _INBOX.q8Zk2.A.3.%d 6 0\r\n\r\n" % i)
    return b"".join(out)


async def parse_all(data: bytes, read: int = 65536) -> tuple[float, int]:
    sink = _Sink()
    parser = Parser(sink)
    started = time.perf_counter()
    for i in range(0, len(data), read):
        await parser.parse(data[i : i + read])
    return time.perf_counter() - started, sink.frames


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=100_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    data = member_job_frames(args.messages)
    per_frame = []
    for _ in range(args.rounds):
        seconds, frames = asyncio.run(parse_all(data))
        if frames != 2 * args.messages:
            raise SystemExit(f"parsed {frames} frames, expected {2 * args.messages}")
        per_frame.append(seconds / frames * 1e6)
    med = statistics.median(per_frame)
    print(f"nats-py parser: {args.messages:,} messages = {2 * args.messages:,} frames, {args.rounds} rounds")
    print(f"  per frame: median {med:.2f} us (min {min(per_frame):.2f}, max {max(per_frame):.2f})")
    print(f"  per message (delivery + ack reply): {2 * med:.2f} us -> parse alone caps at {1e6 / (2 * med):,.0f} msg/s")


if __name__ == "__main__":
    main()
