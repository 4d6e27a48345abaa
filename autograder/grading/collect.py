"""``make collect-zip``: the submissions of a learning platform's zip put where nbgrader grades them.

nbgrader's ``zip_collect`` does the work; this module says how the platform names its files, and
extracts the archive itself (:class:`SafeExtractor`, in place of nbgrader's extractor, which stops
at the first member it refuses, collecting nobody, and refuses it again at every later collect
while the archive stays in ``downloaded/``). Each member is looked at on its own; one that cannot
be used is skipped, and named with why, and everyone else is collected:

- a path that leaves the folder (``../``, an absolute path, a drive letter);
- a link, or anything else but a regular file or a folder;
- a member larger than :attr:`SafeExtractor.max_member_mb` (grading's ``max_file_mb``), counted
  as it is written, whatever the archive's header says;
- a name that is not UTF-8, or that cannot be written here;
- a second member of the same name;
- an archive inside the archive (a student's zip upload): it is not extracted, since the names
  of the files inside it are the student's to choose, and could be another student's.

An archive that cannot be read at all is skipped, and named, in the same way. Of a student's
files that are the same notebook (a resubmission: ``-1``, ``-2``), the one with the highest number
is collected and the others are named (:class:`NewestCollector`; nbgrader would stop the whole
collect at such a pair, its names carrying no time to choose by). What it does *not*
do: check the notebooks (grading's staging does), limit the archive's total size (the platform's
zip is the instructor's; each member is bounded), or match a Canvas user to a student id beyond
the file name (``make grades`` reads the same names back).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import tarfile
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path, PurePosixPath

from nbgrader.plugins import ExtractorPlugin, FileNameCollectorPlugin
from traitlets import Integer, Unicode

from ..course.repository import ROOT, nbgrader
from ..course.settings import Grading, Settings
from ..engine.notes import inert_text

#: How a learning platform names the files of a "download all submissions" zip, as a regular
#: expression for nbgrader's ``FileNameCollectorPlugin.named_regexp`` (matched against the
#: whole path of each extracted file). The default is Canvas's
#: ``<name>_[LATE_]<user id>_<submission id>_<file name>[-<n>].ipynb``, for example
#: ``doejane_1234_567890_01_soft_lookup.ipynb`` or ``doejane_LATE_1234_567891_01_soft_lookup-1.ipynb``
#: (``-1``: a resubmission); the student id is the name part. A student id must start with a
#: letter or digit, so no file name can point outside ``submitted/``.
LMS_PATTERN = (r".*/(?P<student_id>[A-Za-z0-9][A-Za-z0-9.-]*)_(?:LATE_)?[0-9]+_[0-9]+_"
               r"(?P<file_id>[A-Za-z0-9_ .()-]+?)(?:-[0-9]+)?\.ipynb$")
#: The names of archives (nbgrader's ``ExtractorPlugin.zip_ext``, and ``.tar.gz``'s).
ARCHIVES = (".zip", ".gz", ".tgz")
#: A platform's number for a resubmitted file, at the end of its name (``name-2.ipynb``).
RESUBMISSION = re.compile(r"-([0-9]+)\.[^./]+$")
CHUNK = 2**20


@dataclass(frozen=True)
class Skipped:
    """A member of an archive (or an archive) that was not extracted, and why."""

    archive: str
    member: str
    why: str

    def __str__(self) -> str:
        return inert_text(f"{self.archive}: {self.member}: {self.why}" if self.member else f"{self.archive}: {self.why}")


@dataclass
class Collected:
    """What :func:`collect_zip` did: every student with a submission of the assignment, what was skipped."""

    assignment: str
    students: list[str] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"collected {len(self.students)} submissions of {self.assignment}: {', '.join(self.students)}"]
        if self.skipped:
            lines.append(f"skipped {len(self.skipped)} (not collected):")
            lines += [f"  {s}" for s in self.skipped]
        return "\n".join(inert_text(line) for line in lines)


def member_path(name: str) -> PurePosixPath | str:
    """The relative path a member's name stands for, or why it has none that stays in the folder."""
    shown = name.replace("\\", "/")  # a zip made on Windows may separate with backslashes
    if shown.startswith("/") or (len(shown) > 1 and shown[1] == ":"):
        return "an absolute path"
    parts = [p for p in shown.split("/") if p not in ("", ".")]
    if ".." in parts:
        return "a path that leaves the folder (..)"
    if not parts:
        return "an empty name"
    return PurePosixPath(*parts)


