"""Bound-ness from the HLO, not from kernel names: a batch-1 decode's matrix
product inside a command buffer (the op is `command_buffer_1`, the kernel is
named after its fusion, `gemm_fusion_dot_1`) does ~1 FLOP per byte of
weights read and is memory-bound whatever it is called; a library GEMM the
HLO cannot explain is reported as unknown, not guessed."""
from gpuscope.analyzers.trace_analysis import summarize
from gpuscope.collectors.xspace_reader import parse_xspace
from gpuscope.xla import hlo_pb2
from tests.xspace_build import SpaceBuilder

BF16 = 16
PROGRAM = "4242"


def _ins(comp, id_, name, opcode, dims, operands=(), et=BF16, number=None):
    i = comp.instructions.add(id=id_, name=name, opcode=opcode)
    i.shape.element_type = et
    i.shape.dimensions.extend(dims)
    i.operand_ids.extend(operands)
    if number is not None:
        i.parameter_number = number
    return i


def _steady(proto, kernel: str, op: str, every_us: float, kernel_us: float, count: int) -> dict:
    """One kernel launched back to back from one program, summarized."""
    b = SpaceBuilder()
    for k in range(count):
        b.launch("python3", k * every_us, 2, k * every_us + 2, kernel_us, name=kernel, hlo_op=op, program_id=PROGRAM)
    b.hlo_module(PROGRAM, "jit_step", proto.SerializeToString())
    return summarize(parse_xspace(b.bytes(), "steady.xplane.pb"))


def _decode_module(batch: int) -> bytes:
    """jit_decode: a fusion `gemm_fusion_dot.1` computing [batch, 8192] x
    [8192, 8192] in bf16, as XLA lays it out (the dot in a fused computation)."""
    proto = hlo_pb2.HloProto()
    m = proto.hlo_module
    m.name = "jit_decode"
    fused = m.computations.add(id=1, name="fused_dot")
    ins = _ins
    ins(fused, 11, "p0", "parameter", [batch, 8192])
    ins(fused, 12, "p1", "parameter", [8192, 8192])
    dot = ins(fused, 13, "dot.1", "dot", [batch, 8192], [11, 12])
    dot.dot_dimension_numbers.lhs_contracting_dimensions.append(1)
    dot.dot_dimension_numbers.rhs_contracting_dimensions.append(0)
    entry = m.computations.add(id=2, name="main")
    ins(entry, 21, "x", "parameter", [batch, 8192])
    ins(entry, 22, "w", "parameter", [8192, 8192])
    f = ins(entry, 23, "gemm_fusion_dot.1", "fusion", [batch, 8192], [21, 22])
    f.called_computation_ids.append(1)
    m.entry_computation_id = 2
    return proto.SerializeToString()


def _decode_trace(batch: int, kernel_us: float, with_hlo: bool = True, library_gemm: bool = False) -> dict:
    b = SpaceBuilder()
    t = 0.0
    for _ in range(200):
        b.launch("python3", t, 2, t + 2, kernel_us, name="gemm_fusion_dot_1", hlo_op="command_buffer_1",
                 program_id=PROGRAM)
        t += kernel_us + 1
        if library_gemm:
            b.launch("python3", t, 2, t + 2, kernel_us, name="nvjet_sm90_tst_128x160_64x5_2x1_v_bz_NNT",
                     hlo_op="command_buffer_1", program_id=PROGRAM)
            t += kernel_us + 1
    if with_hlo:
        b.hlo_module(PROGRAM, "jit_decode", _decode_module(batch))
    return summarize(parse_xspace(b.bytes(), "decode.xplane.pb"))


def test_batch_1_decode_in_a_command_buffer_is_memory_bound_from_the_hlo():
    # 128 MiB of weights in 30 µs = 4.5 TB/s: near the H200's HBM peak
    s = _decode_trace(batch=1, kernel_us=30)
    assert s["verdict"] == "memory-bound", s["summary"]
    op = s["top_ops"][0]
    assert op["kernel"] == "gemm_fusion_dot_1" and op["op"] == "command_buffer_1"
    assert op["bound"] == "memory" and op["bound_source"] == "hlo"
    assert 0.9 < op["intensity_flops_per_byte"] < 1.1
    assert 0.8 < op["fraction_of_peak"] < 1.0
    assert s["roofline"]["hlo_time_fraction"] == 1.0


def test_a_large_batch_of_the_same_fusion_is_compute_bound():
    # [4096, 8192] x [8192, 8192]: ~2,700 FLOP per byte, far above the ridge
    s = _decode_trace(batch=4096, kernel_us=900)
    assert s["verdict"] == "compute-bound", s["summary"]
    assert s["top_ops"][0]["bound_source"] == "hlo"


def test_without_hlo_the_name_is_used_and_says_so():
    s = _decode_trace(batch=1, kernel_us=30, with_hlo=False)
    op = s["top_ops"][0]
    assert op["bound_source"] == "name" and op["bound"] == "compute"      # the known miss: "gemm" in the name
    assert "placed by kernel names" in s["summary"]
    assert s["confidence"] < 0.75


def test_a_kernel_the_hlo_cannot_explain_is_unknown_with_its_time_share():
    s = _decode_trace(batch=1, kernel_us=30, library_gemm=True)
    lib = next(r for r in s["top_ops"] if r["kernel"].startswith("nvjet"))
    assert lib["bound"] is None and lib["bound_source"] == "unknown"
    assert abs(s["roofline"]["unknown_time_fraction"] - 0.5) < 0.01
    assert s["verdict"] == "memory-bound" and "HLO does not explain" in s["summary"]


