"""Attribution from a fake /proc tree: every cgroup shape we claim to read
(v1 and v2; docker, containerd, CRI-O, podman, Kubernetes slices and
cgroupfs directories, systemd, Slurm), Slurm environ, an environ we may not
read, a process that exits while it is read, and a pid reused by another
process."""
from __future__ import annotations

import pathlib

import pytest

from gpuscope.collectors.attribution import Attributor, PodRef, clean_label, parse_cgroup, parse_cgroup_path
from gpuscope.collectors.nvml import NvmlCollector
from gpuscope.collectors.procstat import ProcStat
from gpuscope.collectors.records import MAX_ATTRIBUTION_BYTES, Attribution
from tests.fakes.nvml import FakeNvml, h200

CID = "4f1c" + "0123456789abcdef" * 3 + "0123456789ab"          # 64 hex digits
POD = "8a3e2c1d-5b6f-4a7e-9c0d-1e2f3a4b5c6d"


def fake_proc(root: pathlib.Path, pid: int, cgroup: str, environ: dict[str, str] | None = None,
              uid: int = 1000, start: int = 5000, cmd: str = "python train.py") -> pathlib.Path:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "stat").write_text(f"{pid} (python) S 1 {pid} {pid} 0 -1 4194560 10 0 0 0 100 50 0 0 20 0 8 0 {start} "
                            "1000000 100 18446744073709551615")
    (d / "cmdline").write_bytes(cmd.replace(" ", "\0").encode() + b"\0")
    (d / "cgroup").write_text(cgroup)
    (d / "status").write_text(f"Name:\tpython\nState:\tS (sleeping)\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n")
    (d / "environ").write_bytes(b"".join(f"{k}={v}".encode() + b"\0" for k, v in (environ or {}).items()))
    return d


# -- cgroup shapes -----------------------------------------------------------------------
SHAPES = [
    # (case, /proc/PID/cgroup, expected fields)
    ("docker v1 cgroupfs", f"12:memory:/docker/{CID}\n11:cpu,cpuacct:/docker/{CID}\n1:name=systemd:/docker/{CID}\n",
     dict(container_id=CID, runtime="docker")),
    ("docker v2 systemd", f"0::/system.slice/docker-{CID}.scope\n", dict(container_id=CID, runtime="docker")),
    ("containerd v2 pod", f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD.replace('-', '_')}"
                          f".slice/cri-containerd-{CID}.scope\n",
     dict(container_id=CID, runtime="containerd", pod_uid=POD)),
    ("containerd guaranteed pod", f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/"
                                  f"cri-containerd-{CID}.scope\n",
     dict(container_id=CID, runtime="containerd", pod_uid=POD)),
    ("cri-o v2 pod", f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{POD.replace('-', '_')}"
                     f".slice/crio-{CID}.scope\n",
     dict(container_id=CID, runtime="cri-o", pod_uid=POD)),
    ("cri-o v1 cgroupfs", f"10:memory:/kubepods/burstable/pod{POD}/crio-{CID}\n",
     dict(container_id=CID, runtime="cri-o", pod_uid=POD)),
    ("kubepods v1 cgroupfs", f"11:pids:/kubepods/burstable/pod{POD}/{CID}\n4:memory:/kubepods/burstable/pod{POD}/{CID}\n",
     dict(container_id=CID, pod_uid=POD)),
    ("kubepods v1 guaranteed", f"4:memory:/kubepods/pod{POD}/{CID}\n", dict(container_id=CID, pod_uid=POD)),
    ("static pod uid", f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{'ab' * 16}.slice/"
                       f"cri-containerd-{CID}.scope\n", dict(container_id=CID, runtime="containerd", pod_uid="ab" * 16)),
    ("kind: nested and in a cgroup namespace", f"0::/../../kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-"
                                                f"burstable.slice/kubepods-burstable-pod{POD.replace('-', '_')}.slice/"
                                                f"cri-containerd-{CID}.scope\n",
     dict(container_id=CID, runtime="containerd", pod_uid=POD)),
    ("podman", f"0::/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{CID}.scope/container\n",
     dict(container_id=CID, runtime="podman", unit="user@1000.service")),
    ("systemd service", "0::/system.slice/vllm-server.service\n", dict(unit="vllm-server.service")),
    ("systemd session", "0::/user.slice/user-1000.slice/session-42.scope\n", dict(unit="session-42.scope")),
    ("systemd user service", "0::/user.slice/user-1000.slice/user@1000.service/app.slice/trainer.service\n",
     dict(unit="trainer.service")),
    ("slurm v1", "12:memory:/slurm/uid_1000/job_81234/step_0/task_0\n11:devices:/slurm/uid_1000/job_81234/step_0\n"
                 "1:name=systemd:/system.slice/slurmd.service\n",
     dict(slurm_job="81234", slurm_step="0", unit="slurmd.service")),
    ("slurm v1, several slurmd", "5:cpuset:/slurm_node07/uid_1000/job_99/step_batch/task_0\n",
     dict(slurm_job="99", slurm_step="batch")),
    ("slurm v2", "0::/system.slice/slurmstepd.scope/job_81234/step_3/user/task_0\n",
     dict(slurm_job="81234", slurm_step="3")),
    ("root", "0::/\n", {}),
    ("hybrid: v2 line at the root, v1 docker", f"0::/\n4:memory:/docker/{CID}\n", dict(container_id=CID, runtime="docker")),
]


