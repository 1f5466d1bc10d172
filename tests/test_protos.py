import subprocess
import sys

from .conftest import ROOT


def test_generated_code_matches_the_proto_files():
    r = subprocess.run([sys.executable, str(ROOT / "protos" / "generate.py"), "--check"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_wire_package_imports_without_our_other_packages():
    code = "import sys, gpuscope.v1.analyzer_pb2_grpc; print(sorted(m for m in sys.modules if m.startswith('gpuscope.') and not m.startswith('gpuscope.v1')))"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert r.stdout.strip() == "[]"


def test_the_attribution_message_has_the_records_fields():
    """One list of labels (collectors/records.py) on the wire, in the store and in findings."""
    from gpuscope.collectors.records import ATTRIBUTION_FIELDS
    from gpuscope.v1 import samples_pb2 as pb
    assert tuple(f.name for f in pb.Attribution.DESCRIPTOR.fields) == ATTRIBUTION_FIELDS
