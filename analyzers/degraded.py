"""Degraded GPUs, fleet-wide: each GPU against the others of its model and
driver, one dimension at a time (docs/degraded.md).

A GPU is `degraded` in a dimension (HBM, tensor, PCIe, NVLink, clocks) when
its figure is well under its peers' median: by more than a fraction of the
median AND by more than a robust z-score bound, in a group large enough to
have a median worth the name. Peers, not the datasheet: a part's measured
ceiling depends on its SKU, clocks, driver and how it was measured, all of
which the group shares, so what remains is the GPU itself. A PCIe link
trained below the device's maximum needs no peers and is flagged directly.

The statistics are one DuckDB query over one row per GPU (10,000 GPUs in
milliseconds); Python only writes the sentences."""
from __future__ import annotations

from dataclasses import dataclass

import duckdb

from gpuscope.collectors.human import percent, value as human_value

MAD_TO_SIGMA = 1.4826       # MAD x this estimates the standard deviation of normal noise


@dataclass(frozen=True)
class Dimension:
    name: str               # the finding's `dimension`
    column: str             # the per-GPU input column, higher is better
    unit: str               # collectors/human.py's units
    label: str              # how a summary names it
    what_to_try: tuple[str, ...] = ()      # a finding's report gives it


_RECALIBRATE = ("measure it again while it is idle (`gpuscope calibrate --gpu N --send ...`): one run can be "
                "unlucky, two that agree are the part")
DIMENSIONS = (
    Dimension("hbm", "hbm_bytes_per_s", "bytes/s", "HBM", (
        _RECALIBRATE,
        "`nvidia-smi -q -d ROW_REMAPPER,ECC`: remapped rows, a pending remap or uncorrectable errors mean a "
        "weak HBM stack; drain the GPU and follow the vendor's field diagnostic (`dcgmi diag -r 3`)")),
    Dimension("tensor", "tensor_flops_per_s", "FLOP/s", "BF16 tensor", (
        _RECALIBRATE,
        "`nvidia-smi -q -d PERFORMANCE,CLOCK`: a clock held down (HW slowdown, power brake) takes the tensor "
        "pipes with it; compare the clocks the calibration recorded with its peers'")),
    Dimension("pcie", "pcie_h2d_bytes_per_s", "bytes/s", "PCIe host-to-device", (
        "`nvidia-smi -q -d PCIE` (or `lspci -vv`, LnkSta against LnkCap) while the GPU is busy: a link "
        "trained under its best is a seating, riser, retimer or BIOS setting; reseat or move the GPU",
        _RECALIBRATE)),
    Dimension("nvlink", "nvlink_d2d_bytes_per_s", "bytes/s", "NVLink device-to-device", (
        "`nvidia-smi nvlink -s` and `nvidia-smi nvlink -e`: an inactive link or rising replay/CRC counters; "
        "`nvidia-smi -q -d FABRIC` on NVSwitch systems",
        _RECALIBRATE)),
    Dimension("clocks", "sm_clock_at_power_hertz", "hertz", "SM clock at the power limit", (
        "`nvidia-smi -q -d PERFORMANCE,TEMPERATURE`: the clock event reasons say whether heat (HW thermal "
        "slowdown) or power holds it; check the fans, the inlet temperature and airflow against its neighbours",
        "a GPU that runs hotter than its peers at the same power has worse cooling, not a worse workload")),
)
LINK_COLUMNS = ("pcie_generation", "pcie_width", "pcie_max_generation", "pcie_max_width")
KEY_COLUMNS = ("host", "gpu", "model", "driver")


@dataclass(frozen=True)
class DegradedConfig:
    # A GPU counts only when both hold. The fraction is 3 sigma of the widest
    # spread healthy GPUs of one model and driver show (~3 %), so even a
    # group whose MAD happens to be small does not flag its own noise; the z
    # bound keeps a noisier group (a mixed cooling, a flaky benchmark) from
    # flagging its tail (docs/degraded.md has what each alone costs).
    min_shortfall: float = 0.09
    max_z: float = -3.5
    # GPUs of the model and driver with a value, the one judged included:
    # a host's 8 GPUs are the smallest group judged.
    min_peers: int = 8
    # The z-score's scale is never under this fraction of the median: a group
    # whose MAD is ~0 (identical readings) must not turn 0.1 % into z = -50.
    scale_floor: float = 0.01


def find_degraded(con: duckdb.DuckDBPyConnection, gpus, config: DegradedConfig = DegradedConfig()) -> list[dict]:
    """`degraded` findings, one per (GPU, dimension), of `gpus`: a table or
    view name in `con`, or a pyarrow table (registered for the call). Its
    rows are GPUs with KEY_COLUMNS, optionally `uuid`, and any of the
    DIMENSIONS' columns and LINK_COLUMNS; a missing column or a NULL is
    unknown, never zero."""
    return _over(con, gpus, lambda source: _find(con, source, config))