@pytest.mark.parametrize("case,text,want", SHAPES, ids=[s[0] for s in SHAPES])
def test_cgroup_shapes(tmp_path, case, text, want):
    fake_proc(tmp_path, 4242, text)
    a = Attributor(tmp_path, users=lambda uid: "alice").of(4242, 5000, "GPU-x", 0)
    got = {k: v for k, v in ((f, getattr(a, f)) for f in ("container_id", "runtime", "pod_uid", "slurm_job",
                                                           "slurm_step", "unit")) if v}
    assert got == want and a.cgroup == "" and a.user == "alice"


@pytest.mark.parametrize("text,raw", [("0::/my-batch-system/alloc-17/worker\n", "/my-batch-system/alloc-17/worker"),
                                      ("7:memory:/lxc/build-42\n", "/lxc/build-42"),
                                      ("garbage without colons\n", "garbage without colons"),
                                      ("0::/docker/not-hex\n", "/docker/not-hex"),
                                      ("0::/kubepods/burstable\n", "/kubepods/burstable"),
                                      # a hybrid host: the unified hierarchy's root says nothing (found in a trial)
                                      ("12:memory:/weird/thing-42\n1:name=systemd:/weird/thing-42\n0::/\n",
                                       "/weird/thing-42")])
def test_an_unknown_shape_is_kept_raw_never_guessed(text, raw):
    facts = parse_cgroup(text)
    assert facts == (type(facts[0])(), raw)


def test_a_hex_directory_is_a_container_only_under_a_pod_or_docker():
    assert parse_cgroup_path(f"/somewhere/{CID}").container_id == ""
    assert parse_cgroup_path(f"/docker/{CID}").container_id == CID


# -- one process, all its sources ------------------------------------------------------------
def test_a_slurm_job_with_its_environ(tmp_path):
    fake_proc(tmp_path, 4242, "0::/system.slice/slurmstepd.scope/job_81234/step_0/user/task_0\n",
              environ={"SLURM_JOB_ID": "81234", "SLURM_STEP_ID": "2", "SLURM_JOB_USER": "alice", "PATH": "/bin"})
    a = Attributor(tmp_path, users=lambda uid: {1000: "alice"}[uid]).of(4242, 5000, "GPU-x", 0)
    assert (a.slurm_job, a.slurm_step, a.slurm_user, a.user) == ("81234", "2", "alice", "alice")


