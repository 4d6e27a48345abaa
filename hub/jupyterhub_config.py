"""JupyterHub for the course on one server (``make hub``): one Linux user per student and per instructor.

- Users log in with their Linux account and password (JupyterHub's PAM authenticator); only those
  named in ``COURSE_STUDENTS`` and ``COURSE_INSTRUCTORS`` (comma-separated) may log in. Each gets
  a JupyterLab of their own, started as their own Linux user (the hub's local process spawner).
- Students see the Assignment List (fetch, validate, submit, fetch feedback) and not Formgrader,
  Create Assignment or the Course List: their servers read the configuration this file writes to
  ``$HUB_STATE/jupyter/student`` (the same settings the student bundle uses), and import the public
  part of ``autograder`` (the visible checks) from ``$HUB_STATE/python``, a copy made here at each
  start: the course folder itself is closed to them (docs/jupyterhub.md). Every user's JupyterLab
  loads the student bundle's style sheet (``custom.css``: nbgrader's Validate dialog wraps a check's
  message). Instructors' servers open
  in the course folder (``COURSE_ROOT``) with Formgrader, which JupyterLab shows in a frame (their
  servers allow frames of the hub's own origin: JupyterHub forbids them by default).
- The exchange is shared as nbgrader documents it for JupyterHub: one folder every user can write
  (``NBGRADER_EXCHANGE``, default ``/srv/nbgrader/exchange``, ``chmod 777``), named in every
  user's nbgrader configuration with the course's id.
- The grading service (``python -m autograder serve``, ``autograder/service/``) runs as a service
  the hub starts and stops, as the hub's user (root: grading's sandbox runs students' code as
  ``nobody``); it grades each submission as it arrives and releases its feedback to that student.
- The proxy is ``configurable-http-proxy`` from ``hub/node_modules`` (``npm ci`` in ``hub/``,
  which ``make hub`` runs). The hub's own database and cookie secret live in ``$HUB_STATE/hub``,
  which only root may enter (default ``HUB_STATE``: ``/srv/attention-hub``, outside the course,
  since every user's server reads its ``jupyter`` and ``python`` folders).

Environment: ``COURSE_ROOT`` (default this repository), ``COURSE_STUDENTS``, ``COURSE_INSTRUCTORS``,
``NBGRADER_EXCHANGE``, ``HUB_STATE``, ``HUB_USER_PYTHON`` (the Python of users' servers, default the hub's),
``HUB_URL`` (default ``http://:8000``: every address, port 8000),
``HUB_API_PORT`` (8081) and ``HUB_PROXY_API_PORT`` (8001).
"""

import json
import os
import shutil
import sys
from pathlib import Path

from autograder.course.bundle import CUSTOM_CSS, INSTRUCTOR_PLUGINS, INSTRUCTOR_SERVER_EXTENSIONS, TOP, bundle_files

c = get_config()  # noqa: F821 - provided by JupyterHub when it loads this file

HERE = Path(__file__).resolve().parent
COURSE = Path(os.environ.get("COURSE_ROOT", HERE.parent)).resolve()
STATE = Path(os.environ.get("HUB_STATE", "/srv/attention-hub")).resolve()
#: The hub's own secrets (its database, cookie secret, the proxy's pid): root's alone.
PRIVATE = STATE / "hub"
#: The public part of ``autograder`` that students' kernels import (the visible checks).
PUBLIC_PYTHON = STATE / "python"
EXCHANGE = os.environ.get("NBGRADER_EXCHANGE", "/srv/nbgrader/exchange")
#: The folder of the style sheet every user's JupyterLab loads (``custom.css``: the student bundle's).
CUSTOM = STATE / "jupyter" / "custom"
COURSE_ID = "attention"
# The Python every user's server and kernels run: the course's environment, which every user must be able to
# read and run (a virtual environment made from a system Python; not one under /root).
USER_PYTHON = Path(os.environ.get("HUB_USER_PYTHON", sys.executable))
BIN = USER_PYTHON.parent


def _names(variable: str) -> set[str]:
    return {name.strip() for name in os.environ.get(variable, "").split(",") if name.strip()}


STUDENTS, INSTRUCTORS = _names("COURSE_STUDENTS"), _names("COURSE_INSTRUCTORS")
if not STUDENTS | INSTRUCTORS:
    raise SystemExit("hub/jupyterhub_config.py: say who may log in: COURSE_STUDENTS=alice,bob COURSE_INSTRUCTORS=prof "
                     "(Linux users of this machine)")

# -- what each role's JupyterLab loads ----------------------------------------------------------

STUDENT_NBGRADER = f"""c = get_config()
c.CourseDirectory.course_id = {COURSE_ID!r}
c.Exchange.root = {EXCHANGE!r}
"""
INSTRUCTOR_NBGRADER = f"""c = get_config()
load_subconfig({str(COURSE / "nbgrader_config.py")!r})  # the course's own settings
c.Exchange.root = {EXCHANGE!r}
"""


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o644)


for role in ("student", "instructor"):
    (STATE / "jupyter" / role).mkdir(parents=True, exist_ok=True)
    for folder in (STATE, STATE / "jupyter", STATE / "jupyter" / role):
        folder.chmod(0o755)  # read by every user's server
