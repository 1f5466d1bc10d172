"""Publishing the fleet tier: what the store holds reaches storage once and
whole, compaction leaves one file per host and day, a crash or storage that
is down loses and duplicates nothing, and a reader never sees part of a file."""
import json
import shutil

import pytest

from gpuscope.analyzers import fleet_layout as lay, object_store
from gpuscope.analyzers.fleet_query import FleetReader, NoFiles
from gpuscope.analyzers.object_store import ObjectStore, StorageError, parse_location
from gpuscope.analyzers.publish import PublishConfig, Publisher
from tests.fleet_data import GPUS, HOSTS, HOURS, T0, Clock, fill_store, s3_server

DAY = 86400.0
ROLLUP_ROWS = len(HOSTS) * len(GPUS) * HOURS * 60


def _publisher(tmp_path, store, clock, url=None, **kw) -> Publisher:
    config = PublishConfig(url=url or str(tmp_path / "fleet"), cluster="c1", state_dir=str(tmp_path / "state"),
                           delay_s=300, backfill_s=HOURS * 3600 + 600, backoff_s=0.01, **kw)
    return Publisher(config, store.fleet_rows, clock=clock)


def _counts(url) -> dict:
    r = FleetReader(url)
    try:
        rows = r.sql("SELECT (SELECT count(*) FROM rollups) AS rollups, (SELECT sum(samples) FROM rollups) AS samples, "
                     "(SELECT count(*) FROM findings) AS findings, (SELECT count(*) FROM captures) AS captures")
        return rows[0]
    finally:
        r.close()


def _keys(url) -> list[str]:
    return [k for k in ObjectStore(parse_location(url)).list() if k.endswith(".parquet")]


