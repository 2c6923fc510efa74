"""Building every image locally: no container registry is needed.

Layers, each tagged by a hash of everything that goes into it so an unchanged
image is skipped (and reused by every checkout and CI run whose inputs hash the same):

1. ``brokerchaos/rootfs:<hash>`` -- the common base: a Debian root filesystem of one suite
   (bookworm unless a plugin's recipe names another: a broker version Debian serves only in
   trixie or sid) with ``BASE_PACKAGES``, made once per suite with ``debootstrap`` on the host
   and loaded with ``docker import`` (or, when a registry serves ``debian:<suite>-slim``, the
   same packages installed on top of it): a suite nobody asks for is never bootstrapped. A
   plugin's ``debian_packages`` are a layer of their own on its suite's base (``apt-get
   install`` from the same mirror), never a second bootstrap; the layer checks the versions
   the recipe pins, so a suite that moved on fails the build naming what it serves.
2. ``brokerchaos/<plugin>:<hash>`` -- Python wheels fetched on the host with
   ``pip download`` and installed offline, the node tooling (the modules a node container runs,
   ``NODE_MODULES``, and the ``faults`` modules they import: never the host-side faults, so a
   change to one leaves every tag as it was) and the plugin's files.
3. ``brokerchaos/toxiproxy:<hash>`` -- the Toxiproxy-API server binary built with cargo,
   on the common base (which has ``nftables`` for packet faults in the sidecar). Its tag is
   a hash of the server's sources, so an image built from the same sources is reused
   without building the binary.
4. ``<plugin image>-faketime:<hash>`` -- only for runs that need the ``faketime`` host
   feature: the plugin's image plus libfaketime, so no other image changes for it.

Images are built when a run first needs them (``harness.runner.build_images``):
``brokerchaos images build`` builds them ahead of time.
"""

from __future__ import annotations

import ast
import fcntl
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import ImageError, ScenarioError
from harness.progress import say
from harness.spec.broker import STABLE_SUITE, BrokerPlugin, ImageRecipe
from harness.spec.fault import FAKETIME_FILE

SUITE = STABLE_SUITE  # the default suite: the Toxiproxy sidecar's, and every recipe's that names none
MIRROR = os.environ.get("BROKERCHAOS_DEBIAN_MIRROR", "http://deb.debian.org/debian")
BASE_PACKAGES = (
    "python3",
    "python3-pip",
    "fuse3",
    "iproute2",
    "procps",
    "netcat-openbsd",
    "ca-certificates",
    "tini",
    # The Toxiproxy sidecar's packet faults: small, and in the base so the sidecar needs no layer.
    "nftables",
)
#: How a layer on a suite other than the default reads its index: the Release files of testing
#: and sid expire within days (``Valid-Until``), so a mirror that lags (a snapshot of the
#: archive) would refuse them; a stable suite's carry no such date.
UNEXPIRED = " -o Acquire::Check-Valid-Until=false"
#: Base packages a suite names its own way: libfuse3's library package follows its soname
#: (``libfuse3-3`` in bookworm, ``libfuse3-4`` from trixie), so later suites take it from ``fuse3``.
SUITE_PACKAGES: dict[str, tuple[str, ...]] = {"bookworm": ("libfuse3-3",)}
NODE_WHEELS = ("mfusepy",)
REPO = Path(__file__).resolve().parent.parent
CACHE = Path(os.environ.get("BROKERCHAOS_CACHE", Path.home() / ".cache" / "brokerchaos"))
LABEL = "brokerchaos.recipe"
TOXIPROXY_CRATE = REPO / "tools" / "toxiproxy-server"
TOXIPROXY_BIN = "brokerchaos-toxiproxy"
#: Variables passed to an ``apt-get`` layer's build when set (a mirror behind a proxy).
PROXY_VARS = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")
#: libfaketime comes from the PyPI package ``libfaketime``, which vendors libfaketime 0.9.12:
#: Debian bookworm's 0.9.10 fails every CLOCK_MONOTONIC ``clock_nanosleep`` (Python's
#: ``time.sleep``) with EINVAL when ``FAKETIME_DONT_FAKE_MONOTONIC=1``, and a fake clock must
#: leave the monotonic clock alone (a real clock error never moves it).
#: What a pinned layer prints when the suite serves another version than the recipe pins.
PIN_MISMATCH = "brokerchaos-pin: the suite serves"
FAKETIME_WHEEL = "libfaketime==3.0.1"
#: The modules a node container runs with ``python3 -m``: its init (the image's entry point), the
#: control command the process faults exec, the lazy filesystem the init mounts and its control
#: command, and the node-side helpers of the clock, corruption and link faults. The image holds
#: these and the ``faults`` modules they import (``node_tooling``), nothing else of ``faults``.
NODE_MODULES = (
    "faults.nodeinit",
    "faults.nodectl",
    "faults.lazyfs",
    "faults.lazyfs.ctl",
    "faults.node.clockread",
    "faults.node.corrupt",
    "faults.node.probe",
)
FAKETIME_LIB = "/usr/local/lib/brokerchaos/libfaketime.so.1"


