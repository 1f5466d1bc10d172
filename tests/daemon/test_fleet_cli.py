"""`gpuscope fleet`: the named questions and SQL over published Parquet, as
people read them and as scripts do, from a directory and from a real S3
server, and errors that say what to do."""
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from gpuscope.analyzers import fleet_layout as lay
from gpuscope.daemon.cli import main
from tests.fleet_data import s3_server

DAY0 = 1794960000.0                 # 2026-11-18 00:00 UTC
ROLL_OUT = DAY0 + 2 * 86400         # 2026-11-20 00:00 UTC: the "driver roll-out"


def _rollups(hours: int, verdict, job="python train.py", pod=None, gpus=2) -> pa.Table:
    """Per-minute rows of `hours` hours from the segment's start; verdict(m) by minute."""
    m = np.repeat(np.arange(hours * 60), gpus)
    return pa.table({"gpu": pa.array(np.tile(np.arange(gpus, dtype=np.int32), hours * 60)),
                     "t": pa.array(m * 60.0), "samples": pa.array(np.full(len(m), 60, np.int64)),
                     "verdict": pa.array([verdict(int(x)) for x in m]), "job": pa.array([job] * len(m)),
                     "namespace": pa.array(["ml" if pod else None] * len(m), pa.string()),
                     "pod": pa.array([pod] * len(m), pa.string()),
                     "slurm_job": pa.nulls(len(m), pa.string()),
                     "util_gpu_ratio": pa.array(np.full(len(m), 0.5)),
                     "gpm_dram_bw_util_ratio": pa.array(np.full(len(m), 0.9))})


def _put(root, cluster, host, day: float, rows: pa.Table, lo=0, hi=1440):
    rows = rows.set_column(1, "t", pa.array(np.asarray(rows["t"]) + day))
    seg = lay.Segment("rollups", lay.date_of(day), cluster, host, lo, hi)
    path = root / seg.key
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(rows, path)


@pytest.fixture(autouse=True)
def _logs_stay(monkeypatch):
    """main() points the logs at this test's captured stderr, closed after
    it; later tests' loggers must not write there."""
    monkeypatch.setattr("gpuscope.daemon.logs.configure", lambda *a, **k: None)


@pytest.fixture()
def tier(tmp_path):
    """Four days of three hosts: node-a goes memory-bound at the roll-out,
    node-b stays compute-bound, node-c (another cluster) is memory-bound
    throughout, with its job in a pod."""
    root = tmp_path / "fleet"
    for d in range(4):
        day = DAY0 + d * 86400
        after = day >= ROLL_OUT
        _put(root, "east", "node-a", day, _rollups(24, lambda m, a=after: "memory-bound" if a else "compute-bound"))
        _put(root, "east", "node-b", day, _rollups(24, lambda m: "compute-bound", job="python gemm.py"))
        _put(root, "west", "node-c", day, _rollups(12, lambda m: "memory-bound" if m % 2 else "idle",
                                                   job="vllm serve", pod="llm-0"))
    # a compaction's leftover: contained in node-b's day segment, never counted
    _put(root, "east", "node-b", DAY0, _rollups(1, lambda m: "compute-bound", job="python gemm.py"), 0, 60)
    return root


def _run(capsys, *argv) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def test_top_jobs_ranks_bottlenecked_gpu_minutes(tier, capsys):
    end = str(DAY0 + 4 * 86400)
    rc, out, _ = _run(capsys, "fleet", "query", "top-jobs", "--from", str(tier), "--start", "2026-11-18",
                      "--end", end, "--json")
    assert rc == 0
    rows = json.loads(out)["rows"]
    # every minute of node-a and node-b is a bottleneck (2 GPUs x 4 days); node-c's are half idle
    assert [(r["group"], r["gpu_minutes"], r["main_verdict"]) for r in rows] == [
        ("node-a: python train.py", 2 * 4 * 1440, "memory-bound"),      # a tie: the later name, as `top` does
        ("node-b: python gemm.py", 2 * 4 * 1440, "compute-bound"),
        ("node-c: vllm serve", 2 * 4 * 360, "memory-bound")]
    assert rows[0]["verdicts"] == [{"verdict": "memory-bound", "minutes": 5760},
                                   {"verdict": "compute-bound", "minutes": 5760}]
    assert rows[0]["gpus"] == 2 and rows[0]["hosts"] == 1 and rows[0]["gpm_dram_bw_util_ratio"] == pytest.approx(0.9)

    rc, out, _ = _run(capsys, "fleet", "query", "top-jobs", "--from", str(tier), "--start", "2026-11-18",
                      "--end", end, "--verdict", "memory-bound", "--by", "pod")
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith("pods with the most GPU-minutes memory-bound, 2026-11-18 00:00 -> 2026-11-22 00:00 UTC")
    assert "ml/llm-0" in lines[2] and "2,880" in lines[2] and "memory-bound (100 %)" in lines[2] and "90 %" in lines[2]
    assert len([x for x in lines if x.strip()[:1].isdigit()]) == 1

    rc, out, _ = _run(capsys, "fleet", "query", "top-jobs", "--from", str(tier), "--start", "2026-11-18",
                      "--end", end, "--cluster", "west", "--json")
    assert [r["group"] for r in json.loads(out)["rows"]] == ["node-c: vllm serve"]


