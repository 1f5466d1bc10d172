"""Whose a GPU process is: its owner, container, Kubernetes pod, Slurm job,
systemd unit and workload, read once per process and kept.

Sources, each of which can fail alone (`status()` says which and why; the
others, and sampling, go on):
- /proc/PID/cgroup: container id and runtime, pod UID, Slurm job and step,
  systemd unit (the shapes below). A path of a shape not listed is kept raw
  in `cgroup`, never guessed at.
- /proc/PID/environ: SLURM_JOB_ID, SLURM_STEP_ID, SLURM_JOB_USER; HOSTNAME,
  a pod's name by default, which tells pods apart when several share a GPU;
  and the launcher's variables that make the process a rank of a
  distributed job (collectors/ranks.py: Slurm, MPI, torch.distributed,
  JAX, Kubernetes). Another user's environ is mode 0400 and behind the kernel's
  ptrace check: root reads it, or CAP_DAC_READ_SEARCH with CAP_SYS_PTRACE;
  without, the Slurm job and step still come from the cgroup.
- /proc/PID/status Uid: the owner, named from the password database.
- the kubelet's pod-resources API (collectors/kubelet.py): which pod and
  container holds each GPU; a process gets them only if its cgroup says it
  runs in a pod (a host process on a pod's GPU is not the pod's).
- collectors/jobs.py: the workload (a JAX job's profiler, a serving engine).

A process is read on first sight and cached under its pid *and* start time
(/proc/PID/stat field 22, which the CPU reading reads anyway), so a pid the
kernel hands to a new process is read again instead of inheriting the old
labels. The pod is per GPU and joined again whenever the kubelet's answer
changes. At steady state a sample costs two dictionary look-ups.

cgroup shapes (v2: one line `0::PATH`; v1: a line per hierarchy, merged,
the first that names a thing wins; segments are matched wherever they sit,
so nesting and a cgroup namespace's `/..` prefixes do not matter):
  docker       /docker/<64 hex>  (v1)   .../docker-<64 hex>.scope  (systemd driver)
  containerd   .../cri-containerd-<64 hex>.scope
  CRI-O        .../crio-<64 hex>.scope   .../pod<uid>/crio-<64 hex>
  podman       .../libpod-<64 hex>.scope
  pods         /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid, '_' for '-'>.slice/...
               /kubepods/burstable/pod<uid>/<64 hex>  (v1; guaranteed pods sit right under kubepods)
  systemd      /user.slice/user-1000.slice/session-3.scope   /system.slice/<unit>.service
  Slurm        /slurm/uid_N/job_J/step_S/task_T  (v1)   /system.slice/slurmstepd.scope/job_J/step_S/...  (v2)
"""
from __future__ import annotations

import dataclasses
import os
import pwd
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol

from .ranks import KUBERNETES_LAUNCHERS, RANK_ENV, Rank, kubernetes_job, rank_from_environ
from .records import MAX_ATTRIBUTION_BYTES, Attribution


class PodLookup(Protocol):
    """What attribution asks of the kubelet client (collectors/kubelet.py)."""
    generation: int                      # changes whenever the answer below may have

    def holders(self, uuid: str, index: int) -> tuple["PodRef", ...]: ...
    def status(self) -> str: ...
    def start(self) -> None: ...
    def close(self) -> None: ...


@dataclass(frozen=True, slots=True)
class PodRef:
    namespace: str
    pod: str
    container: str


