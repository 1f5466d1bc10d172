"""Attribution's cost per GPU-sample, against the same agent without it,
in the same run: 8 fake H200s (frozen fake NVML: its calls cost nothing),
each with --procs GPU processes whose /proc (stat, cmdline, cgroup, environ,
status) lies in a temporary tree, and a real kubelet pod-resources server on
a Unix socket that the agent asks every second.

    python bench/attribution_overhead.py [--ticks 2000] [--rounds 5] [--procs 1]

The agent's per-tick work (scrape -> ring -> uplink buffer -> batch
encoding, one batch a second as the flusher cuts them) runs as fast as it
goes, rounds of "without" and "with" interleaved; process CPU (all threads,
the kubelet client's included) over GPU-samples; the median and the best
round of each. On a loaded machine the rounds scatter by more than
attribution costs, so the steps it adds are also timed alone ("isolated":
the look-up in the scrape, and the batch encoding with and without). Also:
the first sight of a process (the /proc reads attribution caches), and the
analyzer's decoding of a second's batch with and without attributions.
"""
import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from concurrent import futures
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import grpc  # noqa: E402

from gpuscope.analyzers.ingest import decode  # noqa: E402
from gpuscope.collectors.attribution import Attributor  # noqa: E402
from gpuscope.collectors.kubelet import KubeletConfig, PodResources  # noqa: E402
from gpuscope.collectors.nvml import NvmlCollector  # noqa: E402
from gpuscope.collectors.procstat import ProcStat  # noqa: E402
from gpuscope.daemon.convert import encode_batch  # noqa: E402
from gpuscope.k8s.podresources.v1 import api_pb2 as pr, api_pb2_grpc as pr_grpc  # noqa: E402
from tests.fakes.nvml import FakeNvml, h200  # noqa: E402

from agent_loop import HZ, started_agent, tight  # noqa: E402  (bench/, beside this file)

GPUS = 8
CID = "4f1c" + "0123456789abcdef" * 3 + "0123456789ab"
POD = "8a3e2c1d-5b6f-4a7e-9c0d-1e2f3a4b5c6d"


def fake_proc(root: Path, procs: int) -> dict[int, list[int]]:
    """A /proc of GPUS x procs processes, in pods (even GPUs) or Slurm steps (odd); GPU -> its pids."""
    out = {}
    for g in range(GPUS):
        out[g] = []
        for k in range(procs):
            pid = 10_000 + g * 100 + k
            d = root / str(pid)
            d.mkdir(parents=True)
            (d / "stat").write_text(f"{pid} (python) S 1 {pid} {pid} 0 -1 0 0 0 0 0 100 50 0 0 20 0 8 0 5000 1 1")
            (d / "cmdline").write_bytes(b"python\0train.py\0--lr\x003e-4\0")
            cg = (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD.replace('-', '_')}.slice/"
                  f"cri-containerd-{CID}.scope\n" if g % 2 == 0 else
                  f"12:memory:/slurm/uid_1000/job_{81234 + g}/step_0/task_0\n1:name=systemd:/system.slice/slurmd.service\n")
            (d / "cgroup").write_text(cg)
            (d / "environ").write_bytes(b"PATH=/usr/bin\0HOME=/root\0" + (
                f"SLURM_JOB_ID={81234 + g}\0SLURM_STEP_ID=0\0SLURM_JOB_USER=alice\0".encode() if g % 2 else
                b"HOSTNAME=trainer-0\0KUBERNETES_SERVICE_HOST=10.0.0.1\0") + b"X=" + b"y" * 2000 + b"\0")
            (d / "status").write_text("Name:\tpython\nUid:\t0\t0\t0\t0\nGid:\t0\t0\t0\t0\n")
            out[g].append(pid)
    return out


class Kubelet(pr_grpc.PodResourcesListerServicer):
    def List(self, request, context):
        return pr.ListPodResourcesResponse(pod_resources=[pr.PodResources(
            namespace="ml", name=f"trainer-{g}", containers=[pr.ContainerResources(name="main", devices=[
                pr.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[f"GPU-fake-{g:04d}"])])])
            for g in range(0, GPUS, 2)])

    def GetAllocatableResources(self, request, context):
        return pr.AllocatableResourcesResponse(devices=[pr.ContainerDevices(
            resource_name="nvidia.com/gpu", device_ids=[f"GPU-fake-{g:04d}" for g in range(GPUS)])])


def agent_for(root: Path, pids: dict[int, list[int]], attribution: Attributor | None):
    fake = FakeNvml([h200(util_gpu=90, util_mem=30, processes=[(p, 1 << 30) for p in pids[g]]) for g in range(GPUS)],
                    frozen=True)
    return started_agent(NvmlCollector(nvml=fake, procstat=ProcStat(root), attribution=attribution))


def per_sample(agent, up, ticks: int) -> float:
    """CPU seconds per GPU-sample of `ticks` ticks."""
    return tight(agent, up, ticks) / (ticks * GPUS)


