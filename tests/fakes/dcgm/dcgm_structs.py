"""Fake of NVIDIA's `dcgm_structs` (DCGM 4.x, testing/python3/dcgm_structs.py
of NVIDIA/DCGM): the same names, status codes, exception classes and ctypes
structures, byte for byte where gpuscope reads them. Only what a client of
the host engine needs is here; the library loader is the fake host engine
(`fake_hostengine`), whose switches decide what `_dcgmInit` and the calls do.

As in the real module, every DCGM_ST_* code has its own DCGMError subclass
(DCGM_ST_CONNECTION_NOT_VALID -> DCGMError_ConnectionNotValid), `DCGMError(code)`
builds the subclass, and `dcgmExceptionClass(code)` names it for `except`.
"""
import string
import sys
from ctypes import Structure, Union, c_byte, c_char, c_double, c_int, c_int64, c_short, c_uint, c_uint32, c_ushort, sizeof

import dcgmvalue  # noqa: F401  (the real module imports it too)
import fake_hostengine

DCGM_MAX_STR_LENGTH = 256
DCGM_MAX_NUM_DEVICES = 32
DCGM_MAX_CLOCKS = 256
DCGM_MAX_NUM_GROUPS = 64
DCGM_MAX_BLOB_LENGTH = 4096

DCGM_OPERATION_MODE_AUTO = 1
DCGM_OPERATION_MODE_MANUAL = 2