PRIVATE.mkdir(mode=0o700, exist_ok=True)
PRIVATE.chmod(0o700)  # made before the database in it: no moment when another user could open it


def _publish_public_package() -> None:
    """Copy the public part of ``autograder`` (what the student bundle holds) to ``PUBLIC_PYTHON``, afresh."""
    shutil.rmtree(PUBLIC_PYTHON, ignore_errors=True)
    prefix = f"{TOP}/"
    for name, source in bundle_files(COURSE).items():
        if name.startswith(f"{prefix}autograder/"):
            _write(PUBLIC_PYTHON / name[len(prefix):], source.read_text(encoding="utf-8"))
    for folder in (PUBLIC_PYTHON, *(p for p in PUBLIC_PYTHON.rglob("*") if p.is_dir())):
        folder.chmod(0o755)


_publish_public_package()
_write(STATE / "jupyter" / "student" / "nbgrader_config.py", STUDENT_NBGRADER)
_write(STATE / "jupyter" / "student" / "labconfig" / "page_config.json",
       json.dumps({"disabledExtensions": {plugin: True for plugin in INSTRUCTOR_PLUGINS}}, indent=2))
# nbgrader's Validate dialog shows a failed check's message in a <pre> that does not wrap, so its one long line ran
# past the dialog's right edge: every user's JupyterLab loads the student bundle's style sheet, which wraps it
# (JupyterLab's custom CSS, from the folder its web application is told: ServerApp.static_custom_path is not a setting).
_write(CUSTOM / "custom.css", CUSTOM_CSS)
CUSTOM.chmod(0o755)
_write(STATE / "jupyter" / "student" / "jupyter_server_config.json", json.dumps({
    "ServerApp": {"jpserver_extensions": {ext: False for ext in INSTRUCTOR_SERVER_EXTENSIONS},
                  "tornado_settings": {"static_custom_path": [str(CUSTOM)]}},
    "LabApp": {"custom_css": True}}, indent=2))
_write(STATE / "jupyter" / "instructor" / "nbgrader_config.py", INSTRUCTOR_NBGRADER)
# Formgrader is a frame in JupyterLab: the instructor's server allows frames of its own origin (JupyterHub 4.1+ sends
# frame-ancestors 'none' to every user's server). Students' servers keep the hub's default.
_write(STATE / "jupyter" / "instructor" / "jupyter_server_config.json", json.dumps({
    "ServerApp": {"tornado_settings": {"headers": {"Content-Security-Policy": "frame-ancestors 'self'"},
                                       "static_custom_path": [str(CUSTOM)]}},
    "LabApp": {"custom_css": True}}, indent=2))

# -- the hub -----------------------------------------------------------------------------------

c.JupyterHub.bind_url = os.environ.get("HUB_URL", "http://:8000")
c.JupyterHub.hub_bind_url = f"http://127.0.0.1:{os.environ.get('HUB_API_PORT', '8081')}"
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{os.environ.get('HUB_PROXY_API_PORT', '8001')}"
c.ConfigurableHTTPProxy.command = [str(HERE / "node_modules" / ".bin" / "configurable-http-proxy")]
c.ConfigurableHTTPProxy.pid_file = str(PRIVATE / "proxy.pid")
c.JupyterHub.db_url = f"sqlite:///{PRIVATE / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(PRIVATE / "jupyterhub_cookie_secret")

c.Authenticator.allowed_users = STUDENTS | INSTRUCTORS
c.Authenticator.admin_users = INSTRUCTORS

c.Spawner.cmd = [str(USER_PYTHON), "-m", "jupyterhub.singleuser"]
c.Spawner.default_url = "/lab"
c.Spawner.http_timeout = 120  # a loaded machine starts JupyterLab slowly
c.Spawner.start_timeout = 120
c.Spawner.environment = {"NBGRADER_EXCHANGE": EXCHANGE, "PATH": f"{BIN}:/usr/local/bin:/usr/bin:/bin",
                         "PYTHONWARNINGS": "ignore"}


def pre_spawn_hook(spawner) -> None:
    """Each role's configuration; an instructor's server opens in the course folder."""
    role = "instructor" if spawner.user.name in INSTRUCTORS else "student"
    # The role's settings first; then the course environment's own (JupyterLab's server extension, nbgrader's),
    # which a users' Python other than the hub's would not find by itself.
    spawner.environment["JUPYTER_CONFIG_PATH"] = os.pathsep.join([str(STATE / "jupyter" / role),
                                                                  str(Path(sys.prefix) / "etc" / "jupyter")])
    spawner.environment["JUPYTER_PATH"] = str(Path(sys.prefix) / "share" / "jupyter")
    if role == "instructor":
        spawner.notebook_dir = str(COURSE)
    else:  # the visible checks' package; the course's own (its hidden checks too) is in a folder students cannot enter
        spawner.environment["PYTHONPATH"] = str(PUBLIC_PYTHON)


c.Spawner.pre_spawn_hook = pre_spawn_hook

c.JupyterHub.services = [{
    "name": "grading",
    "command": [sys.executable, "-m", "autograder", "serve", "--course", str(COURSE), "--exchange", EXCHANGE],
    "cwd": str(COURSE),
    "environment": {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "NBGRADER_EXCHANGE": EXCHANGE,
                    "PYTHONWARNINGS": "ignore"},
}]
