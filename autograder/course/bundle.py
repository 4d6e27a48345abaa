"""``make student-bundle``: what students get, and nothing else, set up by one command.

The bundle holds the released notebooks and the public part of the ``autograder`` package
(the visible checks and the machinery they use). The hidden checks, the mistake catalogue
(near-solutions) and the instructor pipeline stay out. Beside them:

- ``README.md``: what the course is, and how to set up, open, check, validate and submit;
- the notebooks, each with a set-up cell and, where the course publishes them, an Open-in-Colab
  line at its top (:mod:`autograder.course.notebook_setup`), so that one opened alone finds the checks;
- ``requirements.txt``: PyTorch, NumPy and Matplotlib in the ranges the student's side runs with
  (:mod:`autograder.course.student_versions`), JupyterLab and nbgrader (Validate) pinned as the grader's;
- ``course.py``: ``python course.py`` makes ``.venv`` and installs the requirements on its first
  run (``--cpu``: PyTorch's CPU build on Linux), then opens JupyterLab on the notebooks, with
  ``jupyter/`` as its configuration folder; ``--python`` uses another environment, and says what
  it lacks or has outside the ranges;
- ``jupyter/``: JupyterLab without nbgrader's instructor tools (Formgrader, Create Assignment,
  Course List, disabled both in the page and on the server), with long lines wrapped in the
  Validate dialog;
- ``nbgrader_config.py``: the course id, an exchange folder made when missing, and the
  validator settings of the instructor's course (whole messages, no TCP warning).
"""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import nbformat

from .. import INSTRUCTOR_ONLY
from .notebook_setup import StudentBundle, notebook_link, with_setup
from .repository import ROOT, assignments
from .repository import pins as course_pins
from .settings import course_config
from .student_versions import PACKAGES, requirement

TOP = "attention-course"
#: The instructor's tools a student uses too, pinned as the grader's: JupyterLab, and nbgrader for Validate.
TOOLS = ("jupyterlab", "nbgrader")
#: What each way of installing downloads (measured from PyPI's and the local indexes' file sizes: docs/students.md).
DOWNLOADS = {"linux_pypi": "3.1 GB", "linux_cpu": "0.3 GB", "mac_windows": "0.3 GB", "tools": "0.12 GB"}
#: nbgrader's JupyterLab plugins and server extensions that are for instructors only.
INSTRUCTOR_PLUGINS = ("@jupyter/nbgrader:formgrader", "@jupyter/nbgrader:create-assignment",
                      "@jupyter/nbgrader:course-list")
INSTRUCTOR_SERVER_EXTENSIONS = ("nbgrader.server_extensions.formgrader", "nbgrader.server_extensions.course_list")

#: Lines of nbgrader's Validate dialog wrap instead of running off the right edge.
CUSTOM_CSS = """/* The attention course: a check's message is one long line; wrap it. */
.validation-failed pre, .validation-passed pre, .validation-changed pre, .validation-type-changed pre,
.jp-Dialog-body .jp-RenderedText pre {
  white-space: pre-wrap;
  overflow-wrap: anywhere;
}
.jp-Dialog-content { max-width: min(90vw, 1100px); }
"""

STUDENT_CONFIG = '''"""nbgrader's configuration for students of the attention course (Validate, the Assignment List)."""

import os
from pathlib import Path

c = get_config()  # noqa: F821 - provided by nbgrader when it loads this file

HERE = Path(__file__).resolve().parent

c.CourseDirectory.course_id = "attention"
# Where `nbgrader fetch_assignment` / `submit` exchange files when your instructor uses an
# nbgrader exchange on a shared machine: set NBGRADER_EXCHANGE to the folder they give you.
c.Exchange.root = os.environ.get("NBGRADER_EXCHANGE", str(HERE / "exchange"))
try:
    Path(c.Exchange.root).mkdir(parents=True, exist_ok=True)
except OSError:
    pass

# As in the instructor's course: the same time limit per cell, every message shown whole,
# and no warning about unencrypted TCP on every run.
c.Execute.timeout = {timeout}
c.Validator.width = {width}
c.KernelManager.transport_encryption = "auto"
'''