def isolated(root: Path, pids: dict[int, list[int]], pods, plain, attributed, repeats: int = 7) -> dict:
    """The steps attribution adds, each timed alone (best of `repeats`, wall
    clock: the least disturbed run of a loaded machine): the look-up in the
    scrape, per process-sample, and batch encoding per GPU-sample, one
    second's batch (80 GPU-samples) with and without attributions."""
    import timeit
    at = Attributor(root, pods=pods)
    proc = ProcStat(root)
    flat = [(p, f"GPU-fake-{g:04d}", g) for g, ps in pids.items() for p in ps]
    for p, u, g in flat:
        proc.cpu_cores(p)
        at.of(p, proc.started(p), u, g)
    n = 2000

    def lookups():
        for p, u, g in flat:
            at.of(p, proc.started(p), u, g)
    look = min(timeit.repeat(lookups, number=n, repeat=repeats)) / (n * len(flat)) * 1e6

    def second(agent):
        return [s for _ in range(HZ) for s in agent.collector.scrape().samples]
    a, b = second(plain[0]), second(attributed[0])
    enc_a = min(timeit.repeat(lambda: encode_batch("bench", "b", 1, a, plain[0].devices()), number=200,
                              repeat=repeats)) / (200 * len(a)) * 1e6
    enc_b = min(timeit.repeat(lambda: encode_batch("bench", "b", 1, b, attributed[0].devices()), number=200,
                              repeat=repeats)) / (200 * len(b)) * 1e6
    return dict(lookup_us_per_process_sample=round(look, 3), encode_us_per_gpu_sample_without=round(enc_a, 2),
                encode_us_per_gpu_sample_with=round(enc_b, 2), encode_added_us=round(enc_b - enc_a, 2),
                added_us_per_gpu_sample=round(look * len(flat) / GPUS + enc_b - enc_a, 2))


def first_sight(root: Path, pids: dict[int, list[int]], pods, rounds: int = 200) -> float:
    """µs to read one process the first time (cgroup, environ, status, the pod join)."""
    flat = [(p, g) for g, ps in pids.items() for p in ps]
    c0 = time.process_time()
    for _ in range(rounds):
        at = Attributor(root, pods=pods)
        for p, g in flat:
            at.of(p, 5000, f"GPU-fake-{g:04d}", g)
    return (time.process_time() - c0) / (rounds * len(flat)) * 1e6


def decode_costs(agent, rounds: int = 9, number: int = 50) -> tuple[float, float]:
    """µs for the analyzer to validate and decode one second's batch (8 GPUs
    x 10 samples) without and with its attributions: the same samples, the
    two timed in turn, the best round of each."""
    import timeit
    from dataclasses import replace
    samples = [s for _ in range(HZ) for s in agent.collector.scrape().samples]
    t0 = time.time()
    for s in samples:
        s.t = t0 - 1
    bare = [replace(s, processes=tuple(replace(p, attribution=None) for p in s.processes)) for s in samples]
    batches = [encode_batch("bench", "b", 1, x, agent.devices()) for x in (bare, samples)]
    best = [float("inf"), float("inf")]
    for _ in range(rounds):
        for i, batch in enumerate(batches):
            best[i] = min(best[i], timeit.timeit(lambda: decode(batch), number=number) / number * 1e6)
    return best[0], best[1]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ticks", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--procs", type=int, default=1, help="GPU processes per GPU")
    ns = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "proc"
        pids = fake_proc(root, ns.procs)
        sock = Path(tmp) / "kubelet.sock"
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pr_grpc.add_PodResourcesListerServicer_to_server(Kubelet(), server)
        server.add_insecure_port(f"unix://{sock}")
        server.start()
        pods = PodResources(KubeletConfig(socket=str(sock), refresh_s=1.0))
        pods.start()
        try:
            deadline = time.monotonic() + 10
            while not pods.holders("GPU-fake-0000", 0) and time.monotonic() < deadline:
                time.sleep(0.01)
            attributor = Attributor(root, pods=pods)
            plain = agent_for(root, pids, None)
            attributed = agent_for(root, pids, attributor)
            sample = attributed[0].collector.scrape().samples
            assert sample[0].processes[0].attribution.pod == "trainer-0", sample[0].processes[0]
            assert sample[1].processes[0].attribution.slurm_job == "81235", sample[1].processes[0]
            without, with_ = [], []
            for _ in range(ns.rounds):        # interleaved: the machine's noise falls on both alike
                without.append(per_sample(*plain, ns.ticks))
                with_.append(per_sample(*attributed, ns.ticks))
            a, b = statistics.median(without) * 1e6, statistics.median(with_) * 1e6
            best_a, best_b = min(without) * 1e6, min(with_) * 1e6
            out = dict(date=time.strftime("%Y-%m-%d %H:%M"), machine=f"{platform.node()} {os.cpu_count()} cpu",
                       load=os.getloadavg()[0], python=platform.python_version(), gpus=GPUS, procs_per_gpu=ns.procs,
                       ticks_per_round=ns.ticks, rounds=ns.rounds,
                       tick_path=dict(
                           median_us_per_gpu_sample_without=round(a, 2), median_us_per_gpu_sample_with=round(b, 2),
                           median_ratio=round(b / a, 3), best_us_per_gpu_sample_without=round(best_a, 2),
                           best_us_per_gpu_sample_with=round(best_b, 2), best_ratio=round(best_b / best_a, 3),
                           best_added_us=round(best_b - best_a, 2),
                           rounds_without=[round(x * 1e6, 2) for x in without],
                           rounds_with=[round(x * 1e6, 2) for x in with_]),
                       isolated=isolated(root, pids, pods, plain, attributed),
                       first_sight_us_per_process=round(first_sight(root, pids, pods), 1),
                       kubelet=pods.status(), attribution_status=attributor.status(),
                       decode_us_per_batch=dict(zip(("without", "with"),
                                                    (round(x, 1) for x in decode_costs(attributed[0])))))
        finally:
            pods.close()
            server.stop(grace=None)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
