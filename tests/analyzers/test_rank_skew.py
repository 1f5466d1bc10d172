"""Who arrives last at each collective, from each rank's time inside it
(analyzers/rank_skew.py): clock offsets between hosts change nothing, a
collective missing from one rank's trace is left out, and a job whose
ranks take turns has no straggler."""
from gpuscope.analyzers.rank_skew import skew
from gpuscope.daemon.cmd_dist_jobs import print_skew

MS = 1_000_000


def _ranks(late: dict[str, float], steps: int = 20, offsets: dict[str, int] | None = None, turns: bool = False):
    """Each step's all-reduce ends at the same instant on every rank (none leaves before the last
    arrives); a rank arrives `late[rank]` ms after the first; `offsets`: each host's clock error."""
    out = {}
    for r, lag in late.items():
        off = (offsets or {}).get(r, 0)
        rows = []
        for k in range(steps):
            end = 1_000 * MS + k * 100 * MS
            if turns:                            # each step another rank is the late one
                lag = late[r] if r == str(k % len(late)) else 0
            arrive = end - 30 * MS + int(lag * MS)
            rows.append(["all-reduce", arrive + off, end + off])
        out[r] = rows
    return out


def test_the_rank_that_waits_least_arrived_last_whatever_the_hosts_clocks_say():
    per = _ranks({"0": 0, "1": 2, "2": 25, "3": 1}, offsets={"2": 7 * MS, "3": -4 * MS})
    r = skew(per, {"0": "a", "1": "a", "2": "b", "3": "b"})
    assert r["collectives"] == 20 and r["straggler"]["rank"] == "2" and r["straggler"]["host"] == "b"
    assert r["straggler"]["last_share"] == 1.0
    assert abs(r["straggler"]["arrives_late_by_seconds"] - 0.025) < 1e-9
    assert abs(r["per_rank"]["0"]["wait_seconds_mean"] - 0.030) < 1e-9


def test_a_collective_missing_from_a_rank_s_trace_is_not_matched():
    per = _ranks({"0": 0, "1": 10})
    per["1"] = per["1"][3:]                      # its trace started three steps later
    assert skew(per)["collectives"] == 17


def test_ranks_that_take_turns_have_no_straggler_and_one_rank_is_nothing_to_compare():
    per = _ranks({"0": 20, "1": 20, "2": 20, "3": 20}, turns=True)
    r = skew(per)
    assert r["collectives"] == 20 and r["straggler"] is None
    assert skew({"0": _ranks({"0": 0})["0"]})["collectives"] == 0


def test_the_table_an_on_call_reads(capsys):
    r = skew(_ranks({"0": 0, "1": 25}), {"0": "node-a", "1": "node-b"})
    r["captures"] = [dict(rank="0", id="c0", host="node-a", status="ok", error="", collectives=20),
                     dict(rank="1", id="c1", host="node-b", status="ok", error="", collectives=20)]
    print_skew(r, 3)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("1 of 3 ranks did not report in time")
    assert out[-2] == "20 collectives matched across ranks: arrival skew p50 25.0 ms, p90 25.0 ms, max 25.0 ms"
    assert out[-1] == ("straggler from the traces: rank 1 on node-b, last at 100 % of the collectives, 25.0 ms "
                       "after the first to arrive (median)")
