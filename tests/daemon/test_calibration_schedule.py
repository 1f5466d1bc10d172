"""The agent's weekly calibration: only on a GPU idle long enough, never
beside a job (a job arriving stops it), remembered across restarts, and a
failure retried later, said once. The child is a real process."""
import json
import sys
import time

from gpuscope.collectors.records import DeviceInfo
from gpuscope.daemon.calibration_schedule import CalibrationSchedule, ScheduleConfig


class View:
    def __init__(self):
        self.latest = {0: {"util_gpu_ratio": 0.0}, 1: {"util_gpu_ratio": 0.0}}
        self.pids: dict[int, list[int]] = {}

    def devices(self):
        return [DeviceInfo(gpu=g, uuid=f"GPU-{g}", name="NVIDIA H200") for g in (0, 1)]

    def gpu_pids(self):
        return dict(self.pids)


def _schedule(tmp_path, script: str, **kw):
    clock = [1000.0]
    view = View()
    launched = []

    def command(gpu):
        launched.append(gpu)
        return [sys.executable, "-c", script]
    cfg = ScheduleConfig(state_path=str(tmp_path / "state" / "calibrations.json"), every_s=86400, idle_for_s=600,
                         retry_s=3600, timeout_s=kw.pop("timeout_s", 60), **kw)
    return CalibrationSchedule(cfg, view, command, clock=lambda: clock[0]), view, clock, launched


def _finish(s, clock, step=1.0, limit=30.0):
    deadline = time.monotonic() + limit
    while s.running is not None and time.monotonic() < deadline:
        time.sleep(0.05)
        clock[0] += step
        s.tick()


def test_only_a_gpu_idle_long_enough_is_calibrated_and_the_result_is_remembered(tmp_path):
    s, view, clock, launched = _schedule(tmp_path, "pass")
    view.latest[0]["util_gpu_ratio"] = 0.9          # GPU 0 works
    view.pids = {4242: [1]}                         # GPU 1 holds a job, however quiet
    view.latest[1]["util_gpu_ratio"] = 0.0
    for _ in range(3):
        s.tick()
        clock[0] += 400
    assert launched == []
    view.pids = {}                                   # the job on GPU 1 ends
    s.tick()
    clock[0] += 599
    s.tick()
    assert launched == []                            # idle 599 s: the gap between two jobs of a queue
    clock[0] += 1
    s.tick()
    assert launched == [1] and s.running is not None
    _finish(s, clock)
    assert s.last_done == {"GPU-1": clock[0]}
    saved = json.loads((tmp_path / "state" / "calibrations.json").read_text())
    assert saved == {"last_calibrated": {"GPU-1": clock[0]}}
    # a restarted agent does not measure it again within the interval
    again, view2, clock2, launched2 = _schedule(tmp_path, "pass")
    clock2[0] = clock[0] + 1000
    view2.latest[0]["util_gpu_ratio"] = 0.9
    again.tick()
    clock2[0] += 700
    again.tick()
    assert launched2 == []


def test_a_job_arriving_stops_the_run_and_it_is_tried_again_once_the_gpu_is_idle_again(tmp_path):
    s, view, clock, launched = _schedule(tmp_path, "import time; time.sleep(60)")
    view.latest[1]["util_gpu_ratio"] = 0.9
    s.tick()
    clock[0] += 600
    s.tick()
    assert launched == [0]
    child = s.running[2]
    s.tick()
    assert s.running is not None                       # its own process on the GPU is no intruder
    view.pids = {child.pid: [0]}
    s.tick()
    assert s.running is not None
    view.pids = {child.pid: [0], 777: [0]}
    s.tick()
    assert s.running is None and child.poll() is not None
    assert "GPU-0" not in s.failed_at and s.last_done == {}
    view.pids = {}
    s.tick()
    clock[0] += 600
    s.tick()
    assert launched == [0, 0]
    s.stop()
    assert child.poll() is not None


def test_a_failure_is_said_once_and_retried_after_the_retry_interval(tmp_path):
    script = "import sys; print('noise\\n' * 20000, file=sys.stderr); " \
             "print('gpuscope calibrate: error: no GPU is visible to JAX', file=sys.stderr); sys.exit(2)"
    s, view, clock, launched = _schedule(tmp_path, script)
    view.latest[1]["util_gpu_ratio"] = 0.9
    s.tick()
    clock[0] += 600
    s.tick()
    _finish(s, clock)
    assert s.last_error["GPU-0"] == "exit 2: gpuscope calibrate: error: no GPU is visible to JAX"
    assert s.last_done == {}
    clock[0] += 1800
    s.tick()
    assert launched == [0]                             # not before retry_s
    clock[0] += 1800
    s.tick()
    assert launched == [0, 0]
    _finish(s, clock)


def test_a_run_past_its_timeout_is_killed(tmp_path):
    s, view, clock, launched = _schedule(tmp_path, "import time; time.sleep(60)", timeout_s=5)
    view.latest[1]["util_gpu_ratio"] = 0.9
    s.tick()
    clock[0] += 600
    s.tick()
    child = s.running[2]
    clock[0] += 6
    s.tick()
    assert s.running is None and child.poll() is not None
    assert s.last_error["GPU-0"] == "ran past 5 s"


def test_the_agent_s_flags_become_a_calibrate_command_the_real_parser_takes(tmp_path, monkeypatch):
    """The child presents the agent's own certificate to the agent's analyzer, for the agent's host."""
    from gpuscope.daemon import cmd_serve
    from gpuscope.daemon.cli import build_parser

    p = build_parser()
    ns = p.parse_args(["agent", "--analyzer", "an.example:9403", "--host", "h7", "--tls-dir", str(tmp_path / "tls"),
                       "--tls-server-name", "analyzer", "--capture-dir", str(tmp_path / "cap"),
                       "--calibrate-every", "1d", "--calibrate-idle", "30m"])
    started = []
    monkeypatch.setattr(CalibrationSchedule, "start", lambda self: started.append(self))
    s = cmd_serve._calibration_schedule(View(), ns, "nvml (GPM)")
    assert started == [s] and s.config.every_s == 86400 and s.config.idle_for_s == 1800
    assert s.config.state_path == str(tmp_path / "calibrations.json")
    argv = s.command(3)
    assert argv[:3] == [sys.executable, "-m", "gpuscope.daemon.cli"]
    child = p.parse_args(argv[3:])
    assert (child.gpu, child.quick, child.send, child.host, child.tls_dir, child.tls_server_name, child.force) == (
        3, True, "an.example:9403", "h7", str(tmp_path / "tls"), "analyzer", False)
    # nothing to send to, a recording, or 0: no schedule
    assert cmd_serve._calibration_schedule(View(), p.parse_args(["agent"]), "nvml") is None
    assert cmd_serve._calibration_schedule(View(), ns, "replay:/x.csv") is None
    ns.calibrate_every = 0.0
    assert cmd_serve._calibration_schedule(View(), ns, "nvml") is None