def _write(source, target: Path, limit: int) -> str | None:
    """Copy the stream ``source`` to the new file ``target`` (never through a link, never over a file); why not, or None."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    written = 0
    with os.fdopen(fd, "wb") as handle:
        while chunk := source.read(CHUNK):
            written += len(chunk)
            if written > limit:
                break
            handle.write(chunk)
    if written > limit:
        target.unlink()
        return f"larger than {limit // 2**20} MB"
    return None


def _members(archive: Path):
    """(name, kind, size, open) for each member of a zip or tar archive; kind is 'file', 'folder', 'link' or 'other'."""
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as zf:
            for info in zf.infolist():
                name = info.filename
                if not info.flag_bits & 0x800:  # not flagged UTF-8: read as cp437; many tools write UTF-8 anyway
                    try:
                        name = name.encode("cp437").decode("utf-8")
                    except UnicodeDecodeError:
                        name = name.encode("cp437").decode("utf-8", "surrogateescape")
                mode = info.external_attr >> 16  # Unix mode where the zip was made on Unix; its type may be unset
                kind = ("folder" if info.is_dir() else "link" if stat.S_ISLNK(mode)
                        else "other" if stat.S_IFMT(mode) and not stat.S_ISREG(mode) else "file")
                yield name, kind, info.file_size, (lambda info=info: zf.open(info))
        return
    with tarfile.open(archive) as tf:  # raises tarfile.ReadError where it is neither
        for info in tf:
            kind = ("folder" if info.isdir() else "file" if info.isfile() else "link" if info.issym() or info.islnk()
                    else "other")
            yield info.name, kind, info.size, (lambda info=info: tf.extractfile(info))


def extract_archive(archive: Path, target: Path, limit: int, shown: str) -> list[Skipped]:
    """Extract the zip or tar ``archive`` into ``target``, member by member; what was skipped, and why."""
    skipped: list[Skipped] = []
    target.mkdir(parents=True, exist_ok=True)
    try:
        for name, kind, size, open_member in _members(archive):
            printed = name.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
            path = member_path(name)
            why = (path if isinstance(path, str)
                   else "a name that is not UTF-8" if printed != name
                   else "a symbolic or hard link" if kind == "link"
                   else "not a regular file" if kind == "other"
                   else f"larger than {limit // 2**20} MB" if size > limit
                   else "an archive inside the archive (not extracted)" if kind == "file" and name.lower().endswith(ARCHIVES)
                   else None)
            if why is None and kind == "folder":
                continue
            if why is None:
                try:
                    with open_member() as stream:
                        why = _write(stream, target / path, limit)
                except FileExistsError:
                    why = "a second member of that name"
                except OSError as error:
                    why = f"could not be written ({error.strerror or type(error).__name__})"
                except (zipfile.BadZipFile, tarfile.TarError, RuntimeError, NotImplementedError, ValueError, EOFError) as error:
                    why = f"could not be read ({type(error).__name__}: {error})"
            if why is not None:
                skipped.append(Skipped(shown, printed, why))
    except (zipfile.BadZipFile, tarfile.TarError, OSError, EOFError, UnicodeDecodeError, ValueError) as error:
        skipped.append(Skipped(shown, "", f"not an archive that can be read ({type(error).__name__}); nothing more of it "
                                          "was extracted"))
    return skipped


class SafeExtractor(ExtractorPlugin):
    """nbgrader's extractor, member by member: what cannot be used is skipped and named (see the module's doc)."""

    max_member_mb = Integer(50, help="Largest member of an archive that is extracted.").tag(config=True)
    report = Unicode("", help="A file to write the skipped members to (JSON), for collect_zip.").tag(config=True)

    def extract(self, archive_path: str, extracted_path: str) -> None:
        skipped: list[Skipped] = []
        source, target = Path(archive_path), Path(extracted_path)
        for dirpath, dirnames, filenames in os.walk(source, followlinks=False):
            dirnames.sort()
            rel = Path(dirpath).relative_to(source)
            for name in sorted(filenames):
                path, shown = Path(dirpath) / name, str(rel / name)
                if path.is_symlink() or not path.is_file():
                    skipped.append(Skipped(shown, "", "a link or not a regular file"))
                elif name.lower().endswith(ARCHIVES):
                    stem = name[: -len(".tar.gz")] if name.lower().endswith(".tar.gz") else path.stem
                    skipped += extract_archive(path, target / rel / stem, self.max_member_mb * 2**20, shown)
                else:
                    (target / rel).mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(path, target / rel / name)
        for item in skipped:
            self.log.warning("skipped %s", item)
        _report(self.report, skipped)


def _report(path: str, skipped: list[Skipped]) -> None:
    """Add ``skipped`` to the JSON list at ``path`` (where collect_zip reads them back)."""
    if path:
        before = json.loads(Path(path).read_text(encoding="utf-8")) if Path(path).is_file() else []
        Path(path).write_text(json.dumps(before + [asdict(s) for s in skipped]), encoding="utf-8")


class NewestCollector(FileNameCollectorPlugin):
    """nbgrader's collector by file name, one file per student and notebook: the highest resubmission number."""

    extracted = Unicode("", help="The folder of the extracted files (all are looked at before the first is collected).") \
        .tag(config=True)
    report = Unicode("", help="A file to add the files left out to (JSON), for collect_zip.").tag(config=True)

    def collect(self, submitted_file: str) -> dict | None:
        info = super().collect(submitted_file)
        if info is None or info.get("timestamp"):  # where names carry a time, nbgrader keeps the newest itself
            return info
        chosen = self._newest().get(self._key(info, submitted_file), submitted_file)
        if chosen != submitted_file:
            shown = os.path.relpath(submitted_file, self.extracted or os.path.dirname(submitted_file))
            _report(self.report, [Skipped(shown, "", f"an older file of the same notebook by {info['student_id']} "
                                                    f"(collected: {os.path.basename(chosen)})")])
            return None
        return info

    @staticmethod
    def _key(info: dict, path: str) -> tuple[str, str]:
        return info["student_id"], os.path.splitext(info["file_id"])[0] + os.path.splitext(path)[1]

    def _newest(self) -> dict[tuple[str, str], str]:
        """(student, notebook) -> the file to collect, for every file under :attr:`extracted`."""
        if getattr(self, "_chosen", None) is None:
            ranked: dict[tuple[str, str], tuple[int, str]] = {}
            for dirpath, _, filenames in os.walk(self.extracted):
                for name in filenames:
                    path = os.path.join(dirpath, name)
                    info = super().collect(path)
                    if info:
                        number = RESUBMISSION.search(name)
                        rank = (int(number.group(1)) if number else 0, path)
                        ranked[self._key(info, path)] = max(ranked.get(self._key(info, path), rank), rank)
            self._chosen = {key: path for key, (_, path) in ranked.items()}
        return self._chosen


