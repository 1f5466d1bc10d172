from gpuscope.v1 import samples_pb2 as _samples_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AgentHello(_message.Message):
    __slots__ = ("host", "boot_id")
    HOST_FIELD_NUMBER: _ClassVar[int]
    BOOT_ID_FIELD_NUMBER: _ClassVar[int]
    host: str
    boot_id: str
    def __init__(self, host: _Optional[str] = ..., boot_id: _Optional[str] = ...) -> None: ...

class Command(_message.Message):
    __slots__ = ("id", "gpu", "pid", "kind", "duration_ms", "reason", "start_at", "sent_at")
    ID_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    START_AT_FIELD_NUMBER: _ClassVar[int]
    SENT_AT_FIELD_NUMBER: _ClassVar[int]
    id: str
    gpu: int
    pid: int
    kind: str
    duration_ms: int
    reason: str
    start_at: float
    sent_at: float
    def __init__(self, id: _Optional[str] = ..., gpu: _Optional[int] = ..., pid: _Optional[int] = ..., kind: _Optional[str] = ..., duration_ms: _Optional[int] = ..., reason: _Optional[str] = ..., start_at: _Optional[float] = ..., sent_at: _Optional[float] = ...) -> None: ...

class WatchRequest(_message.Message):
    __slots__ = ("host", "gpu", "verdicts", "kinds")
    HOST_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    VERDICTS_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    host: str
    gpu: int
    verdicts: _containers.RepeatedScalarFieldContainer[str]
    kinds: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, host: _Optional[str] = ..., gpu: _Optional[int] = ..., verdicts: _Optional[_Iterable[str]] = ..., kinds: _Optional[_Iterable[str]] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("kind", "t", "host", "gpu", "verdict", "json")
    KIND_FIELD_NUMBER: _ClassVar[int]
    T_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    JSON_FIELD_NUMBER: _ClassVar[int]
    kind: str
    t: float
    host: str
    gpu: int
    verdict: str
    json: str
    def __init__(self, kind: _Optional[str] = ..., t: _Optional[float] = ..., host: _Optional[str] = ..., gpu: _Optional[int] = ..., verdict: _Optional[str] = ..., json: _Optional[str] = ...) -> None: ...

class TopRequest(_message.Message):
    __slots__ = ("start", "end", "host", "by", "limit")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    start: float
    end: float
    host: str
    by: str
    limit: int
    def __init__(self, start: _Optional[float] = ..., end: _Optional[float] = ..., host: _Optional[str] = ..., by: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class TopRow(_message.Message):
    __slots__ = ("host", "gpu", "job", "verdict", "bottleneck_seconds", "share", "findings", "gpus", "now_verdict", "now_since", "confidence", "summary", "flags", "finding_id", "attribution", "verdicts", "stale", "last_seen_age_seconds", "conditions")
    HOST_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    BOTTLENECK_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    NOW_VERDICT_FIELD_NUMBER: _ClassVar[int]
    NOW_SINCE_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    FINDING_ID_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    VERDICTS_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    host: str
    gpu: int
    job: str
    verdict: str
    bottleneck_seconds: float
    share: float
    findings: int
    gpus: int
    now_verdict: str
    now_since: float
    confidence: float
    summary: str
    flags: _containers.RepeatedScalarFieldContainer[str]
    finding_id: str
    attribution: _samples_pb2.Attribution
    verdicts: _containers.RepeatedCompositeFieldContainer[VerdictSeconds]
    stale: bool
    last_seen_age_seconds: float
    conditions: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, host: _Optional[str] = ..., gpu: _Optional[int] = ..., job: _Optional[str] = ..., verdict: _Optional[str] = ..., bottleneck_seconds: _Optional[float] = ..., share: _Optional[float] = ..., findings: _Optional[int] = ..., gpus: _Optional[int] = ..., now_verdict: _Optional[str] = ..., now_since: _Optional[float] = ..., confidence: _Optional[float] = ..., summary: _Optional[str] = ..., flags: _Optional[_Iterable[str]] = ..., finding_id: _Optional[str] = ..., attribution: _Optional[_Union[_samples_pb2.Attribution, _Mapping]] = ..., verdicts: _Optional[_Iterable[_Union[VerdictSeconds, _Mapping]]] = ..., stale: _Optional[bool] = ..., last_seen_age_seconds: _Optional[float] = ..., conditions: _Optional[_Iterable[str]] = ...) -> None: ...

