"""Where the fleet tier's files live: a local directory, S3 (or any
S3-compatible server) or GCS, behind one small interface.

Why fsspec (s3fs, gcsfs) and not DuckDB's `httpfs`: this build runs DuckDB
2.0, whose extensions download from extensions.duckdb.org at run time; the
only packaged httpfs (PyPI's duckdb-ext-httpfs) is built for DuckDB 1.4.4
and DuckDB 2.0 refuses to load it. DuckDB's Python `register_filesystem`
takes an fsspec filesystem instead, so `read_parquet('s3://...')` works
the same; a site with httpfs reads the same keys with its own `s3://` or
`gs://` URLs (docs/fleet.md).

Visibility: a reader never sees part of a file. A local file is copied to a
temporary name beside its destination (`.*.tmp`, which no reader globs) and
renamed over it; an S3 or GCS object appears whole when its PUT (or its
multipart upload) completes, or not at all.
"""
from __future__ import annotations

import errno
import os
import shutil
import urllib.parse
import uuid
from dataclasses import dataclass
from pathlib import Path

SCHEMES = ("s3", "gs", "gcs")


class StorageError(RuntimeError):
    """Storage refused or could not be reached; str() says what to do."""


@dataclass(frozen=True)
class Location:
    scheme: str                 # "file", "s3", "gs"
    root: str                   # a directory, or bucket/prefix

    @property
    def url(self) -> str:
        return self.root if self.scheme == "file" else f"{self.scheme}://{self.root}"

    def join(self, key: str) -> str:
        return f"{self.root.rstrip('/')}/{key}" if self.root else key


def parse_location(url: str) -> Location:
    """A local directory (a path or file://), s3://BUCKET[/PREFIX] or
    gs://BUCKET[/PREFIX]. Credentials never ride in the URL."""
    if not url:
        raise ValueError("no location: give a directory, s3://BUCKET/PREFIX or gs://BUCKET/PREFIX")
    u = urllib.parse.urlsplit(url)
    if u.scheme in ("", "file"):
        return Location("file", os.path.abspath(u.path if u.scheme else url))
    if u.scheme not in SCHEMES:
        raise ValueError(f"{url!r}: expected a directory, s3://BUCKET/PREFIX or gs://BUCKET/PREFIX")
    if u.username or u.password or u.query:
        raise ValueError(f"{u.scheme}://{u.hostname}/...: credentials and options go in the environment "
                         "(docs/fleet.md), not in the URL")
    if not u.netloc:
        raise ValueError(f"{url!r}: no bucket")
    scheme = "gs" if u.scheme == "gcs" else u.scheme
    return Location(scheme, (u.netloc + u.path).rstrip("/"))


def filesystem(loc: Location):
    """The fsspec filesystem for a location (None for a local directory,
    which needs none). The S3 and GCS libraries are an extra:
    pip install 'gpuscope[fleet]'."""
    if loc.scheme == "file":
        return None
    try:
        if loc.scheme == "s3":
            import s3fs
            # botocore reads AWS_ENDPOINT_URL (an S3-compatible server), keys, profiles and roles itself;
            # retries of one request are botocore's, ours are of the whole file (publish.py)
            return s3fs.S3FileSystem(skip_instance_cache=True, use_listings_cache=False, config_kwargs={"connect_timeout": 10, "read_timeout": 60,
                                                    "retries": {"max_attempts": 2}})
        import gcsfs
        return gcsfs.GCSFileSystem(skip_instance_cache=True, use_listings_cache=False)
    except ImportError as exc:
        raise StorageError(f"{loc.url}: {exc.name or 'the storage library'} is not installed "
                           "(pip install 'gpuscope[fleet]')") from None