DCGM_ST_OK = 0   # Success
DCGM_ST_BADPARAM = -1   # A bad parameter was passed to a function
DCGM_ST_GENERIC_ERROR = -3   # A generic, unspecified error
DCGM_ST_MEMORY = -4   # An out of memory error occured
DCGM_ST_NOT_CONFIGURED = -5   # Setting not configured
DCGM_ST_NOT_SUPPORTED = -6   # Feature not supported
DCGM_ST_INIT_ERROR = -7   # DCGM Init error
DCGM_ST_NVML_ERROR = -8   # When NVML returns error.
DCGM_ST_PENDING = -9   # Object is in pending state of something else
DCGM_ST_UNINITIALIZED = -10  # Object is in undefined state
DCGM_ST_TIMEOUT = -11  # Requested operation timed out
DCGM_ST_VER_MISMATCH = -12  # Version mismatch between received and understood API
DCGM_ST_UNKNOWN_FIELD = -13  # Unknown field id
DCGM_ST_NO_DATA = -14  # No data is available
DCGM_ST_STALE_DATA = -15
DCGM_ST_NOT_WATCHED = -16  # The given field is not being updated by the cache manager
DCGM_ST_NO_PERMISSION = -17  # We are not permissioned to perform the desired action
DCGM_ST_GPU_IS_LOST = -18  # GPU is no longer reachable
DCGM_ST_RESET_REQUIRED = -19  # GPU requires a reset
DCGM_ST_FUNCTION_NOT_FOUND = -20  # Unable to find function
# Connection to the host engine is not valid any longer
DCGM_ST_CONNECTION_NOT_VALID = -21
DCGM_ST_GPU_NOT_SUPPORTED = -22  # This GPU is not supported by DCGM
# The GPUs of the provided group are not compatible with each other for
# the requested operation
DCGM_ST_GROUP_INCOMPATIBLE = -23
DCGM_ST_MAX_LIMIT = -24
DCGM_ST_LIBRARY_NOT_FOUND = -25  # DCGM library could not be found
DCGM_ST_DUPLICATE_KEY = -26  # Duplicate key passed to the function
# GPU is already a part of a sync boost group
DCGM_ST_GPU_IN_SYNC_BOOST_GROUP = -27
# GPU is a not a part of sync boost group
DCGM_ST_GPU_NOT_IN_SYNC_BOOST_GROUP = -28
# This operation cannot be performed when the host engine is running as
# non-root
DCGM_ST_REQUIRES_ROOT = -29
# DCGM GPU Diagnostic was successfully executed, but reported an error.
DCGM_ST_NVVS_ERROR = -30
DCGM_ST_INSUFFICIENT_SIZE = -31  # An input argument is not large enough
# The given field ID is not supported by the API being called
DCGM_ST_FIELD_UNSUPPORTED_BY_API = -32
# This request is serviced by a module of DCGM that is not currently loaded
DCGM_ST_MODULE_NOT_LOADED = -33
# The requested operation could not be completed because the affected
# resource is in use
DCGM_ST_IN_USE = -34
# The specified group is empty and this operation is not valid with an
# empty group
DCGM_ST_GROUP_IS_EMPTY = -35
# Profiling is not supported for this group of GPUs or GPU
DCGM_ST_PROFILING_NOT_SUPPORTED = -36
# The third-party Profiling module returned an unrecoverable error
DCGM_ST_PROFILING_LIBRARY_ERROR = -37
# The requested profiling metrics cannot be collected in a single pass
DCGM_ST_PROFILING_MULTI_PASS = -38
# A diag instance is already running, cannot run a new diag until the
# current one finishes.
DCGM_ST_DIAG_ALREADY_RUNNING = -39
# The DCGM GPU Diagnostic returned JSON that cannot be parsed
DCGM_ST_DIAG_BAD_JSON = -40
DCGM_ST_DIAG_BAD_LAUNCH = -41  # Error while launching the DCGM GPU Diagnostic
DCGM_ST_DIAG_UNUSED = -42  # Unused
# A field value met or exceeded the error threshold.
DCGM_ST_DIAG_THRESHOLD_EXCEEDED = -43
# The installed driver version is insufficient for this API
DCGM_ST_INSUFFICIENT_DRIVER_VERSION = -44
DCGM_ST_INSTANCE_NOT_FOUND = -45  # The specified GPU instance does not exist
# The specified GPU compute instance does not exist
DCGM_ST_COMPUTE_INSTANCE_NOT_FOUND = -46
DCGM_ST_CHILD_NOT_KILLED = -47  # Couldn't kill a child process within the retries
# Detected an error in a 3rd-party library
DCGM_ST_3RD_PARTY_LIBRARY_ERROR = -48
DCGM_ST_INSUFFICIENT_RESOURCES = -49  # Not enough resources available
DCGM_ST_PLUGIN_EXCEPTION = -50  # Exception thrown from a diagnostic plugin
# The diagnostic returned an error that indicates the need for isolation
DCGM_ST_NVVS_ISOLATE_ERROR = -51
# The NVVS binary was not found in the specified location
DCGM_ST_NVVS_BINARY_NOT_FOUND = -52
DCGM_ST_NVVS_KILLED = -53  # The NVVS process was killed by a signal
DCGM_ST_PAUSED = -54  # The hostengine and all modules are paused
DCGM_ST_ALREADY_INITIALIZED = -55  # The object is already initialized
DCGM_ST_NVML_NOT_LOADED = -56  # NVML couldn't be loaded on this system
DCGM_ST_NVML_DRIVER_TIMEOUT = -57  # NVML driver timeout error was detected
# The NVVS returns no available tests (NVVS_ST_TEST_NOT_FOUND)
DCGM_ST_NVVS_NO_AVAILABLE_TEST = -58
# No connection is currently authorized for multi-node diagnostic
DCGM_ST_MNDIAG_CONNECTION_NOT_AVAILABLE = -59
# The connection is not authorized for multi-node diagnostic operations
DCGM_ST_MNDIAG_CONNECTION_UNAUTHORIZED = -60
# An SSH connection to a remote hostengine failed
DCGM_ST_REMOTE_SSH_CONNECTION_FAILED = -61
DCGM_ST_CHILD_SPAWN_FAILED = -62  # A child process could not be spawned
DCGM_ST_FILE_IO_ERROR = -63  # A file operation failed
DCGM_ST_CHILD_SIGNAL_RECEIVED = -64  # A child process received a signal
DCGM_ST_CALLER_ALREADY_STOPPED = -65  # The caller is already stopped
DCGM_ST_DIAG_STOPPED = -66  # The DCGM Diagnostic was stopped
DCGM_ST_GPUS_DETACHED = -67  # The GPUs are detached

