"""Where a lake sink keeps its files: a local directory or an S3-compatible bucket.

The lake sinks' protocol (``sinks/lake/lake_sink.py``) needs one primitive that must be atomic on every
store: ``create`` -- write an object only if its name is free, so exactly one writer claims
each position of the commit log. A local directory does it with ``link`` (a complete temp
file linked to the name; ``link`` fails if the name exists), an object store with a
conditional put (``If-None-Match: *``, honoured by S3, MinIO and other S3-compatible
servers). Nothing else relies on rename or link: objects are written whole and never changed.

Object-store credentials are never arguments: they come from the standard AWS environment
variables (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SESSION_TOKEN``,
``AWS_REGION``, ``AWS_ENDPOINT_URL``) that the operator sets from an Airflow connection, and
no message of this module contains them.
"""

from __future__ import annotations

import abc
import os
import secrets
import shutil
from collections.abc import Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from airflow_provider_cg.core.errors import ConfigError

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pyarrow.fs as pafs

OBJECT_SCHEMES = ("s3", "s3a")
DIR_MARKER = ".started"  # an object store's stand-in for a directory made by ``start_dir``


def is_object_url(location: str) -> bool:
    return urlsplit(str(location)).scheme in OBJECT_SCHEMES


@dataclass(frozen=True)
class ObjectStoreSettings:
    """How to reach an S3-compatible store. ``repr`` never shows the keys."""

    endpoint: str | None = None
    region: str | None = None
    access_key_id: str | None = field(default=None, repr=False)
    secret_access_key: str | None = field(default=None, repr=False)
    session_token: str | None = field(default=None, repr=False)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ObjectStoreSettings:
        env = os.environ if environ is None else environ
        endpoint = env.get("AWS_ENDPOINT_URL_S3") or env.get("AWS_ENDPOINT_URL") or None
        if endpoint and urlsplit(endpoint).scheme not in ("http", "https"):
            raise ConfigError("AWS_ENDPOINT_URL", f"must be an http:// or https:// URL (got {endpoint!r})")
        if endpoint and urlsplit(endpoint).username:
            raise ConfigError("AWS_ENDPOINT_URL", "must not contain credentials (use the connection's login/password)")
        return cls(endpoint=endpoint, region=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None,
                   access_key_id=env.get("AWS_ACCESS_KEY_ID") or None,
                   secret_access_key=env.get("AWS_SECRET_ACCESS_KEY") or None,
                   session_token=env.get("AWS_SESSION_TOKEN") or None)

    @property
    def allow_http(self) -> bool:
        return bool(self.endpoint and self.endpoint.startswith("http://"))

    def object_store_options(self) -> dict[str, str]:
        """``object_store`` configuration keys (obstore, delta-rs storage options)."""
        out = {"region": self.region or "us-east-1"}
        if self.endpoint:
            out["endpoint"] = self.endpoint
            out["allow_http"] = "true" if self.allow_http else "false"
            out["virtual_hosted_style_request"] = "false"
        if self.access_key_id:
            out["access_key_id"] = self.access_key_id
        if self.secret_access_key:
            out["secret_access_key"] = self.secret_access_key
        if self.session_token:
            out["session_token"] = self.session_token
        return out

    def pyarrow_filesystem(self) -> pafs.FileSystem:
        """A pyarrow ``S3FileSystem`` for the same store (readers of the table's data files)."""
        import pyarrow.fs as pafs

        scheme, _, host = (self.endpoint or "https://").partition("://")
        return pafs.S3FileSystem(access_key=self.access_key_id, secret_key=self.secret_access_key,
                                 session_token=self.session_token, region=self.region or "us-east-1",
                                 scheme=scheme, endpoint_override=host.rstrip("/") or None)