# -- cgroup paths ------------------------------------------------------------------------
_HEX64 = "[0-9a-f]{64}"
_RUNTIMES = {"docker": "docker", "cri-containerd": "containerd", "crio": "cri-o", "libpod": "podman"}
_CONTAINER_SCOPE = re.compile(rf"(docker|cri-containerd|crio|libpod)-({_HEX64})\.scope")
_CONTAINER_DIR = re.compile(rf"(crio-)?({_HEX64})")          # cgroupfs driver: the container's own directory
# pod UIDs: 36 characters, or a static pod's 32 hex digits
_UID = r"[0-9a-f][0-9a-f_-]{31,35}"
_POD_SLICE = re.compile(rf"kubepods(?:-besteffort|-burstable|-guaranteed)?-pod({_UID})\.slice")
_POD_DIR = re.compile(rf"pod({_UID})")
_QOS_DIRS = frozenset({"kubepods", "burstable", "besteffort", "guaranteed"})
_SLURM_ROOT = re.compile(r"slurm(?:_[\w.-]+)?|slurmstepd\.scope")   # slurm_<node>: several slurmd on a host
_SLURM_JOB = re.compile(r"job_(\d+)")
_SLURM_STEP = re.compile(r"step_(\w+)")
_SYSTEMD = frozenset({"user.slice", "system.slice", "machine.slice", "init.scope"})


@dataclass(frozen=True, slots=True)
class CgroupFacts:
    container_id: str = ""
    runtime: str = ""
    pod_uid: str = ""
    slurm_job: str = ""
    slurm_step: str = ""
    unit: str = ""
    known: bool = False       # a shape we know (it may still name nothing: `/`, init.scope)

    def merged(self, other: "CgroupFacts") -> "CgroupFacts":
        """self, its empty fields filled from other."""
        return CgroupFacts(*(a or b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other))))


def parse_cgroup_path(path: str) -> CgroupFacts:
    """What one cgroup path says (see the module doc for the shapes)."""
    found: dict[str, str] = {}
    known = not path.strip("/")
    slurm = False
    prev = ""
    for seg in path.split("/"):
        if not seg:
            continue
        if m := _CONTAINER_SCOPE.fullmatch(seg):
            found["runtime"], found["container_id"] = _RUNTIMES[m[1]], m[2]
        elif m := _POD_SLICE.fullmatch(seg):
            found["pod_uid"] = m[1].replace("_", "-")
        elif prev in _QOS_DIRS and (m := _POD_DIR.fullmatch(seg)):
            found["pod_uid"] = m[1]
        elif (found.get("pod_uid") or prev == "docker") and (m := _CONTAINER_DIR.fullmatch(seg)):
            found["container_id"] = m[2]
            found["runtime"] = "cri-o" if m[1] else "docker" if prev == "docker" else found.get("runtime", "")
        elif _SLURM_ROOT.fullmatch(seg):
            slurm = True
        elif slurm and (m := _SLURM_JOB.fullmatch(seg)):
            found["slurm_job"] = m[1]
        elif slurm and (m := _SLURM_STEP.fullmatch(seg)):
            found["slurm_step"] = m[1]
        elif seg.endswith((".service", ".scope")):
            found["unit"] = seg                                  # the innermost unit wins
        elif seg in _SYSTEMD or seg.endswith(".slice"):
            known = True
        prev = seg
    return CgroupFacts(**found, known=known or slurm or bool(found))


def parse_cgroup(text: str) -> tuple[CgroupFacts, str]:
    """The facts of a /proc/PID/cgroup file, and its path when none of its
    lines has a shape we know ("" otherwise). The v2 line comes first, then
    v1's name=systemd, then the other hierarchies."""
    lines = []
    for line in text.splitlines():
        hier, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if path:
            rank = 0 if hier == "0" and not controllers else 1 if controllers == "name=systemd" else 2
            lines.append((rank, len(lines), path))
    facts, known = CgroupFacts(), False
    for _, _, path in sorted(lines):
        one = parse_cgroup_path(path)
        # a root line says nothing when another line places the process (a hybrid host's empty `0::/`
        # beside v1 paths of an unknown shape: found in a trial, such a path was never reported)
        if path.strip("/"):
            facts, known = facts.merged(one), known or one.known
    if lines and all(not p.strip("/") for _, _, p in lines):       # the root cgroup, and nothing else
        facts, known = parse_cgroup_path("/"), True
    if known or not text.strip():
        return facts, ""
    if not lines:                                  # not cgroup lines at all: the text itself, raw
        return facts, text.strip()
    raw = next((p for _, _, p in sorted(lines) if p != "/"), lines[0][2])
    return facts, raw