DCGM_GROUP_DEFAULT = 0  # All the GPUs on the node are added to the group
DCGM_GROUP_EMPTY = 1  # Creates an empty group
DCGM_GROUP_ALL_GPUS = 0x7fffffff

DCGM_FV_FLAG_LIVE_DATA = 0x00000001


class DCGMError(Exception):
    _valClassMapping = dict()
    _error_code_to_string = {
        DCGM_ST_OK: "Success",
        DCGM_ST_BADPARAM: "Bad parameter passed to function",
        DCGM_ST_GENERIC_ERROR: "Generic unspecified error",
        DCGM_ST_MEMORY: "Out of memory error",
        DCGM_ST_NOT_CONFIGURED: "Setting not configured",
        DCGM_ST_NOT_SUPPORTED: "Feature not supported",
        DCGM_ST_INIT_ERROR: "DCGM initialization error",
        DCGM_ST_NVML_ERROR: "NVML error",
        DCGM_ST_PENDING: "Object is in a pending state",
        DCGM_ST_UNINITIALIZED: "Object is in an undefined state",
        DCGM_ST_TIMEOUT: "Timeout",
        DCGM_ST_VER_MISMATCH: "API version mismatch",
        DCGM_ST_UNKNOWN_FIELD: "Unknown field",
        DCGM_ST_NO_DATA: "No data is available",
        DCGM_ST_STALE_DATA: "Data is considered stale",
        DCGM_ST_NOT_WATCHED: "Field is not being updated",
        DCGM_ST_NO_PERMISSION: "Not permissioned",
        DCGM_ST_GPU_IS_LOST: "GPU is unreachable",
        DCGM_ST_RESET_REQUIRED: "GPU requires a reset",
        DCGM_ST_FUNCTION_NOT_FOUND: "Unable to find function",
        DCGM_ST_CONNECTION_NOT_VALID: "The connection to the host engine is not valid any longer",
        DCGM_ST_GPU_NOT_SUPPORTED: "This GPU is not supported by DCGM",
        DCGM_ST_GROUP_INCOMPATIBLE: "GPUs are incompatible with each other for the requested operation",
        DCGM_ST_MAX_LIMIT: "Max limit reached for the object",
        DCGM_ST_LIBRARY_NOT_FOUND: "DCGM library could not be found",
        DCGM_ST_DUPLICATE_KEY: "Duplicate key passed to function",
        DCGM_ST_GPU_IN_SYNC_BOOST_GROUP: "GPU is already a part of a sync boost group",
        DCGM_ST_GPU_NOT_IN_SYNC_BOOST_GROUP: "GPU is not a part of the sync boost group",
        DCGM_ST_REQUIRES_ROOT: "This operation is not supported when the host engine is running as non root",
        DCGM_ST_NVVS_ERROR: "DCGM GPU Diagnostic returned an error.",
        DCGM_ST_INSUFFICIENT_SIZE: "An input argument is not large enough",
        DCGM_ST_FIELD_UNSUPPORTED_BY_API: "The given field ID is not supported by the API being called",
        DCGM_ST_MODULE_NOT_LOADED: "This request is serviced by a module of DCGM that is not currently loaded",
        DCGM_ST_IN_USE: "The requested operation could not be completed because the affected resource is in use",
        DCGM_ST_GROUP_IS_EMPTY: "The specified group is empty, and this operation is incompatible with an empty group",
        DCGM_ST_PROFILING_NOT_SUPPORTED: "Profiling is not supported for this group of GPUs or GPU",
        DCGM_ST_PROFILING_LIBRARY_ERROR: "The third-party Profiling module returned an unrecoverable error",
        DCGM_ST_PROFILING_MULTI_PASS: "The requested profiling metrics cannot be collected in a single pass",
        DCGM_ST_DIAG_ALREADY_RUNNING: "A diag instance is already running, cannot run a new diag until the current one finishes",
        DCGM_ST_DIAG_BAD_JSON: "The GPU Diagnostic returned Json that cannot be parsed.",
        DCGM_ST_DIAG_BAD_LAUNCH: "Error while launching the GPU Diagnostic.",
        DCGM_ST_DIAG_UNUSED: "Unused error code",
        DCGM_ST_DIAG_THRESHOLD_EXCEEDED: "A field value met or exceeded the error threshold.",
        DCGM_ST_INSUFFICIENT_DRIVER_VERSION: "The installed driver version is insufficient for this API",
        DCGM_ST_INSTANCE_NOT_FOUND: "The specified GPU instance does not exist",
        DCGM_ST_COMPUTE_INSTANCE_NOT_FOUND: "The specified GPU compute instance does not exist",
        DCGM_ST_CHILD_NOT_KILLED: "Couldn't kill a child process within the retries",
        DCGM_ST_3RD_PARTY_LIBRARY_ERROR: "Detected an error in a 3rd-party library",
        DCGM_ST_INSUFFICIENT_RESOURCES: "Not enough resources available",
        DCGM_ST_PLUGIN_EXCEPTION: "Exception thrown from a diagnostic plugin",
        DCGM_ST_NVVS_ISOLATE_ERROR: "The diagnostic returned an error that indicates the need for isolation",
        DCGM_ST_NVVS_BINARY_NOT_FOUND: "The NVVS binary was not found in the specified location",
        DCGM_ST_NVVS_KILLED: "The NVVS process was killed by a signal",
        DCGM_ST_PAUSED: "The hostengine and all modules are paused",
        DCGM_ST_ALREADY_INITIALIZED: "The object is already initialized",
        DCGM_ST_NVML_NOT_LOADED: "NVML couldn't be loaded on this system",
        DCGM_ST_NVML_DRIVER_TIMEOUT: "NVML driver timeout error was detected",
        DCGM_ST_NVVS_NO_AVAILABLE_TEST: "The NVVS returns no available tests (NVVS_ST_TEST_NOT_FOUND)",
        DCGM_ST_MNDIAG_CONNECTION_NOT_AVAILABLE: "No connection is currently authorized for multi-node diagnostic",
        DCGM_ST_MNDIAG_CONNECTION_UNAUTHORIZED: "The connection is not authorized for multi-node diagnostic operations",
        DCGM_ST_REMOTE_SSH_CONNECTION_FAILED: "An SSH connection to a remote hostengine failed",
        DCGM_ST_CHILD_SPAWN_FAILED: "A child process could not be spawned",
        DCGM_ST_FILE_IO_ERROR: "A file operation failed",
        DCGM_ST_CHILD_SIGNAL_RECEIVED: "A child process received a signal",
        DCGM_ST_CALLER_ALREADY_STOPPED: "The caller is already stopped",
        DCGM_ST_DIAG_STOPPED: "The DCGM Diagnostic was stopped",
        DCGM_ST_GPUS_DETACHED: "Cannot perform the requested operation because the GPUs are detached",
    }

    def __new__(typ, value):
        """Maps value to a proper subclass of DCGMError."""
        if typ == DCGMError:
            typ = DCGMError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.info = None
        obj.value = value
        return obj

    def __str__(self):
        msg = DCGMError._error_code_to_string.get(self.value, "DCGM Error with code %d" % self.value)
        if self.info is not None:
            if msg[-1] == ".":
                msg = msg[:-1]
            msg += ": '%s'" % self.info
        return msg

    def __eq__(self, other):
        return self.value == other.value

    def __hash__(self):
        return hash(self.value)

    def SetAdditionalInfo(self, msg):
        self.info = msg