class Storage(abc.ABC):
    """Files of one lake location, addressed by '/'-separated paths relative to it."""

    location: str

    @abc.abstractmethod
    def read(self, rel: str) -> bytes:
        """The object's bytes; ``FileNotFoundError`` if absent."""

    @abc.abstractmethod
    def write(self, rel: str, data: bytes) -> None:
        """Write (or replace) an object durably; readers see all of it or the old one."""

    def write_new(self, rel: str, data: bytes) -> None:
        """Write a new object into a directory of one writer (a prepared write's staging) that
        nobody reads before a later ``write`` into the same directory (its manifest). Its bytes
        are durable on return; its name is once that later ``write`` is, which saves a temp
        file, a rename and a directory sync per object on a local disk."""
        self.write(rel, data)

    @abc.abstractmethod
    def create(self, rel: str, data: bytes) -> None:
        """Write an object only if the name is free (``FileExistsError`` otherwise), durably."""

    @abc.abstractmethod
    def exists(self, rel: str) -> bool: ...

    @abc.abstractmethod
    def ensure_dir(self, rel: str) -> None:
        """Make ``rel`` a place objects can be written under (a no-op on object stores); a
        directory made here is durable (its parent synced) before anything in it can be."""

    @abc.abstractmethod
    def start_dir(self, rel: str) -> None:
        """Claim a new directory ``rel`` (``FileExistsError`` if it is there already), durably."""

    @abc.abstractmethod
    def dir_exists(self, rel: str) -> bool:
        """Whether ``start_dir(rel)`` happened and ``delete_tree(rel)`` did not since."""

    @abc.abstractmethod
    def size(self, rel: str) -> int: ...

    @abc.abstractmethod
    def list(self, rel: str) -> list[str]:
        """Names directly under ``rel`` (objects and sub-prefixes), sorted; [] if none."""

    @abc.abstractmethod
    def delete_tree(self, rel: str) -> None:
        """Remove everything under ``rel`` (no error if nothing is there)."""

    @abc.abstractmethod
    def copy(self, src: str, dst: str) -> None:
        """Make ``dst`` hold ``src``'s bytes (a hard link where the store has them)."""

    @abc.abstractmethod
    def uri(self, rel: str = "") -> str:
        """The absolute URI of ``rel`` (``file:///...`` or ``s3://bucket/...``)."""

    def make_durable(self, rel: str) -> None:  # noqa: B027 - objects are durable once put
        """Flush a file another writer (a Spark task) wrote under ``rel``, or a directory's
        names, to stable storage."""

    def file_path(self, rel: str) -> str:
        """What pyarrow opens for ``rel`` with ``filesystem()``."""
        return self.uri(rel)

    def filesystem(self) -> pafs.FileSystem:
        """A ``pyarrow.fs.FileSystem`` that opens ``file_path`` results."""
        raise NotImplementedError


class LocalStorage(Storage):
    """A directory on a POSIX filesystem (``fsync=False``: tests only, no power-loss safety).

    Names are plain strings joined with ``os.path``: a batch makes about 25 storage calls, and
    ``pathlib`` objects were a sixth of the sink's CPU per small batch in a profile."""

    def __init__(self, root: str | os.PathLike, *, fsync: bool = True, create: bool = True) -> None:
        self.root = Path(root).absolute()
        self.location = str(self.root)
        self.fsync = fsync
        if create:
            self.root.mkdir(parents=True, exist_ok=True)

    def path(self, rel: str) -> Path:
        return Path(self._path(rel))

    def _path(self, rel: str) -> str:
        return os.path.join(self.location, rel) if rel else self.location

    def read(self, rel: str) -> bytes:
        with open(self._path(rel), "rb") as fh:
            return fh.read()

    def _write_synced(self, path: str, data: bytes) -> None:
        # "xb": a name taken already is an error, never a silent overwrite; no mkdir: writing
        # into a directory another instance removed fails (FileNotFoundError)
        with open(path, "xb") as fh:
            fh.write(data)
            if self.fsync:
                fh.flush()  # a small write is still in Python's buffer: fsync would find the file empty
                os.fsync(fh.fileno())

    def _tmp(self, target: str, data: bytes) -> str:
        folder, name = os.path.split(target)
        tmp = os.path.join(folder, f".{name}.{secrets.token_hex(6)}.tmp")
        self._write_synced(tmp, data)
        return tmp

    def write(self, rel: str, data: bytes) -> None:
        target = self._path(rel)
        os.replace(self._tmp(target, data), target)
        self.sync_dir(os.path.dirname(target))

    def write_new(self, rel: str, data: bytes) -> None:
        self._write_synced(self._path(rel), data)

    def create(self, rel: str, data: bytes) -> None:
        target = self._path(rel)
        tmp = self._tmp(target, data)
        try:
            os.link(tmp, target)  # fails if the name exists: exactly one writer wins it
        finally:
            os.unlink(tmp)
        self.sync_dir(os.path.dirname(target))

    def sync_dir(self, path: str | os.PathLike) -> None:
        """Sync ``path`` (a folder's names, or a file's bytes) to stable storage."""
        if not self.fsync:
            return
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def make_durable(self, rel: str) -> None:
        self.sync_dir(self._path(rel))  # a file's fd syncs as a folder's does

    def exists(self, rel: str) -> bool:
        return os.path.exists(self._path(rel))

    def ensure_dir(self, rel: str) -> None:
        path = self._path(rel)
        if os.path.isdir(path):
            return
        os.makedirs(path, exist_ok=True)
        self.sync_dir(os.path.dirname(os.path.normpath(path)))

    def start_dir(self, rel: str) -> None:
        path = self._path(rel)
        os.mkdir(path)
        self.sync_dir(os.path.dirname(os.path.normpath(path)))  # its name, before anything written in it counts

    def dir_exists(self, rel: str) -> bool:
        return os.path.isdir(self._path(rel))

    def size(self, rel: str) -> int:
        return os.stat(self._path(rel)).st_size

    def list(self, rel: str) -> list[str]:
        try:
            return sorted(n for n in os.listdir(self._path(rel)) if not n.startswith("."))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def delete_tree(self, rel: str) -> None:
        path = self._path(rel)
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        else:
            with suppress(FileNotFoundError):
                os.unlink(path)

    def copy(self, src: str, dst: str) -> None:
        target = self._path(dst)
        try:
            os.link(self._path(src), target)
        except FileExistsError:
            return
        self.sync_dir(os.path.dirname(target))

    def uri(self, rel: str = "") -> str:
        return self.path(rel).as_uri() if rel else self.root.as_uri()

    def file_path(self, rel: str) -> str:
        return str(self.path(rel))

    def filesystem(self) -> pafs.FileSystem:
        import pyarrow.fs as pafs

        return pafs.LocalFileSystem()


