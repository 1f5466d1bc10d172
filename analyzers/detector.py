"""Anomaly detection per GPU and job, against that job's own recent baseline.

Each classification window is compared with the job's last `baseline_windows`
windows (5 min by default) once `warmup_windows` of them exist:

- bottleneck-changed: the verdict differs from the baseline's usual verdict
  (its mode) for `confirm_windows` windows in a row, or in one window whose
  verdict is unambiguous (confidence >= 0.9 over at least 5 samples) — so a
  change is known within two windows of its onset even when the first
  window straddles it (idle is not a bottleneck; a fall to idle is an
  activity drop);
- activity-drop: SM/GPU activity falls below the baseline median by more
  than max(activity_drop_abs, activity_drop_mads x MAD) for `confirm_windows`
  windows, from a baseline that was busy;
- host-starved-rise: the "starved by the host" score rises above its
  baseline median by `starved_rise_abs` for `confirm_windows` windows;
- throttle: a power-capped or thermal-throttled flag the baseline rarely had;
- serving (a GPU running vLLM, SGLang or TensorRT-LLM, from its /metrics):
  serving-latency when TTFT or ITL p99 rises to `latency_rise_ratio` x the
  baseline median and by at least `latency_rise_abs_s`; serving-queue when
  waiting requests reach max(`queue_min`, `queue_rise_ratio` x the
  baseline median); serving-kv-cache when the KV cache is at least
  `kv_cache_full` used while requests wait; serving-preemption when
  preemptions start on an engine whose baseline had none — each for
  `confirm_windows` windows, and each able to trigger a capture;
- xid / ecc / gpu-lost: health events, at once (no debounce: they are facts).

An anomaly fires once per episode: it re-arms when the window is back to the
baseline, or when the baseline has absorbed the new state. A change of job on
the GPU (other processes) restarts the baseline.
"""
from __future__ import annotations

import math
from array import array
from dataclasses import dataclass, field

from gpuscope.collectors import human

from .classify import Classification, FeatureSet
from .ids import new_id
from .rules.common import HOST, IDLE, LAUNCH, activity, starved
from .rules.transitional import TRANSITIONAL

BOTTLENECK, ACTIVITY_DROP, STARVED_RISE, THROTTLE = "bottleneck-changed", "activity-drop", "host-starved-rise", "throttle"
SERVING_LATENCY, SERVING_QUEUE, SERVING_KV, SERVING_PREEMPTION = (
    "serving-latency", "serving-queue", "serving-kv-cache", "serving-preemption")
DEEP_KINDS = (BOTTLENECK, ACTIVITY_DROP, STARVED_RISE, SERVING_LATENCY, SERVING_QUEUE, SERVING_KV, SERVING_PREEMPTION)
# Counters cannot reliably tell launch-bound from host-bound (each names the
# other as its alternative), so a flip between them is no change of bottleneck;
# the family is named in the verdicts' own words.
FAMILY = {LAUNCH: "launch- or host-bound", HOST: "launch- or host-bound"}


def family(verdict: str) -> str:
    return FAMILY.get(verdict, verdict)


@dataclass(frozen=True)
class DetectorConfig:
    baseline_windows: int = 60          # 5 min of 5 s windows: long enough to be "usual", short enough to adapt
    warmup_windows: int = 12            # 1 min of a new job before anything counts as unusual
    confirm_windows: int = 2            # debounce: one odd window triggers nothing ...
    strong_confidence: float = 0.9      # ... unless the new verdict is that clear in a full window
    strong_min_samples: int = 5         # (one odd sample among five moves a mean by a fifth: not that clear)
    activity_drop_abs: float = 0.20     # 20 points of SM activity: well above GPM's window-to-window noise (~2-5)
    activity_drop_mads: float = 3.0     # ... and 3 MADs for noisy jobs
    busy_baseline: float = 0.30         # a drop only matters from a GPU that was doing work
    starved_rise_abs: float = 0.50      # half the "starved" scale: host suddenly feeding a waiting GPU
    rare_flag_rate: float = 0.20        # a flag seen in under 20 % of the baseline is new
    latency_rise_ratio: float = 3.0     # TTFT / ITL p99 at 3x its usual: users feel it; jitter does not reach it
    latency_rise_abs_s: float = 0.05    # ... and 50 ms more: a 2 -> 6 ms ITL is noise, not an incident
    queue_min: float = 10.0             # waiting requests: a few always queue between steps
    queue_rise_ratio: float = 4.0
    kv_cache_full: float = 0.95         # vLLM preempts from ~100 %; 95 % with a queue is already refusing work


