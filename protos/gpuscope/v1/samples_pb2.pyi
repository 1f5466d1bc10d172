from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class HealthKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    HEALTH_KIND_UNSPECIFIED: _ClassVar[HealthKind]
    HEALTH_KIND_GPU_LOST: _ClassVar[HealthKind]
    HEALTH_KIND_XID: _ClassVar[HealthKind]
    HEALTH_KIND_ECC_UNCORRECTED: _ClassVar[HealthKind]
    HEALTH_KIND_SOURCE_ERROR: _ClassVar[HealthKind]
    HEALTH_KIND_RECOVERED: _ClassVar[HealthKind]
HEALTH_KIND_UNSPECIFIED: HealthKind
HEALTH_KIND_GPU_LOST: HealthKind
HEALTH_KIND_XID: HealthKind
HEALTH_KIND_ECC_UNCORRECTED: HealthKind
HEALTH_KIND_SOURCE_ERROR: HealthKind
HEALTH_KIND_RECOVERED: HealthKind

class Device(_message.Message):
    __slots__ = ("gpu", "uuid", "name", "architecture", "memory_total_bytes", "power_limit_watts", "pcie_generation", "pcie_width", "gpm_supported", "lost", "source", "attribution", "pcie_max_generation", "pcie_max_width", "driver_version", "pcie_busy_generation", "pcie_busy_width")
    GPU_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    ARCHITECTURE_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    POWER_LIMIT_WATTS_FIELD_NUMBER: _ClassVar[int]
    PCIE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    PCIE_WIDTH_FIELD_NUMBER: _ClassVar[int]
    GPM_SUPPORTED_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    PCIE_MAX_GENERATION_FIELD_NUMBER: _ClassVar[int]
    PCIE_MAX_WIDTH_FIELD_NUMBER: _ClassVar[int]
    DRIVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    PCIE_BUSY_GENERATION_FIELD_NUMBER: _ClassVar[int]
    PCIE_BUSY_WIDTH_FIELD_NUMBER: _ClassVar[int]
    gpu: int
    uuid: str
    name: str
    architecture: str
    memory_total_bytes: int
    power_limit_watts: float
    pcie_generation: int
    pcie_width: int
    gpm_supported: bool
    lost: bool
    source: str
    attribution: int
    pcie_max_generation: int
    pcie_max_width: int
    driver_version: str
    pcie_busy_generation: int
    pcie_busy_width: int
    def __init__(self, gpu: _Optional[int] = ..., uuid: _Optional[str] = ..., name: _Optional[str] = ..., architecture: _Optional[str] = ..., memory_total_bytes: _Optional[int] = ..., power_limit_watts: _Optional[float] = ..., pcie_generation: _Optional[int] = ..., pcie_width: _Optional[int] = ..., gpm_supported: _Optional[bool] = ..., lost: _Optional[bool] = ..., source: _Optional[str] = ..., attribution: _Optional[int] = ..., pcie_max_generation: _Optional[int] = ..., pcie_max_width: _Optional[int] = ..., driver_version: _Optional[str] = ..., pcie_busy_generation: _Optional[int] = ..., pcie_busy_width: _Optional[int] = ...) -> None: ...

class Column(_message.Message):
    __slots__ = ("metric", "f64le", "valid")
    METRIC_FIELD_NUMBER: _ClassVar[int]
    F64LE_FIELD_NUMBER: _ClassVar[int]
    VALID_FIELD_NUMBER: _ClassVar[int]
    metric: str
    f64le: bytes
    valid: bytes
    def __init__(self, metric: _Optional[str] = ..., f64le: _Optional[bytes] = ..., valid: _Optional[bytes] = ...) -> None: ...

class ProcessSample(_message.Message):
    __slots__ = ("sample", "pid", "used_memory_bytes", "cpu_cores", "command", "attribution")
    SAMPLE_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    USED_MEMORY_BYTES_FIELD_NUMBER: _ClassVar[int]
    CPU_CORES_FIELD_NUMBER: _ClassVar[int]
    COMMAND_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    sample: int
    pid: int
    used_memory_bytes: int
    cpu_cores: float
    command: str
    attribution: int
    def __init__(self, sample: _Optional[int] = ..., pid: _Optional[int] = ..., used_memory_bytes: _Optional[int] = ..., cpu_cores: _Optional[float] = ..., command: _Optional[str] = ..., attribution: _Optional[int] = ...) -> None: ...

class Attribution(_message.Message):
    __slots__ = ("user", "container_id", "runtime", "pod", "namespace", "container", "pod_uid", "slurm_job", "slurm_step", "slurm_user", "unit", "workload", "cgroup", "dist_job", "rank", "world_size")
    USER_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_ID_FIELD_NUMBER: _ClassVar[int]
    RUNTIME_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_FIELD_NUMBER: _ClassVar[int]
    POD_UID_FIELD_NUMBER: _ClassVar[int]
    SLURM_JOB_FIELD_NUMBER: _ClassVar[int]
    SLURM_STEP_FIELD_NUMBER: _ClassVar[int]
    SLURM_USER_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    WORKLOAD_FIELD_NUMBER: _ClassVar[int]
    CGROUP_FIELD_NUMBER: _ClassVar[int]
    DIST_JOB_FIELD_NUMBER: _ClassVar[int]
    RANK_FIELD_NUMBER: _ClassVar[int]
    WORLD_SIZE_FIELD_NUMBER: _ClassVar[int]
    user: str
    container_id: str
    runtime: str
    pod: str
    namespace: str
    container: str
    pod_uid: str
    slurm_job: str
    slurm_step: str
    slurm_user: str
    unit: str
    workload: str
    cgroup: str
    dist_job: str
    rank: str
    world_size: str
    def __init__(self, user: _Optional[str] = ..., container_id: _Optional[str] = ..., runtime: _Optional[str] = ..., pod: _Optional[str] = ..., namespace: _Optional[str] = ..., container: _Optional[str] = ..., pod_uid: _Optional[str] = ..., slurm_job: _Optional[str] = ..., slurm_step: _Optional[str] = ..., slurm_user: _Optional[str] = ..., unit: _Optional[str] = ..., workload: _Optional[str] = ..., cgroup: _Optional[str] = ..., dist_job: _Optional[str] = ..., rank: _Optional[str] = ..., world_size: _Optional[str] = ...) -> None: ...