# -- the per-process reading -------------------------------------------------------------
_ENV_KEYS = {"SLURM_JOB_ID": "slurm_job", "SLURM_JOBID": "slurm_job", "SLURM_STEP_ID": "slurm_step",
             "SLURM_STEPID": "slurm_step", "SLURM_JOB_USER": "slurm_user", "HOSTNAME": "hostname"}
_ENV_READ = frozenset(k.encode() for k in set(_ENV_KEYS) | RANK_ENV)


def clean_label(text: str) -> str:
    """At most MAX_ATTRIBUTION_BYTES of UTF-8, control and invisible
    characters as U+FFFD: environ and cgroup names are users' text."""
    if not text.isprintable():
        text = "".join(c if c.isprintable() else "\ufffd" for c in text)
    if len(text) * 4 > MAX_ATTRIBUTION_BYTES:
        data = text.encode()
        if len(data) > MAX_ATTRIBUTION_BYTES:
            text = data[:MAX_ATTRIBUTION_BYTES].decode("utf-8", "ignore")
    return text


def job_label(a: Attribution | None, command: str = "") -> str:
    """A name for whose work runs on a GPU that outlives no more than that
    work and is never a pid (a Prometheus label: a pid would make a series
    per process): the Slurm job, else the pod, else the systemd unit, the
    workload, the container, and last the program's name."""
    if a is not None:
        if a.slurm_job:
            return f"slurm:{a.slurm_job}"
        if a.pod:
            return f"pod:{a.namespace}/{a.pod}"
        for prefix, value in (("unit:", a.unit), ("", a.workload), ("container:", a.container_id[:12])):
            if value:
                return prefix + value
    program = command.split(" ", 1)[0].rsplit("/", 1)[-1]
    return clean_label(program) if program else ""


