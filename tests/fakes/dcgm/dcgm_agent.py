"""Fake of NVIDIA's `dcgm_agent` (DCGM 4.x, testing/python3/dcgm_agent.py):
the functions gpuscope calls, with the real names, arguments and return
types (ctypes handles and group ids as c_void_p, field values as arrays of
dcgm_structs.c_dcgmFieldValue_v2), raising what the real ones raise: every
failure is dcgm_structs._dcgmCheckReturn(code), i.e. the DCGMError subclass
of the status. What each call answers is decided by `fake_hostengine`."""
import functools
from ctypes import c_void_p

import dcgm_fields
import dcgm_structs
import dcgmvalue
import fake_hostengine as fh

_S = dcgm_structs


def ensure_byte_strings():
    """As the real decorator: str arguments reach the C library as UTF-8 bytes."""
    def decorator(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            args = tuple(bytes(a, 'utf-8') if isinstance(a, str) else a for a in args)
            kwargs = {k: bytes(v, 'utf-8') if isinstance(v, str) else v for k, v in kwargs.items()}
            return fn(*args, **kwargs)
        return wrapper
    return decorator


def _fail(code):
    _S._dcgmCheckReturn(code)


def _engine(dcgm_handle) -> fh.HostEngine:
    eng = fh.ENGINE
    eng.calls += 1
    if not eng.library_loaded:
        _fail(_S.DCGM_ST_UNINITIALIZED)          # the real dcgmFP: library not loaded
    if not eng.valid(_value(dcgm_handle)):
        _fail(_S.DCGM_ST_CONNECTION_NOT_VALID)
    return eng


def _value(handle) -> int:
    return handle.value if isinstance(handle, c_void_p) else int(handle or 0)


def _gpu(eng, gpu_id) -> fh.FakeDcgmGpu:
    if not 0 <= gpu_id < len(eng.gpus):
        _fail(_S.DCGM_ST_BADPARAM)
    return eng.gpus[gpu_id]


# -- library and connections -------------------------------------------------------------
@ensure_byte_strings()
def dcgmInit():
    eng = fh.ENGINE
    if not eng.library_loaded:
        _fail(_S.DCGM_ST_UNINITIALIZED)
    eng.initialised = True
    return _S.DCGM_ST_OK


@ensure_byte_strings()
def dcgmShutdown():
    fh.ENGINE.initialised = False
    return _S.DCGM_ST_OK


def _connect(embedded: bool) -> c_void_p:
    eng = fh.ENGINE
    handle = eng.new_id()
    eng.connections[handle] = (eng.generation, embedded)
    eng.connects += 1
    return c_void_p(handle)


@ensure_byte_strings()
def dcgmStartEmbedded(opMode):
    eng = fh.ENGINE
    if not eng.initialised:
        _fail(_S.DCGM_ST_UNINITIALIZED)
    if opMode not in (_S.DCGM_OPERATION_MODE_AUTO, _S.DCGM_OPERATION_MODE_MANUAL):
        _fail(_S.DCGM_ST_BADPARAM)
    if eng.driver_missing:                      # the host engine cannot load NVML
        _fail(_S.DCGM_ST_INIT_ERROR)
    return _connect(embedded=True)


@ensure_byte_strings()
def dcgmStopEmbedded(dcgm_handle):
    eng = _engine(dcgm_handle)
    eng.drop(_value(dcgm_handle))
    return _S.DCGM_ST_OK


@ensure_byte_strings()
def dcgmConnect_v2(ip_address, connectParams, version=_S.c_dcgmConnectV2Params_version):
    connectParams.version = version
    eng = fh.ENGINE
    if not eng.initialised:
        _fail(_S.DCGM_ST_UNINITIALIZED)
    if not ip_address:
        _fail(_S.DCGM_ST_BADPARAM)
    if not eng.running or (eng.address is not None and ip_address.decode() != eng.address):
        _fail(_S.DCGM_ST_CONNECTION_NOT_VALID)
    return _connect(embedded=False)


@ensure_byte_strings()
def dcgmDisconnect(dcgm_handle):
    eng = _engine(dcgm_handle)
    eng.drop(_value(dcgm_handle))           # persistAfterDisconnect=0: its groups and watches go
    return _S.DCGM_ST_OK


# -- devices --------------------------------------------------------------------------------
@ensure_byte_strings()
def dcgmGetAllSupportedDevices(dcgm_handle):
    eng = _engine(dcgm_handle)
    return [i for i, g in enumerate(eng.gpus) if not g.lost]


@ensure_byte_strings()
def dcgmGetDeviceAttributes(dcgm_handle, gpuId, version=_S.dcgmDeviceAttributes_version3):
    if version != _S.dcgmDeviceAttributes_version3:
        _fail(_S.DCGM_ST_VER_MISMATCH)
    g = _gpu(_engine(dcgm_handle), gpuId)
    if g.lost:
        _fail(_S.DCGM_ST_GPU_IS_LOST)
    a = _S.c_dcgmDeviceAttributes_v3()
    a.version = version
    a.identifiers.deviceName, a.identifiers.uuid, a.identifiers.pciBusId = g.name, g.uuid, g.pci_bus_id
    a.identifiers.brandName = "NVIDIA"
    a.identifiers.driverVersion = "570.124.06"
    a.memoryUsage.fbTotal = g.fb_total_mib
    a.powerLimits.enforcedPowerLimit = g.power_limit_w
    a.settings.migModeEnabled = int(g.mig)
    return a


@ensure_byte_strings()
def dcgmGetGpuChipArchitecture(dcgm_handle, gpuId):
    return _gpu(_engine(dcgm_handle), gpuId).arch


# -- groups and field groups ----------------------------------------------------------------
@ensure_byte_strings()
def dcgmGroupCreate(dcgm_handle, type, groupName):
    eng = _engine(dcgm_handle)
    gid = eng.new_id()
    members = list(range(len(eng.gpus))) if type == _S.DCGM_GROUP_DEFAULT else []
    eng.groups[gid] = (_value(dcgm_handle), members)
    return c_void_p(gid)


@ensure_byte_strings()
def dcgmGroupDestroy(dcgm_handle, group_id):
    eng = _engine(dcgm_handle)
    if eng.groups.pop(_value(group_id), None) is None:
        _fail(_S.DCGM_ST_NOT_CONFIGURED)
    return _S.DCGM_ST_OK


@ensure_byte_strings()
def dcgmGroupAddDevice(dcgm_handle, group_id, gpu_id):
    eng = _engine(dcgm_handle)
    group = eng.groups.get(_value(group_id))
    if group is None:
        _fail(_S.DCGM_ST_NOT_CONFIGURED)
    _gpu(eng, gpu_id)
    group[1].append(gpu_id)
    return _S.DCGM_ST_OK


@ensure_byte_strings()
def dcgmFieldGroupCreate(dcgm_handle, fieldIds, fieldGroupName):
    eng = _engine(dcgm_handle)
    if not fieldIds or any(f not in eng.known_fields for f in fieldIds):
        _fail(_S.DCGM_ST_BADPARAM)
    if any(name == fieldGroupName for _, name, _ in eng.field_groups.values()):
        _fail(_S.DCGM_ST_DUPLICATE_KEY)
    fgid = eng.new_id()
    eng.field_groups[fgid] = (_value(dcgm_handle), fieldGroupName, list(fieldIds))
    return c_void_p(fgid)


@ensure_byte_strings()
def dcgmFieldGroupDestroy(dcgm_handle, fieldGroupId):
    eng = _engine(dcgm_handle)
    if eng.field_groups.pop(_value(fieldGroupId), None) is None:
        _fail(_S.DCGM_ST_NO_DATA)
    return _S.DCGM_ST_OK


# -- watches ----------------------------------------------------------------------------------
def _lookup(eng, groupId, fieldGroupId):
    group, fg = eng.groups.get(_value(groupId)), eng.field_groups.get(_value(fieldGroupId))
    if group is None or fg is None:
        _fail(_S.DCGM_ST_NOT_CONFIGURED)
    return group[1], fg[2]


def _profiling_refusal(g: fh.FakeDcgmGpu, prof: list[int]):
    if g.profiling_refusal is not None:
        return g.profiling_refusal
    if g.single_pass is not None and not set(prof) <= g.single_pass:
        return fh.ST_PROFILING_MULTI_PASS
    if not set(prof) <= set(g.prof):
        return _S.DCGM_ST_NOT_SUPPORTED
    return None


@ensure_byte_strings()
def dcgmWatchFields(dcgm_handle, groupId, fieldGroupId, updateFreq, maxKeepAge, maxKeepSamples):
    eng = _engine(dcgm_handle)
    gpus, fids = _lookup(eng, groupId, fieldGroupId)
    if updateFreq <= 0:
        _fail(_S.DCGM_ST_BADPARAM)
    prof = [f for f in fids if f in fh.PROFILING]
    accepted = gpus
    if prof:
        refusals = {g: _profiling_refusal(eng.gpus[g], prof) for g in gpus}
        accepted = [g for g in gpus if refusals[g] is None]
        if not accepted:                      # a group watches if any of its GPUs can
            _fail(next(iter(refusals.values())) if refusals else _S.DCGM_ST_GROUP_IS_EMPTY)
    for g in accepted:
        for f in fids:
            eng.watches.setdefault((g, f), set()).add(_value(dcgm_handle))
    eng._cache.clear()
    return _S.DCGM_ST_OK


@ensure_byte_strings()
def dcgmUnwatchFields(dcgm_handle, groupId, fieldGroupId):
    eng = _engine(dcgm_handle)
    gpus, fids = _lookup(eng, groupId, fieldGroupId)
    for g in gpus:
        for f in fids:
            eng.watches.get((g, f), set()).discard(_value(dcgm_handle))
    eng._cache.clear()
    return _S.DCGM_ST_OK


@ensure_byte_strings()
def dcgmUpdateAllFields(dcgm_handle, waitForUpdate):
    _engine(dcgm_handle)
    return _S.DCGM_ST_OK


# -- values ------------------------------------------------------------------------------------
def _fill(eng, fv, gpu_id: int, fid: int, flags: int, now: int) -> None:
    fv.version = _S.dcgmFieldValue_version2
    fv.entityGroupId, fv.entityId, fv.fieldId, fv.ts = dcgm_fields.DCGM_FE_GPU, gpu_id, fid, now
    is_int = fid in fh.INT64
    fv.fieldType = ord(dcgm_fields.DCGM_FT_INT64 if is_int else dcgm_fields.DCGM_FT_DOUBLE)
    blank = dcgmvalue.DCGM_INT64_BLANK if is_int else dcgmvalue.DCGM_FP64_BLANK
    g = eng.gpus[gpu_id] if 0 <= gpu_id < len(eng.gpus) else None
    live = flags & _S.DCGM_FV_FLAG_LIVE_DATA
    if g is None:
        status, value = _S.DCGM_ST_BADPARAM, blank
    elif g.lost:
        status, value = fh.ST_GPU_IS_LOST, blank
    elif not live and not eng.watches.get((gpu_id, fid)):
        status, value = fh.ST_NOT_WATCHED, blank
    elif fid in g.no_data:
        status, value = fh.ST_NO_DATA, blank
    elif fid in fh.PROFILING:
        if fid not in g.prof:
            status, value = fh.ST_NOT_SUPPORTED, blank + 2
        else:
            status, value = fh.ST_OK, blank if eng.paused and not g.gpm else g.prof[fid]
    elif fid not in g.values:
        status, value = fh.ST_NOT_SUPPORTED, blank + 2
    else:
        status, value = fh.ST_OK, g.values[fid]
    fv.status = status
    if is_int:
        fv.value.i64 = int(value)
    else:
        fv.value.dbl = float(value)


@ensure_byte_strings()
def dcgmEntitiesGetLatestValues(dcgmHandle, entities, fieldIds, flags):
    eng = _engine(dcgmHandle)
    eng.reload_if_changed()
    pairs = tuple((e.entityGroupId, e.entityId) for e in entities)

    def build():
        values = (_S.c_dcgmFieldValue_v2 * (len(fieldIds) * len(entities)))()
        now = eng.now_us()
        i = 0
        for group_id, entity_id in (reversed(pairs) if eng.reorder else pairs):
            for fid in fieldIds:
                _fill(eng, values[i], entity_id if group_id == dcgm_fields.DCGM_FE_GPU else -1, fid, flags, now)
                i += 1
        return values
    return eng.cached((pairs, tuple(fieldIds), flags, eng.paused), build)


# -- profiling --------------------------------------------------------------------------------
def _pause_or_resume(dcgmHandle, paused: bool):
    eng = _engine(dcgmHandle)
    if any(g.gpm for g in eng.gpus):           # GPM-enabled GPUs don't support pause/resume
        _fail(_S.DCGM_ST_NOT_SUPPORTED)
    eng.paused = paused
    eng._cache.clear()
    return _S.DCGM_ST_OK


@ensure_byte_strings()
def dcgmProfPause(dcgmHandle):
    fh.ENGINE.pauses += 1
    return _pause_or_resume(dcgmHandle, True)


@ensure_byte_strings()
def dcgmProfResume(dcgmHandle):
    fh.ENGINE.resumes += 1
    return _pause_or_resume(dcgmHandle, False)