def unjudged_groups(con: duckdb.DuckDBPyConnection, gpus, config: DegradedConfig = DegradedConfig()) -> list[dict]:
    """The (model, driver, dimension) groups find_degraded did not judge
    because fewer than `config.min_peers` of their GPUs have a figure: one
    dict each (model, driver, dimension, gpus: how many have one, min_peers),
    sorted. Without it, a 4-GPU box reads "no degraded GPU" though nothing
    was compared. A group none of whose GPUs has a figure in a dimension is
    not listed (nothing there to judge); `gpus` is as for find_degraded."""
    def groups(source: str) -> list[dict]:
        present = _columns(con, source)
        dims = [d for d in DIMENSIONS if d.column in present]
        if not dims:
            return []
        sql = f"""WITH v AS ({_values_sql(source, dims, 'NULL')})
                  SELECT model, driver, dimension, count(*) AS gpus FROM v
                  GROUP BY ALL HAVING count(*) < $min_peers ORDER BY model, driver, dimension"""
        return [dict(r, min_peers=config.min_peers) for r in _rows(con, sql, dict(min_peers=config.min_peers))]
    return _over(con, gpus, groups)


def _over(con: duckdb.DuckDBPyConnection, gpus, fn):
    """fn(name of `gpus` in con): a table or view name as it is, a pyarrow table registered for the call."""
    if isinstance(gpus, str):
        return fn(gpus)
    view = "_degraded_gpus"
    con.register(view, gpus)
    try:
        return fn(view)
    finally:
        con.unregister(view)


def _columns(con: duckdb.DuckDBPyConnection, source: str) -> set[str]:
    present = {r[0] for r in con.execute(f"DESCRIBE {_quote(source)}").fetchall()}
    missing = [c for c in KEY_COLUMNS if c not in present]
    if missing:
        raise ValueError(f"{source} lacks {', '.join(missing)}")
    return present


def _find(con: duckdb.DuckDBPyConnection, source: str, config: DegradedConfig) -> list[dict]:
    present = _columns(con, source)
    uuid = "uuid" if "uuid" in present else "NULL"
    by_gpu: dict[tuple, dict] = {}
    dims = [d for d in DIMENSIONS if d.column in present]
    if dims:
        params = dict(min_shortfall=config.min_shortfall, max_z=config.max_z, min_peers=config.min_peers,
                      scale_floor=config.scale_floor, mad_to_sigma=MAD_TO_SIGMA)
        for row in _rows(con, _peer_sql(source, dims, uuid), params):
            by_gpu[(row["host"], row["gpu"], row["dimension"])] = _peer_finding(row)
    if set(LINK_COLUMNS) & present:
        for row in _rows(con, _link_sql(source, present, uuid)):
            key = (row["host"], row["gpu"], "pcie")
            by_gpu[key] = _with_link(by_gpu.get(key) or _finding(row, "pcie", "bytes/s"), row)
    return sorted(by_gpu.values(), key=lambda f: (f["host"], f["gpu"], f["dimension"]))


def _values_sql(source: str, dims: list[Dimension], uuid: str) -> str:
    # long form: one row per (GPU, dimension) with a finite value (a NaN is as
    # unknown as a NULL); a GPU of unknown model or driver has no known peers
    return " UNION ALL ".join(
        f"SELECT host, gpu, {uuid} AS uuid, model, driver, '{d.name}' AS dimension, "
        f"CAST({d.column} AS DOUBLE) AS value FROM {_quote(source)} "
        f"WHERE isfinite(CAST({d.column} AS DOUBLE)) AND model IS NOT NULL AND driver IS NOT NULL" for d in dims)


def _peer_sql(source: str, dims: list[Dimension], uuid: str) -> str:
    return f"""
        WITH v AS ({_values_sql(source, dims, uuid)}),
        peers AS (
            SELECT model, driver, dimension, count(*) AS peers, median(value) AS peer_median,
                   greatest($mad_to_sigma * mad(value), $scale_floor * abs(median(value))) AS scale
            FROM v GROUP BY ALL HAVING count(*) >= $min_peers)
        SELECT v.*, p.peers, p.peer_median, (v.value - p.peer_median) / p.scale AS z,
               1 - v.value / p.peer_median AS shortfall
        FROM v JOIN peers p USING (model, driver, dimension)
        WHERE p.peer_median > 0
          AND v.value < (1 - $min_shortfall) * p.peer_median
          AND (v.value - p.peer_median) / p.scale <= $max_z"""


def _link_sql(source: str, present: set[str], uuid: str) -> str:
    cols = ", ".join(c if c in present else f"NULL AS {c}" for c in LINK_COLUMNS)
    below = " OR ".join(f"{now} < {top}" for now, top in (("pcie_generation", "pcie_max_generation"),
                                                             ("pcie_width", "pcie_max_width"))
                        if now in present and top in present) or "false"
    return f"SELECT host, gpu, {uuid} AS uuid, model, driver, {cols} FROM {_quote(source)} WHERE {below}"


