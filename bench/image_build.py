"""The container image without Docker: the Dockerfile's own steps run in
chroots of Debian bookworm, to measure what the image holds and to run it.

    sudo python bench/image_build.py [--keep]

No Docker engine runs on our machines, so this stands in for `docker
build`: debootstrap makes Debian bookworm (minbase), slimmed as the
debian:bookworm-slim image is (no docs, man pages or locales; dpkg told to
leave them out of later installs); each stage of the Dockerfile starts from
a copy of it; its RUN lines run as written in a chroot (sh -c, with its ENV),
COPY copies from the context (after .dockerignore) or from an earlier stage.
The one change: pip installs from a wheelhouse made here of the same
packages (PIP_NO_INDEX, PIP_FIND_LINKS), apt-get from Debian's mirror.

Then the final stage is measured (its files; compressed as a registry
stores layers, gzip -6 of a tar) and run, read-only as the chart runs it,
as uid 65532 with a tmpfs /tmp: `gpuscope --version`, `gpuscope up`
replaying the bundled recording until it opens findings, and
`gpuscope-health` asking it over mutual TLS. Needs root, debootstrap and
Debian's mirror. Results to bench/out/image_build.json.
"""
from __future__ import annotations

import argparse
import fnmatch
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.deploy.test_dockerfile import instructions  # noqa: E402  (the one reading of a Dockerfile)
OUT = ROOT / "bench" / "out" / "image"
SLIM_EXCLUDES = ("/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*",
                 "/usr/share/lintian/*", "/usr/share/linda/*")


def sh(*cmd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, **kw)


def remove(path: Path) -> None:
    """rmtree, refused while anything is mounted beneath (a bound /dev would go with it)."""
    mounts = [l.split()[1] for l in Path("/proc/self/mounts").read_text().splitlines()]
    if any(m == str(path) or m.startswith(str(path) + "/") for m in mounts):
        sys.exit(f"{path}: still has mounts beneath; not removing it")
    shutil.rmtree(path, ignore_errors=True)


def size_mb(path: Path) -> float:
    out = sh("du", "-s", "--apparent-size", "--block-size=1", "-x", str(path), capture_output=True, text=True)
    return int(out.stdout.split()[0]) / 1e6


def base_rootfs() -> Path:
    """Debian bookworm minbase, slimmed as debian:bookworm-slim is; made once."""
    base = OUT / "base"
    if (base / "etc" / "debian_version").exists():
        return base
    remove(base)
    sh("debootstrap", "--variant=minbase", "bookworm", str(base), "http://deb.debian.org/debian",
       stdout=subprocess.DEVNULL)
    (base / "etc/dpkg/dpkg.cfg.d/docker-slim").write_text(
        "".join(f"path-exclude {p}\n" for p in SLIM_EXCLUDES) + "path-include /usr/share/doc/*/copyright\n")
    for pattern in SLIM_EXCLUDES:
        for p in base.glob(pattern.lstrip("/")):
            if not p.name == "copyright":
                shutil.rmtree(p) if p.is_dir() and not p.is_symlink() else p.unlink()
    for d in ("var/lib/apt/lists", "var/cache/apt"):
        for p in (base / d).glob("*"):
            shutil.rmtree(p) if p.is_dir() else p.unlink()
    return base


class Chroot:
    """A stage's root with /proc, /dev and the host's DNS, for RUN."""

    def __init__(self, root: Path):
        self.root = root

    def __enter__(self):
        sh("mount", "-t", "proc", "proc", str(self.root / "proc"))
        sh("mount", "--rbind", "/dev", str(self.root / "dev"))
        sh("mount", "--make-rslave", str(self.root / "dev"))
        shutil.copy("/etc/resolv.conf", self.root / "etc/resolv.conf")
        return self

    def __exit__(self, *exc):
        subprocess.run(["umount", "-R", str(self.root / "dev")], check=False)
        subprocess.run(["umount", str(self.root / "proc")], check=False)

    def run(self, command: str, env: dict[str, str], user: str | None = None, timeout: float = 1800):
        args = ["chroot"] + ([f"--userspec={user}"] if user else []) + [str(self.root), "/bin/sh", "-c", command]
        return subprocess.run(args, env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                                          **env}, capture_output=True, text=True, timeout=timeout)


