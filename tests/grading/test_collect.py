"""``make collect-zip``: one student's unusable upload is skipped and named, and everyone else is collected.

A course folder with the release of notebook 01 and a platform's zip of submissions (Canvas's
names), collected with nbgrader's ``zip_collect`` and the course's extractor; no grading.
"""

from __future__ import annotations

import io
import shutil
import stat
import zipfile
from pathlib import Path

import pytest

from autograder.grading import collect

from ..notebook_code import ROOT

A = "01_soft_lookup"
NOTEBOOK = (ROOT / "notebooks" / f"{A}.ipynb").read_bytes()


def course(tmp_path: Path) -> Path:
    root = tmp_path / "course"
    (root / "build" / "release" / A).mkdir(parents=True)
    shutil.copy(ROOT / "notebooks" / f"{A}.ipynb", root / "build" / "release" / A / f"{A}.ipynb")
    config = (ROOT / "nbgrader_config.py").read_text()
    (root / "nbgrader_config.py").write_text(config + "\nc.Grading.max_file_mb = 1\n")  # a huge member: over 1 MB
    return root


def link(archive: zipfile.ZipFile, name: str, target: str) -> None:
    """A symbolic link member, as zip tools on Unix store one."""
    info = zipfile.ZipInfo(name)
    info.external_attr = (stat.S_IFLNK | 0o777) << 16
    archive.writestr(info, target)


def zip_bytes(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return buffer.getvalue()


#: A name whose bytes are not UTF-8, with the zip's UTF-8 flag unset (as an old zip tool writes it).
NOT_UTF8 = b"\xff\xfe_1250_567900_" + A.encode() + b".ipynb"


def platform_zip(path: Path) -> Path:
    """Two honest students, and every kind of member a zip can hold that must not be extracted."""
    student_upload = zip_bytes({
        "../../../../escaped.ipynb": NOTEBOOK,
        f"alice_1111_2222_{A}.ipynb": b"{}",  # another student's name, chosen by this one
    })
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f"doejane_1234_567890_{A}.ipynb", NOTEBOOK)
        archive.writestr(f"eve_1235_567891_{A}.zip", student_upload)
        archive.writestr(f"../../outside_1236_567892_{A}.ipynb", NOTEBOOK)
        archive.writestr(f"/tmp/absolute_1237_567893_{A}.ipynb", NOTEBOOK)
        link(archive, f"mallory_1238_567894_{A}.ipynb", "/etc/passwd")
        archive.writestr(f"big_1239_567895_{A}.ipynb", b" " * (3 * 2**20))  # 3 MB, a few kB compressed
        archive.writestr("XX" + NOT_UTF8[2:].decode(), NOTEBOOK)  # ASCII, made not UTF-8 below
        archive.writestr(f"escape\x1b]0;title\x07/../../term_1240_567896_{A}.ipynb", NOTEBOOK)
        archive.writestr(f"roesmith_LATE_1241_567897_{A}-1.ipynb", NOTEBOOK)
    data = path.read_bytes().replace(b"XX" + NOT_UTF8[2:], NOT_UTF8)  # the same length: the offsets hold
    assert data.count(NOT_UTF8) == 2  # the local header and the central directory
    path.write_bytes(data)
    return path


def files_outside(root: Path) -> set[Path]:
    return {p for p in root.parent.rglob("*") if "downloaded" not in p.parts}