def _rows(con: duckdb.DuckDBPyConnection, sql: str, params: dict | None = None) -> list[dict]:
    cur = con.execute(sql, params or {})
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def _finding(row: dict, dimension: str, unit: str) -> dict:
    return dict(kind="degraded", host=row["host"], gpu=row["gpu"], uuid=row["uuid"], model=row["model"],
                driver=row["driver"], dimension=dimension, value=None, peer_median=None, peers=None,
                shortfall=None, z=None, unit=unit, link=None, summary="")


def _peer_finding(row: dict) -> dict:
    dim = next(d for d in DIMENSIONS if d.name == row["dimension"])
    f = _finding(row, dim.name, dim.unit)
    f.update(value=row["value"], peer_median=row["peer_median"], peers=row["peers"],
             shortfall=row["shortfall"], z=row["z"])
    f["summary"] = (f"{dim.label} {human_value(dim.unit, f['value'])}, {percent(f['shortfall'])} under the median "
                    f"{human_value(dim.unit, f['peer_median'])} of {f['peers']:,} peers "
                    f"({f['model']}, " + (f"driver {f['driver']})" if f["driver"] else "drivers not told apart)"))
    return f


def _with_link(f: dict, row: dict) -> dict:
    f["link"] = {c: row[c] for c in LINK_COLUMNS}
    now = _link_text(row["pcie_generation"], row["pcie_width"])
    top = _link_text(row["pcie_max_generation"], row["pcie_max_width"])
    said = f"PCIe {now}, the device supports {top}"
    f["summary"] = f"{said}; {f['summary']}" if f["summary"] else said
    return f


def _link_text(generation: int | None, width: int | None) -> str:
    return " ".join(p for p in (f"Gen{generation}" if generation is not None else "",
                                f"×{width}" if width is not None else "") if p) or "an unknown link"


def condition(f: dict, config: DegradedConfig = DegradedConfig()) -> dict:
    """A result of `find_degraded` as a fleet check's condition
    (fleet_findings.py): keyed by the GPU's UUID where known, so the
    finding follows the GPU, not the slot. Confidence is 0.5 at the z
    bound and 1.0 at twice it; a link trained under its best is a fact
    the driver states, 1.0."""
    dim = next((d for d in DIMENSIONS if d.name == f["dimension"]), None)
    evidence: dict[str, float] = {}
    if f["value"] is not None and dim is not None:
        evidence.update({dim.column: f["value"], f"peer_median_{dim.column}": f["peer_median"],
                         "shortfall_ratio": round(f["shortfall"], 6), "robust_z": round(f["z"], 3),
                         "peers": float(f["peers"])})
    for k, v in (f.get("link") or {}).items():
        if v is not None:
            evidence[k] = float(v)
    if f["link"] is not None:
        confidence = 1.0
    else:
        confidence = min(1.0, abs(f["z"]) / (2 * abs(config.max_z)))
    gpu_id = f.get("uuid") or f"{f['host']}/{f['gpu']}"
    return dict(key=f"degraded:{f['dimension']}:{gpu_id}", host=f["host"], gpu=f["gpu"], summary=f["summary"],
                evidence=evidence, flags=[f["dimension"]], confidence=round(confidence, 3),
                source=f"peers: {f['model']}" + (f", driver {f['driver']}" if f.get("driver") else ""))


def what_to_try(dimension: str) -> list[str]:
    dim = next((d for d in DIMENSIONS if d.name == dimension), None)
    return list(dim.what_to_try) if dim is not None else []


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def clocks_at_power_sql(samples: str, power_fraction: float = 0.9, min_samples: int = 30,
                        in_range: bool = False) -> str:
    """SQL giving (host, gpu, sm_clock_at_power_hertz, samples_at_power):
    each GPU's median SM clock over the samples drawn at >= `power_fraction`
    of its power limit, from a table of (host, gpu, t, sm_clock_hertz,
    power_watts, power_limit_watts). At the limit the clock is what the
    silicon and its cooling sustain for that power; below it the clock is
    whatever the workload asked, so those samples say nothing. A GPU with
    fewer than `min_samples` such samples gets no figure (no row).
    `in_range`: only samples with $start <= t < $end (parameters)."""
    span = "AND t >= $start AND t < $end" if in_range else ""
    return f"""
        SELECT host, gpu, median(sm_clock_hertz) AS sm_clock_at_power_hertz, count(*) AS samples_at_power
        FROM {_quote(samples)}
        WHERE sm_clock_hertz IS NOT NULL AND power_limit_watts > 0
          AND power_watts >= {float(power_fraction)!r} * power_limit_watts {span}
        GROUP BY host, gpu HAVING count(*) >= {int(min_samples)}"""
