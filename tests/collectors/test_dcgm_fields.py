"""The DCGM field table: ids unique, every metric in the catalogue, and each
scale the one that takes DCGM's unit to the catalogue's."""
from gpuscope.collectors import catalogue as cat
from gpuscope.collectors import dcgm_fields as dcgm

# DCGM unit, catalogue unit -> factor, stated independently of the table
CONVERSIONS = {("%", "ratio"): 0.01, ("ratio", "ratio"): 1.0, ("MHz", "hertz"): 1e6, ("C", "celsius"): 1.0,
               ("W", "watts"): 1.0, ("mJ", "joules"): 1e-3, ("MiB", "bytes"): 2.0 ** 20,
               ("B/s", "bytes/s"): 1.0, ("ns", "seconds"): 1e-9, ("count", "count"): 1.0,
               ("bitmask", "bitmask"): 1.0}


def test_names_and_ids_are_unique_and_metrics_exist():
    assert len({f.name for f in dcgm.FIELDS}) == len({f.id for f in dcgm.FIELDS}) == len(dcgm.FIELDS)
    assert len({f.metric for f in dcgm.FIELDS}) == len(dcgm.FIELDS)       # one field per metric: no ties
    for f in dcgm.FIELDS:
        assert f.metric in cat.BY_NAME, f
        assert dcgm.BY_ID[f.id] is f and dcgm.BY_NAME[f.name] is f
    assert not set(dcgm.NOT_READ) & set(dcgm.BY_NAME)


def test_scales_take_dcgm_units_to_the_catalogues():
    for f in dcgm.FIELDS:
        m = cat.BY_NAME[f.metric]
        assert (f.unit, m.unit) in CONVERSIONS, f
        assert f.scale == CONVERSIONS[(f.unit, m.unit)], f
        assert dcgm.normalise(f, 2.0) == 2.0 * CONVERSIONS[(f.unit, m.unit)]


def test_well_known_ids():
    # dcgm_fields.h, NVIDIA/DCGM
    known = {"DCGM_FI_DEV_GPU_UTIL": 203, "DCGM_FI_DEV_POWER_USAGE": 155, "DCGM_FI_PROF_SM_ACTIVE": 1002,
             "DCGM_FI_PROF_PIPE_TENSOR_HMMA_ACTIVE": 1014, "DCGM_FI_DEV_FB_USED": 252,
             "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS": 112, "DCGM_FI_PROF_NVLINK_RX_BYTES": 1012}
    assert {name: dcgm.BY_NAME[name].id for name in known} == known


# -- docs/recordings.md carries the table: generated here, so that the two cannot drift -------------------------

def fields_table() -> str:
    older = {new: old for old, new in dcgm.ALIASES.items()}
    rows = ["| DCGM field | id | DCGM's unit | metric (unit) |", "|---|---|---|---|"]
    for f in sorted(dcgm.FIELDS, key=lambda f: f.id):
        name = f"`{f.name}`" + (f" (older: `{older[f.name]}`)" if f.name in older else "")
        rows.append(f"| {name} | {f.id} | {f.unit} | `{f.metric}` ({cat.BY_NAME[f.metric].unit}) |")
    return "\n".join(rows) + "\n"


def not_read_table() -> str:
    rows = ["| DCGM field | why it is not read |", "|---|---|"]
    rows += [f"| `{name}` | {why} |" for name, why in dcgm.NOT_READ.items()]
    return "\n".join(rows) + "\n"


def test_docs_carry_the_field_tables():
    from tests.conftest import ROOT
    doc = (ROOT / "docs" / "recordings.md").read_text()
    for table in (fields_table(), not_read_table()):
        assert table in doc, f"docs/recordings.md, section dcgm-exporter, should hold this table:\n\n{table}"