class HealthEvent(_message.Message):
    __slots__ = ("gpu", "t", "kind", "detail", "code")
    GPU_FIELD_NUMBER: _ClassVar[int]
    T_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DETAIL_FIELD_NUMBER: _ClassVar[int]
    CODE_FIELD_NUMBER: _ClassVar[int]
    gpu: int
    t: float
    kind: HealthKind
    detail: str
    code: int
    def __init__(self, gpu: _Optional[int] = ..., t: _Optional[float] = ..., kind: _Optional[_Union[HealthKind, str]] = ..., detail: _Optional[str] = ..., code: _Optional[int] = ...) -> None: ...

class SampleBatch(_message.Message):
    __slots__ = ("host", "boot_id", "seq", "count", "t_f64le", "gpu_u32le", "columns", "processes", "devices", "health", "dropped_samples", "min_unacked_seq", "attributions")
    HOST_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    T_F64LE_FIELD_NUMBER: _ClassVar[int]
    GPU_U32LE_FIELD_NUMBER: _ClassVar[int]
    COLUMNS_FIELD_NUMBER: _ClassVar[int]
    PROCESSES_FIELD_NUMBER: _ClassVar[int]
    DEVICES_FIELD_NUMBER: _ClassVar[int]
    HEALTH_FIELD_NUMBER: _ClassVar[int]
    DROPPED_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    MIN_UNACKED_SEQ_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTIONS_FIELD_NUMBER: _ClassVar[int]
    host: str
    boot_id: str
    seq: int
    count: int
    t_f64le: bytes
    gpu_u32le: bytes
    columns: _containers.RepeatedCompositeFieldContainer[Column]
    processes: _containers.RepeatedCompositeFieldContainer[ProcessSample]
    devices: _containers.RepeatedCompositeFieldContainer[Device]
    health: _containers.RepeatedCompositeFieldContainer[HealthEvent]
    dropped_samples: int
    min_unacked_seq: int
    attributions: _containers.RepeatedCompositeFieldContainer[Attribution]
    def __init__(self, host: _Optional[str] = ..., boot_id: _Optional[str] = ..., seq: _Optional[int] = ..., count: _Optional[int] = ..., t_f64le: _Optional[bytes] = ..., gpu_u32le: _Optional[bytes] = ..., columns: _Optional[_Iterable[_Union[Column, _Mapping]]] = ..., processes: _Optional[_Iterable[_Union[ProcessSample, _Mapping]]] = ..., devices: _Optional[_Iterable[_Union[Device, _Mapping]]] = ..., health: _Optional[_Iterable[_Union[HealthEvent, _Mapping]]] = ..., dropped_samples: _Optional[int] = ..., min_unacked_seq: _Optional[int] = ..., attributions: _Optional[_Iterable[_Union[Attribution, _Mapping]]] = ...) -> None: ...

class BatchAck(_message.Message):
    __slots__ = ("seq", "status", "error")
    class Status(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STATUS_UNSPECIFIED: _ClassVar[BatchAck.Status]
        COMMITTED: _ClassVar[BatchAck.Status]
        DUPLICATE: _ClassVar[BatchAck.Status]
        REJECTED: _ClassVar[BatchAck.Status]
    STATUS_UNSPECIFIED: BatchAck.Status
    COMMITTED: BatchAck.Status
    DUPLICATE: BatchAck.Status
    REJECTED: BatchAck.Status
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    seq: int
    status: BatchAck.Status
    error: str
    def __init__(self, seq: _Optional[int] = ..., status: _Optional[_Union[BatchAck.Status, str]] = ..., error: _Optional[str] = ...) -> None: ...

class CaptureRecord(_message.Message):
    __slots__ = ("id", "host", "target", "pid", "gpus", "job", "start", "end", "duration_ms", "path", "size_bytes", "status", "error", "trigger", "kind")
    ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    TRIGGER_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    id: str
    host: str
    target: str
    pid: int
    gpus: _containers.RepeatedScalarFieldContainer[int]
    job: str
    start: float
    end: float
    duration_ms: int
    path: str
    size_bytes: int
    status: str
    error: str
    trigger: str
    kind: str
    def __init__(self, id: _Optional[str] = ..., host: _Optional[str] = ..., target: _Optional[str] = ..., pid: _Optional[int] = ..., gpus: _Optional[_Iterable[int]] = ..., job: _Optional[str] = ..., start: _Optional[float] = ..., end: _Optional[float] = ..., duration_ms: _Optional[int] = ..., path: _Optional[str] = ..., size_bytes: _Optional[int] = ..., status: _Optional[str] = ..., error: _Optional[str] = ..., trigger: _Optional[str] = ..., kind: _Optional[str] = ...) -> None: ...
