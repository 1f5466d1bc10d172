"""FLOPs and bytes of each HLO instruction that runs as a GPU kernel, from the
HloProto the profiler stores beside the trace.

The model is XLA's own first-order one: a kernel moves its operands in and
its result out once (bytes), and does 2·M·N·K for a dot (batch dims
included) plus one operation per output element of each arithmetic
instruction fused into it (FLOPs). It is a roofline estimate, not a
measurement: reused operands read twice, or slices of a large parameter,
make it err on the side of more bytes.

The proto comes from the trace file, so nothing in it is trusted: negative
or huge dimensions, contracting dimensions out of range, computations that
call themselves and backend configs that are not JSON give an op no cost
(or a capped one), never an exception.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from functools import lru_cache

from google.protobuf.message import DecodeError

from gpuscope.xla import hlo_pb2

# xla.PrimitiveType -> bytes per element (sub-byte types as fractions)
ELEMENT_BYTES = {1: 1, 2: 1, 3: 2, 4: 4, 5: 8, 6: 1, 7: 2, 8: 4, 9: 8, 10: 2, 11: 4, 12: 8, 15: 8, 16: 2,
                 18: 16, 19: 1, 20: 1, 21: 0.5, 22: 0.5, 23: 1, 24: 1, 25: 1, 26: 0.25, 27: 0.25, 28: 1}
NO_DATA = {"parameter", "constant", "bitcast", "get-tuple-element", "tuple", "reshape", "broadcast", "iota",
           "copy-start", "copy-done", "after-all", "partition-id", "replica-id", "slice", "dynamic-slice",
           "transpose", "copy", "concatenate", "pad", "reverse", "gather", "convert"}
# Convolutions are not here: their FLOPs need the window and feature dimensions
# (2 x outputs x input features x window), which a matmul formula gets wrong by
# the window's size; they stay unknown rather than misplaced.
GEMM_TARGETS = ("gemm", "matmul", "cublas")
MAX_ELEMENTS = 1 << 62          # a shape's element count is capped here; every cost stays a finite float
MAX_CALL_DEPTH = 32             # fusions inside fusions; deeper (or cyclic) calls add nothing
MAX_FLOPS = 1e40                # a called computation's FLOPs are capped here, so sums of them stay finite


@dataclass(frozen=True)
class OpCost:
    flops: float | None
    bytes: float | None


def shape_bytes(shape) -> float:
    if shape.tuple_shapes:
        return sum(shape_bytes(s) for s in shape.tuple_shapes)
    return _elements(shape) * ELEMENT_BYTES.get(shape.element_type, 0)


def _elements(shape) -> int:
    if shape.tuple_shapes:
        return min(sum(_elements(s) for s in shape.tuple_shapes), MAX_ELEMENTS)
    return _product(shape.dimensions)


def _product(sizes) -> int:
    """Product of dimension sizes: 0 when one is zero or negative (no data),
    capped at MAX_ELEMENTS."""
    n = 1
    for d in sizes:
        if d <= 0:
            return 0
        n = min(n * d, MAX_ELEMENTS)
    return n


def _contracted(lhs_shape, dims) -> int | None:
    """Size of the contracted dimensions; None when one is not a dimension of lhs."""
    rank = len(lhs_shape.dimensions)
    picked = []
    for d in dims:
        try:
            i = int(d)
        except (TypeError, ValueError, OverflowError):
            return None
        if not 0 <= i < rank:
            return None
        picked.append(lhs_shape.dimensions[i])
    return _product(picked)


def _dot_flops(out_shape, lhs_shape, dims) -> float | None:
    k = _contracted(lhs_shape, dims.lhs_contracting_dimensions)
    return 2.0 * _elements(out_shape) * k if k is not None else None


SLICING = ("dynamic-slice", "slice", "gather")      # ops that read part of their first operand


class Program:
    def __init__(self, proto: hlo_pb2.HloProto):
        self.instructions = {}
        self.computations = {}
        self.by_name = {}
        self.by_kernel = {}      # XLA names a fusion's kernel after it, '.' and '-' as '_': gemm_fusion_dot.1 -> gemm_fusion_dot_1
        self._called_flops: dict[int, float] = {}     # computation id -> FLOPs of its instructions, once known
        for comp in proto.hlo_module.computations:
            self.computations[comp.id] = comp
            for ins in comp.instructions:
                self.instructions[ins.id] = ins
                self.by_name.setdefault(ins.name, ins)
                self.by_kernel.setdefault(ins.name.replace(".", "_").replace("-", "_"), ins)

    def cost(self, name: str) -> OpCost | None:
        """The cost of the instruction `name`, or of the one a kernel of that
        name runs (inside a command buffer the device names only the kernel)."""
        ins = self.by_name.get(name) or self.by_kernel.get(name)
        if ins is None:
            return None
        operands = [self.instructions[i] for i in ins.operand_ids if i in self.instructions]
        read = self._sliced_reads(ins)
        nbytes = shape_bytes(ins.shape) + sum(read.get(k, shape_bytes(o.shape)) for k, o in enumerate(operands))
        return OpCost(self._flops(ins, operands), nbytes)

    def _sliced_reads(self, ins) -> dict[int, float]:
        """Operand number -> bytes a fusion really reads of it, for operands it
        only slices: a scan's body takes all stacked layers and reads one
        (`dynamic-slice`), a gather reads the rows it gathers. Other operands
        are read whole."""
        if ins.opcode != "fusion" or len(ins.called_computation_ids) != 1:
            return {}
        comp = self.computations.get(ins.called_computation_ids[0])
        if comp is None:
            return {}
        params = [i for i in comp.instructions if i.opcode == "parameter"]
        numbers = [p.parameter_number for p in params]
        if len(set(numbers)) != len(numbers):         # not numbered: their order is their number
            numbers = list(range(len(params)))
        users: dict[int, list] = {p.id: [] for p in params}
        for i in comp.instructions:
            for o in i.operand_ids:
                if o in users:
                    users[o].append(i)
        out = {}
        for p, n in zip(params, numbers):
            u = users[p.id]
            # only the sliced operand (operand 0) of each user: an index operand is read whole
            if u and all(x.opcode in SLICING and x.operand_ids and x.operand_ids[0] == p.id for x in u):
                out[n] = float(sum(shape_bytes(x.shape) for x in u))
        return out

    def _flops(self, ins, operands, depth: int = 0, active: set[int] | None = None) -> float | None:
        op = ins.opcode
        if op == "dot":
            return _dot_flops(ins.shape, operands[0].shape, ins.dot_dimension_numbers) if operands else None
        if op in ("fusion", "call", "async-start"):
            active = set() if active is None else active
            return sum(self._computation_flops(cid, depth + 1, active) for cid in ins.called_computation_ids)
        if op == "custom-call":
            target = ins.custom_call_target.lower()
            if "conv" in target:
                return None
            if any(t in target for t in GEMM_TARGETS) and len(operands) >= 2:
                return _custom_gemm_flops(ins, operands)
            return None
        if op == "convolution":
            return None                      # needs window and feature dims; not estimated
        if op in NO_DATA:
            return 0.0
        if op in ("reduce", "reduce-window"):
            return float(sum(_elements(o.shape) for o in operands[: max(1, len(operands) // 2)]))
        return float(_elements(ins.shape))  # elementwise: one op per output element

    def _computation_flops(self, cid: int, depth: int, active: set[int]) -> float:
        """FLOPs of one called computation, each computed once (a DAG of
        fusions costs its size, not its paths); a call back into a computation
        being computed (`active`, this call's own) or nested too deep adds 0."""
        done = self._called_flops.get(cid)
        if done is not None:
            return done
        comp = self.computations.get(cid)
        if comp is None or depth > MAX_CALL_DEPTH or cid in active:
            return 0.0
        active.add(cid)
        total = 0.0
        for inner in comp.instructions:
            inner_ops = [self.instructions[i] for i in inner.operand_ids if i in self.instructions]
            total += self._flops(inner, inner_ops, depth, active) or 0.0
        active.discard(cid)
        total = min(total, MAX_FLOPS)
        self._called_flops[cid] = total          # Programs are shared (lru_cache): only finished totals go here
        return total


def _custom_gemm_flops(ins, operands) -> float | None:
    out = ins.shape.tuple_shapes[0] if ins.shape.tuple_shapes else ins.shape
    try:
        cfg = json.loads(ins.backend_config or b"{}")
    except (ValueError, RecursionError):     # not JSON, not UTF-8, or nested past the parser's depth
        cfg = {}
    gemm = cfg.get("gemm_backend_config") if isinstance(cfg, dict) else None
    gemm = gemm if isinstance(gemm, dict) and gemm else cfg
    dims = gemm.get("dot_dimension_numbers") if isinstance(gemm, dict) else None
    contracting = dims.get("lhs_contracting_dimensions") if isinstance(dims, dict) else None
    lhs = operands[0].shape
    if contracting and isinstance(contracting, list):
        k = _contracted(lhs, contracting)
        if k is None:
            return None
    else:   # plain matmul: lhs·rhs/out = K² (per batch)
        k = math.sqrt(max(_elements(lhs) * _elements(operands[1].shape) / max(_elements(out), 1), 1))
    return 2.0 * _elements(out) * k


@lru_cache(maxsize=256)
def load_program(data: bytes) -> Program | None:
    if not data:
        return None
    proto = hlo_pb2.HloProto()
    try:
        proto.ParseFromString(data)
    except DecodeError:
        return None
    return Program(proto)