@dataclass
class Anomaly:
    id: str
    t: float
    host: str
    gpu: int
    job: str
    kind: str                           # the first of kinds
    kinds: list[str]
    reason: str
    details: dict[str, float | str] = field(default_factory=dict)
    finding_id: str | None = None


@dataclass(slots=True)
class _Point:
    verdict: str
    activity: float | None
    starved: float
    flags: tuple[str, ...]
    serving: dict[str, float] | None = None


# the serving numbers a baseline keeps (evidence keys, analyzers/features.py)
SERVING_BASELINE = ("serving_ttft_p99_seconds", "serving_itl_p99_seconds", "serving_requests_waiting",
                    "serving_preemptions_per_second")


def _median(xs) -> float:
    """statistics.median, without its generality: three baselines of 60 a
    window, 3,200 windows a second at 2,000 agents."""
    s = sorted(xs)
    h = len(s) // 2
    return s[h] if len(s) % 2 else (s[h - 1] + s[h]) / 2


_FLAG_SETS: dict[tuple[str, ...], tuple[str, ...]] = {}


class _History:
    """A GPU's baseline, the last `size` windows, kept in columns: as a
    deque of window objects a full baseline of 60 cost 11.9 KB (190 MB for
    16,000 GPUs, reached five minutes after start); in columns 2.4 KB."""
    __slots__ = ("size", "verdict", "families", "activity", "starved", "flags", "serving")

    def __init__(self, size: int):
        self.size = size
        self.verdict: list[str] = []
        self.families: dict[str, int] = {}  # verdict family -> windows of the baseline in it
        self.activity = array("d")          # NaN: no activity signal in that window
        self.starved = array("d")
        self.flags: list[tuple[str, ...]] = []
        self.serving: dict[str, array] | None = None     # SERVING_BASELINE columns, once an engine was seen

    def __len__(self) -> int:
        return len(self.verdict)

    def append(self, p: _Point) -> None:
        flags = _FLAG_SETS.get(p.flags)
        if flags is None:                   # a handful of flag sets recur: one tuple each
            flags = p.flags
            if len(_FLAG_SETS) < 4096:
                _FLAG_SETS[flags] = flags
        self.verdict.append(p.verdict)
        fam = family(p.verdict)
        self.families[fam] = self.families.get(fam, 0) + 1
        self.activity.append(math.nan if p.activity is None else p.activity)
        self.starved.append(p.starved)
        self.flags.append(flags)
        if p.serving is not None and self.serving is None:      # NaN for the windows before the engine
            self.serving = {k: array("d", [math.nan] * (len(self.verdict) - 1)) for k in SERVING_BASELINE}
        if self.serving is not None:
            for k, col in self.serving.items():
                v = (p.serving or {}).get(k)
                col.append(math.nan if v is None else v)
        if len(self.verdict) > self.size:
            gone = family(self.verdict[0])
            self.families[gone] -= 1
            if not self.families[gone]:
                del self.families[gone]
            del self.verdict[0], self.activity[0], self.starved[0], self.flags[0]
            if self.serving is not None:
                for col in self.serving.values():
                    del col[0]

    def usual_family(self) -> str:
        """The baseline's most frequent verdict family; a tie goes to the one
        seen first in the baseline (as Counter.most_common does)."""
        top = max(self.families.values())
        leaders = [f for f, n in self.families.items() if n == top]
        if len(leaders) == 1:
            return leaders[0]
        return next(f for f in map(family, self.verdict) if f in leaders)

    def usual(self, k: str) -> tuple[float, int]:
        """Median of a serving number over the baseline's windows that had it, and how many had it."""
        col = self.serving.get(k) if self.serving is not None else None
        known = [x for x in col if x == x] if col is not None else []
        return (_median(known) if known else math.nan), len(known)


class _GpuState:
    def __init__(self, size: int):
        self.history = _History(size)
        self.job = ""
        self.streak: dict[str, int] = {}
        self.fired: set[str] = set()
        self.pending_verdict: str | None = None