README = """# Attention, from soft lookup to FlashAttention

An autograded course in Jupyter notebooks: each one asks a question, builds the intuition,
derives the maths, has you implement the idea in PyTorch, and checks your work against
PyTorch's own implementation. When a check fails it says what is wrong and, when your answer
matches a known mistake (no scaling, softmax over the wrong axis, ...), it names the mistake
and the section that explains it.

Notebooks: {notebooks}.

The notebooks run with Python 3.11 to 3.14 and {ranges}: the PyTorch you already have will
do if it is in that range. The first cell of each notebook makes the checks (the `autograder`
folder) importable where the notebook was opened alone; beside this folder it does nothing.

## Where to work

**On Colab.** Open the notebook in Colab ({colab}), run its first cell: it finds the checks
(upload `attention-course.zip` to Colab's Files pane first{fetched}). Colab's own PyTorch is used:
nothing to install. Colab forgets its files when the session ends: *File > Download > .ipynb*
to keep and submit your work.

**On Kaggle.** *File > Import notebook* (the `.ipynb`), and add `attention-course.zip` as a
dataset (*Add Input > Upload*): Kaggle unzips it under `/kaggle/input/`, where the first cell
finds the checks. Kaggle's own PyTorch is used. *File > Download notebook* to submit.

**On a JupyterHub or in your own Jupyter** with PyTorch: unzip this folder there and open the
notebooks from it. `python course.py --python "$(which python)" setup` says whether that
environment is in the ranges above. Validate needs nbgrader (`pip install {nbgrader}`);
without it, *Kernel > Restart Kernel and Run All Cells* runs the same checks.

**On your laptop** (Python 3.11 to 3.14, `python3 --version`; Linux, macOS or Windows), in this folder:

```bash
python3 course.py
```

The first run makes a virtual environment in `.venv/` and installs `requirements.txt` into it
(PyTorch, JupyterLab, nbgrader: a few minutes); every run then opens JupyterLab on this folder in
your browser. What it downloads: on Linux about {linux_pypi}, because PyPI's PyTorch for Linux
is the CUDA build with its NVIDIA libraries; `python3 course.py --cpu` installs PyTorch's CPU
build instead ({cpu_index}), about {linux_cpu} in all, which is what you want without an NVIDIA
GPU. On macOS and Windows, PyPI's PyTorch is the CPU build: about {mac_windows}.
On Windows, type `py course.py` (or `py -3.13 course.py` to choose the version).
Already have an environment (conda, say)? `python course.py --python "$(which python)"` uses it
instead, and says what it lacks or has outside the ranges.

## Work through a notebook

1. **Open** `01_soft_lookup.ipynb` in JupyterLab and read from the top, running each cell
   with Shift+Enter.
2. **Fill in** each exercise cell: replace `raise NotImplementedError()` with your code. Keep
   the function's name and signature.
3. **Check**: the cell under each exercise calls `check_<exercise>(...)`. It prints
   `... passes the visible checks.` or a red `CheckFailed` message that says what went wrong.
   The cell marked "Hidden tests run here when your notebook is graded" is empty for you:
   more tests run there at grading time.
   *Run > Run All Cells* stops at the first exercise you have not written yet: that is expected.
4. **Validate** before you submit: press **Validate** in the notebook's toolbar. It restarts
   the notebook in a fresh kernel, runs every cell, and lists every test cell that fails, with
   its whole message. From a terminal: `python3 course.py validate 01_soft_lookup.ipynb`.
   (*Kernel > Restart Kernel and Run All Cells* runs everything too, but stops at the first error.)
5. **Submit** the `.ipynb` file as your instructor asks (upload it to your learning platform,
   or *Nbgrader > Assignment List* when your instructor uses an nbgrader exchange). Do not
   rename it and do not edit the test cells: they are replaced by the originals at grading
   time, and tampering is detected. Your work is graded with PyTorch {torch}, whatever yours.

## What is in this folder

- `NN_name.ipynb`: the notebooks.
- `autograder/`: the visible checks your test cells call (the hidden ones stay with your instructor).
- `course.py`, `requirements.txt`: setting up and opening the course.
- `jupyter/`: JupyterLab's settings for this course (it leaves out the instructor's tools).
- `nbgrader_config.py`: settings of Validate and of the Assignment List.
"""

