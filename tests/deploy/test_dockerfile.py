"""The Dockerfile, read as Docker reads it (no Docker engine runs on our
machines; docs/benchmarks.md, "Container image", has what its steps were
measured to put on disk): a base pinned by release, the final stage not
root, no secret in the image or its context, only gpuscope installed, NVML
left to the host's driver through the NVIDIA container toolkit, and a word
on the missing HEALTHCHECK."""
import fnmatch
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

DOCKERFILE = ROOT / "Dockerfile"
SECRET_WORDS = re.compile(r"key|token|secret|password|passwd|credential", re.I)


def instructions(dockerfile: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments
    dropped (bench/image_build.py runs them)."""
    out, pending = [], ""
    for line in dockerfile.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        word, _, rest = (pending + line).strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        pending = ""
    return out


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for ins in instructions():
        if ins[0] == "FROM":
            result.append([])
        if result:
            result[-1].append(ins)
    return result


def args() -> dict[str, str]:
    return dict(a.split("=", 1) for w, a in instructions() if w == "ARG" and "=" in a)


def test_the_base_is_pinned_by_release():
    for stage in stages():
        image = stage[0][1].split()[0]
        image = re.sub(r"\$\{(\w+)\}", lambda m: args()[m.group(1)], image)
        name, _, tag = image.partition(":")
        assert tag and tag != "latest" and not tag.startswith("$"), image
        assert re.search(r"bookworm|\d+\.\d+", tag), f"{image}: name a release"


def test_the_final_stage_is_not_root():
    users = [a for w, a in stages()[-1] if w == "USER"]
    assert users, "no USER: the image would run as root"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "a numeric uid, so runAsNonRoot can check it"


def test_nvml_comes_from_the_host_driver():
    env = " ".join(a for w, a in stages()[-1] if w == "ENV")
    assert "NVIDIA_VISIBLE_DEVICES=all" in env and "NVIDIA_DRIVER_CAPABILITIES=utility" in env
    text = DOCKERFILE.read_text().lower()
    for bundled in ("libnvidia-ml", "nvidia-utils", "cuda", "nvidia/"):
        assert bundled not in re.sub(r"#.*", "", text), f"{bundled}: NVML must come from the host's driver"


def test_only_gpuscope_is_installed():
    build, final = stages()[0], stages()[-1]
    runs = [a for w, a in build if w == "RUN"]
    assert any("deploy/container/install.sh /opt/gpuscope /src" in r for r in runs)
    copies = [a for w, a in final if w == "COPY"]
    assert copies == ["--from=build /opt/gpuscope /opt/gpuscope",
                      "deploy/container/gpuscope-health /opt/gpuscope/bin/gpuscope-health"]
    for r in (a for w, a in final if w == "RUN"):
        installed = re.search(r"apt-get install ([^&]+)", r).group(1).split()
        assert [p for p in installed if not p.startswith("-")] == ["python3", "ca-certificates"]
        assert "rm -rf /var/lib/apt/lists/*" in r, "the package lists stay out of the layer"
    assert [a for w, a in final if w == "ENTRYPOINT"] == ['["gpuscope"]']


def test_no_secret_reaches_the_image():
    for word, arg in instructions():
        if word in ("ENV", "ARG", "LABEL"):
            for name in re.findall(r"(\w+)=", arg):
                assert not SECRET_WORDS.search(name), f"{word} {name}: secrets are given at run time"
        if word in ("COPY", "ADD"):
            assert not SECRET_WORDS.search(arg) and ".pem" not in arg, arg
    assert not [w for w, _ in instructions() if w == "ADD"], "COPY only: ADD fetches URLs and unpacks archives"


def test_healthcheck_is_none_and_says_why():
    text = DOCKERFILE.read_text()
    assert [a for w, a in instructions() if w == "HEALTHCHECK"] == ["NONE"]
    before = text[:text.index("HEALTHCHECK NONE")].rsplit("\n\n", 1)[-1]
    assert "Kubernetes ignores HEALTHCHECK" in before and "gpuscope-health" in before


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule for these simple patterns: the last match wins, a
    pattern matches a path or any of its parents."""
    parts = path.split("/")
    verdict = False
    for p in patterns:
        negate = p.startswith("!")
        p = p.lstrip("!").rstrip("/")
        for i in range(1, len(parts) + 1):
            prefix = "/".join(parts[:i])
            if fnmatch.fnmatchcase(prefix, p) or (p.startswith("**/") and fnmatch.fnmatchcase(parts[i - 1], p[3:])):
                verdict = not negate
                break
    return verdict


def test_the_context_holds_what_the_build_needs_and_nothing_of_a_checkout():
    patterns = [l.strip() for l in (ROOT / ".dockerignore").read_text().splitlines()
                if l.strip() and not l.startswith("#")]
    tracked = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    if not tracked:
        pytest.skip("not a git checkout")
    sent = [f for f in tracked if not _ignored(f, patterns)]
    for needed in ("pyproject.toml", "README.md", "deploy/container/install.sh", "deploy/container/gpuscope-health",
                   "daemon/cli.py", "collectors/data/h200-run1.csv.gz", "protos/gpuscope/v1/agent_pb2.py",
                   "security/tls.py", "analyzers/store.py"):
        assert needed in sent, f"{needed}: the build needs it"
    for kept_out in (".venv/bin/python", ".git/HEAD", "bench/out/x.json", "build/deploy-tools/helm",
                     "tests/conftest.py", "gpuscope.duckdb", "pki/ca.key"):
        assert _ignored(kept_out, patterns), kept_out
    assert _ignored("pki/agents/gpu-1/agent.pem", patterns)


def test_the_pyarrow_parts_the_image_leaves_out_are_never_imported():
    """install.sh removes pyarrow's Flight and S3 libraries (48 MB): safe
    while nothing here imports them."""
    install = (ROOT / "deploy" / "container" / "install.sh").read_text()
    assert "libarrow_flight" in install and "libarrow_s3" in install
    for py in ROOT.glob("*/**/*.py"):
        if py.parts[len(ROOT.parts)] in (".venv", "build", "tests", "bench"):
            continue
        text = py.read_text(errors="replace")
        assert not re.search(r"pyarrow\.(flight|fs|_s3fs|_flight)\b|from pyarrow import .*\b(flight|fs)\b", text), py


def test_install_sh_is_posix_sh():
    for script in ("deploy/container/install.sh", "deploy/helm/make-secrets.sh"):
        out = subprocess.run(["sh", "-n", str(ROOT / script)], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert shlex.split((ROOT / script).read_text().splitlines()[0]) == ["#!/bin/sh"]


def test_extras_are_a_build_arg_off_by_default(tmp_path):
    """`docker build --build-arg EXTRAS=fleet` makes the fleet tier's image;
    the default installs no extra (the fleet one is ~60 MB, the image is
    at 388 of its 400). install.sh turns EXTRAS into pip's SOURCE[EXTRAS]:
    run here with a stand-in python3 whose venv's pip records its words."""
    build = stages()[0]
    assert ("ARG", "EXTRAS=") in build, "declared in the build stage, empty"
    [install] = [a for w, a in build if w == "RUN" and "install.sh" in a]
    assert install.startswith('EXTRAS="${EXTRAS}" '), install
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "python3"
    # `python3 -m venv PREFIX` makes PREFIX/bin/pip, which logs; `python -c` prints a site dir
    fake.write_text('#!/bin/sh\nmkdir -p "$3/bin" "$3/site"\n'
                    'printf \'#!/bin/sh\\necho "$*" >> %s/pip.log\\n\' > "$3/bin/pip"\n'
                    'printf \'#!/bin/sh\\necho %s/prefix/site\\n\' > "$3/bin/python"\n'
                    'chmod +x "$3/bin/pip" "$3/bin/python"\n' % (tmp_path, tmp_path))
    fake.chmod(0o755)
    script = ROOT / "deploy" / "container" / "install.sh"
    for extras, wanted in (("", "/src"), ("fleet", "/src[fleet]")):
        (tmp_path / "pip.log").unlink(missing_ok=True)
        subprocess.run(["sh", str(script), str(tmp_path / "prefix"), "/src"], check=True, capture_output=True,
                       env={"PATH": f"{bin_dir}:/usr/bin:/bin", "EXTRAS": extras})
        said = (tmp_path / "pip.log").read_text().splitlines()
        first = said[0].split()
        assert first[0] == "install" and first[-1] == wanted, first
        # reports are drawn on on-call machines: matplotlib (~80 MB) stays out of the image
        assert any(line.startswith("uninstall -y -q matplotlib") for line in said), said
    (tmp_path / "pip.log").unlink()
    subprocess.run(["sh", str(script), str(tmp_path / "prefix"), "/src"], check=True, capture_output=True,
                   env={"PATH": f"{bin_dir}:/usr/bin:/bin", "EXTRAS": "fleet,report"})
    said = (tmp_path / "pip.log").read_text().splitlines()
    assert said[0].split()[-1] == "/src[fleet,report]" and not any("matplotlib" in line for line in said)
