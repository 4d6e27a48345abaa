#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu). It installs
# what grading needs: Python 3.11, bubblewrap (the sandbox of the student's code) and the course's
# exact pins.
set -euo pipefail

ROOT="${AUTOGRADER_GRADESCOPE_ROOT:-/autograder}"
SOURCE="$ROOT/source"
VENV="$ROOT/venv"
export DEBIAN_FRONTEND=noninteractive

apt-get update
apt-get install -y --no-install-recommends bubblewrap util-linux ca-certificates
# The pins need Python 3.11: Ubuntu 22.04 has only a release candidate of it and 24.04 none, so it
# comes from the deadsnakes archive unless a final 3.11 is already installed.
if ! python3.11 -c 'import sys; sys.exit(sys.version_info.releaselevel != "final")' 2>/dev/null; then
    apt-get install -y --no-install-recommends software-properties-common gpg-agent
    add-apt-repository -y ppa:deadsnakes/ppa
    apt-get update
fi
apt-get install -y --no-install-recommends python3.11 python3.11-venv

python3.11 -m venv "$VENV"
"$VENV/bin/python" -m pip install --quiet --upgrade pip
# The exact pins of pyproject.toml that grading needs (written here by `make gradescope`); torch's CPU
# build when PyTorch's CPU index has that version (a local version such as 2.13.0+cpu meets the pin).
"$VENV/bin/python" -m pip install --quiet --extra-index-url https://download.pytorch.org/whl/cpu \
    @PINS@
# Pulled in by jupyter-events, it builds ~35 parsers whenever nbformat is imported (2 s of CPU in
# every grading); no notebook schema uses the format it checks, and jsonschema skips it without it.
"$VENV/bin/python" -m pip uninstall --quiet --yes rfc3987-syntax

# The grader and the student's kernel import the course's package from $SOURCE (no copy elsewhere).
PURELIB="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$SOURCE" > "$PURELIB/attention-course.pth"

# Without bubblewrap the student's code runs as `nobody`: it may read Python and the public checks,
# never the hidden checks, the pipeline or the private course (gradebook, source notebook).
chmod -R a+rX "$VENV" "$SOURCE/autograder"
chmod 755 "$ROOT" "$SOURCE"
chmod -R go-rwx "$SOURCE/autograder/hidden" "$SOURCE/autograder/pipeline" "$SOURCE/course"

# matplotlib builds its font list once here instead of in every submission's kernel.
"$VENV/bin/python" -c "import matplotlib.pyplot, nbgrader, torch; print('torch', torch.__version__)"
"$VENV/bin/python" -m autograder.pipeline.gradescope doctor --root "$ROOT"
