"""The wheels that travel to the GPU machine (it has no network), in the ignored folder benchmarks/.wheels.

    python benchmarks/device_wheels.py prepare   # here: download what the device lacks, print what will travel
    python benchmarks/device_wheels.py select    # there: print the carried wheels this Python needs

`prepare` downloads, for each library of requirements.txt with a floor, the version constraints.txt pins
(the tested one) when the device lacks the library, has it below the floor, or has a version nobody has read
(DEVICE below: what that machine was seen to hold); it checks each wheel's own requirements against the
device's versions, prints the total size of what will travel (the wheels and the working tree) and refuses
(exit 1) when that is over LIMIT_MIB (63): the device tool takes 64 MiB in all. `select` prints the wheels whose
library is missing from this Python or below its floor, for `pip install --no-index --no-deps --target`.
"""

from __future__ import annotations

import re
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WHEELS = REPO / "benchmarks" / ".wheels"
LIMIT_MIB = 63  # the device tool takes 64 MiB; 1 MiB left for what changes between prepare and the call
# The GPU machine as seen (docs: DESIGN.md section 11, the device tool's KINDS.md): Python 3.12, manylinux
# x86_64. None: installed, version not read (carried, and installed there only if below the floor).
DEVICE = {"torch": "2.11.0", "transformers": "5.17.0", "safetensors": "0.8.0", "tokenizers": "0.23.2",
          "huggingface_hub": "1.33.0", "numpy": "2.5.2", "pillow": None, "tqdm": None, "peft": None,
          "accelerate": "1.15.0", "filelock": None, "regex": None, "requests": None, "httpx": None,
          "packaging": None, "pyyaml": None, "psutil": None, "typing_extensions": None, "typer": None}
PLATFORM_ARGS = ["--only-binary=:all:", "--no-deps", "--python-version", "3.12", "--implementation", "cp",
                 "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_27_x86_64",
                 "--platform", "manylinux_2_24_x86_64", "--platform", "manylinux_2_17_x86_64",
                 "--platform", "manylinux2014_x86_64", "--platform", "manylinux1_x86_64"]


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def version_tuple(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", text.split("+")[0])[:3])


def read_specs(path: Path, op: str) -> dict[str, str]:
    found = {}
    for line in path.read_text().splitlines():
        m = re.match(rf"^([A-Za-z0-9_.-]+)\s*{re.escape(op)}\s*([0-9][0-9A-Za-z.]*)", line.strip())
        if m:
            found[norm(m.group(1))] = m.group(2)
    return found


def floors() -> dict[str, str]:
    return read_specs(REPO / "requirements.txt", ">=")


def wheel_library(path: Path) -> tuple[str, str]:
    name, version = path.name.split("-")[:2]
    return norm(name), version


def needed_on_device() -> list[tuple[str, str]]:
    pins = read_specs(REPO / "constraints.txt", "==")
    needed = []
    for name, floor in floors().items():
        have = DEVICE.get(name, "missing")
        if have is None or have == "missing" or version_tuple(have) < version_tuple(floor):
            if name not in pins:
                raise SystemExit(f"{name}: the device needs it (has {have}, floor {floor}) but constraints.txt pins no "
                                 "version of it; add one there.")
            needed.append((name, pins[name]))
    return needed


def check_wheel_requirements(wheels: list[Path]) -> list[str]:
    """Each carried wheel's own requirements that the device (with the other carried wheels) does not meet."""
    from packaging.requirements import Requirement

    have = {n: v for n, v in DEVICE.items()}
    have.update(dict(wheel_library(w) for w in wheels))
    problems = []
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as z:
            meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
            lines = z.read(meta).decode().splitlines()
        for line in lines:
            if not line.startswith("Requires-Dist:"):
                continue
            req = Requirement(line.split(":", 1)[1].strip())
            if req.marker is not None and not req.marker.evaluate({"extra": "", "python_version": "3.12",
                                                                 "sys_platform": "linux", "platform_machine": "x86_64"}):
                continue
            name = norm(req.name)
            if name == "importlib_metadata":  # diffusers falls back to the standard library's on Python >= 3.8
                continue
            version = have.get(name, "missing")
            if version == "missing":
                problems.append(f"{wheel.name} needs {req}: not on the device")
            elif version is not None and req.specifier and not req.specifier.contains(version, prereleases=True):
                problems.append(f"{wheel.name} needs {req}: the device has {version}")
    return problems


def tree_bytes() -> int:
    """The working tree that travels: tracked files and untracked ones git does not ignore."""
    names = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z", "-c", "-o", "--exclude-standard"],
                           capture_output=True, check=True).stdout.split(b"\0")
    return sum((REPO / n.decode()).stat().st_size for n in names if n and (REPO / n.decode()).is_file())


def prepare() -> int:
    WHEELS.mkdir(parents=True, exist_ok=True)
    needed = needed_on_device()
    keep = set()
    for name, version in needed:
        existing = [w for w in WHEELS.glob("*.whl") if wheel_library(w) == (name, version)]
        if not existing:
            subprocess.run([sys.executable, "-m", "pip", "download", "-q", *PLATFORM_ARGS, "-d", str(WHEELS),
                            f"{name}=={version}"], check=True)
            existing = [w for w in WHEELS.glob("*.whl") if wheel_library(w) == (name, version)]
        keep.update(existing)
    for stale in set(WHEELS.glob("*.whl")) - keep:  # one version of each library: two would stop the install
        stale.unlink()
    wheels = sorted(keep)
    for w in wheels:
        print(f"  {w.name}: {w.stat().st_size / 2**20:.1f} MiB")
    problems = check_wheel_requirements(wheels)
    for p in problems:
        print(f"  PROBLEM: {p}")
    wheel_total, tree = sum(w.stat().st_size for w in wheels), tree_bytes()
    total = wheel_total + tree
    print(f"will travel: {total / 2**20:.1f} MiB (wheels {wheel_total / 2**20:.1f} MiB + working tree "
          f"{tree / 2**20:.1f} MiB; limit {LIMIT_MIB} MiB)")
    if total > LIMIT_MIB * 2**20:
        print(f"REFUSED: over {LIMIT_MIB} MiB. Lower what the device needs (a floor at or below its version) or "
              "remove untracked files from the working tree.")
        return 1
    return 1 if problems else 0


def select() -> int:
    need = floors()
    for wheel in sorted(WHEELS.glob("*.whl")):
        name, _ = wheel_library(wheel)
        try:
            have = metadata.version(name)
        except metadata.PackageNotFoundError:
            have = None
        if have is None or (name in need and version_tuple(have) < version_tuple(need[name])):
            print(f"carried {wheel.name}: this Python has {have or 'none'}", file=sys.stderr)
            print(wheel)
    return 0


if __name__ == "__main__":
    commands = {"prepare": prepare, "select": select}
    if len(sys.argv) != 2 or sys.argv[1] not in commands:
        raise SystemExit(f"usage: {sys.argv[0]} prepare|select")
    raise SystemExit(commands[sys.argv[1]]())