def dcgmExceptionClass(error_code):
    return DCGMError._valClassMapping.get(error_code)


def _extractDCGMErrorsAsClasses():
    """Each DCGM_ST_* gets its own DCGMError subclass, named as the real
    module names it: DCGM_ST_UNINITIALIZED -> DCGMError_Uninitialized."""
    this_module = sys.modules[__name__]
    for err_name in [x for x in dir(this_module) if x.startswith("DCGM_ST_")]:
        class_name = "DCGMError_" + string.capwords(err_name.replace("DCGM_ST_", ""), "_").replace("_", "")
        err_val = getattr(this_module, err_name)

        def gen_new(val):
            def new(typ):
                return DCGMError.__new__(typ, val)
            return new
        new_error_class = type(class_name, (DCGMError,), {'__new__': gen_new(err_val)})
        new_error_class.__module__ = __name__
        setattr(this_module, class_name, new_error_class)
        DCGMError._valClassMapping[err_val] = new_error_class


_extractDCGMErrorsAsClasses()


def _dcgmCheckReturn(ret):
    if ret != DCGM_ST_OK:
        raise DCGMError(ret)
    return ret


def _dcgmInit(libDcgmPath=None):
    """Loads libdcgm.so.4 in the real module: DCGM_ST_LIBRARY_NOT_FOUND when
    the DCGM package is not installed (the bindings can be there without it)."""
    if fake_hostengine.ENGINE.library_missing:
        _dcgmCheckReturn(DCGM_ST_LIBRARY_NOT_FOUND)
    fake_hostengine.ENGINE.library_loaded = True