def test_one_unusable_upload_skips_itself_and_collects_everyone_else(tmp_path):
    root = course(tmp_path)
    archive = platform_zip(tmp_path / "submissions.zip")
    before = files_outside(root)
    collected = collect.collect_zip(A, archive, root=root)
    assert collected.students == ["doejane", "roesmith"], collected
    assert (root / "submitted" / "doejane" / A / f"{A}.ipynb").read_bytes() == NOTEBOOK
    why = {s.member: s.why for s in collected.skipped}
    assert why == {
        f"eve_1235_567891_{A}.zip": "an archive inside the archive (not extracted)",
        f"../../outside_1236_567892_{A}.ipynb": "a path that leaves the folder (..)",
        f"/tmp/absolute_1237_567893_{A}.ipynb": "an absolute path",
        f"mallory_1238_567894_{A}.ipynb": "a symbolic or hard link",
        f"big_1239_567895_{A}.ipynb": "larger than 1 MB",
        NOT_UTF8.decode("utf-8", "backslashreplace"): "a name that is not UTF-8",
        f"escape\x1b]0;title\x07/../../term_1240_567896_{A}.ipynb": "a path that leaves the folder (..)",
    }, why
    assert {s.archive for s in collected.skipped} == {"submissions.zip"}
    # nothing was written outside downloaded/ and submitted/ of the two students
    written = files_outside(root) - before
    assert {p.relative_to(root) for p in written if p.is_file()} == {
        Path("submitted/doejane") / A / f"{A}.ipynb", Path("submitted/roesmith") / A / f"{A}.ipynb"}, written
    assert not Path(f"/tmp/absolute_1237_567893_{A}.ipynb").exists()
    # what the command prints names each one, on a line of its own, and obeys no escape sequence
    printed = str(collected).split("\n")
    assert printed[0] == f"collected 2 submissions of {A}: doejane, roesmith" and len(printed) == 2 + len(why)
    assert not any(c in line for line in printed for c in "\x1b\x07\r"), printed
    assert any("escape\\x1b]0;title\\x07/../../term" in line for line in printed), printed


def test_an_archive_left_in_downloaded_never_blocks_a_later_collect(tmp_path):
    """The archive above, and one that is not a zip at all, stay in downloaded/: the next collect still works."""
    root = course(tmp_path)
    collect.collect_zip(A, platform_zip(tmp_path / "submissions.zip"), root=root)
    (root / "downloaded" / A / "archive" / "broken.zip").write_bytes(b"PK\x03\x04 not really a zip")
    later = tmp_path / "late.zip"
    late = zip_bytes({f"kimlee_1260_567990_{A}.ipynb": NOTEBOOK})
    later.write_bytes(late)
    collected = collect.collect_zip(A, later, root=root)
    assert collected.students == ["doejane", "kimlee", "roesmith"], collected
    broken = [s for s in collected.skipped if s.archive == "broken.zip"]
    assert len(broken) == 1 and broken[0].why.startswith("not an archive that can be read"), collected.skipped
    assert {s.archive for s in collected.skipped} == {"broken.zip", "submissions.zip"}


@pytest.mark.parametrize("name", ["a/../../b.ipynb", "..\\..\\b.ipynb", "C:/b.ipynb", "/b.ipynb", "./", ""])
def test_a_member_path_that_would_leave_the_folder_has_none(name):
    assert isinstance(collect.member_path(name), str), collect.member_path(name)


def test_a_students_two_files_of_one_notebook_collect_the_newest_and_stop_no_one(tmp_path):
    """nbgrader stops the whole collect at two files of one student and notebook with no time in their names."""
    root = course(tmp_path)
    archive = tmp_path / "resubmitted.zip"
    newest = NOTEBOOK + b"\n"  # told apart from the others by its bytes
    archive.write_bytes(zip_bytes({f"doejane_1234_567890_{A}.ipynb": NOTEBOOK,
                                   f"eve_1235_567891_{A}.ipynb": b"{}", f"eve_1235_567891_{A}-2.ipynb": newest,
                                   f"eve_1235_567891_{A}-1.ipynb": b"{}"}))
    collected = collect.collect_zip(A, archive, root=root)
    assert collected.students == ["doejane", "eve"], collected
    assert (root / "submitted" / "eve" / A / f"{A}.ipynb").read_bytes() == newest
    older = sorted(s.archive for s in collected.skipped)
    assert older == [f"resubmitted/eve_1235_567891_{A}-1.ipynb", f"resubmitted/eve_1235_567891_{A}.ipynb"], collected
    assert all(f"collected: eve_1235_567891_{A}-2.ipynb" in s.why for s in collected.skipped)
