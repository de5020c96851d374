"""Folding and clean-up under outside faults: three writer processes land random overlapping
batches into one Parquet dataset whose log folds every few positions, while clean-up runs in a
loop with no retention at all (production keeps at least an hour) and writers are SIGKILLed
(then restarted: they finish what they marked acking) and SIGSTOPped past several clean-ups.
Every input a writer marked acking lands exactly once."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from airflow_provider_cg.core.landing.sinks import ParquetLakeSink, read_committed
from airflow_provider_cg.core.landing.sinks.lake.protocol_log import clean_protocol_log
from tests.support.chaos import chaos_seed

ROOT = Path(__file__).resolve().parents[3]
MEMBERS = ("m0", "m1", "m2")


def _start(lake: Path, member: str, seed: int, report: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.support.log_chaos_worker", str(lake), member, str(seed),
                             str(report)], cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def test_fold_and_clean_up_under_sigkill_and_sigstop(request, tmp_path):
    seed = chaos_seed(request)
    rng = random.Random(seed)
    lake = tmp_path / "lake"
    ParquetLakeSink(lake, fsync=False)
    reports = {m: tmp_path / f"{m}.txt" for m in MEMBERS}
    procs = {m: _start(lake, m, rng.randrange(1, 10**6), reports[m]) for m in MEMBERS}
    stop, cleaned, errors = threading.Event(), Counter(), []

    def clean() -> None:
        store = ParquetLakeSink(lake, fsync=False).store
        while not stop.is_set():
            try:
                done = clean_protocol_log(store, retention_hours=0)
                cleaned["records"] += done.records
                cleaned["runs"] += 1
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))
            time.sleep(0.05)

    cleaner = threading.Thread(target=clean)
    cleaner.start()
    faults = []
    try:
        while len(faults) < 12:
            time.sleep(rng.uniform(0.3, 1.0))
            m = rng.choice(MEMBERS)
            proc = procs[m]
            if proc.poll() is not None:
                assert proc.returncode == 0 or proc.returncode == -9, f"{m} exited {proc.returncode}: " \
                                                                       f"{proc.stderr.read()[-8000:]}"
                procs[m] = _start(lake, m, rng.randrange(1, 10**6), reports[m])
            elif rng.random() < 0.6:
                proc.kill()
                proc.wait()
                faults.append(f"SIGKILL {m}")
                procs[m] = _start(lake, m, rng.randrange(1, 10**6), reports[m])
            else:
                os.kill(proc.pid, signal.SIGSTOP)
                time.sleep(rng.uniform(0.5, 2.0))  # several clean-ups free positions it has not read
                os.kill(proc.pid, signal.SIGCONT)
                faults.append(f"SIGSTOP {m}")
    finally:
        stop.set()
        cleaner.join()
        for m, proc in procs.items():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            assert proc.returncode in (0, -9), f"{m} exited {proc.returncode}: {proc.stderr.read()[-8000:]}"
    assert not errors, errors[:3]
    # the members' next lives finish what was marked acking
    for m in MEMBERS:
        sink = ParquetLakeSink(lake, fsync=False)
        for p in sink.recover("ORDERS", "g", m):
            sink.commit(p) if p.acking else sink.abort(p)
    acked = {int(s) for path in reports.values() if path.exists() for line in path.read_text().splitlines()
             for s in line.split()}
    got = Counter(read_committed(lake, columns=["origin_seq"]).column("origin_seq").to_pylist())
    dups = [s for s, n in got.items() if n > 1]
    print(f"seed {seed}: {len(faults)} faults, {cleaned['runs']} clean-ups removed {cleaned['records']} records, "
          f"{len(got)} inputs landed, {len(acked)} acked")
    assert not dups, f"seed {seed}: {len(dups)} inputs landed twice, e.g. {dups[:5]}"
    assert acked <= set(got), f"seed {seed}: {len(acked - set(got))} acked inputs missing"
    assert cleaned["records"] > 100, (cleaned, faults)
