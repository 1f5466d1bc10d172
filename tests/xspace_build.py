"""XSpaces built with the real protobuf schema, for trace patterns with known
truth: a device plane (kernels with HLO op, program id and correlation id),
a host plane (threads of nested events, launches carrying the correlation
id of the kernel they launched), and HLO modules in the metadata plane, laid
out the way jax.profiler writes them (see the bundled H200 traces)."""
from __future__ import annotations

from gpuscope.xla import xplane_pb2

PS_PER_US = 1_000_000
H200 = dict(memory_bandwidth=4.8e12, core_count=132, clock_rate=1_980_000, compute_cap_major=9,
            compute_cap_minor=0)


class _Plane:
    def __init__(self, plane):
        self.plane = plane
        self._stats: dict[str, int] = {}
        self._events: dict[str, int] = {}

    def stat(self, name: str) -> int:
        return self._id(self.plane.stat_metadata, self._stats, name)

    def event(self, name: str) -> int:
        return self._id(self.plane.event_metadata, self._events, name)

    @staticmethod
    def _id(table, known: dict[str, int], name: str) -> int:
        if name not in known:
            i = len(known) + 1
            table[i].id = i
            table[i].name = name
            known[name] = i
        return known[name]


class SpaceBuilder:
    def __init__(self, device_props: dict | None = H200):
        self.space = xplane_pb2.XSpace()
        self.space.hostnames.append("synthetic")
        self._props = device_props or {}
        self._devs: dict[int, _Plane] = {}
        self._device(0)
        self._host = _Plane(self.space.planes.add(id=2, name="/host:CPU"))
        self._meta = _Plane(self.space.planes.add(id=3, name="/host:metadata"))
        self._streams: dict[tuple[int, int], object] = {}
        self._threads: dict[str, object] = {}
        self._corr = 0

    # -- device ---------------------------------------------------------------------------
    def _device(self, gpu: int) -> _Plane:
        if gpu not in self._devs:
            dev = _Plane(self.space.planes.add(id=100 + gpu, name=f"/device:GPU:{gpu}"))
            for key, value in self._props.items():
                dev.plane.stats.add(metadata_id=dev.stat(key)).uint64_value = int(value)
            self._devs[gpu] = dev
        return self._devs[gpu]

    def kernel(self, start_us: float, dur_us: float, name: str = "loop_add_fusion", hlo_op: str = "",
               program_id: str = "", stream: int = 7, corr: int | None = None, gpu: int = 0) -> int:
        """A device activity on GPU `gpu`; returns its correlation id (for the launch)."""
        dev = self._device(gpu)
        if (gpu, stream) not in self._streams:
            self._streams[(gpu, stream)] = dev.plane.lines.add(id=stream, name=f"Stream #{stream}(Compute)",
                                                               timestamp_ns=0)
        if corr is None:
            self._corr += 1
            corr = self._corr
        ev = self._streams[(gpu, stream)].events.add(metadata_id=dev.event(name),
                                              offset_ps=int(start_us * PS_PER_US),
                                              duration_ps=int(dur_us * PS_PER_US))
        ev.stats.add(metadata_id=dev.stat("correlation_id"), int64_value=corr)
        if hlo_op:
            ev.stats.add(metadata_id=dev.stat("hlo_op"), str_value=hlo_op)
        if program_id:
            ev.stats.add(metadata_id=dev.stat("program_id"), str_value=program_id)
        return corr

    # -- host -----------------------------------------------------------------------------
    def host(self, thread: str, start_us: float, dur_us: float, name: str, corr: int | None = None) -> None:
        """A host event on `thread`; nest events by giving them times inside
        their parent's. `corr`: this event launched the device activity with it."""
        if thread not in self._threads:
            self._threads[thread] = self._host.plane.lines.add(id=len(self._threads) + 1, name=thread,
                                                               display_name=thread, timestamp_ns=0)
        ev = self._threads[thread].events.add(metadata_id=self._host.event(name),
                                              offset_ps=int(start_us * PS_PER_US),
                                              duration_ps=int(dur_us * PS_PER_US))
        if corr is not None:
            ev.stats.add(metadata_id=self._host.stat("correlation_id"), int64_value=corr)

    def launch(self, thread: str, at_us: float, dispatch_us: float, kernel_start_us: float, kernel_dur_us: float,
               name: str = "loop_add_fusion", **kernel) -> None:
        """The JAX dispatch path on `thread` (PjitFunction > Execute > the
        launch, named after the kernel as XLA names it), then the kernel."""
        corr = self.kernel(kernel_start_us, kernel_dur_us, name, **kernel)
        self.host(thread, at_us, dispatch_us, "PjitFunction(step)")
        self.host(thread, at_us + dispatch_us * 0.1, dispatch_us * 0.8,
                  "[0] PjRtStreamExecutorRawLoadedExecutable::Execute")
        self.host(thread, at_us + dispatch_us * 0.5, dispatch_us * 0.3, name, corr=corr)

    # -- HLO --------------------------------------------------------------------------------
    def hlo_module(self, program_id: str, module_name: str, hlo_proto: bytes) -> None:
        m = self._meta.plane.event_metadata[len(self._meta.plane.event_metadata) + 1]
        m.id = len(self._meta.plane.event_metadata)
        m.name = f"{module_name}({program_id})"
        m.stats.add(metadata_id=self._meta.stat("Hlo Proto"), bytes_value=hlo_proto)
        m.stats.add(metadata_id=self._meta.stat("program_id"), str_value=program_id)

    def bytes(self) -> bytes:
        return self.space.SerializeToString()