class ObjectStore:
    """put (whole or not at all), list, delete under a location."""

    def __init__(self, loc: Location, fs=None):
        self.loc = loc
        self.fs = fs if fs is not None else filesystem(loc)

    def put(self, local: str, key: str) -> None:
        dest = self.loc.join(key)
        try:
            if self.fs is None:
                Path(dest).parent.mkdir(parents=True, exist_ok=True)
                tmp = str(Path(dest).parent / f".{Path(dest).name}.{uuid.uuid4().hex[:8]}.tmp")
                try:
                    shutil.copyfile(local, tmp)
                    with open(tmp, "rb+") as f:
                        os.fsync(f.fileno())
                    os.replace(tmp, dest)
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
            else:
                self.fs.put_file(local, dest)
        except Exception as exc:  # every library raises its own; the publisher retries any of them
            raise StorageError(describe(exc, self.loc)) from exc

    def probe(self) -> None:
        """Writes and deletes a small object at the root: start-up refuses a
        target it cannot write (a read-only file system, a missing bucket,
        no credentials) instead of failing at the first pass, minutes later.
        Raises StorageError saying what to do."""
        key = f".gpuscope-probe-{uuid.uuid4().hex[:12]}"
        try:
            if self.fs is None:
                os.makedirs(self.loc.root, exist_ok=True)
                path = os.path.join(self.loc.root, key)
                with open(path, "wb") as f:
                    f.write(b"gpuscope")
                os.unlink(path)
            else:
                with self.fs.open(self.loc.join(key), "wb") as f:
                    f.write(b"gpuscope")
                self.fs.rm_file(self.loc.join(key))
        except Exception as exc:  # every library raises its own
            why = describe(exc, self.loc)
            if self.fs is None and isinstance(exc, OSError) and exc.errno in (errno.EROFS, errno.EACCES) and \
                    os.environ.get("INVOCATION_ID"):           # a systemd service
                why += _under_systemd(self.loc.root)
            raise StorageError(why) from exc

    def delete(self, key: str) -> None:
        dest = self.loc.join(key)
        try:
            if self.fs is None:
                Path(dest).unlink(missing_ok=True)
            else:
                self.fs.rm_file(dest)
        except FileNotFoundError:
            pass
        except Exception as exc:
            raise StorageError(describe(exc, self.loc)) from exc

    def list(self, prefix: str = "") -> list[str]:
        return sorted(self.sizes(prefix))

    def sizes(self, prefix: str = "") -> dict[str, int]:
        """Keys under prefix, relative to the root, and their sizes (a
        missing prefix: none)."""
        base = self.loc.join(prefix).rstrip("/")
        try:
            if self.fs is None:
                if not os.path.isdir(base):
                    return {}
                out = {}
                for d, _, files in os.walk(base):
                    rel = os.path.relpath(d, self.loc.root)
                    for f in files:
                        out[f if rel == "." else f"{rel}/{f}"] = os.stat(os.path.join(d, f)).st_size
                return out
            root = self.loc.root.rstrip("/") + "/"
            found = self.fs.find(base, detail=True)
            return {(k[len(root):] if k.startswith(root) else k): int(v.get("size") or 0) for k, v in found.items()}
        except FileNotFoundError:
            return {}
        except Exception as exc:
            raise StorageError(describe(exc, self.loc)) from exc

    def directories(self, prefix: str) -> list[str]:
        """The names directly under prefix (`date=...` directories)."""
        base = self.loc.join(prefix).rstrip("/")
        try:
            if self.fs is None:
                return sorted(e.name for e in os.scandir(base) if e.is_dir()) if os.path.isdir(base) else []
            return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(base, detail=False))
        except FileNotFoundError:
            return []
        except Exception as exc:
            raise StorageError(describe(exc, self.loc)) from exc

    def url_of(self, key: str) -> str:
        """What DuckDB reads: a path, or a URL its registered filesystem serves."""
        return self.loc.join(key) if self.fs is None else f"{self.loc.scheme}://{self.loc.join(key)}"


def _under_systemd(root: str) -> str:
    """What the shipped unit needs to write a directory outside its state
    directory (found in a trial: ReadWritePaths= alone was not enough)."""
    return ("; the gpuscope-analyzer unit writes only its state directory: publish under it "
            "(--publish /var/lib/gpuscope/fleet), or give the unit a user that owns the directory and "
            f"ReadWritePaths={root} in a drop-in (docs/fleet.md, systemd)")


def describe(exc: BaseException, loc: Location) -> str:
    """One line that says what went wrong and what to do."""
    name = type(exc).__name__
    text = str(exc) or name
    if name in ("NoCredentialsError", "PartialCredentialsError") or "credentials" in text.lower():
        if loc.scheme == "s3":
            return (f"{loc.url}: no S3 credentials ({text}); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                    "or AWS_PROFILE, or run where an instance role applies (and AWS_ENDPOINT_URL for an "
                    "S3-compatible server)")
        if loc.scheme == "gs":
            return (f"{loc.url}: no GCS credentials ({text}); set GOOGLE_APPLICATION_CREDENTIALS to a service "
                    "account key, or run `gcloud auth application-default login`")
    if isinstance(exc, PermissionError) or "AccessDenied" in text or "403" in text:
        return f"{loc.url}: access denied ({text}); the credentials in use may not write or list there"
    if "NoSuchBucket" in text or "bucket does not exist" in text.lower():
        return f"{loc.url}: no such bucket ({text})"
    return f"{loc.url}: {name}: {text}"