class _DcgmStructure(Structure):
    """As the real one: char arrays read back as str, not bytes."""
    def __getattribute__(self, key):
        value = super().__getattribute__(key)
        if isinstance(value, bytes):
            return value.decode('utf-8')
        return value

    def __setattr__(self, key, raw_value):
        fieldtype = next((f[1] for f in self._fields_ if f[0] == key), None)
        value = raw_value
        if fieldtype == c_uint and not isinstance(value, c_uint32):
            value = int(value)
        elif fieldtype == c_int and not isinstance(value, c_int):
            value = int(value)
        elif isinstance(raw_value, str):
            value = raw_value.encode('utf-8')
        return super().__setattr__(key, value)


class DcgmUnion(Union):
    def __getattribute__(self, key):
        value = super().__getattribute__(key)
        if isinstance(value, bytes):
            return value.decode('utf-8')
        return value


class _PrintableStructure(_DcgmStructure):
    def __str__(self):
        return self.__class__.__name__ + "(" + ", ".join(
            "%s: %s" % (name, getattr(self, name)) for name, _ in self._fields_) + ")"


def make_dcgm_version(struct, ver):
    return sizeof(struct) | (ver << 24)


class c_dcgmConnectV2Params_v1(_PrintableStructure):
    _fields_ = [('version', c_uint), ('persistAfterDisconnect', c_uint)]


c_dcgmConnectV2Params_version1 = make_dcgm_version(c_dcgmConnectV2Params_v1, 1)


class c_dcgmConnectV2Params_v2(_PrintableStructure):
    _fields_ = [('version', c_uint), ('persistAfterDisconnect', c_uint), ('timeoutMs', c_uint),
                ('addressIsUnixSocket', c_uint)]


c_dcgmConnectV2Params_version2 = make_dcgm_version(c_dcgmConnectV2Params_v2, 2)
c_dcgmConnectV2Params_version = c_dcgmConnectV2Params_version2


class c_dcgmClockSet_v1(_PrintableStructure):
    _fields_ = [('version', c_uint), ('memClock', c_uint), ('smClock', c_uint)]


class c_dcgmGroupEntityPair_t(_PrintableStructure):
    _fields_ = [('entityGroupId', c_uint32), ('entityId', c_uint32)]

    def __eq__(self, other):
        return (self.entityGroupId == other.entityGroupId) and (self.entityId == other.entityId)


class c_dcgmDeviceSupportedClockSets_v1(_PrintableStructure):
    _fields_ = [('version', c_uint), ('count', c_uint), ('clockSet', c_dcgmClockSet_v1 * DCGM_MAX_CLOCKS)]


