"""Structure-aware fuzzing of the dcgm-exporter readers behind `read_recording`.

The contract: for any file, a Recording whose times are Unix seconds and
whose GPUs are indices, or RecordingError naming the file; never another
exception. Inputs: valid scrapes and query_range answers with lines,
tokens and JSON nodes mutated, and raw bytes after the characters that
pick the reader. Every run is the same run (`derandomize=True`).
"""
from __future__ import annotations

import json
import math
import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuscope.collectors.recording import RecordingError, read_recording

T0 = 1764547200
LABELS = 'gpu="{g}",UUID="GPU-{g}",device="nvidia{g}",modelName="NVIDIA H200",Hostname="h1",pod="p"'
FIELDS = ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_USED",
          "DCGM_FI_DEV_NAME", "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS")
TOKENS = ["{", "}", '"', ",", "=", " ", "\t", "\n", "# ", "#time: ", "NaN", "+Inf", "-1", "1e308", "1_0", "0x10",
          "99999999999999999999", str(T0), str(T0 * 1000), "2025-12-01T00:00:00Z", "2025-13-01T00:00:00",
          'gpu="', 'Hostname="h2"', 'GPU_I_ID="1"', "\\", "\x00", "é", "DCGM_FI_DEV_GPU_UTIL"]


def fuzz(n: int):
    return settings(max_examples=n, derandomize=True, database=None, deadline=None, print_blob=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def exposition(rng: random.Random) -> str:
    out = []
    for k in range(rng.randint(1, 4)):
        out.append(f"# {T0 + k}.5")
        for f in FIELDS:
            out += [f"# HELP {f} help.", f"# TYPE {f} gauge"]
            out += [f"{f}{{{LABELS.format(g=g)}}} {rng.choice(['1', '95.5', 'NaN', '', 'H200'])}"
                    + (f" {(T0 + k) * 1000}" if rng.random() < 0.2 else "") for g in range(2)]
    return "\n".join(out) + "\n"


def query_range(rng: random.Random) -> dict:
    result = [{"metric": {"__name__": f, "gpu": str(g), "Hostname": "h1"},
               "values": [[T0 + k, rng.choice(["1", "95.5", "NaN"])] for k in range(rng.randint(0, 3))]}
              for f in FIELDS for g in range(2)]
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


def mutate_text(text: str, rng: random.Random) -> str:
    lines = text.split("\n")
    for _ in range(rng.randint(1, 6)):
        i = rng.randrange(len(lines))
        op = rng.randrange(5)
        if op == 0:                                   # a token into a line
            j = rng.randint(0, len(lines[i]))
            lines[i] = lines[i][:j] + rng.choice(TOKENS) + lines[i][j:]
        elif op == 1:                                 # a line cut short
            lines[i] = lines[i][:rng.randint(0, len(lines[i]))]
        elif op == 2:                                 # a line repeated or moved
            lines.insert(rng.randrange(len(lines) + 1), lines[i])
        elif op == 3:
            del lines[i]
        else:                                         # a character replaced
            if lines[i]:
                j = rng.randrange(len(lines[i]))
                lines[i] = lines[i][:j] + chr(rng.randrange(1, 0x250)) + lines[i][j + 1:]
        if not lines:
            lines = [""]
    return "\n".join(lines)


def mutate_json(doc, rng: random.Random):
    """A node somewhere in the document replaced by another JSON value."""
    junk = [None, True, 0, -1, 1e308, "x", "NaN", [], {}, [1], [T0, "1"], [T0, "1", 2], {"a": 1}, "1_0", [[T0]]]
    path, node = [], doc
    while isinstance(node, (dict, list)) and node and rng.random() < 0.8:
        key = rng.choice(list(node)) if isinstance(node, dict) else rng.randrange(len(node))
        path.append((node, key))
        node = node[key]
    if path:
        parent, key = path[-1]
        parent[key] = rng.choice(junk)
    else:
        doc = rng.choice(junk)
    return doc


def check(tmp_path, data: bytes) -> None:
    p = tmp_path / "f"
    p.write_bytes(data)
    try:
        rec = read_recording(p)
    except RecordingError as exc:
        assert str(exc).startswith(str(p)), str(exc)
        return
    assert len(rec) and all(1e9 <= t < 1e10 for t in rec.t.tolist()) and all(0 <= g <= 65535 for g in rec.gpus())
    assert all(len(v) == len(rec) for v in rec.metrics.values())
    assert not any(math.isinf(x) for v in rec.metrics.values() for x in v.tolist())


@fuzz(500)
@given(st.integers(0, 2 ** 64 - 1))
def test_mutated_scrapes(tmp_path_factory, seed):
    rng = random.Random(seed)
    check(tmp_path_factory.mktemp("f"), mutate_text(exposition(rng), rng).encode("utf-8", "surrogatepass"))


@fuzz(500)
@given(st.integers(0, 2 ** 64 - 1))
def test_mutated_query_range(tmp_path_factory, seed):
    rng = random.Random(seed)
    doc = query_range(rng)
    for _ in range(rng.randint(1, 3)):
        doc = mutate_json(doc, rng)
    text = json.dumps(doc)
    if rng.random() < 0.3:
        text = mutate_text(text, rng)
    check(tmp_path_factory.mktemp("f"), text.encode())


@fuzz(200)
@given(st.sampled_from([b"#", b"# 1764547200\n", b"DCGM_FI_", b"{", b"["]), st.binary(max_size=200))
def test_raw_bytes_after_the_sniffed_start(tmp_path_factory, start, rest):
    check(tmp_path_factory.mktemp("f"), start + rest)