def test_a_pass_publishes_each_row_once_partitioned_by_date_cluster_host(tmp_path):
    store = fill_store(tmp_path / "a.duckdb")
    clock = Clock(T0 + HOURS * 3600 + 600)           # 10 min after the data: all of it is past the 5 min delay
    p = _publisher(tmp_path, store, clock)
    out = p.run_pass()
    assert out["files_pending"] == 0 and out["files_uploaded"] > 0
    url = str(tmp_path / "fleet")
    assert _counts(url) == dict(rollups=ROLLUP_ROWS, samples=ROLLUP_ROWS * 60, findings=1, captures=1)
    keys = _keys(url)
    assert all(lay.parse_key(k) is not None for k in keys)
    assert "table=findings/date=2026-11-18/cluster=c1/host=node-a/part-0100-0200.parquet" in keys
    # segments never straddle an hour; the hive columns are in the path, not in the files
    assert {lay.parse_key(k).lo // 60 == (lay.parse_key(k).hi - 1) // 60 for k in keys} == {True}
    r = FleetReader(url)
    one = r.sql("SELECT * FROM rollups WHERE host = 'node-a' AND gpu = 0 ORDER BY t LIMIT 1")[0]
    assert (one["cluster"], str(one["date"]), one["t"], one["samples"], one["util_gpu_ratio"]) == \
        ("c1", "2026-11-18", T0, 60, 0.25)
    # each GPU-minute carries the finding holding it: its verdict and whose the job is
    by = {(x["host"], x["gpu"], x["verdict"], x["pod"], x["slurm_job"]): x["n"] for x in r.sql(
        "SELECT host, gpu, verdict, pod, slurm_job, count(*) AS n FROM rollups GROUP BY ALL")}
    assert by[("node-a", 0, "memory-bound", "llm-0", None)] == 60
    assert by[("node-b", 1, "compute-bound", None, "81234")] == HOURS * 60
    assert by[("node-a", 1, None, None, None)] == HOURS * 60
    cap = r.sql("SELECT id, verdict, summary FROM captures")[0]
    assert cap == dict(id="c-1", verdict="memory-bound", summary='{"verdict": "memory-bound"}')
    r.close()
    # a second pass with nothing new publishes nothing
    assert p.run_pass()["files_uploaded"] == 0


def test_closed_hours_and_days_become_one_file_per_host(tmp_path):
    store = fill_store(tmp_path / "a.duckdb")
    clock = Clock(T0 + 3600 + 600)
    p = _publisher(tmp_path, store, clock, interval_s=60)
    url = str(tmp_path / "fleet")
    for _ in range(12):                              # 5-minute passes over the next hour
        clock.t += 300
        p.run_pass()
    rollups = sorted(k for k in _keys(url) if k.startswith("table=rollups") and "node-a" in k)
    # closed hours are one segment each; the hour still open keeps its 5-minute segments
    assert rollups[:2] == ["table=rollups/date=2026-11-18/cluster=c1/host=node-a/part-0000-0100.parquet",
                           "table=rollups/date=2026-11-18/cluster=c1/host=node-a/part-0100-0200.parquet"]
    published_minutes = (clock.t - 300 - T0) // 60           # up to the 5-minute delay
    assert _counts(url)["rollups"] == len(HOSTS) * len(GPUS) * published_minutes
    clock.t = T0 + DAY + 900                         # the day has closed
    p.run_pass()
    rollups = sorted(k for k in _keys(url) if k.startswith("table=rollups"))
    assert rollups == [f"table=rollups/date=2026-11-18/cluster=c1/host={h}/part-0000-2400.parquet" for h in HOSTS]
    assert _counts(url) == dict(rollups=ROLLUP_ROWS, samples=ROLLUP_ROWS * 60, findings=1, captures=1)
    # nothing of a closed day stays in the outbox or among the sent copies
    assert not [f for f in (tmp_path / "state").rglob("*.parquet")]


def test_a_restart_resumes_and_a_crash_before_the_watermark_counts_nothing_twice(tmp_path):
    store = fill_store(tmp_path / "a.duckdb")
    clock = Clock(T0 + 3600 + 1200)
    p = _publisher(tmp_path, store, clock)
    p.run_pass()
    state = (tmp_path / "state" / "state.json").read_text()
    clock.t += 1800
    p.run_pass()
    # the process died after uploading, before its watermark was saved: the next start redoes the range
    (tmp_path / "state" / "state.json").write_text(state)
    clock.t = T0 + HOURS * 3600 + 600
    again = _publisher(tmp_path, store, clock)
    assert again.watermarks == {t: float(v) for t, v in json.loads(state)["watermarks"].items()}
    again.run_pass()
    assert _counts(str(tmp_path / "fleet")) == dict(rollups=ROLLUP_ROWS, samples=ROLLUP_ROWS * 60, findings=1,
                                                   captures=1)


class FlakyStorage(ObjectStore):
    """Storage that refuses every put while `down`, as S3 does in an outage."""

    def __init__(self, loc):
        super().__init__(loc)
        self.down = False
        self.refused = 0

    def put(self, local, key):
        if self.down:
            self.refused += 1
            raise StorageError(f"{self.loc.url}: EndpointConnectionError: could not connect")
        super().put(local, key)


def test_storage_down_delays_publishing_then_it_resumes_with_every_row(tmp_path):
    store = fill_store(tmp_path / "a.duckdb")
    clock = Clock(T0 + HOURS * 3600 + 600)
    url = str(tmp_path / "fleet")
    flaky = FlakyStorage(parse_location(url))
    config = PublishConfig(url=url, cluster="c1", state_dir=str(tmp_path / "state"), delay_s=300,
                           backfill_s=HOURS * 3600 + 600, attempts=3, backoff_s=0.01)
    p = Publisher(config, store.fleet_rows, storage=flaky, clock=clock)
    flaky.down = True
    out = p.run_pass()
    assert out["files_uploaded"] == 0 and out["files_pending"] > 0 and flaky.refused == 3   # retried, then left
    st = p.status()
    assert st["consecutive_failures"] == 3 and "EndpointConnectionError" in st["last_error"]
    assert st["lag_seconds"] >= HOURS * 3600                     # the oldest row not in storage
    assert _keys(url) == []
    clock.t += 3600                                              # still down an hour later: staged, not lost
    p.run_pass()
    flaky.down = False
    out = p.run_pass()
    assert out["files_pending"] == 0
    assert p.status()["consecutive_failures"] == 0 and p.status()["lag_seconds"] < 3600
    assert _counts(url) == dict(rollups=ROLLUP_ROWS, samples=ROLLUP_ROWS * 60, findings=1, captures=1)


def test_a_file_cut_off_while_written_is_never_visible(tmp_path, monkeypatch):
    store = fill_store(tmp_path / "a.duckdb")
    clock = Clock(T0 + HOURS * 3600 + 600)
    url = str(tmp_path / "fleet")
    p = _publisher(tmp_path, store, clock, attempts=1)
    real_copy = shutil.copyfile

    def cut(src, dst):                               # the disk fills half way through the copy
        with open(src, "rb") as f, open(dst, "wb") as out:
            out.write(f.read()[:100])
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(object_store.shutil, "copyfile", cut)
    assert p.run_pass()["files_uploaded"] == 0
    assert [f for f in (tmp_path / "fleet").rglob("*") if f.is_file()] == []     # no part, no temporary left
    with pytest.raises(NoFiles):
        _counts(url)
    assert "No space left on device" in p.status()["last_error"]
    monkeypatch.setattr(object_store.shutil, "copyfile", real_copy)
    p.run_pass()
    assert _counts(url)["rollups"] == ROLLUP_ROWS


def test_s3_publish_and_read_through_a_real_s3_server(tmp_path, monkeypatch):
    with s3_server(monkeypatch) as server:
        store = fill_store(tmp_path / "a.duckdb")
        clock = Clock(T0 + 3600 + 600)
        url = "s3://fleet/gpuscope"
        p = _publisher(tmp_path, store, clock, url=url, attempts=2)
        p.run_pass()
        first = _counts(url)
        assert first["rollups"] == len(HOSTS) * len(GPUS) * 65          # up to 5 minutes ago
        # the server goes away: the pass keeps its rows in the outbox, readers still see the first hour
        host, port = server.get_host_and_port()
        server.stop()
        clock.t = T0 + HOURS * 3600 + 600
        out = p.run_pass()
        assert out["files_uploaded"] == 0 and out["files_pending"] > 0
        assert p.status()["consecutive_failures"] == 2
        # ... and comes back (moto keeps its objects): the next pass resumes where it stopped
        from moto.server import ThreadedMotoServer
        back = ThreadedMotoServer(ip_address=host, port=port, verbose=False)
        back.start()
        try:
            assert p.run_pass()["files_pending"] == 0
            assert _counts(url) == dict(rollups=ROLLUP_ROWS, samples=ROLLUP_ROWS * 60, findings=1, captures=1)
            keys = ObjectStore(parse_location(url)).list()
            assert keys and all(k.startswith("table=") and k.endswith(".parquet") for k in keys)
        finally:
            back.stop()


def test_config_refuses_what_would_fail_later(tmp_path):
    with pytest.raises(ValueError, match="cluster name"):
        PublishConfig(url=str(tmp_path), cluster="a/b", state_dir=str(tmp_path))
    with pytest.raises(ValueError, match="credentials and options go in the environment"):
        PublishConfig(url="s3://key:secret@bucket/x", cluster="c", state_dir=str(tmp_path))
    with pytest.raises(ValueError, match="expected a directory"):
        PublishConfig(url="ftp://x/y", cluster="c", state_dir=str(tmp_path))