def user_name(uid: int) -> str:
    """The login of a uid, else `uid:N` (a container's users are seldom in the agent's passwd)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid:{uid}"


@dataclass(slots=True)
class _Counts:
    """How each source fared, over the processes read so far."""
    read: int = 0
    gone: int = 0                # exited between NVML's list and our reading
    cgroup_unknown: int = 0
    cgroup_unreadable: int = 0
    environ_denied: int = 0
    environ_unreadable: int = 0
    status_unreadable: int = 0
    unnamed_uids: int = 0
    shared_gpus: int = 0         # several pods hold the GPU and nothing told them apart
    example_cgroup: str = ""
    last_error: str = ""


class _Gone(Exception):
    """The process exited while we read it."""


@dataclass(frozen=True, slots=True)
class _Facts:
    base: Attribution             # all but the pod's labels
    hostname: str                 # from environ: a pod's name by default
    rank: Rank | None = None      # a Kubernetes rank's job is named after its pod (ranks.kubernetes_job)


class Attributor:
    def __init__(self, proc_root: str | os.PathLike = "/proc", pods: PodLookup | None = None,
                 workload: Callable[[int], str] | None = None, users: Callable[[int], str] = user_name,
                 max_tracked: int = 4096):
        """pods: the kubelet client (None: not on Kubernetes, or switched
        off); workload: pid -> what it runs (JobDiscovery.workload)."""
        self._root = Path(proc_root)
        self._pods = pods
        self._workload = workload
        self._users = users
        self._names: dict[int, str] = {}
        self._facts: dict[tuple[int, int | None], _Facts] = {}
        self._joined: dict[tuple[int, int | None, int], tuple[int, Attribution]] = {}
        self._max = max_tracked
        self.counts = _Counts()
        # set by whoever knows the source lists no processes (dcgm-exporter; DCGM without NVML): the
        # processes line of status then says so instead of "ok: 0 read"
        self.no_processes = ""

    @property
    def pods(self) -> PodLookup | None:
        """The kubelet client: a source that lists no processes names GPUs' pods from it directly."""
        return self._pods

    def start(self) -> None:
        """Starts the kubelet client's refreshes (the agent, once sampling starts)."""
        if self._pods is not None:
            self._pods.start()

    def close(self) -> None:
        if self._pods is not None:
            self._pods.close()

    def of(self, pid: int, start: int | None, gpu_uuid: str, gpu: int) -> Attribution | None:
        """The attribution of process `pid` (started at `start`, from
        ProcStat.started) on GPU `gpu`; None when it exited before it could
        be read. Never raises for what /proc or the kubelet do."""
        generation = self._pods.generation if self._pods is not None else 0
        key = (pid, start, gpu)
        hit = self._joined.get(key)
        if hit is not None and hit[0] == generation:
            return hit[1]
        facts = self._facts.get((pid, start))
        if facts is None:
            try:
                facts = self._read(pid)
            except _Gone:
                self.counts.gone += 1
                return None
            self._facts[(pid, start)] = facts
        attribution = self._join(facts, gpu_uuid, gpu)
        self._joined[key] = (generation, attribution)
        return attribution

    def forget_except(self, live: set[int]) -> None:
        """Drop processes no longer on any GPU (cheap when nothing grew)."""
        if len(self._joined) <= 4 * len(live) + 64 and len(self._joined) <= self._max:
            return
        self._facts = {k: v for k, v in self._facts.items() if k[0] in live}
        self._joined = {k: v for k, v in self._joined.items() if k[0] in live}

    # -- reading one process ---------------------------------------------------------
    def _read(self, pid: int) -> _Facts:
        c = self.counts
        base: dict[str, str] = {}
        text = self._text(pid, "cgroup")
        if text is None:
            c.cgroup_unreadable += 1
        else:
            facts, raw = parse_cgroup(text)
            base.update((k, v) for k, v in dataclasses.asdict(facts).items() if k != "known" and v)
            if raw:
                c.cgroup_unknown += 1
                c.example_cgroup = clean_label(raw)
                base["cgroup"] = raw
        raw_env = self._environ(pid)
        env: dict[str, str] = {}
        for name, field in _ENV_KEYS.items():
            if raw_env.get(name) and field not in env:
                env[field] = raw_env[name]
        for k in ("slurm_job", "slurm_step", "slurm_user"):
            if env.get(k):
                base[k] = env[k]                 # the job's own word beats the cgroup's reading of it
        rank = rank_from_environ(raw_env)
        if rank is not None:
            base.update(rank=str(rank.rank), world_size="" if rank.world is None else str(rank.world))
            if rank.job:                    # an Indexed Job's is named after its pod, once known (_join)
                base["dist_job"] = rank.job
        base["user"] = self._owner(pid)
        if self._workload is not None:
            try:
                base["workload"] = self._workload(pid)
            except OSError:                      # the process left meanwhile: no workload to name
                pass
        c.read += 1
        return _Facts(Attribution(**{k: clean_label(v) for k, v in base.items() if v}),
                      clean_label(env.get("hostname", "")), rank)

    def _text(self, pid: int, name: str) -> str | None:
        """A /proc/PID file, None when it cannot be read (the reason kept
        for status); _Gone when the process is gone."""
        try:
            return (self._root / str(pid) / name).read_bytes().decode("utf-8", "replace")
        except (FileNotFoundError, ProcessLookupError) as exc:
            raise _Gone(pid) from exc
        except OSError as exc:
            self.counts.last_error = f"{name} of pid {pid}: {exc.strerror or exc}"
            return None

    def _environ(self, pid: int) -> dict[str, str]:
        try:
            raw = (self._root / str(pid) / "environ").read_bytes()
        except (FileNotFoundError, ProcessLookupError) as exc:
            raise _Gone(pid) from exc
        except PermissionError:
            self.counts.environ_denied += 1
            return {}
        except OSError as exc:
            self.counts.environ_unreadable += 1
            self.counts.last_error = f"environ of pid {pid}: {exc.strerror or exc}"
            return {}
        out: dict[str, str] = {}
        for item in raw.split(b"\0"):
            name, eq, value = item.partition(b"=")
            if eq and name in _ENV_READ:
                key = name.decode()
                if key not in out:
                    out[key] = value.decode("utf-8", "replace")
        return out

    def _owner(self, pid: int) -> str:
        for line in (self._text(pid, "status") or "").splitlines():
            if line.startswith("Uid:"):
                try:
                    uid = int(line.split()[1])         # the real uid: who started it
                except (IndexError, ValueError):
                    break
                name = self._names.get(uid)
                if name is None:
                    name = self._names[uid] = self._users(uid)
                    if name == f"uid:{uid}":
                        self.counts.unnamed_uids += 1
                return name
        self.counts.status_unreadable += 1
        return ""

    def _join(self, facts: _Facts, gpu_uuid: str, gpu: int) -> Attribution:
        """The process's labels with its pod's, if it runs in one."""
        if self._pods is None or not facts.base.pod_uid:
            return facts.base
        holders = self._pods.holders(gpu_uuid, gpu)
        if len(holders) > 1:      # time-sliced GPU: the pod's own hostname tells which
            holders = tuple(h for h in holders if h.pod == facts.hostname)
            if len(holders) != 1:
                self.counts.shared_gpus += 1
        if len(holders) != 1:
            return facts.base
        h = holders[0]
        joined = dataclasses.replace(facts.base, pod=clean_label(h.pod), namespace=clean_label(h.namespace),
                                     container=clean_label(h.container))
        if facts.rank is not None and facts.rank.launcher in KUBERNETES_LAUNCHERS:
            named = kubernetes_job(facts.rank, h.namespace, h.pod)
            joined = dataclasses.replace(joined, dist_job=clean_label(named.job) if named else "")
        return joined

    # -- status -----------------------------------------------------------------------
    def status(self) -> dict[str, str]:
        """Each source's state in a line that starts with a word: ok,
        partial, absent, permission denied, unimplemented, unreachable, off."""
        c = self.counts
        out = {"processes": f"ok: {c.read} read" + (f", {c.gone} exited before they could be read"
                                                     if c.gone else "")}
        if self.no_processes and not c.read:
            out["processes"] = self.no_processes
        cg = []
        if c.cgroup_unknown:
            cg.append(f"{c.cgroup_unknown} of a shape not known, kept raw (e.g. {c.example_cgroup!r})")
        if c.cgroup_unreadable:
            cg.append(f"{c.cgroup_unreadable} unreadable ({c.last_error})")
        out["cgroup"] = "partial: " + "; ".join(cg) if cg else "ok"
        if c.environ_denied:
            out["environ"] = (f"permission denied for {c.environ_denied} processes: Slurm variables come from their "
                              f"cgroup only; to read them run the agent as root, or give it CAP_SYS_PTRACE and "
                              f"CAP_DAC_READ_SEARCH (docs/operations.md, Whose job is it)")
        elif c.environ_unreadable:
            out["environ"] = f"partial: {c.environ_unreadable} unreadable ({c.last_error})"
        else:
            out["environ"] = "ok"
        out["user"] = (f"partial: {c.unnamed_uids} uids have no name in this host's password database "
                       f"(shown as uid:N)" if c.unnamed_uids else "ok")
        if c.status_unreadable:
            out["user"] = f"partial: /proc/PID/status unreadable for {c.status_unreadable} processes"
        if self._pods is None:
            out["kubelet"] = "off"
        else:
            out["kubelet"] = self._pods.status()
            if c.shared_gpus:
                out["kubelet"] += (f"; {c.shared_gpus} processes on GPUs several pods share, not told apart "
                                   f"(their pod UID stays)")
        return out