def test_environ_we_may_not_read_degrades_to_the_cgroup(tmp_path, monkeypatch):
    d = fake_proc(tmp_path, 4242, "12:memory:/slurm/uid_1001/job_77/step_1/task_0\n",
                  environ={"SLURM_JOB_ID": "77"}, uid=1001)
    (d / "environ").chmod(0)
    real = pathlib.Path.read_bytes

    def read_bytes(self):                   # root reads a 0000 file: refuse as the kernel does for others
        if self.name == "environ" and self.parent == d:
            raise PermissionError(13, "Permission denied")
        return real(self)
    monkeypatch.setattr(pathlib.Path, "read_bytes", read_bytes)
    at = Attributor(tmp_path, users=lambda uid: f"uid:{uid}")
    a = at.of(4242, 5000, "GPU-x", 0)
    assert (a.slurm_job, a.slurm_step, a.slurm_user, a.user) == ("77", "1", "", "uid:1001")
    st = at.status()
    assert st["environ"].startswith("permission denied for 1 processes") and "CAP_SYS_PTRACE" in st["environ"]
    assert st["user"].startswith("partial: 1 uids have no name") and st["cgroup"] == "ok"


def test_a_process_gone_before_or_while_it_is_read_gets_none_and_is_counted(tmp_path):
    at = Attributor(tmp_path)
    assert at.of(999, None, "GPU-x", 0) is None                 # exited between NVML's list and us
    d = fake_proc(tmp_path, 4242, f"0::/system.slice/docker-{CID}.scope\n")
    (d / "environ").unlink()                                    # exited after its cgroup was read
    assert at.of(4242, 5000, "GPU-x", 0) is None
    assert at.status()["processes"] == "ok: 0 read, 2 exited before they could be read"
    fake_proc(tmp_path, 4242, f"0::/system.slice/docker-{CID}.scope\n")   # nothing cached: read when it is there
    assert at.of(4242, 5000, "GPU-x", 0).container_id == CID


def test_an_unknown_cgroup_is_kept_raw_and_said(tmp_path):
    fake_proc(tmp_path, 4242, "0::/my-batch-system/alloc-17/worker\n")
    at = Attributor(tmp_path)
    assert at.of(4242, 5000, "GPU-x", 0).cgroup == "/my-batch-system/alloc-17/worker"
    assert at.status()["cgroup"] == "partial: 1 of a shape not known, kept raw (e.g. '/my-batch-system/alloc-17/worker')"


def test_users_text_is_cut_and_cleaned(tmp_path):
    fake_proc(tmp_path, 4242, "0::/\n", environ={"SLURM_JOB_ID": "1\x1b[31m" + "é" * 400})
    a = Attributor(tmp_path).of(4242, 5000, "GPU-x", 0)
    assert a.slurm_job.startswith("1\ufffd[31m") and len(a.slurm_job.encode()) <= MAX_ATTRIBUTION_BYTES
    assert a.slurm_job.isprintable() and clean_label("ok") == "ok"


def test_a_reused_pid_is_read_again(tmp_path):
    fake_proc(tmp_path, 4242, "0::/system.slice/slurmstepd.scope/job_1/step_0\n", start=5000)
    reads = []
    at = Attributor(tmp_path, users=lambda uid: reads.append(uid) or "alice")
    first = at.of(4242, 5000, "GPU-x", 0)
    assert at.of(4242, 5000, "GPU-x", 0) is first                 # cached: one read per process
    fake_proc(tmp_path, 4242, "0::/system.slice/slurmstepd.scope/job_2/step_0\n", start=9000)
    assert at.of(4242, 5000, "GPU-x", 0).slurm_job == "1"          # same start: the same process
    assert at.of(4242, 9000, "GPU-x", 0).slurm_job == "2"          # another start: another process
    assert at.counts.read == 2 and reads == [1000]                 # user names are cached per uid


def test_the_workload_comes_from_job_discovery(tmp_path):
    from gpuscope.collectors.jobs import JobDiscovery
    fake_proc(tmp_path, 10, "0::/\n", cmd="vllm serve meta-llama/Llama-3-8B --port 8000")
    d = fake_proc(tmp_path, 11, "0::/\n", cmd="python -m vllm.v1.engine.core")
    (d / "stat").write_text("11 (python) S 10 11 11 0 -1 0 0 0 0 0 1 1 0 0 20 0 1 0 6000")
    fake_proc(tmp_path, 12, "0::/\n", environ={"GPUSCOPE_PROFILER_PORT": "9012"})
    at = Attributor(tmp_path, workload=JobDiscovery(lambda a: False, proc_root=tmp_path).workload)
    assert at.of(11, 6000, "GPU-x", 0).workload == "vllm"
    assert at.of(12, 5000, "GPU-x", 0).workload == "jax 127.0.0.1:9012"