class VerdictSeconds(_message.Message):
    __slots__ = ("verdict", "seconds")
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    SECONDS_FIELD_NUMBER: _ClassVar[int]
    verdict: str
    seconds: float
    def __init__(self, verdict: _Optional[str] = ..., seconds: _Optional[float] = ...) -> None: ...

class TopResponse(_message.Message):
    __slots__ = ("rows", "start", "end", "by", "conditions")
    ROWS_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    BY_FIELD_NUMBER: _ClassVar[int]
    CONDITIONS_FIELD_NUMBER: _ClassVar[int]
    rows: _containers.RepeatedCompositeFieldContainer[TopRow]
    start: float
    end: float
    by: str
    conditions: _containers.RepeatedCompositeFieldContainer[Finding]
    def __init__(self, rows: _Optional[_Iterable[_Union[TopRow, _Mapping]]] = ..., start: _Optional[float] = ..., end: _Optional[float] = ..., by: _Optional[str] = ..., conditions: _Optional[_Iterable[_Union[Finding, _Mapping]]] = ...) -> None: ...

class RecordsRequest(_message.Message):
    __slots__ = ("table", "host", "since", "limit")
    TABLE_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    SINCE_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    table: str
    host: str
    since: float
    limit: int
    def __init__(self, table: _Optional[str] = ..., host: _Optional[str] = ..., since: _Optional[float] = ..., limit: _Optional[int] = ...) -> None: ...

class RecordsResponse(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, json: _Optional[_Iterable[str]] = ...) -> None: ...

class AccuracyRequest(_message.Message):
    __slots__ = ("start", "end", "host")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    start: float
    end: float
    host: str
    def __init__(self, start: _Optional[float] = ..., end: _Optional[float] = ..., host: _Optional[str] = ...) -> None: ...

class VerdictPairs(_message.Message):
    __slots__ = ("model", "counters_verdict", "trace_verdict", "pairs")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_VERDICT_FIELD_NUMBER: _ClassVar[int]
    TRACE_VERDICT_FIELD_NUMBER: _ClassVar[int]
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    model: str
    counters_verdict: str
    trace_verdict: str
    pairs: int
    def __init__(self, model: _Optional[str] = ..., counters_verdict: _Optional[str] = ..., trace_verdict: _Optional[str] = ..., pairs: _Optional[int] = ...) -> None: ...

class AccuracyResponse(_message.Message):
    __slots__ = ("pairs",)
    PAIRS_FIELD_NUMBER: _ClassVar[int]
    pairs: _containers.RepeatedCompositeFieldContainer[VerdictPairs]
    def __init__(self, pairs: _Optional[_Iterable[_Union[VerdictPairs, _Mapping]]] = ...) -> None: ...

class DegradedRequest(_message.Message):
    __slots__ = ("start", "end")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    start: float
    end: float
    def __init__(self, start: _Optional[float] = ..., end: _Optional[float] = ...) -> None: ...

