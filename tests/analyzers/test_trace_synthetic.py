"""Hand-built XSpaces for what the fixtures lack: collectives on a
multi-stream GPU, their overlap with compute, and an all-reduce-bound step."""
from gpuscope.analyzers.trace_analysis import summarize
from gpuscope.collectors.xspace_reader import parse_xspace
from gpuscope.xla import xplane_pb2

US = 1_000_000   # ps per µs


def _space(kernels):
    """kernels: (stream, name, hlo_op, start_us, dur_us)"""
    space = xplane_pb2.XSpace()
    plane = space.planes.add(id=1, name="/device:GPU:0")
    names = {}
    for i, key in enumerate(["hlo_op", "memory_bandwidth", "core_count", "clock_rate", "compute_cap_major",
                             "compute_cap_minor", "correlation_id"], start=1):
        plane.stat_metadata[i].id = i
        plane.stat_metadata[i].name = key
        names[key] = i
    for key, value in (("memory_bandwidth", 3.35e12), ("core_count", 132), ("clock_rate", 1_830_000),
                       ("compute_cap_major", 9), ("compute_cap_minor", 0)):
        st = plane.stats.add(metadata_id=names[key])
        if key == "memory_bandwidth":
            st.uint64_value = int(value)
        else:
            st.int64_value = int(value)
    lines = {}
    meta = {}
    for n, (stream, name, op, start, dur) in enumerate(kernels):
        if stream not in lines:
            lines[stream] = plane.lines.add(id=stream, name=f"Stream #{stream}(Compute)", timestamp_ns=0)
        if name not in meta:
            mid = len(meta) + 1
            plane.event_metadata[mid].id = mid
            plane.event_metadata[mid].name = name
            meta[name] = mid
        ev = lines[stream].events.add(metadata_id=meta[name], offset_ps=int(start * US), duration_ps=int(dur * US))
        ev.stats.add(metadata_id=names["hlo_op"], str_value=op)
        ev.stats.add(metadata_id=names["correlation_id"], int64_value=n)
    return parse_xspace(space.SerializeToString(), "synthetic.xplane.pb")


def test_overlapped_all_reduce_is_measured_and_does_not_dominate():
    k = []
    for step in range(20):
        t = step * 1000
        k.append((7, "sm90_xmma_gemm_bf16", "custom-call.1", t, 900))
        k.append((9, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "all-reduce-start.1", t + 100, 600))
    s = summarize(_space(k))
    comm = s["communication"]
    assert 0.55 < comm["collective_fraction"] < 0.65
    assert comm["collective_overlap_with_compute"] == 1.0 and comm["exposed_fraction"] == 0.0
    assert s["verdict"] == "compute-bound"


def test_exposed_all_reduce_makes_the_step_communication_bound():
    k = []
    for step in range(20):
        t = step * 1000
        k.append((7, "sm90_xmma_gemm_bf16", "custom-call.1", t, 200))
        k.append((9, "ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "all-reduce.3", t + 200, 750))
    s = summarize(_space(k))
    assert s["verdict"] == "communication-bound", s["summary"]
    assert s["communication"]["exposed_fraction"] > 0.7
