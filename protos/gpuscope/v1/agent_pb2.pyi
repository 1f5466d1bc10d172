from gpuscope.v1 import samples_pb2 as _samples_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CaptureRequest(_message.Message):
    __slots__ = ("jax_address", "pid", "duration_ms", "trigger")
    JAX_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    jax_address: str
    pid: int
    duration_ms: int
    trigger: str
    def __init__(self, jax_address: _Optional[str] = ..., pid: _Optional[int] = ..., duration_ms: _Optional[int] = ..., trigger: _Optional[str] = ...) -> None: ...

class CaptureReply(_message.Message):
    __slots__ = ("record", "xspace")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    XSPACE_FIELD_NUMBER: _ClassVar[int]
    record: _samples_pb2.CaptureRecord
    xspace: bytes
    def __init__(self, record: _Optional[_Union[_samples_pb2.CaptureRecord, _Mapping]] = ..., xspace: _Optional[bytes] = ...) -> None: ...

class ListCapturesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListCapturesReply(_message.Message):
    __slots__ = ("captures",)
    CAPTURES_FIELD_NUMBER: _ClassVar[int]
    captures: _containers.RepeatedCompositeFieldContainer[_samples_pb2.CaptureRecord]
    def __init__(self, captures: _Optional[_Iterable[_Union[_samples_pb2.CaptureRecord, _Mapping]]] = ...) -> None: ...

class ListJobsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Job(_message.Message):
    __slots__ = ("pid", "address", "gpus", "command", "found_by", "kind", "trace_dir", "attribution")
    PID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    FOUND_BY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    TRACE_DIR_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    pid: int
    address: str
    gpus: _containers.RepeatedScalarFieldContainer[int]
    command: str
    found_by: str
    kind: str
    trace_dir: str
    attribution: _samples_pb2.Attribution
    def __init__(self, pid: _Optional[int] = ..., address: _Optional[str] = ..., gpus: _Optional[_Iterable[int]] = ..., command: _Optional[str] = ..., found_by: _Optional[str] = ..., kind: _Optional[str] = ..., trace_dir: _Optional[str] = ..., attribution: _Optional[_Union[_samples_pb2.Attribution, _Mapping]] = ...) -> None: ...

class ListJobsReply(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ...) -> None: ...

class AgentStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class AgentStatus(_message.Message):
    __slots__ = ("host", "boot_id", "source", "interval_seconds", "ticks", "samples", "dropped_samples", "batches_sent", "batches_acked", "batches_rejected", "unacked_samples", "uplink_connected", "analyzer", "devices", "cpu_seconds", "tick_overruns", "last_error", "source_errors", "attribution")
    class SourceErrorsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class AttributionEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    HOST_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TICKS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    DROPPED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    BATCHES_SENT_FIELD_NUMBER: _ClassVar[int]
    BATCHES_ACKED_FIELD_NUMBER: _ClassVar[int]
    BATCHES_REJECTED_FIELD_NUMBER: _ClassVar[int]
    UNACKED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    UPLINK_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    ANALYZER_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    CPU_SECONDS_FIELD_NUMBER: _ClassVar[int]
    TICK_OVERRUNS_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    SOURCE_ERRORS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    host: str
    boot_id: str
    source: str
    interval_seconds: float
    ticks: int
    samples: int
    dropped_samples: int
    batches_sent: int
    batches_acked: int
    batches_rejected: int
    unacked_samples: int
    uplink_connected: bool
    analyzer: str
    devices: _containers.RepeatedCompositeFieldContainer[_samples_pb2.Device]
    cpu_seconds: float
    tick_overruns: int
    last_error: str
    source_errors: _containers.ScalarMap[str, int]
    attribution: _containers.ScalarMap[str, str]
    def __init__(self, host: _Optional[str] = ..., boot_id: _Optional[str] = ..., source: _Optional[str] = ..., interval_seconds: _Optional[float] = ..., ticks: _Optional[int] = ..., samples: _Optional[int] = ..., dropped_samples: _Optional[int] = ..., batches_sent: _Optional[int] = ..., batches_acked: _Optional[int] = ..., batches_rejected: _Optional[int] = ..., unacked_samples: _Optional[int] = ..., uplink_connected: _Optional[bool] = ..., analyzer: _Optional[str] = ..., devices: _Optional[_Iterable[_Union[_samples_pb2.Device, _Mapping]]] = ..., cpu_seconds: _Optional[float] = ..., tick_overruns: _Optional[int] = ..., last_error: _Optional[str] = ..., source_errors: _Optional[_Mapping[str, int]] = ..., attribution: _Optional[_Mapping[str, str]] = ...) -> None: ...

class RecentSamplesRequest(_message.Message):
    __slots__ = ("seconds", "gpu")
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    seconds: float
    gpu: int
    def __init__(self, seconds: _Optional[float] = ..., gpu: _Optional[int] = ...) -> None: ...
