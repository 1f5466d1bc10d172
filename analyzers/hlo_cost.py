"""FLOPs and bytes of each HLO instruction that runs as a GPU kernel, from the
HloProto the profiler stores beside the trace.

The model is XLA's own first-order one: a kernel moves its operands in and
its result out once (bytes), and does 2·M·N·K for a dot (batch dims
included) plus one operation per output element of each arithmetic
instruction fused into it (FLOPs). It is a roofline estimate, not a
measurement: reused operands read twice, or slices of a large parameter,
make it err on the side of more bytes.
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
GEMM_TARGETS = ("gemm", "matmul", "cublas", "cudnn$conv")


@dataclass(frozen=True)
class OpCost:
    flops: float | None
    bytes: float | None


def shape_bytes(shape) -> float:
    if shape.tuple_shapes:
        return sum(shape_bytes(s) for s in shape.tuple_shapes)
    return math.prod(shape.dimensions) * ELEMENT_BYTES.get(shape.element_type, 0)


def _elements(shape) -> int:
    if shape.tuple_shapes:
        return sum(_elements(s) for s in shape.tuple_shapes)
    return math.prod(shape.dimensions)


def _dot_flops(out_shape, lhs_shape, dims) -> float:
    k = math.prod(lhs_shape.dimensions[d] for d in dims.lhs_contracting_dimensions) if dims else 1
    return 2.0 * _elements(out_shape) * k


class Program:
    def __init__(self, proto: hlo_pb2.HloProto):
        self.instructions = {}
        self.computations = {}
        self.by_name = {}
        for comp in proto.hlo_module.computations:
            self.computations[comp.id] = comp
            for ins in comp.instructions:
                self.instructions[ins.id] = ins
                self.by_name.setdefault(ins.name, ins)

    def cost(self, name: str) -> OpCost | None:
        ins = self.by_name.get(name)
        if ins is None:
            return None
        operands = [self.instructions[i] for i in ins.operand_ids if i in self.instructions]
        nbytes = shape_bytes(ins.shape) + sum(shape_bytes(o.shape) for o in operands)
        return OpCost(self._flops(ins, operands), nbytes)

    def _flops(self, ins, operands) -> float | None:
        op = ins.opcode
        if op == "dot":
            return _dot_flops(ins.shape, operands[0].shape, ins.dot_dimension_numbers) if operands else None
        if op in ("fusion", "call", "async-start"):
            total = 0.0
            for cid in ins.called_computation_ids:
                comp = self.computations.get(cid)
                if comp is None:
                    continue
                for inner in comp.instructions:
                    inner_ops = [self.instructions[i] for i in inner.operand_ids if i in self.instructions]
                    f = self._flops(inner, inner_ops)
                    total += f or 0.0
            return total
        if op == "custom-call":
            target = ins.custom_call_target.lower()
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


def _custom_gemm_flops(ins, operands) -> float | None:
    out = ins.shape.tuple_shapes[0] if ins.shape.tuple_shapes else ins.shape
    try:
        cfg = json.loads(ins.backend_config or b"{}")
    except ValueError:
        cfg = {}
    dims = (cfg.get("gemm_backend_config") or cfg).get("dot_dimension_numbers") if isinstance(cfg, dict) else None
    lhs = operands[0].shape
    if dims and dims.get("lhs_contracting_dimensions"):
        k = math.prod(lhs.dimensions[int(d)] for d in dims["lhs_contracting_dimensions"])
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