class ObjectStorage(Storage):
    """A prefix of an S3-compatible bucket (``s3://bucket/prefix``), through ``obstore``."""

    def __init__(self, url: str, settings: ObjectStoreSettings | None = None) -> None:
        parts = urlsplit(url)
        if parts.scheme not in OBJECT_SCHEMES or not parts.netloc:
            raise ConfigError("sink_path", f"{url!r} is not an s3://bucket/prefix URL")
        if parts.username or parts.password or "@" in parts.netloc:
            raise ConfigError("sink_path", "must not contain credentials (they come from the connection)")
        self.bucket = parts.netloc
        self.prefix = parts.path.strip("/")
        self.location = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self.settings = settings or ObjectStoreSettings.from_env()
        self._fs = None
        from datetime import timedelta

        from obstore.store import S3Store

        opts: Any = dict(self.settings.object_store_options())  # obstore's S3Config keys
        client: Any = {"allow_http": opts.pop("allow_http", "false") == "true", "timeout": "30s", "connect_timeout": "5s"}
        self._store = S3Store(self.bucket, config=opts, client_options=client,
                              retry_config={"max_retries": 3, "retry_timeout": timedelta(seconds=20),
                                            "backoff": {"base": 2, "init_backoff": timedelta(milliseconds=100),
                                                        "max_backoff": timedelta(seconds=2)}})

    def _key(self, rel: str) -> str:
        rel = rel.strip("/")
        return f"{self.prefix}/{rel}" if self.prefix and rel else (self.prefix or rel)

    @contextmanager
    def _io(self, op: str, rel: str) -> Iterator[None]:
        """An object-store failure (the server gone, a timeout, a 5xx after the retries) as one
        ``ConnectionError`` line: transient, the job exits 2 and a rerun recovers the batch."""
        from obstore.exceptions import AlreadyExistsError, BaseError, NotFoundError, PreconditionError

        try:
            yield
        except (NotFoundError, AlreadyExistsError, PreconditionError):
            raise  # answers, not failures: the caller turns them into FileNotFound/FileExists
        except BaseError as e:
            first = (str(e).splitlines() or [""])[0][:200]
            raise ConnectionError(f"object store {self.settings.endpoint or 'S3'}: {op} {self.uri(rel)} failed "
                                  f"({type(e).__name__}: {first})") from None

    def read(self, rel: str) -> bytes:
        import obstore
        from obstore.exceptions import NotFoundError

        try:
            with self._io("read", rel):
                return bytes(obstore.get(self._store, self._key(rel)).bytes())
        except (NotFoundError, FileNotFoundError):
            raise FileNotFoundError(rel) from None

    def write(self, rel: str, data: bytes) -> None:
        import obstore

        with self._io("write", rel):
            obstore.put(self._store, self._key(rel), data)

    def create(self, rel: str, data: bytes) -> None:
        import obstore
        from obstore.exceptions import AlreadyExistsError, PreconditionError

        try:
            with self._io("create", rel):
                obstore.put(self._store, self._key(rel), data, mode="create")
        except (AlreadyExistsError, PreconditionError):
            raise FileExistsError(rel) from None

    def exists(self, rel: str) -> bool:
        import obstore
        from obstore.exceptions import NotFoundError

        try:
            with self._io("head", rel):
                obstore.head(self._store, self._key(rel))
            return True
        except (NotFoundError, FileNotFoundError):
            return False

    def ensure_dir(self, rel: str) -> None:
        return None

    def start_dir(self, rel: str) -> None:
        self.create(f"{rel}/{DIR_MARKER}", b"")

    def dir_exists(self, rel: str) -> bool:
        return self.exists(f"{rel}/{DIR_MARKER}")

    def size(self, rel: str) -> int:
        import obstore
        from obstore.exceptions import NotFoundError

        try:
            with self._io("head", rel):
                return int(obstore.head(self._store, self._key(rel))["size"])
        except (NotFoundError, FileNotFoundError):
            raise FileNotFoundError(rel) from None

    def list(self, rel: str) -> list[str]:
        import obstore

        base = self._key(rel)
        base = f"{base}/" if base else ""
        with self._io("list", rel):
            found = obstore.list_with_delimiter(self._store, base or None)
        names = {p.rstrip("/").rsplit("/", 1)[-1] for p in found["common_prefixes"]}
        names |= {o["path"].rsplit("/", 1)[-1] for o in found["objects"]}
        return sorted(n for n in names if not n.startswith("."))

    def delete_tree(self, rel: str) -> None:
        import obstore

        key = self._key(rel)
        paths = [key]
        with self._io("delete", rel):
            for chunk in obstore.list(self._store, key + "/"):
                paths += [o["path"] for o in chunk]
            obstore.delete(self._store, paths)

    def copy(self, src: str, dst: str) -> None:
        import obstore
        from obstore.exceptions import NotFoundError

        try:
            with self._io("copy", src):
                obstore.copy(self._store, self._key(src), self._key(dst))
        except (NotFoundError, FileNotFoundError):  # as its reads: one exception for a missing object
            raise FileNotFoundError(src) from None

    def uri(self, rel: str = "") -> str:
        key = self._key(rel)
        return f"s3://{self.bucket}/{key}" if key else f"s3://{self.bucket}"

    def file_path(self, rel: str) -> str:
        return f"{self.bucket}/{self._key(rel)}"

    def filesystem(self) -> pafs.FileSystem:
        if self._fs is None:
            self._fs = self._make_filesystem()
        return self._fs

    def _make_filesystem(self) -> pafs.FileSystem:
        import pyarrow.fs as pafs

        s = self.settings
        kwargs: dict[str, str | None] = {"region": s.region or "us-east-1"}
        if s.endpoint:
            parts = urlsplit(s.endpoint)
            kwargs["endpoint_override"] = parts.netloc
            kwargs["scheme"] = parts.scheme
        if s.access_key_id:
            kwargs.update(access_key=s.access_key_id, secret_key=s.secret_access_key, session_token=s.session_token)
        return pafs.S3FileSystem(**kwargs)

    def check(self) -> None:
        """Reach the bucket now: a missing bucket, refused credentials or an unreachable store
        become one line naming the setting, before anything is read from NATS."""
        import obstore
        from obstore.exceptions import BaseError, NotFoundError, PermissionDeniedError, UnauthenticatedError

        try:
            obstore.list_with_delimiter(self._store, (self.prefix + "/") if self.prefix else None)
        except (PermissionDeniedError, UnauthenticatedError):
            raise ConfigError("aws credentials", f"refused by the object store for bucket {self.bucket!r}") from None
        except (NotFoundError, FileNotFoundError):
            raise ConfigError("sink_path", f"bucket {self.bucket!r} does not exist") from None
        except BaseError as e:
            text = str(e)
            if "NoSuchBucket" in text:
                raise ConfigError("sink_path", f"bucket {self.bucket!r} does not exist") from None
            if "InvalidAccessKeyId" in text or "SignatureDoesNotMatch" in text or "AccessDenied" in text:
                raise ConfigError("aws credentials",
                                  f"refused by the object store for bucket {self.bucket!r}") from None
            raise ConnectionError(f"object store {self.settings.endpoint or 'S3'} unreachable "
                                  f"({type(e).__name__})") from None


def open_storage(location: str, *, fsync: bool = True) -> Storage:
    """A local path (or ``file://`` URL) or an ``s3://bucket/prefix`` URL."""
    location = str(location)
    if is_object_url(location):
        return ObjectStorage(location)
    parts = urlsplit(location)
    if parts.scheme == "file":
        location = parts.path
    elif parts.scheme and len(parts.scheme) > 1:
        raise ConfigError("sink_path", f"unsupported scheme {parts.scheme!r} (a local path, file:// or s3://)")
    return LocalStorage(location, fsync=fsync)
