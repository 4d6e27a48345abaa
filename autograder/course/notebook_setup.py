"""What the student bundle adds at the top of each released notebook, so that it opens anywhere.

A notebook opened alone (Colab opens one file; Kaggle, a hub, a student's own Jupyter can too) has
no ``autograder`` beside it, so its test cells could not import the checks. The bundle puts two
cells before the notebook's own:

- a line with the notebook's link where the course publishes its notebooks (in Colab, for a
  GitHub address; :attr:`StudentBundle.notebooks_url`), when that is set;
- a set-up cell that makes the checks importable: nothing where ``autograder`` already imports
  (the bundle's own folder, a graded kernel); else the ``autograder`` folder of a Kaggle
  dataset, or of ``attention-course.zip`` uploaded beside the notebook, or of the zip published
  at :attr:`StudentBundle.package_url`, copied into the working folder. It installs nothing with
  pip and never touches the PyTorch already there; it says when PyTorch, NumPy or Matplotlib is
  outside the course's ranges (:mod:`autograder.course.student_versions`).

The set-up cell's code is one function, defined and called: it binds no module name, so the
graded kernel (which loads the imports of the cells before the first exercise) gets nothing from it.

What this does *not* do: check what the downloaded zip holds beyond its paths (it is the course's
own file, from the address the instructor set), or keep a student from editing the cell.
"""

from __future__ import annotations

import re

import nbformat
from traitlets import Unicode
from traitlets.config import Configurable

from .student_versions import PACKAGES, below, oldest, version_tuple


class StudentBundle(Configurable):
    """Where the student bundle is published (``c.StudentBundle.<trait>`` in ``nbgrader_config.py``)."""

    notebooks_url = Unicode("", help="Where the bundle's notebooks are published, unzipped: a GitHub folder "
                            "(https://github.com/OWNER/REPO/blob/BRANCH/FOLDER), each notebook then opening in "
                            "Colab from its first line, or a folder of the course's site. Empty: no link.").tag(config=True)
    package_url = Unicode("", help="A zip holding the bundle's autograder/ folder (attention-course.zip on the "
                          "course's site) that a notebook opened alone downloads in its set-up cell. Empty: a GitHub "
                          "notebooks_url's archive, else the student uploads attention-course.zip beside the "
                          "notebook.").tag(config=True)


GITHUB = re.compile(r"https://github\.com/(?P<repo>[^/]+/[^/]+)/blob/(?P<ref>[^/]+)(?P<folder>(?:/[^/]+)*)/?$")

SETUP_CELL = '''# Set-up: makes the course's checks importable where this notebook was opened alone (Colab, Kaggle,
# a hub). Beside the course's own folder it does nothing. It never installs or changes PyTorch.
def _course_setup(url={url!r}, ranges={ranges!r}):
    import importlib, importlib.metadata, importlib.util, io, pathlib, re, sys, urllib.request, zipfile
    for package, (low, high) in ranges.items():
        try:
            have = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue  # the notebook's own import says so
        if not tuple(low) <= tuple(int(n) for n in re.findall(r"\\d+", have)[:len(low)]) < tuple(high):
            print(f"note: this course runs with {{package}} >= {{'.'.join(map(str, low))}}, < "
                  f"{{'.'.join(map(str, high))}}; this is {{have}}")
    if importlib.util.find_spec("autograder"):
        return
    here, kaggle = pathlib.Path.cwd(), pathlib.Path("/kaggle/input")
    for folder in [*kaggle.glob("*"), *kaggle.glob("*/*")]:
        if (folder / "autograder" / "__init__.py").is_file():  # a Kaggle dataset, unzipped
            sys.path.insert(0, str(folder))
            return print(f"the checks: {{folder / 'autograder'}}")
    found = sorted(here.glob("attention-course*.zip")) + sorted(kaggle.glob("**/attention-course*.zip"))
    if not found and not url:
        raise RuntimeError("The checks are missing: upload attention-course.zip (from your instructor) beside "
                           "this notebook, then run this cell again.")
    source = found[0] if found else url
    data = found[0].read_bytes() if found else urllib.request.urlopen(url, timeout=120).read()
    with zipfile.ZipFile(io.BytesIO(data)) as bundle:
        names = [n for n in bundle.namelist() if ".." not in n.split("/") and not n.startswith("/")]
        inits = sorted((n for n in names if n.endswith("autograder/__init__.py")), key=len)
        if not inits:
            raise RuntimeError(f"{{source}} holds no autograder/ folder")
        top = inits[0][: -len("autograder/__init__.py")]
        for name in names:
            if name.startswith(top + "autograder/") and not name.endswith("/"):
                target = here / name[len(top):]
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(bundle.read(name))
    importlib.invalidate_caches()
    print(f"the checks: {{here / 'autograder'}}, from {{source}}")


_course_setup()
'''


def _settings(config) -> tuple[str, str]:
    bundle = StudentBundle(config=config)
    return bundle.notebooks_url.rstrip("/"), bundle.package_url


def notebook_link(notebooks_url: str, name: str) -> str:
    """The address that opens notebook ``name`` (``01_soft_lookup.ipynb``): in Colab for a GitHub folder."""
    github = GITHUB.match(notebooks_url)
    if github:
        return f"https://colab.research.google.com/github/{github['repo']}/blob/{github['ref']}{github['folder']}/{name}"
    return f"{notebooks_url}/{name}"


def package_address(notebooks_url: str, package_url: str) -> str:
    """The zip the set-up cell downloads: :attr:`StudentBundle.package_url`, else a GitHub folder's archive."""
    github = GITHUB.match(notebooks_url)
    if package_url or not github:
        return package_url
    return f"https://github.com/{github['repo']}/archive/{github['ref']}.zip"


def ranges() -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """package -> (oldest release, first release past the range), as numbers, for the set-up cell."""
    return {p: (version_tuple(oldest(p)), version_tuple(below(p))) for p in PACKAGES}


def with_setup(notebook: nbformat.NotebookNode, name: str, config) -> nbformat.NotebookNode:
    """A copy of ``notebook`` (file ``name``) with the link line and the set-up cell before its cells."""
    notebooks_url, package_url = _settings(config)
    notebook = nbformat.from_dict(notebook)
    cells = []
    if notebooks_url:
        link = notebook_link(notebooks_url, name)
        where = "Open in Colab" if link.startswith("https://colab.") else "This notebook online"
        cells.append(nbformat.v4.new_markdown_cell(
            f"[{where}]({link}) · opened alone (Colab, Kaggle), the set-up cell below fetches the checks; "
            "the bundle's README says what to install elsewhere."))
    code = SETUP_CELL.format(url=package_address(notebooks_url, package_url), ranges=ranges())
    cells.append(nbformat.v4.new_code_cell(code))
    for cell, id_ in zip(cells, ("course-link", "course-setup")[-len(cells):]):
        cell.id = id_  # the same bundle from the same course: no random cell ids
    notebook.cells = cells + notebook.cells
    return notebook