class c_dcgmDeviceThermals_v1(_PrintableStructure):
    _fields_ = [('version', c_uint), ('slowdownTemp', c_uint), ('shutdownTemp', c_uint)]


class c_dcgmDevicePowerLimits_v1(_PrintableStructure):
    _fields_ = [('version', c_uint), ('curPowerLimit', c_uint), ('defaultPowerLimit', c_uint),
                ('enforcedPowerLimit', c_uint), ('minPowerLimit', c_uint), ('maxPowerLimit', c_uint)]


class c_dcgmDeviceIdentifiers_v1(_PrintableStructure):
    _fields_ = [
        ('version', c_uint),
        ('brandName', c_char * DCGM_MAX_STR_LENGTH),
        ('deviceName', c_char * DCGM_MAX_STR_LENGTH),
        ('pciBusId', c_char * DCGM_MAX_STR_LENGTH),
        ('serial', c_char * DCGM_MAX_STR_LENGTH),
        ('uuid', c_char * DCGM_MAX_STR_LENGTH),
        ('vbios', c_char * DCGM_MAX_STR_LENGTH),
        ('inforomImageVersion', c_char * DCGM_MAX_STR_LENGTH),
        ('pciDeviceId', c_uint32),
        ('pciSubSystemId', c_uint32),
        ('driverVersion', c_char * DCGM_MAX_STR_LENGTH),
        ('virtualizationMode', c_uint32)
    ]


class c_dcgmDeviceMemoryUsage_v1(_PrintableStructure):
    _fields_ = [('version', c_uint), ('bar1Total', c_uint), ('fbTotal', c_uint), ('fbUsed', c_uint),
                ('fbFree', c_uint)]


class c_dcgmDeviceSettings_v2(_PrintableStructure):
    _fields_ = [('version', c_uint), ('persistenceModeEnabled', c_uint), ('migModeEnabled', c_uint),
                ('confidentialComputeMode', c_uint)]


class c_dcgmDeviceAttributes_v3(_PrintableStructure):
    _fields_ = [
        ('version', c_uint),
        ('clockSets', c_dcgmDeviceSupportedClockSets_v1),
        ('thermalSettings', c_dcgmDeviceThermals_v1),
        ('powerLimits', c_dcgmDevicePowerLimits_v1),
        ('identifiers', c_dcgmDeviceIdentifiers_v1),
        ('memoryUsage', c_dcgmDeviceMemoryUsage_v1),
        ('settings', c_dcgmDeviceSettings_v2),
    ]


dcgmDeviceAttributes_version3 = make_dcgm_version(c_dcgmDeviceAttributes_v3, 3)


class c_dcgmFieldValue_v1_value(DcgmUnion):
    _fields_ = [
        ('i64', c_int64),
        ('dbl', c_double),
        ('str', c_char * DCGM_MAX_STR_LENGTH),
        ('blob', c_byte * DCGM_MAX_BLOB_LENGTH)
    ]


class c_dcgmFieldValue_v1(_PrintableStructure):
    _fields_ = [
        ('version', c_uint),
        ('fieldId', c_ushort),
        ('fieldType', c_short),
        ('status', c_int),
        ('ts', c_int64),
        ('value', c_dcgmFieldValue_v1_value)
    ]


dcgmFieldValue_version1 = make_dcgm_version(c_dcgmFieldValue_v1, 1)


class c_dcgmFieldValue_v2(_PrintableStructure):
    _fields_ = [
        ('version', c_uint),
        ('entityGroupId', c_uint),
        ('entityId', c_uint),
        ('fieldId', c_ushort),
        ('fieldType', c_short),
        ('status', c_int),
        ('unused', c_uint),
        ('ts', c_int64),
        ('value', c_dcgmFieldValue_v1_value)
    ]


dcgmFieldValue_version2 = make_dcgm_version(c_dcgmFieldValue_v2, 2)
