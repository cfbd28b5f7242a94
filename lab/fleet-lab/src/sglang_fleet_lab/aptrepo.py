"""A signed apt repository with the layout of NVIDIA's CUDA repository
(``<base>/debian12/x86_64/``, ``cuda-keyring_1.1-1_all.deb``, ``Packages``, signed ``Release``),
holding stub packages named and versioned like NVIDIA's."""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from sglang_fleet_lab.state import STATE_DIR

STUBS = Path(__file__).resolve().parents[4] / "lab" / "nvidia"  # beside this package
BRANCH = "580"
DRIVERS = ("580.95.05", "580.105.08")  # two releases of the branch, oldest first
DISTRO, ARCH = "debian12", "x86_64"
GNUPG = STATE_DIR / "gnupg"
RELOAD = "systemctl daemon-reload >/dev/null 2>&1 || true\n"  # as deb-systemd-helper does


def disable(unit: str) -> str:
    """A prerm that stops and disables the package's unit on removal, as dh_installsystemd's
    generated scripts do (no enable links left dangling)."""
    return (f'if [ "$1" = remove ]; then systemctl disable --now {unit} >/dev/null 2>&1 '
            "|| true; fi\n")


@dataclass
class Deb:
    name: str
    version: str
    arch: str = "amd64"
    depends: str = ""
    conflicts: str = ""
    provides: str = ""
    files: dict[str, str | Path] = field(default_factory=dict)  # path in package → text or file
    postinst: str = ""
    prerm: str = ""
    description: str = "lab stand-in"


# The exporter's package as NVIDIA builds it (NVIDIA/dcgm-exporter packaging/): its unit runs
# /usr/bin/dcgm-exporter with the default counters file; these are a few of its fields.
DCGM_EXPORTER_UNIT = ("[Unit]\nDescription=NVIDIA DCGM-exporter service\n"
                      "Wants=nvidia-dcgm.service\nAfter=nvidia-dcgm.service\n\n[Service]\nUser=root\n"
                      "ExecStart=/usr/bin/dcgm-exporter -f "
                      "/etc/dcgm-exporter/default-counters.csv\nRestart=on-abort\n\n"
                      "[Install]\nWantedBy=multi-user.target\n")
# DCGM's own unit as its package installs it (NVIDIA/DCGM config-files/systemd/
# nvidia-dcgm.service.in): nv-hostengine in the foreground (the lab's says where it would listen).
DCGM_UNIT = ("[Unit]\nDescription=NVIDIA DCGM service\nConflicts=dcgm.service\n"
             "After=nvidia-gpu-reset.target\nWants=nvidia-gpu-reset.target\n\n[Service]\n"
             "User=root\nPrivateTmp=false\n\n"
             "Environment=\"DCGM_HOME_DIR=/var/log/nvidia-dcgm\"\n\n"
             "ExecStart=/usr/bin/nv-hostengine -n --service-account nvidia-dcgm\n\n"
             "Restart=on-abort\n\n[Install]\nWantedBy=multi-user.target\n")
DCGM_COUNTERS = ("# DCGM FIELD, Prometheus metric type, help message\n"
                 "DCGM_FI_DEV_GPU_TEMP, gauge, GPU temperature (in C).\n"
                 "DCGM_FI_DEV_POWER_USAGE, gauge, Power draw (in W).\n"
                 "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\n"
                 "DCGM_FI_DEV_XID_ERRORS, gauge, Value of the last XID error encountered.\n"
                 "DCGM_FI_DEV_FB_FREE, gauge, Framebuffer memory free (in MiB).\n"
                 "DCGM_FI_DEV_FB_USED, gauge, Framebuffer memory used (in MiB).\n")


def _daemon_unit(description: str, name: str, version: str) -> str:
    return (f"[Unit]\nDescription={description}\nAfter=lab-nvidia-module.service\n\n"
            f"[Service]\nType=forking\nPIDFile=/run/lab-nvidia/{name}.pid\n"
            f"ExecStart=/usr/lib/lab-nvidia/lab-daemon {name} {version}\n"
            "Restart=no\n\n[Install]\nWantedBy=multi-user.target\n")


