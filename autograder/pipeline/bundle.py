"""``make student-bundle``: what students get, and nothing else.

The bundle holds the released notebooks and the public part of the ``autograder``
package (the visible checks and the machinery they use). The hidden checks, the mistake
catalogue (near-solutions) and the instructor pipeline stay out.
"""

from __future__ import annotations

import zipfile
from pathlib import Path

from .course import ROOT

#: Parts of the package that never leave the instructor's machine.
PRIVATE = ("hidden", "pipeline", "__main__.py")
TOP = "attention-course"


def bundle_files(root: Path = ROOT) -> dict[str, Path]:
    """Archive name -> file on disk, for every file of the bundle."""
    files = {f"{TOP}/{p.name}": p for p in sorted((root / "notebooks").glob("*.ipynb"))}
    package = root / "autograder"
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        if relative.parts[0] in PRIVATE:
            continue
        # Beside the notebooks, so `import autograder` works from the notebooks' folder.
        files[f"{TOP}/autograder/{relative.as_posix()}"] = path
    files[f"{TOP}/requirements.txt"] = root / "build" / "requirements.txt"
    return files


def requirements(root: Path = ROOT) -> str:
    """The pinned packages a student needs (read from pyproject.toml)."""
    import tomllib

    deps = tomllib.loads((root / "pyproject.toml").read_text())["project"]["dependencies"]
    keep = ("torch", "numpy", "matplotlib", "jupyterlab")
    return "".join(f"{d}\n" for d in deps if d.split("==")[0] in keep)


def write_bundle(output: str | Path, root: Path = ROOT) -> Path:
    """Write the bundle zip to ``output`` and return its path."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    (root / "build").mkdir(exist_ok=True)
    (root / "build" / "requirements.txt").write_text(requirements(root))
    with zipfile.ZipFile(output, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, path in bundle_files(root).items():
            archive.write(path, name)
    return output