class Detector:
    def __init__(self, config: DetectorConfig = DetectorConfig()):
        self.config = config
        self._gpus: dict[tuple[str, int], _GpuState] = {}

    def warmup(self) -> tuple[int, int]:
        """(windows the least-known GPU has, windows needed before anything
        counts as unusual); (0, needed) before any GPU is seen."""
        have = min((len(st.history) for st in list(self._gpus.values())), default=0)
        return min(have, self.config.warmup_windows), self.config.warmup_windows

    def observe(self, host: str, c: Classification, job: str, finding_id: str | None = None) -> Anomaly | None:
        """A transitional window is neither compared nor remembered: its
        means describe neither regime."""
        if TRANSITIONAL in c.flags:
            return None
        cfg = self.config
        if c.starved is None:          # a classification made by hand: its signals from its evidence
            f = FeatureSet.from_evidence(c.evidence)
            act, starv = float(activity(f)[0]), float(starved(f)[0])
            act = None if act != act else act
        else:
            act, starv = c.activity, c.starved
        st = self._gpus.get((host, c.gpu))
        job_key = job.split(" ")[0] if job else ""
        if st is None or (job_key and st.job and job_key != st.job):
            st = self._gpus[(host, c.gpu)] = _GpuState(cfg.baseline_windows)
        st.job = job_key or st.job
        serving = {k: c.evidence[k] for k in SERVING_BASELINE if k in c.evidence} or None
        point = _Point(c.verdict, act, starv, tuple(c.flags), serving)
        anomaly = None
        if len(st.history) >= cfg.warmup_windows:
            anomaly = self._compare(host, c, st, point, job, finding_id)
        st.history.append(point)
        return anomaly

    def _compare(self, host, c, st, p: _Point, job, finding_id) -> Anomaly | None:
        cfg = self.config
        base = st.history
        usual = base.usual_family()
        hits: dict[str, tuple[str, dict]] = {}

        # bottleneck changed (streak counts the same new verdict family)
        now = family(c.verdict)
        if now != usual and c.verdict != IDLE:
            st.streak[BOTTLENECK] = st.streak.get(BOTTLENECK, 0) + 1 if st.pending_verdict == now else 1
            st.pending_verdict = now
            strong = (c.confidence >= cfg.strong_confidence
                      and c.evidence.get("samples", 0) >= cfg.strong_min_samples)
            # fired once per new family: a second, different change re-arms it
            for k in [k for k in st.fired if k.startswith(BOTTLENECK) and k != f"{BOTTLENECK}:{now}"]:
                st.fired.discard(k)
            if st.streak[BOTTLENECK] >= cfg.confirm_windows or strong:
                hits[f"{BOTTLENECK}:{now}"] = (f"{usual} -> {c.verdict}", {"usual_verdict": usual})
        else:
            st.streak[BOTTLENECK], st.pending_verdict = 0, None
            for k in [k for k in st.fired if k.startswith(BOTTLENECK)]:
                st.fired.discard(k)

        acts = [a for a in base.activity if a == a]
        if acts and p.activity is not None:
            med = _median(acts)
            mad = _median([abs(a - med) for a in acts])
            limit = max(cfg.activity_drop_abs, cfg.activity_drop_mads * mad)
            dropped = med >= cfg.busy_baseline and med - p.activity >= limit
            self._streak(st, ACTIVITY_DROP, dropped, recovered=p.activity >= med - limit / 2)
            if dropped and st.streak[ACTIVITY_DROP] >= cfg.confirm_windows:
                hits[ACTIVITY_DROP] = (f"SM activity {human.percent(p.activity)} against a usual {human.percent(med)}",
                                       {"activity_ratio": p.activity, "baseline_activity_ratio": med,
                                        "baseline_mad": mad})

        starv = _median(base.starved)
        rose = p.starved - starv >= cfg.starved_rise_abs
        self._streak(st, STARVED_RISE, rose, recovered=p.starved - starv < cfg.starved_rise_abs / 2)
        if rose and st.streak[STARVED_RISE] >= cfg.confirm_windows:
            hits[STARVED_RISE] = (f"GPU starved by the host (score {human.percent(p.starved)} against a usual "
                                  f"{human.percent(starv)})",
                                  {"starved_score": p.starved, "baseline_starved_score": starv})

        for flag in p.flags:
            rate = sum(flag in fl for fl in base.flags) / len(base)
            new = rate < cfg.rare_flag_rate
            key = f"{THROTTLE}:{flag}"
            self._streak(st, key, new, recovered=flag not in p.flags)
            if new and st.streak[key] >= cfg.confirm_windows:
                hits[key] = (f"{flag} (seen in {human.percent(rate)} of the baseline)", {"baseline_flag_rate": rate})
        for key in [k for k in st.fired if k.startswith(THROTTLE) and k.split(":", 1)[1] not in p.flags]:
            st.fired.discard(key)

        if p.serving is not None:
            self._serving(st, c, p, hits)

        fresh = {k: v for k, v in hits.items() if k not in st.fired}
        st.fired.update(fresh)
        if not fresh:
            return None
        kinds = [k.split(":")[0] for k in fresh]
        details: dict = {"verdict": c.verdict, "confidence": c.confidence}
        for _, d in fresh.values():
            details.update(d)
        return Anomaly(id=new_id(), t=c.end, host=host, gpu=c.gpu, job=job, kind=kinds[0],
                       kinds=kinds, reason="; ".join(r for r, _ in fresh.values()), details=details,
                       finding_id=finding_id)

    def _serving(self, st: _GpuState, c: Classification, p: _Point, hits: dict) -> None:
        """The serving engine's own regressions against its baseline."""
        cfg, now, base = self.config, p.serving, st.history
        for key, words in (("serving_ttft_p99_seconds", "TTFT"), ("serving_itl_p99_seconds", "ITL")):
            v = now.get(key)
            usual, n = base.usual(key)
            if v is None or n < cfg.warmup_windows:
                continue
            rose = v >= cfg.latency_rise_ratio * usual and v - usual >= cfg.latency_rise_abs_s
            name = f"{SERVING_LATENCY}:{words}"
            self._streak(st, name, rose, recovered=v < (1 + cfg.latency_rise_ratio) / 2 * usual)
            if rose and st.streak[name] >= cfg.confirm_windows:
                hits[name] = (f"{words} p99 {v * 1e3:.0f} ms against a usual {usual * 1e3:.0f} ms "
                              f"({v / usual if usual > 0 else math.inf:.1f}x)",
                              {f"{key}": v, f"baseline_{key}": usual})
        waiting = now.get("serving_requests_waiting")
        usual, n = base.usual("serving_requests_waiting")
        if waiting is not None and n >= cfg.warmup_windows:
            grew = waiting >= max(cfg.queue_min, cfg.queue_rise_ratio * usual)
            self._streak(st, SERVING_QUEUE, grew, recovered=waiting < max(cfg.queue_min, 2 * usual) / 2)
            if grew and st.streak[SERVING_QUEUE] >= cfg.confirm_windows:
                hits[SERVING_QUEUE] = (f"{waiting:.0f} requests waiting against a usual {usual:.0f}",
                                       {"serving_requests_waiting": waiting, "baseline_requests_waiting": usual})
        kv = c.evidence.get("serving_kv_cache_usage_ratio")
        if kv is not None:
            full = kv >= cfg.kv_cache_full and (waiting or 0) > 0
            self._streak(st, SERVING_KV, full, recovered=kv < cfg.kv_cache_full - 0.1 or not waiting)
            if full and st.streak[SERVING_KV] >= cfg.confirm_windows:
                hits[SERVING_KV] = (f"KV cache {human.percent(kv)} full with {waiting:.0f} requests waiting",
                                    {"serving_kv_cache_usage_ratio": kv, "serving_requests_waiting": waiting})
        pre = now.get("serving_preemptions_per_second")
        usual, n = base.usual("serving_preemptions_per_second")
        if pre is not None and n >= cfg.warmup_windows:
            began = pre > 0 and usual == 0
            self._streak(st, SERVING_PREEMPTION, began, recovered=pre == 0)
            if began and st.streak[SERVING_PREEMPTION] >= cfg.confirm_windows:
                hits[SERVING_PREEMPTION] = (f"{pre:.2g} preemptions/s on an engine that had none",
                                            {"serving_preemptions_per_second": pre})

    @staticmethod
    def _streak(st: _GpuState, key: str, hit: bool, recovered: bool) -> None:
        st.streak[key] = st.streak.get(key, 0) + 1 if hit else 0
        if recovered:
            st.fired.discard(key)

    def health(self, host: str, gpu: int, kind: str, detail: str, t: float, job: str = "") -> Anomaly:
        return Anomaly(id=new_id(), t=t, host=host, gpu=gpu, job=job, kind=kind, kinds=[kind],
                       reason=detail)