def _driver(version: str, flavour: str) -> Deb:
    name = f"nvidia-driver-{BRANCH}-open" if flavour == "open" else f"nvidia-driver-{BRANCH}"
    other = f"nvidia-driver-{BRANCH}" if flavour == "open" else f"nvidia-driver-{BRANCH}-open"
    return Deb(
        name=name, version=f"{version}-1", conflicts=other,
        description=f"NVIDIA driver metapackage ({flavour} kernel modules)",
        files={"usr/bin/nvidia-smi": STUBS / "nvidia-smi",
               "usr/lib/lab-nvidia/driver": f"{version} {flavour}\n",
               "usr/lib/lab-nvidia/lab-nvidia-load": STUBS / "lab-nvidia-load",
               "usr/lib/lab-nvidia/lab-daemon": STUBS / "lab-daemon",
               # the lab's kernel log (a guest cannot read the machine's): NVRM lines
               "usr/local/bin/dmesg": STUBS / "dmesg",
               "lib/systemd/system/lab-nvidia-module.service":
                   STUBS / "lab-nvidia-module.service"},
        postinst="systemctl enable lab-nvidia-module.service >/dev/null 2>&1 || true\n",
        prerm='if [ "$1" = remove ]; then systemctl disable lab-nvidia-module.service '
              '>/dev/null 2>&1 || true; fi\n')


def packages(kernel: str) -> list[Deb]:
    debs: list[Deb] = []
    for version in DRIVERS:
        debs += [
            _driver(version, "open"),
            Deb(f"nvidia-open-{BRANCH}", f"{version}-1",
                depends=f"nvidia-driver-{BRANCH}-open (= {version}-1)",
                description="NVIDIA open kernel modules driver"),
            _driver(version, "proprietary"),
            Deb(f"cuda-drivers-{BRANCH}", f"{version}-1",
                depends=f"nvidia-driver-{BRANCH} (= {version}-1)",
                description="CUDA driver metapackage (proprietary kernel modules)"),
            Deb("nvidia-fabricmanager", f"{version}-1",
                description="NVIDIA Fabric Manager", postinst=RELOAD,
                prerm=disable("nvidia-fabricmanager.service"),
                files={"lib/systemd/system/nvidia-fabricmanager.service":
                       _daemon_unit("NVIDIA fabric manager service", "fabricmanager", version)}),
        ]
    pin = (f"Package: *nvidia* libnvidia* cuda-drivers*\nPin: version {BRANCH}.*\n"
           "Pin-Priority: 1000\n")
    debs += [
        Deb(f"nvidia-driver-pinning-{BRANCH}", f"{BRANCH}-1", arch="all",
            files={f"etc/apt/preferences.d/nvidia-driver-pinning-{BRANCH}": pin},
            description="Pin the NVIDIA driver stack to one branch"),
        Deb("nvlsm", "2025.06.4-1", description="NVLink subnet manager", postinst=RELOAD,
            prerm=disable("nvlsm.service"),
            files={"lib/systemd/system/nvlsm.service":
                   _daemon_unit("NVLink Subnet Manager", "nvlsm", "2025.06.4")}),
        Deb("datacenter-gpu-manager-4-cuda13", "1:4.4.1-1", description="NVIDIA DCGM",
            postinst=RELOAD, prerm=disable("nvidia-dcgm.service"),
            files={"lib/systemd/system/nvidia-dcgm.service": DCGM_UNIT,
                   "usr/bin/nv-hostengine": STUBS / "nv-hostengine",
                   "usr/bin/dcgmi": "#!/bin/sh\necho 'Successfully ran diagnostic.'\n"}),
        Deb("datacenter-gpu-manager-exporter", "4.5.2-4.8.1-1",
            description="NVIDIA DCGM Exporter", postinst=RELOAD,
            prerm=disable("nvidia-dcgm-exporter.service"),
            files={"usr/bin/dcgm-exporter": STUBS / "dcgm-exporter",
                   "etc/dcgm-exporter/default-counters.csv": DCGM_COUNTERS,
                   "lib/systemd/system/nvidia-dcgm-exporter.service": DCGM_EXPORTER_UNIT}),
        Deb("cuda-toolkit-12-9", "12.9.1-1", description="CUDA Toolkit 12.9",
            files={"usr/local/cuda-12.9/bin/nvcc":
                   "#!/bin/sh\necho 'Cuda compilation tools, release 12.9, V12.9.86'\n"}),
        Deb(f"linux-headers-{kernel}", "1", description="Kernel headers for the running kernel",
            files={f"usr/src/linux-headers-{kernel}/Makefile": "# lab stand-in\n"}),
    ]
    return debs