class DegradedGpu(_message.Message):
    __slots__ = ("host", "gpu", "uuid", "model", "dimension", "value", "peer_median", "peers", "shortfall", "z", "unit", "summary", "driver", "pcie_generation", "pcie_width", "pcie_max_generation", "pcie_max_width")
    HOST_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    PEER_MEDIAN_FIELD_NUMBER: _ClassVar[int]
    PEERS_FIELD_NUMBER: _ClassVar[int]
    SHORTFALL_FIELD_NUMBER: _ClassVar[int]
    Z_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    PCIE_GENERATION_FIELD_NUMBER: _ClassVar[int]
    PCIE_WIDTH_FIELD_NUMBER: _ClassVar[int]
    PCIE_MAX_GENERATION_FIELD_NUMBER: _ClassVar[int]
    PCIE_MAX_WIDTH_FIELD_NUMBER: _ClassVar[int]
    host: str
    gpu: int
    uuid: str
    model: str
    dimension: str
    value: float
    peer_median: float
    peers: int
    shortfall: float
    z: float
    unit: str
    summary: str
    driver: str
    pcie_generation: int
    pcie_width: int
    pcie_max_generation: int
    pcie_max_width: int
    def __init__(self, host: _Optional[str] = ..., gpu: _Optional[int] = ..., uuid: _Optional[str] = ..., model: _Optional[str] = ..., dimension: _Optional[str] = ..., value: _Optional[float] = ..., peer_median: _Optional[float] = ..., peers: _Optional[int] = ..., shortfall: _Optional[float] = ..., z: _Optional[float] = ..., unit: _Optional[str] = ..., summary: _Optional[str] = ..., driver: _Optional[str] = ..., pcie_generation: _Optional[int] = ..., pcie_width: _Optional[int] = ..., pcie_max_generation: _Optional[int] = ..., pcie_max_width: _Optional[int] = ...) -> None: ...

class UnjudgedGroup(_message.Message):
    __slots__ = ("model", "driver", "dimension", "gpus", "min_peers")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    DRIVER_FIELD_NUMBER: _ClassVar[int]
    DIMENSION_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    MIN_PEERS_FIELD_NUMBER: _ClassVar[int]
    model: str
    driver: str
    dimension: str
    gpus: int
    min_peers: int
    def __init__(self, model: _Optional[str] = ..., driver: _Optional[str] = ..., dimension: _Optional[str] = ..., gpus: _Optional[int] = ..., min_peers: _Optional[int] = ...) -> None: ...

class DegradedResponse(_message.Message):
    __slots__ = ("gpus", "unjudged")
    GPUS_FIELD_NUMBER: _ClassVar[int]
    UNJUDGED_FIELD_NUMBER: _ClassVar[int]
    gpus: _containers.RepeatedCompositeFieldContainer[DegradedGpu]
    unjudged: _containers.RepeatedCompositeFieldContainer[UnjudgedGroup]
    def __init__(self, gpus: _Optional[_Iterable[_Union[DegradedGpu, _Mapping]]] = ..., unjudged: _Optional[_Iterable[_Union[UnjudgedGroup, _Mapping]]] = ...) -> None: ...

class ReportRequest(_message.Message):
    __slots__ = ("finding_id", "context_seconds")
    FINDING_ID_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    finding_id: str
    context_seconds: float
    def __init__(self, finding_id: _Optional[str] = ..., context_seconds: _Optional[float] = ...) -> None: ...

