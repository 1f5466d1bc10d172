"""The straggler rule over a job's ranks (analyzers/stragglers.py): most
ranks wait, one or a few do not (or compute while all wait); the others'
numbers never name a straggler."""
from gpuscope.analyzers import programs as pg
from gpuscope.analyzers.stragglers import StragglerConfig, find_stragglers


def _ranks(verdicts, sm=None, clocks=None, job="slurm:77.0", hosts=2, pid=100):
    runs, interval = [], {}
    for i, v in enumerate(verdicts):
        r = pg.new_run(f"h{i % hosts}", pid + i, "python train.py", 0.0,
                       {"dist_job": job, "rank": str(i), "world_size": str(len(verdicts))})
        r["gpus"] = [i // hosts]
        runs.append(r)
        interval[r["id"]] = dict(verdicts={v: 10}, gpm_sm_util_ratio=(sm or [0.2] * len(verdicts))[i],
                                 sm_clock_hertz=(clocks or [1.98e9] * len(verdicts))[i])
    return runs, interval


def test_the_one_rank_not_waiting_is_named_with_its_slower_clock():
    runs, interval = _ranks(["communication-bound"] * 7 + ["compute-bound"], clocks=[1.98e9] * 7 + [1.5e9])
    (f,) = find_stragglers(runs, interval)
    assert (f["host"], f["gpu"], f["flags"], f["job"]) == ("h1", 3, ["compute-bound"], "slurm:77.0 rank 7")
    assert "rank 7 of 8 of slurm:77.0 (8 ranks seen on 2 hosts) is the straggler on h1: compute-bound, while 7 of 8" \
        in f["summary"]
    assert "SM clock 1.50 GHz vs the job's 1.98 GHz" in f["summary"]
    assert f["evidence"]["rank"] == 7.0 and f["confidence"] == 0.875


def test_when_every_rank_waits_the_one_still_computing_is_the_straggler():
    runs, interval = _ranks(["communication-bound"] * 8, sm=[0.2, 0.21, 0.19, 0.2, 0.22, 0.2, 0.8, 0.2])
    (f,) = find_stragglers(runs, interval)
    assert f["evidence"]["rank"] == 6.0 and "80 % SM activity against the job's 20 %" in f["summary"]


def test_no_straggler_when_ranks_do_not_mostly_wait_or_many_do_not_or_the_job_is_small():
    assert find_stragglers(*_ranks(["compute-bound"] * 7 + ["communication-bound"])) == []
    assert find_stragglers(*_ranks(["communication-bound"] * 5 + ["compute-bound"] * 3)) == []    # 3 of 8: no one rank
    assert find_stragglers(*_ranks(["communication-bound"] * 2 + ["compute-bound"])) == []        # under min_ranks
    runs, interval = _ranks(["communication-bound"] * 3 + ["compute-bound"])
    assert len(find_stragglers(runs, interval, StragglerConfig(min_ranks=4))) == 1


def test_ranks_of_other_jobs_and_processes_of_no_job_are_apart():
    a_runs, a_int = _ranks(["communication-bound"] * 7 + ["compute-bound"], job="torch:run-a")
    b_runs, b_int = _ranks(["compute-bound"] * 8, job="torch:run-b", pid=500)
    lone = pg.new_run("h9", 1, "python notebook.py", 0.0, {})
    found = find_stragglers(a_runs + b_runs + [lone], {**a_int, **b_int, lone["id"]: dict(verdicts={"idle": 9})})
    assert [f["job"] for f in found] == ["torch:run-a rank 7"]


def test_a_restarted_rank_is_its_newest_process_not_another_rank():
    """Found in a trial: a 4-rank job whose rank 3 restarted read "5 ranks
    seen", its old process counted as a waiting rank; a 3-rank job with a
    rank restarted twice was judged as if it had 5."""
    def restarted(runs, interval, rank, host, gpu, times, verdict="communication-bound"):
        for k, start in enumerate(times):
            o = pg.new_run(host, 900 + 10 * rank + k, "python train.py", start,
                           dict(runs[0]["attribution"], rank=str(rank)))
            o["gpus"] = [gpu]
            runs.append(o)
            interval[o["id"]] = dict(verdicts={verdict: 10}, gpm_sm_util_ratio=0.2, sm_clock_hertz=1.98e9)
    runs, interval = _ranks(["communication-bound"] * 3 + ["compute-bound"])
    for r in runs:
        r["start"] = r["end"] = 50.0
    restarted(runs, interval, 3, "h1", 1, [0.0])                 # rank 3's process before its restart
    (f,) = find_stragglers(runs, interval)
    assert "(4 ranks seen on 2 hosts)" in f["summary"] and "3 of 4 ranks wait" in f["summary"]
    assert f["evidence"]["ranks_seen"] == 4.0
    runs, interval = _ranks(["communication-bound"] * 2 + ["compute-bound"])
    restarted(runs, interval, 0, "h0", 0, [-20.0, -10.0])
    assert find_stragglers(runs, interval) == []                 # 3 ranks: under min_ranks