# -- pods from the kubelet ---------------------------------------------------------------------
class Pods:
    def __init__(self, by_uuid):
        self.by_uuid, self.generation = by_uuid, 1

    def holders(self, uuid, index):
        return self.by_uuid.get(uuid, ())

    def status(self):
        return "ok: fake"


def test_the_pod_holding_the_gpu_names_a_process_in_a_pod_and_only_such(tmp_path):
    slice_ = f"kubepods-burstable-pod{POD.replace('-', '_')}.slice"
    fake_proc(tmp_path, 1, f"0::/kubepods.slice/kubepods-burstable.slice/{slice_}/cri-containerd-{CID}.scope\n")
    fake_proc(tmp_path, 2, "0::/system.slice/nvidia-persistenced.service\n")
    pods = Pods({"GPU-a": (PodRef("ml", "trainer-0", "main"),)})
    at = Attributor(tmp_path, pods=pods)
    a = at.of(1, 5000, "GPU-a", 0)
    assert (a.namespace, a.pod, a.container, a.pod_uid, a.container_id) == ("ml", "trainer-0", "main", POD, CID)
    assert at.of(2, 5000, "GPU-a", 0).pod == ""                    # a host service on a pod's GPU is not the pod's
    pods.by_uuid, pods.generation = {"GPU-a": (PodRef("ml", "trainer-1", "main"),)}, 2
    assert at.of(1, 5000, "GPU-a", 0).pod == "trainer-1"            # a new answer is joined again
    assert at.counts.read == 2


def test_a_time_sliced_gpu_is_told_apart_by_the_pods_hostname(tmp_path):
    cg = f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n"
    fake_proc(tmp_path, 1, cg, environ={"HOSTNAME": "infer-b"})
    fake_proc(tmp_path, 2, cg)
    shared = (PodRef("ml", "infer-a", "srv"), PodRef("ml", "infer-b", "srv"))
    at = Attributor(tmp_path, pods=Pods({"GPU-a": shared}))
    assert at.of(1, 5000, "GPU-a", 0).pod == "infer-b"
    assert at.of(2, 5000, "GPU-a", 0).pod == "" and at.of(2, 5000, "GPU-a", 0).pod_uid == POD
    assert "1 processes on GPUs several pods share" in at.status()["kubelet"]


# -- through the NVML collector ------------------------------------------------------------------
def test_samples_carry_the_attribution_and_a_reused_pid_is_not_misattributed(tmp_path):
    fake_proc(tmp_path, 4242, "0::/system.slice/slurmstepd.scope/job_1/step_0\n",
              environ={"SLURM_JOB_ID": "1", "SLURM_JOB_USER": "alice"}, start=5000)
    fake = FakeNvml([h200(processes=[(4242, 1 << 30)]), h200(processes=[(4242, 1 << 30)])])
    c = NvmlCollector(nvml=fake, procstat=ProcStat(tmp_path), attribution=Attributor(tmp_path))
    c.start()
    s = c.scrape().samples
    assert [p.attribution.slurm_job for x in s for p in x.processes] == ["1", "1"]
    again = c.scrape().samples
    assert again[0].processes[0].attribution is s[0].processes[0].attribution      # a reference, not a copy
    fake_proc(tmp_path, 4242, f"0::/system.slice/docker-{CID}.scope\n", start=7777, cmd="python serve.py")
    p = c.scrape().samples[0].processes[0]
    assert (p.attribution.slurm_job, p.attribution.container_id, p.command) == ("", CID, "python serve.py")
    assert p.cpu_cores is None                     # no CPU rate across two processes either


def test_sampling_goes_on_when_attribution_cannot_read_anything(tmp_path):
    fake = FakeNvml([h200(processes=[(4242, 1 << 30)])])
    c = NvmlCollector(nvml=fake, procstat=ProcStat(tmp_path), attribution=Attributor(tmp_path / "nowhere"))
    c.start()
    s = c.scrape().samples[0]
    assert s.processes[0].attribution is None and s.values["procs_count"] == 1.0
    assert Attribution().pod == ""