COURSE_SCRIPT = r'''#!/usr/bin/env python3
"""Set up and open the attention course.

    python3 course.py                     # first run: make .venv and install requirements.txt; then open JupyterLab
    python3 course.py --cpu               # the same, with PyTorch's CPU build on Linux (about 0.2 GB, not 3 GB)
    python3 course.py --cpu --cpu-index URL  # PyTorch's CPU wheels from another index (a mirror, a folder)
    python3 course.py validate NB.ipynb   # what the Validate button does, in a terminal
    python3 course.py --python PATH ...   # use an environment you already have instead of .venv
"""

# No `from __future__` and no syntax newer than Python 3.6 above the version check: an older Python
# must get to the one line that says what to install, not to a SyntaxError.
import sys

OLDEST, NEWEST = (3, 11), (3, 14)
if sys.version_info < OLDEST:
    sys.exit("This course needs Python 3.11 to 3.14; this is Python %s. Install one from python.org "
             "(or your package manager), then run it: python3.13 course.py" % sys.version.split()[0])

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
VENV = HERE / ".venv"
#: PyTorch's own index of CPU-only wheels (PyPI's Linux wheel is the CUDA build, with its NVIDIA libraries).
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
#: What nbgrader validate prints when a notebook would lose points (it exits 0 either way).
NOT_VALID = ("VALIDATION FAILED ON", "THE CONTENTS OF", "THE TYPES OF")


def validate(python, notebooks):
    """nbgrader validate, then its words; the exit status 1 when a notebook would lose points (a script or a
    shell can tell, as from any command), 0 when every one passes."""
    done = subprocess.run([python, "-m", "nbgrader", "validate", *notebooks], cwd=HERE, env=environment(),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    print(done.stdout, end="")
    return done.returncode or int(any(words in done.stdout for words in NOT_VALID))


#: What `lab` and `validate` need beyond the notebooks' own packages.
TOOLS = {"lab": "jupyterlab", "validate": "nbgrader"}


def venv_python() -> Path:
    return VENV / ("Scripts/python.exe" if os.name == "nt" else "bin/python")


def requirements() -> dict[str, str]:
    """package -> its versions in requirements.txt (">=2.5,<2.16", "==0.9.6")."""
    found = {}
    for line in (HERE / "requirements.txt").read_text().splitlines():
        match = re.match(r"\s*([A-Za-z0-9_.-]+)\s*([<>=!~].*)?$", line.split("#")[0])
        if match:
            found[match.group(1).lower()] = (match.group(2) or "").replace(" ", "")
    return found


def numbers(version: str) -> tuple:
    return tuple(int(n) for n in re.match(r"\d+(?:\.\d+)*", version).group().split("."))


def satisfies(version: str, spec: str) -> bool:
    """Whether ``version`` is inside ``spec`` (">=2.5,<2.16"); the release's numbers only, as pip compares them."""
    have = numbers(version)
    for clause in filter(None, spec.split(",")):
        op, wanted = re.match(r"(==|>=|<=|<|>)(.+)", clause).groups()
        want = numbers(wanted)
        size = max(len(have), len(want))
        a, b = have + (0,) * (size - len(have)), want + (0,) * (size - len(want))
        if not {"==": a == b, ">=": a >= b, "<=": a <= b, "<": a < b, ">": a > b}[op]:
            return False
    return True


def versions(python: str, packages) -> dict:
    """package -> its version in the environment of ``python`` (None: not installed)."""
    probe = ("import json, sys; from importlib.metadata import version, PackageNotFoundError\n"
             "def v(n):\n    try: return version(n)\n    except PackageNotFoundError: return None\n"
             "print(json.dumps({n: v(n) for n in sys.argv[1:]}))")
    done = subprocess.run([python, "-c", probe, *packages], check=True, capture_output=True, text=True)
    return json.loads(done.stdout)


def outside_ranges(python: str) -> list:
    """The notebooks' packages (those of requirements.txt with a range) that ``python`` lacks or has outside it."""
    ranges = {name: spec for name, spec in requirements().items() if not spec.startswith("==")}
    found = versions(python, ranges)
    return [f"{name} {found[name] or 'missing'} (the course runs with {name}{spec})"
            for name, spec in ranges.items() if not found[name] or not satisfies(found[name], spec)]


def pip(python: Path, *args: str) -> None:
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *args], check=True)


def setup(cpu: bool = False, index: str = CPU_INDEX) -> Path:
    """Make .venv and install requirements.txt into it (with ``cpu``, PyTorch from ``index`` first), unless that
    was done for these requirements."""
    python = venv_python()
    stamp = VENV / ".installed"
    asked = ("--cpu\n" if cpu else "") + (f"--cpu-index {index}\n" if cpu and index != CPU_INDEX else "")
    wanted = (HERE / "requirements.txt").read_text() + asked
    if python.exists() and stamp.is_file() and stamp.read_text() == wanted:
        return python
    if sys.version_info[:2] > NEWEST:
        print(f"note: this course is tested with Python 3.11 to 3.14; this is {sys.version.split()[0]}")
    if not python.exists():
        print("making .venv ...")
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    pip(python, "--upgrade", "pip")
    if cpu and sys.platform.startswith("linux"):
        print(f"installing PyTorch's CPU build from {index} ...")
        try:
            pip(python, "--index-url", index, "torch" + requirements()["torch"])
        except subprocess.CalledProcessError:
            sys.exit(f"could not install PyTorch from {index} (pip's message is above); without --cpu, "
                     "course.py installs PyPI's build instead")
    elif cpu:
        print("note: PyPI's PyTorch for macOS and Windows is the CPU build already: --cpu changes nothing here")
    print("installing requirements.txt into .venv (a few minutes the first time) ...")
    pip(python, "-r", str(HERE / "requirements.txt"))
    stamp.write_text(wanted)
    return python


def environment() -> dict:
    """JupyterLab's settings come from jupyter/ (the student's extensions only, wrapped dialogs)."""
    env = dict(os.environ)
    env["JUPYTER_CONFIG_DIR"] = str(HERE / "jupyter")
    env.setdefault("PYTHONWARNINGS", "ignore")
    return env


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--python", help="the Python of an environment that has requirements.txt (default: .venv)")
    parser.add_argument("--cpu", action="store_true",
                        help=f"on Linux, install PyTorch's CPU build from {CPU_INDEX} into .venv (no CUDA libraries)")
    parser.add_argument("--cpu-index", default=CPU_INDEX, metavar="URL",
                        help="where --cpu finds PyTorch's CPU wheels instead: a mirror, or a folder laid out as "
                             "a simple index (file:///path/to/simple)")
    parser.add_argument("command", nargs="?", default="lab", choices=["lab", "setup", "validate"])
    parser.add_argument("rest", nargs=argparse.REMAINDER, help="lab: options for jupyter lab; validate: notebooks")
    args = parser.parse_args(argv)
    python = args.python or str(setup(args.cpu, args.cpu_index))
    if args.python:
        outside = outside_ranges(python)
        if outside:
            print(f"note: {python} has {', '.join(outside)}: pip install -r requirements.txt, or run without --python")
    if args.command == "setup":
        print(f"ready: python3 course.py opens JupyterLab with {python}")
        return 0
    tool = TOOLS[args.command]
    if not versions(python, [tool])[tool]:
        print(f"{args.command} needs {tool}, which {python} does not have: "
              f"{python} -m pip install {tool}{requirements()[tool]} (or run course.py without --python: its .venv has it)")
        return 1
    if args.command == "validate":
        return validate(python, args.rest)
    command = [python, "-m", "jupyterlab", f"--notebook-dir={HERE}"]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        command.append("--allow-root")
    return subprocess.call(command + args.rest, cwd=HERE, env=environment())


if __name__ == "__main__":
    raise SystemExit(main())
'''