class ReportResponse(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...

class RangeReportRequest(_message.Message):
    __slots__ = ("start", "end", "host", "gpu", "max_points", "max_gpus")
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    MAX_POINTS_FIELD_NUMBER: _ClassVar[int]
    MAX_GPUS_FIELD_NUMBER: _ClassVar[int]
    start: float
    end: float
    host: str
    gpu: int
    max_points: int
    max_gpus: int
    def __init__(self, start: _Optional[float] = ..., end: _Optional[float] = ..., host: _Optional[str] = ..., gpu: _Optional[int] = ..., max_points: _Optional[int] = ..., max_gpus: _Optional[int] = ...) -> None: ...

class CaptureReport(_message.Message):
    __slots__ = ("record", "xspace")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    XSPACE_FIELD_NUMBER: _ClassVar[int]
    record: _samples_pb2.CaptureRecord
    xspace: bytes
    def __init__(self, record: _Optional[_Union[_samples_pb2.CaptureRecord, _Mapping]] = ..., xspace: _Optional[bytes] = ...) -> None: ...

class CaptureChunk(_message.Message):
    __slots__ = ("record", "trace_bytes", "data")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    TRACE_BYTES_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    record: _samples_pb2.CaptureRecord
    trace_bytes: int
    data: bytes
    def __init__(self, record: _Optional[_Union[_samples_pb2.CaptureRecord, _Mapping]] = ..., trace_bytes: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class CaptureSummary(_message.Message):
    __slots__ = ("record", "verdict", "confidence", "summary_json", "finding_id")
    RECORD_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_JSON_FIELD_NUMBER: _ClassVar[int]
    FINDING_ID_FIELD_NUMBER: _ClassVar[int]
    record: _samples_pb2.CaptureRecord
    verdict: str
    confidence: float
    summary_json: str
    finding_id: str
    def __init__(self, record: _Optional[_Union[_samples_pb2.CaptureRecord, _Mapping]] = ..., verdict: _Optional[str] = ..., confidence: _Optional[float] = ..., summary_json: _Optional[str] = ..., finding_id: _Optional[str] = ...) -> None: ...

class CapturesRequest(_message.Message):
    __slots__ = ("host", "limit")
    HOST_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    host: str
    limit: int
    def __init__(self, host: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class CapturesResponse(_message.Message):
    __slots__ = ("captures",)
    CAPTURES_FIELD_NUMBER: _ClassVar[int]
    captures: _containers.RepeatedCompositeFieldContainer[CaptureSummary]
    def __init__(self, captures: _Optional[_Iterable[_Union[CaptureSummary, _Mapping]]] = ...) -> None: ...

class Evidence(_message.Message):
    __slots__ = ("numbers", "flags", "summary", "alternatives", "decided_by", "counters_verdict", "trace_verdict", "captures", "source")
    class NumbersEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    NUMBERS_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    SUMMARY_FIELD_NUMBER: _ClassVar[int]
    ALTERNATIVES_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    COUNTERS_VERDICT_FIELD_NUMBER: _ClassVar[int]
    TRACE_VERDICT_FIELD_NUMBER: _ClassVar[int]
    CAPTURES_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    numbers: _containers.ScalarMap[str, float]
    flags: _containers.RepeatedScalarFieldContainer[str]
    summary: str
    alternatives: _containers.RepeatedScalarFieldContainer[str]
    decided_by: str
    counters_verdict: str
    trace_verdict: str
    captures: _containers.RepeatedScalarFieldContainer[str]
    source: str
    def __init__(self, numbers: _Optional[_Mapping[str, float]] = ..., flags: _Optional[_Iterable[str]] = ..., summary: _Optional[str] = ..., alternatives: _Optional[_Iterable[str]] = ..., decided_by: _Optional[str] = ..., counters_verdict: _Optional[str] = ..., trace_verdict: _Optional[str] = ..., captures: _Optional[_Iterable[str]] = ..., source: _Optional[str] = ...) -> None: ...

class Finding(_message.Message):
    __slots__ = ("id", "host", "gpu", "job", "verdict", "start", "end", "confidence", "evidence", "windows", "attribution", "kind", "absorbed_until")
    ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    EVIDENCE_FIELD_NUMBER: _ClassVar[int]
    WINDOWS_FIELD_NUMBER: _ClassVar[int]
    ATTRIBUTION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    ABSORBED_UNTIL_FIELD_NUMBER: _ClassVar[int]
    id: str
    host: str
    gpu: int
    job: str
    verdict: str
    start: float
    end: float
    confidence: float
    evidence: Evidence
    windows: int
    attribution: _samples_pb2.Attribution
    kind: str
    absorbed_until: float
    def __init__(self, id: _Optional[str] = ..., host: _Optional[str] = ..., gpu: _Optional[int] = ..., job: _Optional[str] = ..., verdict: _Optional[str] = ..., start: _Optional[float] = ..., end: _Optional[float] = ..., confidence: _Optional[float] = ..., evidence: _Optional[_Union[Evidence, _Mapping]] = ..., windows: _Optional[int] = ..., attribution: _Optional[_Union[_samples_pb2.Attribution, _Mapping]] = ..., kind: _Optional[str] = ..., absorbed_until: _Optional[float] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("host", "gpu_limit")
    HOST_FIELD_NUMBER: _ClassVar[int]
    GPU_LIMIT_FIELD_NUMBER: _ClassVar[int]
    host: str
    gpu_limit: int
    def __init__(self, host: _Optional[str] = ..., gpu_limit: _Optional[int] = ...) -> None: ...

class GpuState(_message.Message):
    __slots__ = ("host", "gpu", "name", "verdict", "confidence", "last_sample", "open_finding", "flags", "lost", "stale", "last_seen_age_seconds", "source")
    HOST_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    VERDICT_FIELD_NUMBER: _ClassVar[int]
    CONFIDENCE_FIELD_NUMBER: _ClassVar[int]
    LAST_SAMPLE_FIELD_NUMBER: _ClassVar[int]
    OPEN_FINDING_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    LOST_FIELD_NUMBER: _ClassVar[int]
    STALE_FIELD_NUMBER: _ClassVar[int]
    LAST_SEEN_AGE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    host: str
    gpu: int
    name: str
    verdict: str
    confidence: float
    last_sample: float
    open_finding: str
    flags: _containers.RepeatedScalarFieldContainer[str]
    lost: bool
    stale: bool
    last_seen_age_seconds: float
    source: str
    def __init__(self, host: _Optional[str] = ..., gpu: _Optional[int] = ..., name: _Optional[str] = ..., verdict: _Optional[str] = ..., confidence: _Optional[float] = ..., last_sample: _Optional[float] = ..., open_finding: _Optional[str] = ..., flags: _Optional[_Iterable[str]] = ..., lost: _Optional[bool] = ..., stale: _Optional[bool] = ..., last_seen_age_seconds: _Optional[float] = ..., source: _Optional[str] = ...) -> None: ...

class AnalyzerStatus(_message.Message):
    __slots__ = ("version", "started", "batches_committed", "batches_duplicate", "batches_rejected", "samples_committed", "hosts", "gpus", "findings_open", "db_path", "window_seconds", "anomalies", "decisions", "captures_in_flight", "agents_connected", "gpus_stale", "hosts_stale", "analysis_lag_seconds", "samples_stored", "gpus_total", "gpus_matching", "publish", "batches_held", "batches_over_rate", "store_error", "store_failing_seconds")
    class DecisionsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STARTED_FIELD_NUMBER: _ClassVar[int]
    BATCHES_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    BATCHES_DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    BATCHES_REJECTED_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_COMMITTED_FIELD_NUMBER: _ClassVar[int]
    HOSTS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    FINDINGS_OPEN_FIELD_NUMBER: _ClassVar[int]
    DB_PATH_FIELD_NUMBER: _ClassVar[int]
    WINDOW_SECONDS_FIELD_NUMBER: _ClassVar[int]
    ANOMALIES_FIELD_NUMBER: _ClassVar[int]
    DECISIONS_FIELD_NUMBER: _ClassVar[int]
    CAPTURES_IN_FLIGHT_FIELD_NUMBER: _ClassVar[int]
    AGENTS_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    GPUS_STALE_FIELD_NUMBER: _ClassVar[int]
    HOSTS_STALE_FIELD_NUMBER: _ClassVar[int]
    ANALYSIS_LAG_SECONDS_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_STORED_FIELD_NUMBER: _ClassVar[int]
    GPUS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    GPUS_MATCHING_FIELD_NUMBER: _ClassVar[int]
    PUBLISH_FIELD_NUMBER: _ClassVar[int]
    BATCHES_HELD_FIELD_NUMBER: _ClassVar[int]
    BATCHES_OVER_RATE_FIELD_NUMBER: _ClassVar[int]
    STORE_ERROR_FIELD_NUMBER: _ClassVar[int]
    STORE_FAILING_SECONDS_FIELD_NUMBER: _ClassVar[int]
    version: str
    started: float
    batches_committed: int
    batches_duplicate: int
    batches_rejected: int
    samples_committed: int
    hosts: int
    gpus: _containers.RepeatedCompositeFieldContainer[GpuState]
    findings_open: int
    db_path: str
    window_seconds: float
    anomalies: int
    decisions: _containers.ScalarMap[str, int]
    captures_in_flight: int
    agents_connected: int
    gpus_stale: int
    hosts_stale: int
    analysis_lag_seconds: float
    samples_stored: int
    gpus_total: int
    gpus_matching: int
    publish: PublishStatus
    batches_held: int
    batches_over_rate: int
    store_error: str
    store_failing_seconds: float
    def __init__(self, version: _Optional[str] = ..., started: _Optional[float] = ..., batches_committed: _Optional[int] = ..., batches_duplicate: _Optional[int] = ..., batches_rejected: _Optional[int] = ..., samples_committed: _Optional[int] = ..., hosts: _Optional[int] = ..., gpus: _Optional[_Iterable[_Union[GpuState, _Mapping]]] = ..., findings_open: _Optional[int] = ..., db_path: _Optional[str] = ..., window_seconds: _Optional[float] = ..., anomalies: _Optional[int] = ..., decisions: _Optional[_Mapping[str, int]] = ..., captures_in_flight: _Optional[int] = ..., agents_connected: _Optional[int] = ..., gpus_stale: _Optional[int] = ..., hosts_stale: _Optional[int] = ..., analysis_lag_seconds: _Optional[float] = ..., samples_stored: _Optional[int] = ..., gpus_total: _Optional[int] = ..., gpus_matching: _Optional[int] = ..., publish: _Optional[_Union[PublishStatus, _Mapping]] = ..., batches_held: _Optional[int] = ..., batches_over_rate: _Optional[int] = ..., store_error: _Optional[str] = ..., store_failing_seconds: _Optional[float] = ...) -> None: ...

class PublishStatus(_message.Message):
    __slots__ = ("target", "cluster", "interval_seconds", "staged_until", "files_pending", "lag_seconds", "last_upload", "last_pass", "files_uploaded", "rows_staged", "failures", "consecutive_failures", "last_error")
    TARGET_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    STAGED_UNTIL_FIELD_NUMBER: _ClassVar[int]
    FILES_PENDING_FIELD_NUMBER: _ClassVar[int]
    LAG_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LAST_UPLOAD_FIELD_NUMBER: _ClassVar[int]
    LAST_PASS_FIELD_NUMBER: _ClassVar[int]
    FILES_UPLOADED_FIELD_NUMBER: _ClassVar[int]
    ROWS_STAGED_FIELD_NUMBER: _ClassVar[int]
    FAILURES_FIELD_NUMBER: _ClassVar[int]
    CONSECUTIVE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    LAST_ERROR_FIELD_NUMBER: _ClassVar[int]
    target: str
    cluster: str
    interval_seconds: float
    staged_until: float
    files_pending: int
    lag_seconds: float
    last_upload: float
    last_pass: float
    files_uploaded: int
    rows_staged: int
    failures: int
    consecutive_failures: int
    last_error: str
    def __init__(self, target: _Optional[str] = ..., cluster: _Optional[str] = ..., interval_seconds: _Optional[float] = ..., staged_until: _Optional[float] = ..., files_pending: _Optional[int] = ..., lag_seconds: _Optional[float] = ..., last_upload: _Optional[float] = ..., last_pass: _Optional[float] = ..., files_uploaded: _Optional[int] = ..., rows_staged: _Optional[int] = ..., failures: _Optional[int] = ..., consecutive_failures: _Optional[int] = ..., last_error: _Optional[str] = ...) -> None: ...

class FindingsRequest(_message.Message):
    __slots__ = ("host", "gpu", "verdicts", "start", "end", "open_only", "limit", "flags", "pod", "namespace", "slurm_job", "kinds")
    HOST_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    VERDICTS_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    OPEN_ONLY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    FLAGS_FIELD_NUMBER: _ClassVar[int]
    POD_FIELD_NUMBER: _ClassVar[int]
    NAMESPACE_FIELD_NUMBER: _ClassVar[int]
    SLURM_JOB_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    host: str
    gpu: int
    verdicts: _containers.RepeatedScalarFieldContainer[str]
    start: float
    end: float
    open_only: bool
    limit: int
    flags: _containers.RepeatedScalarFieldContainer[str]
    pod: str
    namespace: str
    slurm_job: str
    kinds: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, host: _Optional[str] = ..., gpu: _Optional[int] = ..., verdicts: _Optional[_Iterable[str]] = ..., start: _Optional[float] = ..., end: _Optional[float] = ..., open_only: _Optional[bool] = ..., limit: _Optional[int] = ..., flags: _Optional[_Iterable[str]] = ..., pod: _Optional[str] = ..., namespace: _Optional[str] = ..., slurm_job: _Optional[str] = ..., kinds: _Optional[_Iterable[str]] = ...) -> None: ...

class FindingsResponse(_message.Message):
    __slots__ = ("findings",)
    FINDINGS_FIELD_NUMBER: _ClassVar[int]
    findings: _containers.RepeatedCompositeFieldContainer[Finding]
    def __init__(self, findings: _Optional[_Iterable[_Union[Finding, _Mapping]]] = ...) -> None: ...

class MetricQuery(_message.Message):
    __slots__ = ("metric", "host", "gpu", "start", "end", "aggregate", "step_seconds", "raw", "group_by")
    METRIC_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    END_FIELD_NUMBER: _ClassVar[int]
    AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    STEP_SECONDS_FIELD_NUMBER: _ClassVar[int]
    RAW_FIELD_NUMBER: _ClassVar[int]
    GROUP_BY_FIELD_NUMBER: _ClassVar[int]
    metric: str
    host: str
    gpu: int
    start: float
    end: float
    aggregate: str
    step_seconds: float
    raw: bool
    group_by: str
    def __init__(self, metric: _Optional[str] = ..., host: _Optional[str] = ..., gpu: _Optional[int] = ..., start: _Optional[float] = ..., end: _Optional[float] = ..., aggregate: _Optional[str] = ..., step_seconds: _Optional[float] = ..., raw: _Optional[bool] = ..., group_by: _Optional[str] = ...) -> None: ...

class MetricPoint(_message.Message):
    __slots__ = ("t", "value")
    T_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    t: float
    value: float
    def __init__(self, t: _Optional[float] = ..., value: _Optional[float] = ...) -> None: ...

class MetricSeries(_message.Message):
    __slots__ = ("host", "gpu", "points", "value", "samples", "group", "gpus")
    HOST_FIELD_NUMBER: _ClassVar[int]
    GPU_FIELD_NUMBER: _ClassVar[int]
    POINTS_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    GROUP_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    host: str
    gpu: int
    points: _containers.RepeatedCompositeFieldContainer[MetricPoint]
    value: float
    samples: int
    group: str
    gpus: int
    def __init__(self, host: _Optional[str] = ..., gpu: _Optional[int] = ..., points: _Optional[_Iterable[_Union[MetricPoint, _Mapping]]] = ..., value: _Optional[float] = ..., samples: _Optional[int] = ..., group: _Optional[str] = ..., gpus: _Optional[int] = ...) -> None: ...

class MetricResult(_message.Message):
    __slots__ = ("metric", "unit", "aggregate", "series")
    METRIC_FIELD_NUMBER: _ClassVar[int]
    UNIT_FIELD_NUMBER: _ClassVar[int]
    AGGREGATE_FIELD_NUMBER: _ClassVar[int]
    SERIES_FIELD_NUMBER: _ClassVar[int]
    metric: str
    unit: str
    aggregate: str
    series: _containers.RepeatedCompositeFieldContainer[MetricSeries]
    def __init__(self, metric: _Optional[str] = ..., unit: _Optional[str] = ..., aggregate: _Optional[str] = ..., series: _Optional[_Iterable[_Union[MetricSeries, _Mapping]]] = ...) -> None: ...

class CalibrationReport(_message.Message):
    __slots__ = ("host", "calibration_json", "dry_run")
    HOST_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_JSON_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    host: str
    calibration_json: str
    dry_run: bool
    def __init__(self, host: _Optional[str] = ..., calibration_json: _Optional[str] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class CalibrationAck(_message.Message):
    __slots__ = ("id", "ceilings")
    ID_FIELD_NUMBER: _ClassVar[int]
    CEILINGS_FIELD_NUMBER: _ClassVar[int]
    id: str
    ceilings: int
    def __init__(self, id: _Optional[str] = ..., ceilings: _Optional[int] = ...) -> None: ...

class CeilingsRequest(_message.Message):
    __slots__ = ("host", "model", "uuid", "history")
    HOST_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    UUID_FIELD_NUMBER: _ClassVar[int]
    HISTORY_FIELD_NUMBER: _ClassVar[int]
    host: str
    model: str
    uuid: str
    history: bool
    def __init__(self, host: _Optional[str] = ..., model: _Optional[str] = ..., uuid: _Optional[str] = ..., history: _Optional[bool] = ...) -> None: ...

class CeilingsResponse(_message.Message):
    __slots__ = ("calibrations_json",)
    CALIBRATIONS_JSON_FIELD_NUMBER: _ClassVar[int]
    calibrations_json: str
    def __init__(self, calibrations_json: _Optional[str] = ...) -> None: ...

class ProgramsRequest(_message.Message):
    __slots__ = ("start", "host", "fingerprint", "limit")
    START_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    start: float
    host: str
    fingerprint: str
    limit: int
    def __init__(self, start: _Optional[float] = ..., host: _Optional[str] = ..., fingerprint: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class ProgramsResponse(_message.Message):
    __slots__ = ("programs_json",)
    PROGRAMS_JSON_FIELD_NUMBER: _ClassVar[int]
    programs_json: str
    def __init__(self, programs_json: _Optional[str] = ...) -> None: ...

class DistJobsRequest(_message.Message):
    __slots__ = ("start", "job", "limit")
    START_FIELD_NUMBER: _ClassVar[int]
    JOB_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    start: float
    job: str
    limit: int
    def __init__(self, start: _Optional[float] = ..., job: _Optional[str] = ..., limit: _Optional[int] = ...) -> None: ...

class DistJobsResponse(_message.Message):
    __slots__ = ("jobs_json",)
    JOBS_JSON_FIELD_NUMBER: _ClassVar[int]
    jobs_json: str
    def __init__(self, jobs_json: _Optional[str] = ...) -> None: ...

class CaptureJobRequest(_message.Message):
    __slots__ = ("job", "duration_ms", "lead_ms")
    JOB_FIELD_NUMBER: _ClassVar[int]
    DURATION_MS_FIELD_NUMBER: _ClassVar[int]
    LEAD_MS_FIELD_NUMBER: _ClassVar[int]
    job: str
    duration_ms: int
    lead_ms: int
    def __init__(self, job: _Optional[str] = ..., duration_ms: _Optional[int] = ..., lead_ms: _Optional[int] = ...) -> None: ...

class CaptureJobResponse(_message.Message):
    __slots__ = ("group", "start_at", "ranks_json")
    GROUP_FIELD_NUMBER: _ClassVar[int]
    START_AT_FIELD_NUMBER: _ClassVar[int]
    RANKS_JSON_FIELD_NUMBER: _ClassVar[int]
    group: str
    start_at: float
    ranks_json: str
    def __init__(self, group: _Optional[str] = ..., start_at: _Optional[float] = ..., ranks_json: _Optional[str] = ...) -> None: ...

class JobSkewRequest(_message.Message):
    __slots__ = ("group",)
    GROUP_FIELD_NUMBER: _ClassVar[int]
    group: str
    def __init__(self, group: _Optional[str] = ...) -> None: ...

class JobSkewResponse(_message.Message):
    __slots__ = ("json",)
    JSON_FIELD_NUMBER: _ClassVar[int]
    json: str
    def __init__(self, json: _Optional[str] = ...) -> None: ...
