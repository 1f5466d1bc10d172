"""Runs against their program's baseline (analyzers/programs.py,
program_check.py): the store's processes, samples and windows made into
runs, one fleet check at a time, and a run that departs from its earlier
runs found with the numbers that say how."""
import json

import pytest

from gpuscope.analyzers import programs as pg
from gpuscope.analyzers.program_check import CURSOR, ProgramCheck
from gpuscope.analyzers.store import Store, StoreConfig

CONFIG = pg.ProgramsConfig(min_run_s=50.0, lag_s=0.0)
CMD = "python3.11 /home/ci/jobs/run-{n}/train.py --lr 3e-4 --seed {n} --output-dir /ckpt/run-{n}"


@pytest.fixture
def store(tmp_path):
    s = Store(StoreConfig(str(tmp_path / "p.duckdb")))
    yield s
    s.close()


def put_run(store, host, pid, command, t0, seconds=60, gpus=(0,), dram=0.8, sm=0.9, verdict="memory-bound",
            others=()):
    """A process on its GPUs for `seconds` at 1 Hz, their samples and 5 s windows; `others`: pids sharing them."""
    con = store._con
    for g in gpus:
        for i in range(seconds):
            t = t0 + i
            for p, c in ((pid, command),) + tuple(others):
                con.execute("INSERT INTO processes (host, gpu, t, pid, command) VALUES (?, ?, ?, ?, ?)",
                            [host, g, t, p, c])
            con.execute("INSERT INTO samples (host, gpu, t, util_gpu_ratio, gpm_sm_util_ratio, gpm_dram_bw_util_ratio,"
                        " power_watts) VALUES (?, ?, ?, 1.0, ?, ?, 500)", [host, g, t, sm, dram])
        for w in range(0, seconds, 5):
            con.execute('INSERT INTO windows (host, gpu, start, "end", verdict) VALUES (?, ?, ?, ?, ?)',
                        [host, g, t0 + w, t0 + w + 5, verdict])


def check(store, now):
    c = ProgramCheck(store, CONFIG)
    runs, cursor, _ = c.collect(now)
    found = c.judge(runs, {})
    c.apply(runs, cursor)
    return runs, found


def test_runs_of_one_program_on_many_hosts_make_its_baseline_and_a_slow_one_is_found(store):
    for n, host in enumerate(("h1", "h2", "h3", "h4")):
        put_run(store, host, 100 + n, CMD.format(n=n), 1000.0 + n * 100, dram=0.80 + n * 0.01)
    runs, found = check(store, 1500.0)
    assert len(runs) == 4 and not found
    assert len({r["command_fp"] for r in runs}) == 1          # seeds, run dirs and output paths are not the program
    assert {r["name"] for r in runs} == {"python train.py"}
    r = min(runs, key=lambda r: r["start"])
    assert (r["gpus"], r["sampled_s"], r["verdicts"]) == ([0], 59.0, {"memory-bound": 12})
    assert pg.mean(r, "gpm_dram_bw_util_ratio") == pytest.approx(0.80)
    # the same program later, on h9, with DRAM well under its earlier runs'
    put_run(store, "h9", 555, CMD.format(n=9), 1600.0, gpus=(2, 3), dram=0.55)
    runs, found = check(store, 1700.0)
    assert [r["host"] for r in runs] == ["h9"]
    assert [(f["host"], f["gpu"]) for f in found] == [("h9", 2), ("h9", 3)]
    f = found[0]
    assert f["flags"] == ["lower-activity"] and f["key"] == f"regression:{runs[0]['id']}:2"
    assert f["summary"].startswith("python train.py (same command line as 4 earlier runs) is off its baseline on h9: "
                                   "memory-bound, DRAM activity 55 % vs baseline 82 %")
    assert f["evidence"]["gpm_dram_bw_util_ratio"] == pytest.approx(0.55)
    assert f["evidence"]["baseline_gpm_dram_bw_util_ratio"] == pytest.approx(0.815)
    assert f["job"].startswith("pid:555 python3.11")
    assert store.meta_float(CURSOR) == 1700.0