def requirements(root: Path = ROOT) -> str:
    """What a student installs: the notebooks' packages in their ranges, then JupyterLab and nbgrader as pinned."""
    pins = course_pins(root)
    return "".join(f"{requirement(name)}\n" for name in PACKAGES) + "".join(f"{pins[name]}\n" for name in TOOLS)


def _instructor_value(root: Path, name: str, default: int) -> int:
    """A number set in the instructor's nbgrader_config.py (``c.Section.name = 60``)."""
    section, key = name.split(".")
    value = course_config(root).get(section, {}).get(key, default)
    return int(value)


def readme(root: Path = ROOT) -> str:
    """The bundle's README: the notebooks (with their links where the course publishes them), where to work."""
    published = StudentBundle(config=course_config(root))
    names = [name for name in assignments(root) if (root / "notebooks" / f"{name}.ipynb").is_file()]
    url = published.notebooks_url.rstrip("/")
    notebooks = ", ".join(f"[`{n}`]({notebook_link(url, n + '.ipynb')})" if url else f"`{n}`" for n in names)
    fetched = ", unless your instructor publishes it: then the cell downloads it" if published.package_url or url else ""
    return README.format(
        notebooks=notebooks, ranges=", ".join(f"`{requirement(p)}`" for p in PACKAGES),
        colab="each notebook's link above" if url else "*File > Upload notebook*", fetched=fetched,
        nbgrader=course_pins(root)["nbgrader"], torch=course_pins(root)["torch"].split("==")[1],
        cpu_index="`https://download.pytorch.org/whl/cpu`", **DOWNLOADS)


