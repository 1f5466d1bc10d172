"""Runs of programs and their baselines: "slower than usual" as a finding
(docs/programs.md).

A run is one process of one command on one host, from the first to the
last time its agent listed it on a GPU. Each fleet check adds what the
store received since the last one to the runs it covers: the counters of
the GPUs the run held alone (a GPU shared by two processes says nothing of
either), the verdicts of their windows, and, when a capture of the process
lands, its program's HLO fingerprint, step time and top ops.

A run's program is its HLO fingerprint when a capture saw it, else its
command line's (fingerprints.py). Its baseline is the runs of the same
program that started before it, on any host: the median of each figure and
the median absolute deviation around it. A run departs from its baseline,
and the check opens a `regression` finding on each GPU it holds, when:
- its step (or a serving engine's inter-token latency, at a comparable
  load) is slower by at least `slower_ratio` AND by `max_z` robust
  deviations;
- the activity its program lives on (SM, tensor, DRAM, or utilisation
  without GPM) is under the baseline by `activity_drop` AND `max_z`;
- its verdict is not its program's (most of its windows one verdict, most
  earlier runs another);
- its captures' top op is none of the earlier runs' top ops.
A baseline needs `min_runs` earlier runs of `min_run_s` sampled seconds
each; a run is judged once it has that much itself.
"""
from __future__ import annotations

import hashlib
import json
import statistics
from dataclasses import dataclass

from gpuscope.collectors.human import percent, value as human_value

from .degraded import MAD_TO_SIGMA
from .fingerprints import command_fingerprint

# metric -> (how a summary names it, its unit for collectors/human.py)
SIGNATURE = {
    "util_gpu_ratio": ("utilisation", "ratio"),
    "gpm_sm_util_ratio": ("SM activity", "ratio"),
    "gpm_tensor_util_ratio": ("tensor activity", "ratio"),
    "gpm_dram_bw_util_ratio": ("DRAM activity", "ratio"),
    "power_watts": ("power", "watts"),
    "sm_clock_hertz": ("SM clock", "hertz"),
    "serving_generation_tokens_per_second": ("tokens/s", "1/s"),
    "serving_itl_p50_seconds": ("inter-token latency", "seconds"),
    "serving_requests_running": ("requests running", "count"),
}
# What a program's speed shows in when no step time is known: the activities, richest first.
ACTIVITIES = ("gpm_dram_bw_util_ratio", "gpm_tensor_util_ratio", "gpm_sm_util_ratio", "util_gpu_ratio")
MIN_ACTIVITY = 0.05         # an activity its program barely uses says nothing of its speed
BRIDGE_S = 60.0             # a process listed again this soon after was there in between
RELATIVE_NOISE = 0.02       # runs of one program differ by at least this much: the MAD's floor
RUN_COLUMNS = ("id", "host", "pid", "command", "command_fp", "hlo_fp", "name", "job", "gpus", "attribution",
               "start", "end", "sampled_s", "signature", "verdicts", "step_seconds", "step_captures", "top_ops",
               "captures", "updated")


@dataclass(frozen=True)
class ProgramsConfig:
    min_run_s: float = 600.0        # sampled seconds before a run is judged or counts in a baseline
    min_runs: int = 3               # earlier runs a baseline needs
    baseline_runs: int = 50         # the newest earlier runs a baseline is made of
    slower_ratio: float = 1.15      # step or latency at least 15 % longer...
    activity_drop: float = 0.15     # ... or the program's activity at least 15 % under its baseline
    max_z: float = 3.0              # ... and past this many robust deviations of the baseline's runs
    majority: float = 0.6           # a verdict is a run's (or its program's) when it holds this share
    run_gap_s: float = 600.0        # a process not listed for this long has ended (a new one is a new run)
    sibling_s: float = 60.0         # runs started this close together are ranks of one launch, not a baseline
    lag_s: float = 60.0             # a check covers samples up to this long ago: late batches still count


def run_id(host: str, pid: int, command: str, start: float) -> str:
    return hashlib.sha256(f"{host}\x00{pid}\x00{command}\x00{start!r}".encode()).hexdigest()[:16]