def test_hosts_changed_after_a_roll_out(tier, capsys):
    rc, out, _ = _run(capsys, "fleet", "query", "hosts-changed", "--from", str(tier), "--after", "2026-11-20T00:00",
                      "--to", "memory-bound", "--window", "2d", "--json")
    assert rc == 0
    rows = json.loads(out)["rows"]
    assert [(r["host"], r["before_share"], r["after_share"], r["before_verdict"], r["after_verdict"])
            for r in rows] == [("node-a", 0.0, 1.0, "compute-bound", "memory-bound")]
    rc, out, _ = _run(capsys, "fleet", "query", "hosts-changed", "--from", str(tier), "--after", "2026-11-20",
                      "--to", "memory-bound", "--window", "2d")
    assert "east         node-a" in out and "+100 pt" in out and "compute-bound -> memory-bound" in out
    rc, out, _ = _run(capsys, "fleet", "query", "hosts-changed", "--from", str(tier), "--after", "2026-11-20",
                      "--to", "launch-bound")
    assert "none: no host's launch-bound share grew that much" in out


def test_sql_over_the_views(tier, capsys):
    rc, out, _ = _run(capsys, "fleet", "sql", "SELECT cluster, count(DISTINCT host) AS hosts, count(*) AS minutes "
                      "FROM rollups GROUP BY ALL ORDER BY cluster", "--from", str(tier))
    assert rc == 0
    assert out.splitlines() == ["cluster  hosts  minutes", "east         2   23,040", "west         1    5,760"]
    rc, out, _ = _run(capsys, "fleet", "sql", "SELECT DISTINCT date FROM rollups ORDER BY 1", "--from", str(tier),
                      "--since", "3650d", "--json")
    assert [r["date"] for r in json.loads(out)["rows"]] == ["2026-11-18", "2026-11-19", "2026-11-20", "2026-11-21"]


def test_errors_say_what_to_do(tmp_path, tier, capsys, monkeypatch):
    monkeypatch.delenv("GPUSCOPE_FLEET", raising=False)
    rc, _, err = _run(capsys, "fleet", "query", "top-jobs")
    assert rc == 1 and "--from DIR, s3://BUCKET/PREFIX or gs://BUCKET/PREFIX (or $GPUSCOPE_FLEET)" in err
    rc, _, err = _run(capsys, "fleet", "query", "top-jobs", "--from", str(tmp_path / "nothing"))
    assert rc == 1 and "no rollups files under" in err and "--publish URL --cluster NAME" in err
    rc, _, err = _run(capsys, "fleet", "query", "hosts-changed", "--from", str(tier), "--after", "last tuesday",
                      "--to", "memory-bound")
    assert rc == 1 and "bad time 'last tuesday': give ISO 8601 like 2026-11-20T00:00" in err
    rc, _, err = _run(capsys, "fleet", "sql", "SELECT * FROM samples", "--from", str(tier))
    assert rc == 1 and "views here: rollups" in err
    rc, _, err = _run(capsys, "fleet", "sql", "SELEC 1", "--from", str(tier))
    assert rc == 1 and "syntax error" in err.lower()
    rc, _, err = _run(capsys, "fleet", "query", "top-jobs", "--from", "ftp://x/y")
    assert rc == 1 and "expected a directory, s3://BUCKET/PREFIX or gs://BUCKET/PREFIX" in err


def test_the_same_answers_from_s3(tier, capsys, monkeypatch, tmp_path):
    with s3_server(monkeypatch):
        import boto3
        s3 = boto3.client("s3")
        for path in tier.rglob("*.parquet"):
            s3.upload_file(str(path), "fleet", f"tier/{path.relative_to(tier)}")
        argv = ["fleet", "query", "top-jobs", "--start", "2026-11-18", "--end", str(DAY0 + 4 * 86400), "--json"]
        rc, local, _ = _run(capsys, *argv, "--from", str(tier))
        rc, remote, _ = _run(capsys, *argv, "--from", "s3://fleet/tier")
        assert rc == 0 and json.loads(remote)["rows"] == json.loads(local)["rows"]
        # no credentials anywhere: said, with what to set
        for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.delenv(k)
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        rc, _, err = _run(capsys, *argv, "--from", "s3://fleet/tier")
        assert rc == 1 and "no S3 credentials" in err and "AWS_ACCESS_KEY_ID" in err