def collect_zip(assignment: str, archive: Path, pattern: str = LMS_PATTERN, root: Path = ROOT) -> Collected:
    """Put the submissions of an LMS zip into ``submitted/`` with nbgrader's ``zip_collect``.

    The zip is copied to ``downloaded/<assignment>/archive/`` and every archive there is extracted
    by :class:`SafeExtractor` (skipping, and naming, what cannot be used); each ``.ipynb`` whose
    name matches ``pattern`` (see :data:`LMS_PATTERN`) becomes
    ``submitted/<student_id>/<assignment>/<file>.ipynb``. Files that do not match are skipped
    (nbgrader logs them).
    """
    target = root / "downloaded" / assignment / "archive"
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(archive, target / Path(archive).name)
    extractor = f"{SafeExtractor.__module__}.{SafeExtractor.__name__}"
    collector = f"{NewestCollector.__module__}.{NewestCollector.__name__}"
    with tempfile.TemporaryDirectory(prefix="collect-") as work:
        report = Path(work) / "skipped.json"
        done = nbgrader("zip_collect", assignment, "--force", "--log-level=WARN",
                        f"--ZipCollectApp.extractor_plugin={extractor}", f"--SafeExtractor.report={report}",
                        f"--SafeExtractor.max_member_mb={Settings.load(root).value(Grading, 'max_file_mb')}",
                        f"--ZipCollectApp.collector_plugin={collector}", f"--NewestCollector.report={report}",
                        f"--NewestCollector.extracted={root / 'downloaded' / assignment / 'extracted'}",
                        f"--FileNameCollectorPlugin.named_regexp={pattern}", root=root, check=False)
        if done.returncode != 0:
            raise RuntimeError(" | ".join((done.stderr or done.stdout).strip().splitlines()[-3:]))
        skipped = [Skipped(**s) for s in json.loads(report.read_text(encoding="utf-8"))] if report.is_file() else []
    students = sorted(p.parent.name for p in (root / "submitted").glob(f"*/{assignment}"))
    return Collected(assignment, students, skipped)
