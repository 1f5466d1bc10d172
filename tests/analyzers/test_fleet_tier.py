"""The fleet tier inside the analyzer and on the command line: the layout's
names, the analyzer's publish job and the status it reports (through the
wire, as `gpuscope status` prints it), and the flags refused before start."""
import pytest

from gpuscope.analyzers import fleet_layout as lay
from gpuscope.analyzers.analyzer import Analyzer, AnalyzerConfig
from gpuscope.analyzers.fleet_query import parse_time
from gpuscope.analyzers.publish import PublishConfig
from gpuscope.analyzers.service import AnalyzerServicer
from gpuscope.daemon.cli import build_parser
from gpuscope.daemon.clients import message_dict
from gpuscope.daemon.cliutil import UsageError
from gpuscope.daemon.cmd_oncall import publish_line
from gpuscope.daemon.cmd_serve import _analyzer_config
from tests.fleet_data import HOURS, T0, Clock, fill_store


def test_segment_names_round_trip_and_readers_skip_contained_ones():
    s = lay.segment("rollups", "east", "node a/1", T0 + 3600, T0 + 3900)
    assert s.key == "table=rollups/date=2026-11-18/cluster=east/host=node%20a%2F1/part-0100-0105.parquet"
    assert lay.parse_key("prefix/" + s.key) == s
    assert lay.parse_key(s.key.replace(".parquet", ".parquet.tmp")) is None
    assert lay.parse_key(s.directory + "/.part-0100-0105.parquet.abc.tmp") is None
    day = lay.Segment("rollups", "2026-11-18", "east", "h", 0, 1440)
    hour = lay.Segment("rollups", "2026-11-18", "east", "h", 60, 120)
    redo = lay.Segment("rollups", "2026-11-18", "east", "h", 60, 65)
    other = lay.Segment("rollups", "2026-11-18", "east", "g", 60, 65)
    assert lay.maximal([hour, redo, other]) == [other, hour]
    assert lay.maximal([day, hour, redo]) == [day]
    assert lay.ranges(T0 + 3000, T0 + 7500) == [(T0 + 3000, T0 + 3600), (T0 + 3600, T0 + 7200),
                                                 (T0 + 7200, T0 + 7500)]
    with pytest.raises(ValueError, match="within one UTC date"):
        lay.segment("rollups", "east", "h", T0 - 60, T0 + 60)
    with pytest.raises(ValueError, match="cluster name"):
        lay.check_cluster("")


def test_times_people_type():
    assert parse_time("2026-11-18") == T0
    assert parse_time("2026-11-18T01:00") == T0 + 3600
    assert parse_time("2026-11-18T01:00+01:00") == T0
    assert parse_time(str(T0)) == T0
    assert parse_time("24h", now=T0 + 86400) == T0
    with pytest.raises(ValueError, match="bad time"):
        parse_time("yesterday")


def test_the_analyzer_publishes_on_its_scheduler_and_says_how_far_it_got(tmp_path):
    fill_store(tmp_path / "a.duckdb").close()
    clock = Clock(T0 + HOURS * 3600 + 600)
    config = AnalyzerConfig(str(tmp_path / "a.duckdb"), publish=PublishConfig(
        url=str(tmp_path / "fleet"), cluster="east", state_dir=str(tmp_path / "a.duckdb.publish"),
        backfill_s=HOURS * 3600 + 600))
    a = Analyzer(config, clock=clock)
    try:
        assert a.status()["publish"]["files_pending"] == 0 and a.status()["publish"]["last_upload"] == 0
        a._publish_job()
        st = a.status()["publish"]
        assert st["files_uploaded"] > 0 and st["consecutive_failures"] == 0 and st["lag_seconds"] == 300
        # through the wire, as `gpuscope status` reads it
        wire = message_dict(AnalyzerServicer(a)._status_pb("", 10))
        assert wire["publish"]["cluster"] == "east" and wire["publish"]["files_uploaded"] == st["files_uploaded"]
        line = publish_line(wire["publish"])
        assert line.startswith(f"  fleet tier: cluster east to {tmp_path / 'fleet'}, 5m behind, 0 files waiting")
        assert "STORAGE FAILING" in publish_line(dict(wire["publish"], consecutive_failures=3, last_error="503"))
    finally:
        a.close()
    off = Analyzer(AnalyzerConfig(str(tmp_path / "b.duckdb")))
    try:
        assert off.status()["publish"] is None
        assert "publish" not in message_dict(AnalyzerServicer(off)._status_pb("", 10))
    finally:
        off.close()


def test_a_cluster_name_the_partitions_cannot_take_is_refused_by_its_flag(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["analyzer", "--publish", "/tmp/x", "--cluster", "east/1"])
    assert "argument --cluster: 'east/1': letters, digits" in capsys.readouterr().err


@pytest.mark.parametrize("flags, error", [
    (["--publish", "/tmp/x"], "--publish needs --cluster NAME"),
    (["--cluster", "east"], "--cluster names what --publish writes"),
    (["--publish", "s3://k:s@bucket/x", "--cluster", "east"], "credentials and options go in the environment"),
])
def test_publish_flags_refused_before_start(flags, error):
    ns = build_parser().parse_args(["analyzer", "--db", "/tmp/never.duckdb", *flags])
    with pytest.raises(UsageError, match=error):
        _analyzer_config(ns, dry_run=False)


def test_publish_flags_make_the_config(monkeypatch):
    from tests.fleet_data import s3_server
    with s3_server(monkeypatch):
        ns = build_parser().parse_args(["analyzer", "--db", "/var/lib/g/a.duckdb", "--publish", "s3://fleet/gpuscope",
                                        "--cluster", "east", "--publish-interval", "1m", "--publish-delay", "2m"])
        p = _analyzer_config(ns, dry_run=False).publish
    assert (p.url, p.cluster, p.interval_s, p.delay_s, p.state_dir) == \
        ("s3://fleet/gpuscope", "east", 60.0, 120.0, "/var/lib/g/a.duckdb.publish")


def test_a_target_it_cannot_write_is_refused_at_start(tmp_path, monkeypatch):
    """Found in a trial: an unwritable directory and an unreachable S3 were
    accepted, and failed at the first pass with rows, minutes later."""
    for url, words in ((str(tmp_path / "file" / "x"), "Not a directory|not a directory|File exists"),
                       ("/proc/gpuscope-fleet", "No such file|Permission denied|Read-only|not permitted"),
                       ("s3://nobucket/x", "nobucket|NoSuchBucket|credentials|Could not connect|endpoint")):
        (tmp_path / "file").write_text("x")
        ns = build_parser().parse_args(["analyzer", "--db", str(tmp_path / "a.duckdb"), "--publish", url,
                                        "--cluster", "east"])
        monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
        with pytest.raises(UsageError, match=f"--publish: .*({words})"):
            _analyzer_config(ns, dry_run=False)