def test_an_embedding_gather_is_memory_bound_from_the_hlo():
    """A vocabulary-sized embedding table, 4,096 token rows gathered: a few
    FLOPs per byte moved, so below the ridge whatever the kernel is named."""
    proto = hlo_pb2.HloProto()
    m = proto.hlo_module
    fused = m.computations.add(id=1, name="fused_gather")
    for id_, name, opcode, dims, etype in ((11, "table", "parameter", [128256, 4096], BF16),
                                          (12, "ids", "parameter", [4096, 1], 4),
                                          (13, "gather.1", "gather", [4096, 4096], BF16)):
        i = fused.instructions.add(id=id_, name=name, opcode=opcode)
        i.shape.element_type = etype
        i.shape.dimensions.extend(dims)
        if opcode == "gather":
            i.operand_ids.extend([11, 12])
    entry = m.computations.add(id=2, name="main")
    for id_, name, dims, etype in ((21, "table", [128256, 4096], BF16), (22, "ids", [4096, 1], 4)):
        i = entry.instructions.add(id=id_, name=name, opcode="parameter")
        i.shape.element_type = etype
        i.shape.dimensions.extend(dims)
    f = entry.instructions.add(id=23, name="input_gather_fusion", opcode="fusion")
    f.shape.element_type = BF16
    f.shape.dimensions.extend([4096, 4096])
    f.operand_ids.extend([21, 22])
    f.called_computation_ids.append(1)
    s = _steady(proto, "input_gather_fusion", "input_gather_fusion", every_us=500, kernel_us=450, count=100)
    assert s["verdict"] == "memory-bound", s["summary"]
    assert s["top_ops"][0]["bound_source"] == "hlo" and s["top_ops"][0]["intensity_flops_per_byte"] < 1


def test_a_scan_body_reads_one_layer_of_the_stacked_weights():
    """jax.lax.scan over 32 stacked layers: the body's fusion takes all the
    weights [32, 4096, 4096] and dynamic-slices one layer; its bytes are one
    layer's, so a 4096-token GEMM is compute-bound."""
    proto = hlo_pb2.HloProto()
    m = proto.hlo_module
    ins = _ins
    fused = m.computations.add(id=1, name="fused_dot")
    ins(fused, 11, "p0", "parameter", [4096, 4096], number=0)
    ins(fused, 12, "p1", "parameter", [32, 4096, 4096], number=1)
    ins(fused, 13, "p2", "parameter", [], et=4, number=2)
    ins(fused, 16, "zero", "constant", [], et=4)
    ins(fused, 14, "dynamic-slice.1", "dynamic-slice", [1, 4096, 4096], [12, 13, 16, 16])
    ins(fused, 17, "bitcast.1", "bitcast", [4096, 4096], [14])
    dot = ins(fused, 15, "dot.1", "dot", [4096, 4096], [11, 17])
    dot.dot_dimension_numbers.lhs_contracting_dimensions.append(1)
    dot.dot_dimension_numbers.rhs_contracting_dimensions.append(0)
    body = m.computations.add(id=2, name="body")
    ins(body, 21, "x", "parameter", [4096, 4096], number=0)
    ins(body, 22, "w", "parameter", [32, 4096, 4096], number=1)
    ins(body, 23, "i", "parameter", [], et=4, number=2)
    ins(body, 24, "gemm_fusion_dot.1", "fusion", [4096, 4096], [21, 22, 23]).called_computation_ids.append(1)
    s = _steady(proto, "gemm_fusion_dot_1", "command_buffer_1", every_us=231, kernel_us=229, count=320)
    assert s["verdict"] == "compute-bound", s["summary"]
    assert 1300 < s["top_ops"][0]["intensity_flops_per_byte"] < 1400


def test_an_op_faster_than_the_hardware_is_unknown_not_placed():
    """128 MiB of weights in 10 µs would be 13 TB/s on a 4.8 TB/s H200: the
    HLO's count is not what ran, so the op is not placed on the roofline."""
    s = _decode_trace(batch=1, kernel_us=10)
    op = s["top_ops"][0]
    assert op["bound"] is None and op["bound_source"] == "unknown" and "of peak" in op["note"]


def test_a_cudnn_convolution_is_unknown_not_costed_as_a_matmul():
    proto = hlo_pb2.HloProto()
    entry = proto.hlo_module.computations.add(id=1, name="main")
    _ins(entry, 1, "x", "parameter", [32, 256, 56, 56])
    _ins(entry, 2, "w", "parameter", [256, 256, 3, 3])
    conv = _ins(entry, 3, "custom-call.7", "custom-call", [32, 256, 56, 56], [1, 2])
    conv.custom_call_target = "__cudnn$convForward"
    s = _steady(proto, "sm90_xmma_fprop_implicit_gemm", "custom-call.7", every_us=50, kernel_us=46, count=200)
    assert s["top_ops"][0]["bound_source"] == "unknown"


def test_copies_on_a_gh200_are_not_judged_against_a_pcie_link():
    from gpuscope.analyzers.links import pcie_link
    assert pcie_link(device_name="NVIDIA GH200 480GB") is None
    assert pcie_link(device_name="NVIDIA H200")["generation"] == 5