def build_deb(deb: Deb, out: Path) -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, content in deb.files.items():
            target = root / name
            target.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(content, Path):
                shutil.copy(content, target)
            else:
                target.write_text(content)
            program = name.startswith(("usr/bin", "usr/local")) or "/lab-" in name
            target.chmod(0o755 if program and not name.endswith(".service") else 0o644)
        control = root / "DEBIAN"
        control.mkdir()
        fields = {"Package": deb.name, "Version": deb.version, "Architecture": deb.arch,
                  "Maintainer": "sglang-fleet lab <lab@localhost>", "Depends": deb.depends,
                  "Conflicts": deb.conflicts, "Provides": deb.provides,
                  "Description": deb.description}
        (control / "control").write_text(
            "".join(f"{k}: {v}\n" for k, v in fields.items() if v))
        if deb.postinst:
            (control / "postinst").write_text("#!/bin/sh\nset -e\n" + deb.postinst)
            (control / "postinst").chmod(0o755)
        if deb.prerm:
            (control / "prerm").write_text("#!/bin/sh\nset -e\n" + deb.prerm)
            (control / "prerm").chmod(0o755)
        path = out / f"{deb.name}_{deb.version.split(':')[-1]}_{deb.arch}.deb"
        subprocess.run(["dpkg-deb", "--root-owner-group", "-Zxz", "--build", str(root),
                        str(path)], check=True, stdout=subprocess.DEVNULL)
    return path


def _gpg(*args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "GNUPGHOME": str(GNUPG)}
    return subprocess.run(["gpg", "--batch", "--yes", *args], check=True, env=env,
                          capture_output=True)


def stop_agent() -> None:
    """Stop the gpg-agent that signing started (it outlives ``gpg`` and would outlive the lab)."""
    if GNUPG.exists():
        subprocess.run(["gpgconf", "--homedir", str(GNUPG), "--kill", "gpg-agent"],
                       check=False, capture_output=True)


def signing_key() -> bytes:
    """The lab's archive key (created once), exported for the keyring package."""
    if not (GNUPG / "pubring.kbx").exists():
        GNUPG.mkdir(parents=True, mode=0o700, exist_ok=True)
        _gpg("--passphrase", "", "--quick-gen-key", "sglang-fleet lab archive <lab@localhost>",
             "rsa3072", "sign", "never")
    export: bytes = _gpg("--export").stdout
    return export


def build(www: Path, base_url: str, kernel: str) -> Path:
    """Write the repository under ``www``; return its directory."""
    repo = www / "compute" / "cuda" / "repos" / DISTRO / ARCH
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir(parents=True)
    key = signing_key()
    keyring = Deb("cuda-keyring", "1.1-1", arch="all",
                  description="GPG keyring for the CUDA repository",
                  files={"usr/share/keyrings/cuda-archive-keyring.gpg": "",
                         f"etc/apt/sources.list.d/cuda-{DISTRO}-{ARCH}.list":
                         "deb [signed-by=/usr/share/keyrings/cuda-archive-keyring.gpg] "
                         f"{base_url}/{DISTRO}/{ARCH}/ /\n"})
    for deb in packages(kernel):
        build_deb(deb, repo)
    with tempfile.TemporaryDirectory() as tmp:
        keyfile = Path(tmp) / "cuda-archive-keyring.gpg"
        keyfile.write_bytes(key)
        keyring.files["usr/share/keyrings/cuda-archive-keyring.gpg"] = keyfile
        build_deb(keyring, repo)
    listing = subprocess.run(["apt-ftparchive", "packages", "."], cwd=repo, check=True,
                             capture_output=True).stdout
    (repo / "Packages").write_bytes(listing)
    (repo / "Packages.gz").write_bytes(gzip.compress(listing, mtime=0))
    release = subprocess.run(
        ["apt-ftparchive", "-o", "APT::FTPArchive::Release::Origin=NVIDIA",
         "-o", "APT::FTPArchive::Release::Label=NVIDIA CUDA", "release", "."],
        cwd=repo, check=True, capture_output=True).stdout
    (repo / "Release").write_bytes(release)
    _gpg("--clearsign", "-o", str(repo / "InRelease"), str(repo / "Release"))
    _gpg("-abs", "-o", str(repo / "Release.gpg"), str(repo / "Release"))
    return repo