def new_run(host: str, pid: int, command: str, start: float, attribution: dict) -> dict:
    fp = command_fingerprint(command)
    return dict(id=run_id(host, pid, command, start), host=host, pid=pid, command=command,
                command_fp=fp.value if fp else None, hlo_fp=None, name=fp.name if fp else f"pid {pid}",
                job=f"pid:{pid}" + (f" {command}" if command else ""), gpus=[], attribution=attribution,
                start=start, end=start, sampled_s=0.0, signature={}, verdicts={}, step_seconds=None,
                step_captures=0, top_ops=[], captures=[], updated=start)


def add_presence(run: dict, gpus: list[int], first: float, last: float) -> None:
    """The process listed from `first` to `last`: seen again within
    BRIDGE_S of where the run stood, it ran in between too (each check
    sees the samples after its cursor only)."""
    begin = first if first - run["end"] > BRIDGE_S else run["end"]
    run["gpus"] = sorted(set(run["gpus"]) | set(gpus))
    run["sampled_s"] += max(0.0, last - begin)
    run["end"] = max(run["end"], last)


def add_signature(run: dict, sums: dict[str, tuple[float, int]]) -> None:
    """`sums`: metric -> (sum, count) over new samples."""
    sig = run["signature"]
    for m, (s, n) in sums.items():
        if n:
            old = sig.get(m, (0.0, 0))
            sig[m] = [old[0] + s, old[1] + n]


def add_verdicts(run: dict, counts: dict[str, int]) -> None:
    for v, n in counts.items():
        run["verdicts"][v] = run["verdicts"].get(v, 0) + n


def add_capture(run: dict, capture_id: str, program: dict, top_ops: list[str]) -> None:
    """A capture of the run's process: its program's HLO fingerprint becomes
    the run's program; the step is averaged over the run's captures."""
    if capture_id in run["captures"]:
        return
    run["captures"] = run["captures"][-19:] + [capture_id]
    if program.get("kind") == "hlo":
        run["hlo_fp"] = program["fingerprint"]
        run["name"] = program["name"]
    step = program.get("step_seconds")
    if step:
        n = run["step_captures"]
        run["step_seconds"] = ((run["step_seconds"] or 0.0) * n + step) / (n + 1)
        run["step_captures"] = n + 1
    if top_ops:
        run["top_ops"] = top_ops[:3]


def siblings(a: dict, b: dict, config: ProgramsConfig) -> bool:
    """Two runs of one launch (the ranks of a job): started together, or in
    one Slurm job. A job slow as a whole is as slow in each of its ranks, so
    its ranks are never each other's baseline."""
    slurm = (a.get("attribution") or {}).get("slurm_job")
    if slurm and slurm == (b.get("attribution") or {}).get("slurm_job"):
        return True
    return abs(a["start"] - b["start"]) < config.sibling_s


def mean(run: dict, metric: str) -> float | None:
    s = run["signature"].get(metric)
    return s[0] / s[1] if s and s[1] else None


def majority_verdict(verdicts: dict[str, int], share: float) -> str | None:
    total = sum(verdicts.values())
    if not total:
        return None
    v, n = max(verdicts.items(), key=lambda kv: kv[1])
    return v if n / total >= share else None


@dataclass(frozen=True)
class Spread:
    median: float
    mad: float           # scaled to a standard deviation, floored at RELATIVE_NOISE of the median
    runs: int

    def z(self, x: float) -> float:
        return (x - self.median) / self.mad if self.mad else 0.0


def spread(values: list[float]) -> Spread | None:
    vals = [v for v in values if v is not None]
    if not vals:
        return None
    med = statistics.median(vals)
    mad = statistics.median(abs(v - med) for v in vals) * MAD_TO_SIGMA
    return Spread(med, max(mad, RELATIVE_NOISE * abs(med)), len(vals))


