"""Which addresses the processes under this one listen on, read from /proc (Linux): a
background sampler for tests that assert servers bind only to loopback."""

from __future__ import annotations

import ipaddress
import os
import threading
from pathlib import Path


def descendants(root: int) -> set[int]:
    """``root``'s child processes, recursively."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    out, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in out:
                out.add(child)
                todo.append(child)
    return out


def _socket_inodes(pid: int) -> set[int]:
    inodes = set()
    try:
        for fd in os.scandir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(fd.path)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    except OSError:
        pass
    return inodes


def _address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    if len(raw) == 4:
        return str(ipaddress.IPv4Address(raw[::-1]))
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    addr = ipaddress.IPv6Address(words)
    return str(addr.ipv4_mapped or addr)


def listening() -> dict[int, str]:
    """Socket inode -> ``address:port`` of every TCP socket in the LISTEN state."""
    out = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            if cols[3] != "0A":  # LISTEN
                continue
            host, port = cols[1].split(":")
            out[int(cols[9])] = f"{_address(host)}:{int(port, 16)}"
    return out


def is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address.rsplit(":", 1)[0]).is_loopback


class ListenerWatch:
    """Samples, until stopped, the listening addresses of this process's descendants:
    ``found`` maps ``address:port`` to the command that listened on it."""

    def __init__(self, interval: float = 0.2) -> None:
        self.interval, self.found = interval, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ListenerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.wait(self.interval):
            sockets = listening()
            for pid in descendants(me):
                for inode in _socket_inodes(pid) & set(sockets):
                    try:
                        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120].decode()
                    except OSError:
                        cmd = "?"
                    self.found.setdefault(sockets[inode], cmd)

    def outside_loopback(self) -> dict[str, str]:
        return {a: c for a, c in self.found.items() if not is_loopback(a)}
