"""Command line of the instructor pipeline: ``python -m autograder COMMAND``."""

from __future__ import annotations

import argparse
import signal

from .course import release, settings
from .grading import collect, grade


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the command; the exit code is non-zero when something failed."""
    parser = argparse.ArgumentParser(prog="python -m autograder", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    rel = commands.add_parser("release", help="generate notebooks/ and solutions/ from source/")
    rel.add_argument("assignments", nargs="*", help="assignment names (default: all)")
    auto = commands.add_parser("autograde", help="grade every submission in submitted/, in parallel")
    auto.add_argument("assignments", nargs="*", help="assignment names (default: all)")
    auto.add_argument("--workers", type=int, default=None,
                      help="submissions at once (default: Grading.workers of nbgrader_config.py, else the cores)")
    auto.add_argument("--cell-timeout", type=int, default=None,
                      help="seconds per cell (default: Execute.timeout of nbgrader_config.py)")
    auto.add_argument("--notebook-timeout", type=int, default=None,
                      help="seconds per notebook, restarts included (default: ResilientExecute.notebook_timeout)")
    auto.add_argument("--no-sandbox", action="store_true",
                      help="grade even where no sandbox can be made: students' code then runs with your rights")
    auto.add_argument("--cluster", metavar="ADDRESS", default=None,
                      help="grade on the workers of the Dask scheduler at ADDRESS (tcp://host:8786), the grades "
                           "written here (default: Grading.cluster of nbgrader_config.py, else on this machine)")
    zipped = commands.add_parser("collect-zip", help="put an LMS zip of submissions into submitted/ (nbgrader zip_collect)")
    zipped.add_argument("assignment", help="the assignment the zip holds")
    zipped.add_argument("zip", help="the zip as the learning platform exports it")
    zipped.add_argument("--pattern", default=collect.LMS_PATTERN,
                         help="regular expression naming student_id and file_id in each file's path (default: Canvas)")
    fb = commands.add_parser("feedback", help="write feedback/ for every graded submission")
    fb.add_argument("assignments", nargs="*", help="assignment names (default: all)")
    similar = commands.add_parser("similarity", help="write report/similarity/: similar answers per exercise, and "
                                  "answers matching the reference solution")
    similar.add_argument("assignments", nargs="*", help="assignment names (default: all)")
    similar.add_argument("--threshold", type=float, default=None,
                         help="list the pairs at or above this similarity, 0 to 1 (default: 0.5)")
    commands.add_parser("grades", help="write grades.csv (nbgrader export) and grades-canvas.csv (Canvas's import)")
    commands.add_parser("settings", help="print every setting of the course as a Markdown table")
    new = commands.add_parser("new-notebook", help="write the files of a new notebook (source, references, checks, "
                              "hidden checks, tests) with one example exercise")
    new.add_argument("name", help="NN_name, e.g. 10_linear_attention")
    new.add_argument("--title", default=None, help="the notebook's title (default: from its name)")
    serve = commands.add_parser("serve", help="grade each submission as it arrives in the exchange and release its "
                                "feedback to that student (the grading service)")
    serve.add_argument("--workers", type=int, default=None, help="submissions graded at once (default: "
                       "GradingService.workers of nbgrader_config.py)")
    serve.add_argument("--exchange", default=None, help="the exchange folder (default: Exchange.root)")
    serve.add_argument("--course", default=None, help="the course folder (default: this repository)")
    serve.add_argument("--until-idle", action="store_true", help="stop when nothing is left to grade now")
    serve.add_argument("--no-sandbox", action="store_true",
                       help="grade even where no sandbox can be made: students' code then runs with your rights")
    bundle = commands.add_parser("bundle", help="zip the student bundle")
    bundle.add_argument("output", help="path of the zip to write")
    args = parser.parse_args(argv)
    grade.tools_on_path()
    if args.command == "release":
        release.release(args.assignments)
    elif args.command == "autograde":
        try:
            course = settings.Settings.load(flags={
                "Grading.workers": args.workers, "Grading.cluster": args.cluster, "Execute.timeout": args.cell_timeout,
                "ResilientExecute.notebook_timeout": args.notebook_timeout,
                "Grading.sandbox": False if args.no_sandbox else None})
            address = course.value(settings.Grading, "cluster") or None
            if address is not None:
                from .grading import cluster

                summary = cluster.autograde(address, args.assignments, course)
            else:
                summary = grade.autograde(args.assignments, course)
        except (grade.SandboxUnavailable, OSError, RuntimeError, ValueError) as error:  # OSError: no file, no scheduler
            print(f"make autograde: {error}")
            return 2
        print(summary)
        return 1 if summary.failed else 0
    elif args.command == "collect-zip":
        from pathlib import Path

        print(collect.collect_zip(args.assignment, Path(args.zip), args.pattern))
    elif args.command == "feedback":
        from .grading import feedback

        run = feedback.feedback(args.assignments)
        print(run)
        return 1 if run.broken else 0
    elif args.command == "similarity":
        from .grading import similarity, similarity_page

        threshold = similarity.THRESHOLD if args.threshold is None else args.threshold
        if not 0.0 <= threshold <= 1.0:
            print(f"make similarity: the threshold is a similarity from 0 to 1, not {threshold}")
            return 2
        try:
            found = similarity_page.write(args.assignments, threshold=threshold)
        except ValueError as error:
            print(f"make similarity: {error}")
            return 2
        print(similarity_page.summary(found, threshold))
    elif args.command == "grades":
        from .grading import export

        try:
            print(export.export())
        except RuntimeError as error:
            print(f"make grades: {error}")
            return 2
    elif args.command == "new-notebook":
        from .course import scaffold

        try:
            written = scaffold.create(args.name, args.title)
        except (ValueError, FileExistsError) as error:
            print(f"make new-notebook: {error}")
            return 2
        print("\n".join(str(p) for p in written))
    elif args.command == "settings":
        print(settings.table(), end="")
    elif args.command == "serve":
        import logging
        from pathlib import Path

        from .course.repository import ROOT
        from .service.serve import Service, summary

        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
        logging.getLogger("autograder.service").setLevel(logging.INFO)  # one line per submission, not nbconvert's
        signal.signal(signal.SIGTERM, _interrupt)  # stopped by JupyterHub: finish as on Ctrl-C, the state saved
        root = Path(args.course).resolve() if args.course else ROOT
        try:
            course = settings.Settings.load(root, {"GradingService.workers": args.workers,
                                                   "Grading.sandbox": False if args.no_sandbox else None})
            service = Service(root, settings=course, exchange=Path(args.exchange) if args.exchange else None)
        except ValueError as error:
            print(f"python -m autograder serve: {error}")
            return 2
        try:
            service.serve(idle_exit=args.until_idle)
        except grade.SandboxUnavailable as error:
            print(f"python -m autograder serve: {error}")
            return 2
        except KeyboardInterrupt:
            pass
        print(summary(service))
    elif args.command == "bundle":
        from .course import bundle as bundle_module

        print(bundle_module.write_bundle(args.output))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