def _digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode() if isinstance(p, str) else p)
        h.update(b"\0")
    return h.hexdigest()[:16]


def _tree_digest(paths: Iterable[Path]) -> str:
    h = hashlib.sha256()
    for root in sorted(paths):
        files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
        for f in files:
            if "__pycache__" in f.parts or f.suffix == ".pyc":
                continue
            h.update(str(f.relative_to(root.parent)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def node_tooling(root: Path = REPO, modules: Iterable[str] = NODE_MODULES) -> dict[str, Path]:
    """The files of ``modules`` and of every module of theirs they import, transitively, with the
    packages that hold them (``__init__.py``; a package's ``__main__.py``), by path under ``root``.
    Read from the sources' import statements (nothing is imported), so a new import of a node
    module brings its file into the image by itself."""
    todo, seen = list(modules), set()
    packages = {m.split(".")[0] for m in todo}
    found: dict[str, Path] = {}
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for f in _module_files(root, name):
            if f.relative_to(root).as_posix() not in found:
                found[f.relative_to(root).as_posix()] = f
                todo += [m for m in _imports(f, root) if m.split(".")[0] in packages]
    return dict(sorted(found.items()))


def _module_files(root: Path, name: str) -> list[Path]:
    """A module's file, or a package's ``__init__.py`` and ``__main__.py``, and its packages' ``__init__.py``."""
    parts = name.split(".")
    files = [root.joinpath(*parts[:i], "__init__.py") for i in range(1, len(parts))]
    where = root.joinpath(*parts)
    if where.with_suffix(".py").is_file():
        files.append(where.with_suffix(".py"))
    elif where.is_dir():
        files += [where / "__init__.py", where / "__main__.py"]
    else:
        raise ImageError(f"node tooling: module {name} has no file under {root}")
    return [f for f in files if f.is_file()]


def _imports(f: Path, root: Path) -> list[str]:
    """The modules ``f`` imports (``from M import N`` also names ``M.N``, which may be a module)."""
    here = list(f.relative_to(root).with_suffix("").parts)
    out: list[str] = []
    for node in ast.walk(ast.parse(f.read_text(), str(f))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = here[: len(here) - node.level] if node.level else []  # a relative import's package
            module = ".".join([*base, *([node.module] if node.module else [])])
            out.append(module)
            out += [f"{module}.{a.name}" for a in node.names if _is_module(root, f"{module}.{a.name}")]
    return out


def _is_module(root: Path, name: str) -> bool:
    where = root.joinpath(*name.split("."))
    return where.with_suffix(".py").is_file() or where.is_dir()


def _pin_check(package: str, want: str) -> str:
    """A shell step that fails the layer unless ``package`` installed upstream version ``want``
    (or ``want``.something), naming what the suite served instead."""
    return (
        f" && v=$(dpkg-query -W -f='${{Version}}' {package}) && u=${{v#*:}}"
        f' && case "$u" in {want}|{want}[-.+~]*) ;; *) echo "{PIN_MISMATCH} {package} $v"; exit 3;; esac'
    )


class NotServed(ImageError):
    """The suite no longer serves a package, or serves another version of it than the recipe pins."""


def _check_served(line: str) -> None:
    """Raise ``NotServed`` for a build's output line that says a pinned package is not served."""
    if line.startswith(PIN_MISMATCH):
        raise NotServed(f"Debian serves {line.removeprefix(PIN_MISMATCH).strip()}")
    if line.startswith("E: Unable to locate package") or line.startswith("E: Package '"):
        raise NotServed(f"Debian's archive: {line.removeprefix('E: ')}")


def _exists(client, tag: str) -> bool:
    import docker.errors

    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


@dataclass(eq=False)
class ImageBuilder:
    """Builds the images a run needs; ``force`` rebuilds even when the hash matches.

    ``namespace`` replaces the ``brokerchaos`` of every repository name and ``cache`` the host's
    cache of packages and wheels: a benchmark builds everything from nothing that way, beside the
    images in use and without touching them. ``tags_only`` builds nothing and needs no Docker: each
    method answers the content tag it would build (what a plan keys its cells by).
    """

    client: Any
    _: KW_ONLY
    force: bool = False
    namespace: str = "brokerchaos"
    cache: Path = CACHE
    tags_only: bool = False
    _bases: dict[str, str] = field(default_factory=dict, init=False, repr=False)  # each suite's base tag

    # -- layer 1: root filesystems -------------------------------------------------------

    def rootfs(
        self, extra_packages: Iterable[str] = (), suite: str = SUITE, pins: Mapping[str, str] | None = None
    ) -> str:
        """A suite's base, or the base plus a layer of ``extra_packages`` installed on it.
        ``pins``: package -> the upstream version it must install (a prefix), checked in the layer."""
        base = self.base(suite)
        extras = tuple(sorted(set(extra_packages) - set(BASE_PACKAGES)))
        if not extras:
            return base
        checks = "".join(_pin_check(pkg, want) for pkg, want in sorted((pins or {}).items()))
        tag = (
            f"{self.namespace}/rootfs:{_digest(base, *extras, checks) if checks else _digest(base, *extras)}"
        )
        dockerfile = (
            f"FROM {base}\n"
            f"RUN apt-get{'' if suite == SUITE else UNEXPIRED} update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
            f"--no-install-recommends {' '.join(extras)} >/dev/null{checks} "
            "&& rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb\n"
        )

        def build() -> None:
            say("images", f"{', '.join(extras)}: a layer on the {suite} base {base}")
            # The host's network: the mirror is reached the way debootstrap reached it.
            self._build(tag, dockerfile, {}, network="host")

        self._once(tag, build)
        return tag

    def base(self, suite: str = SUITE) -> str:
        """A suite's base: one bootstrap of ``BASE_PACKAGES`` that every image of the suite starts from."""
        if suite in self._bases:
            return self._bases[suite]
        packages = tuple(sorted((*BASE_PACKAGES, *SUITE_PACKAGES.get(suite, ()))))
        tag = f"{self.namespace}/rootfs:{_digest(suite, *packages)}"
        self._once(
            tag,
            lambda: self._registry_base(tag, packages, suite) or self._bootstrap(tag, packages, suite),
        )
        self._bases[suite] = tag
        return tag

    def _bootstrap(self, tag: str, packages: tuple[str, ...], suite: str) -> bool:
        """``debootstrap`` on the host, the tree loaded with ``docker import`` as ``tag``."""
        if shutil.which("debootstrap") is None:
            raise ImageError(
                "debootstrap is not installed: run `apt-get install -y debootstrap` (scripts/install.sh does)"
            )
        say(
            "images",
            f"bootstrapping Debian {suite} with {len(packages)} packages -> {tag} (a minute or more)",
        )
        cache = self.cache / "debootstrap-debs"
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix="brokerchaos-rootfs-") as tmp:
            root = Path(tmp) / "root"
            cmd = [
                "debootstrap",
                "--variant=minbase",
                f"--cache-dir={cache}",
                f"--include={','.join(packages)}",
                suite,
                str(root),
                MIRROR,
            ]
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                tail = (proc.stdout + proc.stderr).strip().splitlines()[-3:]
                raise ImageError(f"debootstrap {suite} failed (exit {proc.returncode}): {' | '.join(tail)}")
            # Services must not start at build time; apt lists are not needed offline.
            (root / "usr/sbin/policy-rc.d").write_text("#!/bin/sh\nexit 101\n")
            (root / "usr/sbin/policy-rc.d").chmod(0o755)
            for d in ("var/lib/apt/lists", "var/cache/apt/archives"):
                shutil.rmtree(root / d, ignore_errors=True)
                (root / d).mkdir(parents=True, exist_ok=True)
            tar_path = Path(tmp) / "rootfs.tar"
            subprocess.run(["tar", "-C", str(root), "--numeric-owner", "-cf", str(tar_path), "."], check=True)
            say("images", f"docker import {tar_path.stat().st_size >> 20} MiB")
            repo, _, version = tag.partition(":")
            self.client.api.import_image_from_file(
                str(tar_path),
                repository=repo,
                tag=version,
                changes=[f"LABEL {LABEL}={version}", "ENV LANG=C.UTF-8", 'CMD ["/bin/bash"]'],
            )
        return True

    def _once(self, tag: str, build: Callable[[], object]) -> None:
        """``build()`` makes ``tag`` unless it exists. A file lock per tag makes commands that need
        the same missing image at once (parallel test workers, two runs) build it once: the others
        wait, then find it. With ``tags_only`` nothing is built: the tag is all the caller wants."""
        if self.tags_only:
            return
        if not self.force and _exists(self.client, tag):
            say("images", f"{tag} up to date")
            return
        locks = self.cache / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        with (locks / (tag.replace("/", "_").replace(":", "_") + ".lock")).open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not self.force and _exists(self.client, tag):
                say("images", f"{tag} up to date (built meanwhile by another command)")
                return
            build()

    def _registry_base(self, tag: str, packages: tuple[str, ...], suite: str) -> bool:
        """Where a registry serves debian:<suite>-slim, install the packages on top of it."""
        import docker.errors

        if os.environ.get("BROKERCHAOS_NO_REGISTRY") or not os.environ.get("BROKERCHAOS_TRY_REGISTRY"):
            return False
        try:
            self.client.images.pull("debian", tag=f"{suite}-slim")
        except docker.errors.DockerException:
            return False
        dockerfile = (
            f"FROM debian:{suite}-slim\n"
            f"RUN apt-get update && apt-get install -y --no-install-recommends {' '.join(packages)} "
            "&& rm -rf /var/lib/apt/lists/*\n"
        )
        self._build(tag, dockerfile, {})
        return True

    # -- layer 2: Python and files ------------------------------------------------------

    def wheels(self, packages: Iterable[str]) -> Path:
        packages = tuple(sorted(set(packages)))
        out = self.cache / "wheels" / _digest(*packages)
        if (out / ".complete").exists():
            return out
        out.mkdir(parents=True, exist_ok=True)
        say("images", f"fetching wheels on the host: {', '.join(packages)}")
        proc = subprocess.run(
            [
                "python3",
                "-m",
                "pip",
                "download",
                "--quiet",
                "--only-binary=:all:",
                "--python-version",
                "3.11",
                "--platform",
                "manylinux2014_x86_64",
                "--platform",
                "manylinux_2_17_x86_64",
                "--platform",
                "manylinux_2_28_x86_64",
                "-d",
                str(out),
                *packages,
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            tail = proc.stderr.strip().splitlines()[-1:] or ["(no output)"]
            raise ImageError(f"pip download {' '.join(packages)} failed: {tail[0]}")
        (out / ".complete").write_text("ok")
        return out

    def node_image(self, recipe: ImageRecipe) -> str:
        """A plugin's image: rootfs + wheels + node tooling + the plugin's files."""
        base = self.rootfs(recipe.debian_packages, recipe.suite, recipe.pins)
        wheel_dir = self.wheels(NODE_WHEELS + tuple(recipe.python_packages))
        # Every file goes in with one COPY (the context holds them at their container paths under
        # ``root/``) and every variable with one ENV: each instruction is a container committed.
        files: dict[str, Path] = {"tmp/wheels": wheel_dir}
        files |= {f"opt/brokerchaos/{rel}": f for rel, f in node_tooling(REPO).items()}
        for host, container in recipe.copy.items():
            files[container.lstrip("/")] = Path(host)
        env = {"PYTHONPATH": "/opt/brokerchaos", "PYTHONUNBUFFERED": "1", **recipe.env}
        lines = [
            f"FROM {base}",
            "COPY root/ /",
            "RUN python3 -m pip install --no-index --no-cache-dir --break-system-packages "
            "--find-links /tmp/wheels /tmp/wheels/*.whl && rm -rf /tmp/wheels",
            "ENV " + " ".join(f"{k}={json.dumps(str(v))}" for k, v in env.items()),
            *[f"RUN {cmd}" for cmd in recipe.run],
            'ENTRYPOINT ["/usr/bin/tini", "-g", "--", "python3", "-m", "faults.nodeinit"]',
        ]
        dockerfile = "\n".join(lines) + "\n"
        digest = _digest(dockerfile, *(f"{c}:{_tree_digest([h])}" for c, h in sorted(files.items())))
        repo = recipe.name
        if self.namespace != "brokerchaos" and repo.startswith("brokerchaos/"):
            repo = f"{self.namespace}/{repo.removeprefix('brokerchaos/')}"
        tag = f"{repo}:{digest}"
        self._once(tag, lambda: self._build(tag, dockerfile, {f"root/{c}": h for c, h in files.items()}))
        return self._latest(tag)

    def _latest(self, tag: str) -> str:
        """Also tag the image ``:latest`` (what docker-compose.yml names)."""
        if self.tags_only:
            return tag
        repo = tag.rsplit(":", 1)[0]
        self.client.images.get(tag).tag(repo, "latest")
        return tag

    def faketime_image(self, node_tag: str) -> str:
        """A node image plus libfaketime and its control file (offset +0), for clock faults.

        The library is preloaded into the broker's process only (``harness.cluster``), never
        into the container's other processes; the control file is world-readable so a broker
        running as its own user reads it.
        """
        wheel_dir = self.wheels((FAKETIME_WHEEL,))
        # The suite's python3 names the directory (3.11 in bookworm): a glob finds it.
        lib_dir = "/usr/local/lib/python3*/dist-packages/libfaketime/vendor/libfaketime/src"
        dockerfile = (
            f"FROM {node_tag}\nCOPY wheels /tmp/wheels\n"
            "RUN python3 -m pip install --no-index --no-cache-dir --no-deps --break-system-packages "
            "/tmp/wheels/*.whl && rm -rf /tmp/wheels"
            f" && mkdir -p {Path(FAKETIME_LIB).parent} {Path(FAKETIME_FILE).parent}"
            f" && ln -sf {lib_dir}/libfaketime.so.1 {FAKETIME_LIB} && test -f {FAKETIME_LIB}"
            f" && echo +0 > {FAKETIME_FILE} && chmod 0755 {Path(FAKETIME_FILE).parent} && chmod 0644 {FAKETIME_FILE}\n"
        )
        repo = node_tag.rsplit(":", 1)[0]
        tag = f"{repo}-faketime:{_digest(dockerfile, _tree_digest([wheel_dir]))}"
        self._once(tag, lambda: self._build(tag, dockerfile, {"wheels": wheel_dir}))
        return tag

    def toxiproxy_image(self) -> str:
        """The sidecar, tagged by the server's sources (not its binary, whose bytes depend on the
        build's paths): a checkout with the same sources reuses the image without running cargo."""
        base = self.base()
        dockerfile = (
            f"FROM {base}\nCOPY {TOXIPROXY_BIN} /usr/local/bin/{TOXIPROXY_BIN}\n"
            f'ENTRYPOINT ["/usr/local/bin/{TOXIPROXY_BIN}"]\nCMD ["--host", "0.0.0.0", "--port", "8474"]\n'
        )
        sources = [
            TOXIPROXY_CRATE / "src",
            TOXIPROXY_CRATE / "vendor",
            TOXIPROXY_CRATE / "Cargo.toml",
            TOXIPROXY_CRATE / "Cargo.lock",
        ]
        tag = f"{self.namespace}/toxiproxy:{_digest(dockerfile, _tree_digest(sources))}"
        self._once(tag, lambda: self._build(tag, dockerfile, {TOXIPROXY_BIN: self.toxiproxy_binary()}))
        return self._latest(tag)

    def toxiproxy_binary(self) -> Path:
        """Build the Toxiproxy-API server with cargo when its sources changed."""
        target = TOXIPROXY_CRATE / "target" / "release" / TOXIPROXY_BIN
        if not (TOXIPROXY_CRATE / "Cargo.toml").exists():
            raise ImageError(f"{TOXIPROXY_CRATE} is missing: brokerchaos must run from a source checkout")
        sources = [
            *(TOXIPROXY_CRATE / "src").rglob("*.rs"),
            *(TOXIPROXY_CRATE / "vendor").rglob("*"),  # the patched noxious
            TOXIPROXY_CRATE / "Cargo.toml",
            TOXIPROXY_CRATE / "Cargo.lock",
        ]
        if target.exists() and all(p.stat().st_mtime <= target.stat().st_mtime for p in sources):
            return target
        if shutil.which("cargo") is None:
            raise ImageError(
                "cargo is not installed: the Toxiproxy-API server is built with cargo (install Rust)"
            )
        say("images", "building the Toxiproxy-API server with cargo (a few minutes the first time)")
        proc = subprocess.run(
            [
                "cargo",
                "build",
                "--release",
                "--locked",
                "--manifest-path",
                str(TOXIPROXY_CRATE / "Cargo.toml"),
            ],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            tail = proc.stderr.strip().splitlines()[-3:]
            raise ImageError(f"cargo build of the Toxiproxy-API server failed: {' | '.join(tail)}")
        return target

    def _build(
        self, tag: str, dockerfile: str, files: Mapping[str, Path], *, network: str | None = None
    ) -> None:
        """``network``: the build's network mode (``host`` for a layer that fetches packages)."""
        import docker.errors

        say("images", f"building {tag}")
        context = io.BytesIO()
        with tarfile.open(fileobj=context, mode="w") as tar:
            data = dockerfile.encode()
            info = tarfile.TarInfo("Dockerfile")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
            for arcname, path in files.items():
                tar.add(
                    str(path),
                    arcname=arcname,
                    filter=lambda ti: None if "__pycache__" in ti.name or ti.name.endswith(".pyc") else ti,
                )
        context.seek(0)
        repo, _, version = tag.partition(":")
        try:
            for chunk in self.client.api.build(
                fileobj=context,
                custom_context=True,
                tag=tag,
                rm=True,
                forcerm=True,
                decode=True,
                labels={LABEL: version},
                network_mode=network,
                buildargs={k: os.environ[k] for k in PROXY_VARS if k in os.environ} if network else None,
            ):
                if "error" in chunk:
                    raise ImageError(f"building {tag}: {chunk['error'].strip()}")
                line = chunk.get("stream", "").strip()
                _check_served(line)
                if line.startswith("Step "):
                    say("images", f"  {line}")
        except docker.errors.APIError as exc:
            raise ImageError(f"building {tag}: {exc.explanation or exc}") from exc


def broker_image(builder: ImageBuilder, plugin: BrokerPlugin) -> str:
    """``plugin``'s node image at its bound version. A version Debian no longer serves (the package
    is gone from its suite, or the suite moved on to another upstream version) is a
    ``ScenarioError`` naming the plugin's other versions."""
    try:
        return builder.node_image(plugin.image())
    except NotServed as exc:
        rel = plugin.release
        if rel is None:
            raise
        others = ", ".join(v.name for v in plugin.versions if v != rel) or "(none)"
        raise ScenarioError(
            f"broker.version: Debian {rel.suite} no longer serves {plugin.name} {rel.name} ({exc}); "
            f"{plugin.name}'s other versions: {others}"
        ) from None