def baseline(earlier: list[dict], config: ProgramsConfig) -> dict:
    """The figures of a program's earlier runs (each judged long enough)."""
    runs = [r for r in earlier if r["sampled_s"] >= config.min_run_s]
    out: dict = dict(runs=len(runs), metrics={}, step=spread([r["step_seconds"] for r in runs]))
    for m in SIGNATURE:
        s = spread([mean(r, m) for r in runs])
        if s is not None:
            out["metrics"][m] = s
    majors = [majority_verdict(r["verdicts"], config.majority) for r in runs]
    out["verdict"] = majority_verdict({v: majors.count(v) for v in set(majors) if v}, config.majority)
    with_ops = [r["top_ops"] for r in runs if r["top_ops"]]
    out["top_ops"] = sorted({op for ops in with_ops for op in ops}) if len(with_ops) >= 2 else None
    return out


def judge(run: dict, earlier: list[dict], config: ProgramsConfig, degraded: list[dict] = (),
          same: str = "command line", base: dict | None = None) -> dict | None:
    """The run's departure from its program's baseline, or None: {flags,
    evidence, confidence, summary, runs}. `degraded`: open degraded
    findings of the run's GPUs, named as a likely cause; `same`: what
    makes the earlier runs the same program ("HLO", "command line");
    `base`: baseline(earlier), when the caller has it already."""
    if run["sampled_s"] < config.min_run_s:
        return None
    base = baseline(earlier, config) if base is None else base
    if base["runs"] < config.min_runs:
        return None
    flags, evidence, sure, said = [], {"baseline_runs": float(base["runs"])}, [], []
    slower = None
    if run["step_seconds"] and base["step"] is not None and base["step"].runs >= config.min_runs:
        s = base["step"]
        ratio, z = run["step_seconds"] / s.median, s.z(run["step_seconds"])
        if ratio >= config.slower_ratio and z >= config.max_z:
            slower = ratio
            flags.append("slower-step")
            evidence.update(step_seconds=run["step_seconds"], baseline_step_seconds=s.median, step_ratio=ratio,
                            step_z=z)
            sure.append(z)
            said.append(f"step {human_value('seconds', run['step_seconds'])} vs "
                        f"{human_value('seconds', s.median)}")
    itl = _slower_latency(run, base, config)
    if itl is not None:
        ratio, z, s = itl
        slower = max(slower or 0.0, ratio)
        flags.append("slower-latency")
        evidence.update(itl_p50_seconds=mean(run, "serving_itl_p50_seconds"), baseline_itl_p50_seconds=s.median,
                        itl_ratio=ratio, itl_z=z)
        sure.append(z)
        said.append(f"inter-token latency {human_value('seconds', mean(run, 'serving_itl_p50_seconds'))} vs "
                    f"{human_value('seconds', s.median)}")
    drop = _activity_drop(run, base, config)
    if drop is not None:
        metric, value, s, z = drop
        flags.append("lower-activity")
        evidence.update({metric: value, f"baseline_{metric}": s.median, "activity_z": z})
        sure.append(-z)
        said.append(f"{SIGNATURE[metric][0]} {percent(value)} vs baseline {percent(s.median)}")
    verdict = majority_verdict(run["verdicts"], config.majority)
    if verdict and base["verdict"] and verdict != base["verdict"]:
        flags.append("verdict")
        sure.append(config.max_z * 1.5)
        said.insert(0, f"{verdict}, where its earlier runs were {base['verdict']}")
    if run["top_ops"] and base["top_ops"] is not None and run["top_ops"][0] not in base["top_ops"]:
        flags.append("top-op")
        sure.append(config.max_z)
        said.append(f"top op {run['top_ops'][0]}, never in its earlier runs' top ops")
    if not flags:
        return None
    if verdict and "verdict" not in flags:
        said.insert(0, verdict)
    how = ("off its baseline" if not slower else f"{percent(slower - 1.0)} slower" if slower < 2
           else f"{slower:.{0 if slower >= 10 else 1}f}x slower")
    summary = (f"{run['name']} (same {same} as {base['runs']} earlier run{'s' if base['runs'] != 1 else ''}) "
               f"is {how} on {run['host']}: " + ", ".join(said))
    for f in degraded:
        summary += f"; gpu {f['gpu']} is degraded: {f['summary']}"
    confidence = min(1.0, max(sure) / (2 * config.max_z))
    return dict(flags=flags, evidence={k: float(v) for k, v in evidence.items() if v is not None},
                confidence=round(confidence, 3), summary=summary, runs=base["runs"])


