"""Add bytecode to the zips of PySpark and Py4J that ``spark-submit`` puts first on the path of
every Spark driver and Python worker (``$SPARK_HOME/python/lib``): they hold only sources,
which ``zipimport`` compiles in each process and cannot cache, so every Spark job of the tests
compiled PySpark again in its driver and its workers (about 0.6 CPU-s each). Run once by
``make test`` on the environment it made; the bytecode is checked against the source beside
it (``packaging.hash_checked_bytecode``), so what runs is the installed PySpark as it is.
"""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path

from airflow_provider_cg.core.tools.packaging import hash_checked_bytecode


def add_bytecode(zip_path: Path) -> bool:
    """Rewrite ``zip_path`` with a ``.pyc`` beside each source that has none; False if none was missing."""
    with zipfile.ZipFile(zip_path) as zi:
        names = set(zi.namelist())
        missing = [n for n in names if n.endswith(".py") and n + "c" not in names]
        if not missing:
            return False
        tmp = zip_path.with_suffix(f".{os.getpid()}.tmp")
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zo:
            for info in zi.infolist():
                data = zi.read(info)
                zo.writestr(info, data)
                if info.filename in missing:
                    try:
                        zo.writestr(info.filename + "c", hash_checked_bytecode(data, info.filename))
                    except SyntaxError:  # (a source for another Python: it stays a source)
                        pass
    os.replace(tmp, zip_path)
    return True


def main() -> int:
    import pyspark

    lib = Path(pyspark.__file__).resolve().parent / "python" / "lib"
    for zip_path in sorted(lib.glob("*.zip")):
        print(f"{zip_path}: {'bytecode added' if add_bytecode(zip_path) else 'has its bytecode'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