def test_a_run_is_extended_check_after_check_and_judged_once_it_has_run_long_enough(store):
    for n in range(3):
        put_run(store, f"h{n}", 10 + n, CMD.format(n=n), 1000.0 + n * 70)
    check(store, 1300.0)
    put_run(store, "h9", 99, CMD.format(n=9), 1400.0, seconds=30, dram=0.4)
    runs, found = check(store, 1430.0)
    assert runs[0]["sampled_s"] == 29.0 and not found      # too short to judge yet
    put_run(store, "h9", 99, CMD.format(n=9), 1430.0, seconds=40, dram=0.4)
    runs, found = check(store, 1470.0)
    assert len(runs) == 1 and runs[0]["sampled_s"] == 69.0 and runs[0]["start"] == 1400.0
    assert [f["flags"] for f in found] == [["lower-activity"]]
    assert len(store.program_runs()) == 4


def test_a_gpu_shared_by_two_processes_says_nothing_of_either(store):
    for n in range(3):
        put_run(store, f"h{n}", 10 + n, CMD.format(n=n), 1000.0 + n * 70)
    put_run(store, "h9", 99, CMD.format(n=9), 1300.0, dram=0.3, others=((7, "python notebook.py"),))
    runs, found = check(store, 1400.0)
    shared = next(r for r in runs if r["pid"] == 99)
    assert shared["signature"] == {} and shared["verdicts"] == {} and not found


def test_a_different_verdict_is_a_regression_even_at_the_same_activity(store):
    for n in range(3):
        put_run(store, f"h{n}", 10 + n, CMD.format(n=n), 1000.0 + n * 70, verdict="compute-bound")
    put_run(store, "h9", 99, CMD.format(n=9), 1300.0, verdict="host-bound")
    _, found = check(store, 1400.0)
    assert found[0]["flags"] == ["verdict"]
    assert "host-bound, where its earlier runs were compute-bound" in found[0]["summary"]


def test_too_few_earlier_runs_make_no_baseline(store):
    for n in range(2):
        put_run(store, f"h{n}", 10 + n, CMD.format(n=n), 1000.0 + n * 70)
    put_run(store, "h9", 99, CMD.format(n=9), 1300.0, dram=0.1)
    assert check(store, 1400.0)[1] == []


def test_a_run_after_a_gap_is_a_new_run_and_a_restart_goes_on_from_the_cursor(tmp_path):
    path = str(tmp_path / "r.duckdb")
    s = Store(StoreConfig(path))
    put_run(s, "h1", 42, "python serve.py", 1000.0)
    check(s, 1100.0)
    s.close()
    s = Store(StoreConfig(path))
    try:
        put_run(s, "h1", 42, "python serve.py", 1100.0 + CONFIG.run_gap_s + 1)
        runs, _ = check(s, 1100.0 + CONFIG.run_gap_s + 100)
        assert len(runs) == 1 and runs[0]["start"] == 1100.0 + CONFIG.run_gap_s + 1
        assert len(s.program_runs()) == 2
    finally:
        s.close()


def _run(**kw):
    r = pg.new_run("h1", 1, "python x.py", 0.0, {})
    r.update(sampled_s=1000.0, **kw)
    return r


def test_a_slower_step_says_how_much_slower_against_the_same_hlo():
    earlier = [_run(step_seconds=s, hlo_fp="abc") for s in (0.100, 0.101, 0.099, 0.100)]
    run = _run(step_seconds=0.123, hlo_fp="abc", name="jit_train_step")
    j = pg.judge(run, earlier, pg.ProgramsConfig(), same="HLO")
    assert j["flags"] == ["slower-step"]
    assert j["summary"].startswith("jit_train_step (same HLO as 4 earlier runs) is 23 % slower on h1: step 123 ms "
                                   "vs 100 ms")
    assert j["evidence"]["step_ratio"] == pytest.approx(1.23)
    # within the bound: not a regression
    assert pg.judge(_run(step_seconds=0.110, hlo_fp="abc"), earlier, pg.ProgramsConfig()) is None