def _slower_latency(run: dict, base: dict, config: ProgramsConfig):
    """A serving run's inter-token latency against its baseline's, when it
    ran at a comparable load (requests running within a factor of 2)."""
    s = base["metrics"].get("serving_itl_p50_seconds")
    x = mean(run, "serving_itl_p50_seconds")
    load, base_load = mean(run, "serving_requests_running"), base["metrics"].get("serving_requests_running")
    if s is None or x is None or s.runs < config.min_runs or not s.median:
        return None
    if load is None or base_load is None or not base_load.median or not 0.5 <= load / base_load.median <= 2.0:
        return None
    ratio, z = x / s.median, s.z(x)
    return (ratio, z, s) if ratio >= config.slower_ratio and z >= config.max_z else None


def _activity_drop(run: dict, base: dict, config: ProgramsConfig):
    """The activity with the largest drop past both bounds, of those the
    program uses: (metric, value, baseline, z)."""
    worst = None
    for m in ACTIVITIES:
        s, x = base["metrics"].get(m), mean(run, m)
        if s is None or x is None or s.runs < config.min_runs or s.median < MIN_ACTIVITY:
            continue
        z = s.z(x)
        if x <= s.median * (1 - config.activity_drop) and z <= -config.max_z and (worst is None or z < worst[3]):
            worst = (m, x, s, z)
    return worst


# a regression's flag -> what its report tells the on-call to try
WHAT_TO_TRY = {
    "slower-step": (
        "trace the run now (`gpuscope capture --server AGENT --pid PID`) and set its top ops and idle gaps "
        "against an earlier run's capture (`gpuscope programs FINGERPRINT` lists them): the part that grew is "
        "the cause",
        "slower on one host only points at the host: `gpuscope degraded` for its GPUs, its CPU and data path"),
    "slower-latency": (
        "set the engine's load against its earlier runs' (`gpuscope query --metric serving_requests_running`, "
        "KV-cache use, preemptions): more waiting and preempted requests at the same load is the GPU or its "
        "configuration",),
    "lower-activity": (
        "the GPU does less of its program's usual work: its bottleneck finding (`gpuscope findings --host H`) "
        "says what it waits on; a host that starves it (CPU, data loading) or a degraded GPU (`gpuscope "
        "degraded`) are the usual causes",),
    "verdict": (
        "the run's bottleneck moved: read its bottleneck finding and that verdict's advice (`gpuscope findings "
        "--host H`), and compare the job's configuration with its earlier runs'",),
    "top-op": (
        "a new top op is a changed program in all but name: a new input shape, XLA flag or library version; "
        "compare the job's configuration and versions with an earlier run's",),
}


def what_to_try(flag: str) -> list[str]:
    return list(WHAT_TO_TRY.get(flag, ()))


def condition(run: dict, gpu: int, judged: dict) -> dict:
    """A judged run as a fleet check's condition on one of its GPUs."""
    return dict(key=f"regression:{run['id']}:{gpu}", host=run["host"], gpu=gpu, job=run["job"],
                attribution=run["attribution"], summary=judged["summary"], evidence=judged["evidence"],
                flags=judged["flags"], confidence=judged["confidence"],
                source=f"program {run['hlo_fp'] or run['command_fp']}: {judged['runs']} earlier runs")


def run_row(run: dict) -> tuple:
    return tuple(json.dumps(run[c]) if c in ("gpus", "attribution", "signature", "verdicts", "top_ops", "captures")
                 else run[c] for c in RUN_COLUMNS)


def run_from_row(row: dict) -> dict:
    out = dict(row)
    for c in ("gpus", "attribution", "signature", "verdicts", "top_ops", "captures"):
        out[c] = json.loads(out[c]) if out.get(c) else ([] if c in ("gpus", "top_ops", "captures") else {})
    return out