def generated_files(root: Path = ROOT) -> dict[str, str]:
    """Archive name -> text, for every file of the bundle made here rather than copied."""
    page_config = {"disabledExtensions": {plugin: True for plugin in INSTRUCTOR_PLUGINS}}
    server_config = {"ServerApp": {"jpserver_extensions": {ext: False for ext in INSTRUCTOR_SERVER_EXTENSIONS}},
                     "LabApp": {"custom_css": True}}
    config = STUDENT_CONFIG.format(timeout=_instructor_value(root, "Execute.timeout", 60),
                                   width=_instructor_value(root, "Validator.width", 640))
    return {
        f"{TOP}/README.md": readme(root),
        f"{TOP}/requirements.txt": requirements(root),
        f"{TOP}/course.py": COURSE_SCRIPT,
        f"{TOP}/nbgrader_config.py": config,
        f"{TOP}/jupyter/labconfig/page_config.json": json.dumps(page_config, indent=2) + "\n",
        f"{TOP}/jupyter/jupyter_server_config.json": json.dumps(server_config, indent=2) + "\n",
        f"{TOP}/jupyter/custom/custom.css": CUSTOM_CSS,
    }


def bundle_files(root: Path = ROOT) -> dict[str, Path]:
    """Archive name -> file on disk, for every file of the bundle copied from the course."""
    files = {f"{TOP}/{p.name}": p for p in sorted((root / "notebooks").glob("*.ipynb"))}
    package = root / "autograder"
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        if relative.parts[0] in INSTRUCTOR_ONLY:
            continue
        # Beside the notebooks, so `import autograder` works from the notebooks' folder.
        files[f"{TOP}/autograder/{relative.as_posix()}"] = path
    return files


def write_bundle(output: str | Path, root: Path = ROOT) -> Path:
    """Write the bundle zip to ``output`` and return its path."""
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(output, "w", zipfile.ZIP_DEFLATED) as archive:
        config = course_config(root)
        for name, path in bundle_files(root).items():
            if name.count("/") == 1 and name.endswith(".ipynb"):  # a notebook: with its set-up cell on top
                notebook = with_setup(nbformat.read(path, as_version=4), path.name, config)
                archive.writestr(_entry(name), nbformat.writes(notebook) + "\n")
            else:
                archive.write(path, name)
        for name, text in generated_files(root).items():
            archive.writestr(_entry(name), text)
    return output


def _entry(name: str) -> zipfile.ZipInfo:
    """A file made here: a fixed date, executable when it is a script."""
    info = zipfile.ZipInfo(name, date_time=(2024, 1, 1, 0, 0, 0))
    info.external_attr = (0o755 if name.endswith(".py") else 0o644) << 16
    info.compress_type = zipfile.ZIP_DEFLATED
    return info