def ignored(path: str, patterns: list[str]) -> bool:
    parts, verdict = path.split("/"), False
    for p in patterns:
        negate, p = p.startswith("!"), p.lstrip("!").rstrip("/")
        for i in range(1, len(parts) + 1):
            if fnmatch.fnmatchcase("/".join(parts[:i]), p) or \
                    (p.startswith("**/") and fnmatch.fnmatchcase(parts[i - 1], p[3:])):
                verdict = not negate
                break
    return verdict


def copy_context(dest: Path) -> int:
    patterns = [l.strip() for l in (ROOT / ".dockerignore").read_text().splitlines()
                if l.strip() and not l.startswith("#")]
    files = sh("git", "ls-files", "--cached", "--others", "--exclude-standard", cwd=ROOT, capture_output=True,
               text=True).stdout.split()
    n = 0
    for f in files:
        if ignored(f, patterns) or not (ROOT / f).is_file():
            continue
        (dest / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / f, dest / f)
        n += 1
    return n


def build(wheelhouse: Path) -> tuple[Path, dict, dict]:
    """Runs the Dockerfile; returns the final stage's root, its config and timings."""
    steps = instructions(ROOT / "Dockerfile")
    args: dict[str, str] = {}
    stages: dict[str, Path] = {}
    timings: dict[str, float] = {}
    root = None
    config: dict = {}
    pip_env = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": "/wheelhouse", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    for word, rest in steps:
        rest_expanded = re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), ""), rest)
        if word == "ARG":
            k, _, v = rest.partition("=")
            args.setdefault(k, v)
        elif word == "FROM":
            image, _, name = rest_expanded.partition(" AS ")
            assert image.startswith("debian:bookworm"), f"{image}: this stand-in makes Debian bookworm only"
            name = name.strip() or f"stage{len(stages)}"
            root = OUT / name
            remove(root)
            sh("cp", "-a", str(base_rootfs()), str(root))
            stages[name] = root
            config = {"env": {}, "user": "0"}
        elif word == "RUN":
            assert root is not None
            shutil.copytree(wheelhouse, root / "wheelhouse")
            t = time.monotonic()
            with Chroot(root) as c:
                done = c.run(rest_expanded, {**config["env"], **pip_env})
            timings[rest_expanded[:60]] = round(time.monotonic() - t, 1)
            shutil.rmtree(root / "wheelhouse")
            if done.returncode:
                sys.exit(f"RUN {rest_expanded}\nexited {done.returncode}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        elif word == "COPY":
            words = shlex.split(rest_expanded)
            source_stage = next((w.split("=", 1)[1] for w in words if w.startswith("--from=")), None)
            src, dest = [w for w in words if not w.startswith("--")]
            target = root / dest.lstrip("/")
            if source_stage:
                sh("cp", "-a", str(stages[source_stage] / src.lstrip("/")), str(target))
            elif src == ".":
                target.mkdir(parents=True, exist_ok=True)
                timings["context_files"] = copy_context(target)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(ROOT / src, target)
        elif word == "ENV":
            for item in shlex.split(rest_expanded):
                k, _, v = item.partition("=")
                config["env"][k] = re.sub(r"\$(\w+)", lambda m: config["env"].get(m.group(1), ""), v)
        elif word == "USER":
            config["user"] = rest_expanded
        elif word in ("ENTRYPOINT", "CMD"):
            config[word.lower()] = json.loads(rest_expanded)
        elif word in ("EXPOSE", "HEALTHCHECK", "WORKDIR", "LABEL"):
            config[word.lower()] = rest_expanded
        else:
            sys.exit(f"{word}: not an instruction this stand-in knows")
    for p in ("etc/resolv.conf",):
        (root / p).write_text("")
    return root, config, timings


def compressed_mb(path: Path) -> float:
    tar = subprocess.Popen(["tar", "-C", str(path), "-cf", "-", "."], stdout=subprocess.PIPE)
    gz = subprocess.run(["gzip", "-6"], stdin=tar.stdout, capture_output=True)
    tar.wait()
    return len(gz.stdout) / 1e6


def run_image(root: Path, config: dict) -> dict:
    """The final stage read-only, as uid 65532 with a tmpfs /tmp, as the chart runs it."""
    ro = OUT / "ro"
    ro.mkdir(exist_ok=True)
    sh("mount", "--bind", str(root), str(ro))
    sh("mount", "--make-private", str(ro))
    sh("mount", "-o", "remount,bind,ro", str(ro))
    results: dict = {}
    try:
        sh("mount", "-t", "tmpfs", "-o", "size=256m,mode=1777", "tmpfs", str(ro / "tmp"))
        sh("mount", "-t", "tmpfs", "-o", "size=512m,mode=0777", "tmpfs", str(ro / "var/lib/gpuscope"))
        env = {**config["env"]}
        with _Mounts(ro) as c:
            entry = " ".join(config["entrypoint"])
            v = c.run(f"{entry} --version", env, user=config["user"])
            results["version"] = (v.stdout + v.stderr).strip()
            port = _free_port()
            up = subprocess.Popen(["chroot", f"--userspec={config['user']}", str(ro), "/bin/sh", "-c",
                                   f"exec {entry} --json-logs up --no-view --speed 4 --duration 40 "
                                   f"--listen 127.0.0.1:{port} --db /var/lib/gpuscope/up.duckdb"],
                                  env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            health = None
            for _ in range(60):
                time.sleep(1)
                h = c.run(f"gpuscope-health 127.0.0.1:{port} --ca /var/lib/gpuscope/tls/ca.pem "
                          "--cert /var/lib/gpuscope/tls/client.pem --key /var/lib/gpuscope/tls/client.key", env,
                          user=config["user"])
                if h.returncode == 0:
                    health = "SERVING"
                    break
                health = h.stderr.strip()
            results["health"] = health
            log, _ = up.communicate(timeout=120)
            results["up_exit"] = up.returncode
            results["findings_opened"] = log.count('"finding opened"')
            results["errors"] = [l for l in log.splitlines() if '"level": "error"' in l][:5]
            results["read_only_root"] = c.run("touch /opt/x", env, user="0").returncode != 0
    finally:
        for m in ("var/lib/gpuscope", "tmp"):
            subprocess.run(["umount", str(ro / m)], check=False)
        subprocess.run(["umount", str(ro)], check=False)
    return results


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Mounts(Chroot):
    """/proc and /dev for a read-only root: its resolv.conf is not written."""

    def __enter__(self):
        sh("mount", "-t", "proc", "proc", str(self.root / "proc"))
        sh("mount", "--rbind", "/dev", str(self.root / "dev"))
        sh("mount", "--make-rslave", str(self.root / "dev"))
        return self


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--keep", action="store_true", help="keep the stages under bench/out/image")
    ns = ap.parse_args()
    if os.geteuid() != 0 or not shutil.which("debootstrap"):
        sys.exit("needs root and debootstrap (apt-get install debootstrap)")
    OUT.mkdir(parents=True, exist_ok=True)
    wheelhouse = OUT / "wheelhouse"
    shutil.rmtree(wheelhouse, ignore_errors=True)
    sh(sys.executable, "-m", "pip", "wheel", "-q", "--wheel-dir", str(wheelhouse), str(ROOT),
       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    # what pip needs to build gpuscope from /src (pyproject.toml's build-system)
    sh(sys.executable, "-m", "pip", "download", "-q", "--dest", str(wheelhouse), "setuptools>=69", "wheel",
       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = base_rootfs()
    final, config, timings = build(wheelhouse)
    result = {
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "base_mb": round(size_mb(base), 1),
        "image_mb": round(size_mb(final), 1),
        "opt_gpuscope_mb": round(size_mb(final / "opt/gpuscope"), 1),
        "apt_layer_mb": round(size_mb(final) - size_mb(base) - size_mb(final / "opt/gpuscope"), 1),
        "image_gzip_mb": round(compressed_mb(final), 1),
        "debian": (final / "etc/debian_version").read_text().strip(),
        "python": subprocess.run(["chroot", str(final), "python3", "--version"], capture_output=True,
                                 text=True).stdout.strip(),
        "steps_s": timings,
        "run": run_image(final, config),
    }
    out = ROOT / "bench" / "out" / "image_build.json"
    out.write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    if not ns.keep:
        for stage in OUT.iterdir():
            if stage.name not in ("base",):
                remove(stage)


if __name__ == "__main__":
    main()
