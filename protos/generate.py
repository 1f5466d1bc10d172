"""Regenerate the Python code for the .proto files under protos/gpuscope/.

    python protos/generate.py            # rewrite the generated files
    python protos/generate.py --check    # exit 1 if they are stale (CI)
"""
import argparse
import filecmp
import pathlib
import sys
import tempfile

from grpc_tools import protoc

ROOT = pathlib.Path(__file__).resolve().parent
# gpuscope.v1: our wire; gpuscope.xla: copies of the XLA profiler's;
# gpuscope.k8s.podresources.v1: the kubelet's pod-resources API as published
PACKAGES = ("v1", "xla", "k8s/podresources/v1")
PROTOS = sorted(p for pkg in PACKAGES for p in (ROOT / "gpuscope" / pkg).glob("*.proto"))


def generate(out: pathlib.Path) -> None:
    import grpc_tools

    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    args = ["protoc", f"-I{ROOT}", f"-I{include}", f"--python_out={out}",
            f"--pyi_out={out}", f"--grpc_python_out={out}"]
    args += [str(p.relative_to(ROOT)) for p in PROTOS]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        generate(pathlib.Path(tmp))
        stale = []
        for pkg in PACKAGES:
            target = ROOT / "gpuscope" / pkg
            for f in sorted((pathlib.Path(tmp) / "gpuscope" / pkg).glob("*_pb2*.py*")):
                if ns.check:
                    if not (target / f.name).exists() or not filecmp.cmp(f, target / f.name, shallow=False):
                        stale.append(f"{pkg}/{f.name}")
                else:
                    (target / f.name).write_bytes(f.read_bytes())
        if stale:
            print("stale generated code, run `python protos/generate.py`: " + ", ".join(stale), file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