def test_a_serving_engine_is_slower_only_at_a_comparable_load():
    def serving(itl, running):
        return _run(signature={"serving_itl_p50_seconds": [itl * 10, 10], "serving_requests_running": [running * 10, 10]})
    earlier = [serving(0.020, 16), serving(0.021, 15), serving(0.020, 17)]
    j = pg.judge(serving(0.030, 16), earlier, pg.ProgramsConfig())
    assert j["flags"] == ["slower-latency"] and "is 50 % slower" in j["summary"]
    assert pg.judge(serving(0.030, 64), earlier, pg.ProgramsConfig()) is None      # 4x the load: not comparable


def test_a_new_top_op_and_a_degraded_gpu_are_named():
    earlier = [_run(top_ops=["fusion.1", "gemm.2"]), _run(top_ops=["fusion.1"]), _run(top_ops=["gemm.2", "fusion.1"])]
    degraded = [dict(gpu=0, summary="HBM 3.6 TB/s, 18 % under the median of 7 peers")]
    j = pg.judge(_run(top_ops=["all-reduce.3"]), earlier, pg.ProgramsConfig(), degraded)
    assert j["flags"] == ["top-op"]
    assert "top op all-reduce.3, never in its earlier runs' top ops" in j["summary"]
    assert j["summary"].endswith("; gpu 0 is degraded: HBM 3.6 TB/s, 18 % under the median of 7 peers")


def test_run_rows_round_trip_through_the_store(store):
    r = _run(signature={"power_watts": [10.0, 2]}, verdicts={"idle": 3}, top_ops=["a"], captures=["c1"])
    r["gpus"] = [0, 1]
    store.upsert_program_runs([pg.run_row(r)])
    back = pg.run_from_row(store.program_runs()[0])
    assert {k: back[k] for k in r} == r
    assert json.loads(json.dumps(store.programs()[0], default=str))["runs"] == 1


def test_the_ranks_of_one_launch_are_not_each_other_s_baseline(store):
    # eight ranks of one job started together on two hosts; one rank is slower: a straggler, not a regression
    for rank in range(8):
        put_run(store, f"h{rank // 4}", 200 + rank, CMD.format(n=rank), 1000.0 + rank * 0.5, gpus=(rank % 4,),
                dram=0.4 if rank == 5 else 0.8)
    assert check(store, 1100.0)[1] == []
    # another job, in one Slurm allocation, whose ranks came up minutes apart, one after the other on one GPU
    other = "python3 eval.py --suite mmlu --seed {n}"
    for rank in range(4):
        put_run(store, "h7", 300 + rank, other.format(n=rank), 2000.0 + rank * 120, dram=0.4 if rank == 3 else 0.8)
    store._con.execute("UPDATE processes SET slurm_job = '991' WHERE host = 'h7'")
    runs, found = check(store, 2600.0)
    assert found == []
    # each held the GPU alone in its own time: each has its own signature
    assert sorted(round(pg.mean(r, "gpm_dram_bw_util_ratio"), 2) for r in runs) == [0.4, 0.8, 0.8, 0.8]
    # the allocation's ranks are the baseline of a later run of the same job
    put_run(store, "h8", 400, other.format(n=9), 3000.0, dram=0.3)
    assert [f["host"] for f in check(store, 3100.0)[1]] == ["h8"]


def test_a_serving_engine_s_program_is_listed_as_serving(store):
    from gpuscope.analyzers.program_list import list_programs
    serve = "/usr/bin/python3 /usr/local/bin/vllm serve meta-llama/Llama-3.1-8B --port {n}"
    for n in range(2):
        put_run(store, f"h{n}", 10 + n, serve.format(n=8000 + n), 1000.0 + n * 70)
    put_run(store, "h5", 20, CMD.format(n=5), 1000.0)
    check(store, 1300.0)
    kinds = {p["name"]: p["kind"] for p in list_programs(store, 0.0)}
    assert kinds == {"vllm meta-llama/Llama-3.1-8B": "serving", "python train.py": "command"}
    (one,) = list_programs(store, 0.0, fingerprint=pg.command_fingerprint(serve.format(n=1)).value)
    assert one["kind"] == "serving" and one["runs"] == 2
