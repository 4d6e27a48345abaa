#!/usr/bin/env bash
# Gradescope runs this once, as root, when it builds the autograder's image (Ubuntu). It installs
# what grading needs: a Python the course supports (3.11 to 3.14), bubblewrap (the sandbox of the
# student's code) and the course's exact pins.
#   bash setup.sh --which-python   only says which Python it would use (and installs nothing)
set -euo pipefail

# The image's own Python when the course supports it (Ubuntu 24.04: 3.12; Debian 13: 3.13), else the
# newest supported one installed beside it; empty when none (then it comes from the deadsnakes archive).
which_python() {
    local candidate
    for candidate in python3 python3.14 python3.13 python3.12 python3.11; do
        if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys
sys.exit(not ((3, 11) <= sys.version_info[:2] <= (3, 14) and sys.version_info.releaselevel == "final"))' 2>/dev/null; then
            command -v "$candidate"
            return 0
        fi
    done
}

if [ "${1:-}" = "--which-python" ]; then
    which_python
    exit 0
fi

ROOT="${AUTOGRADER_GRADESCOPE_ROOT:-/autograder}"
SOURCE="$ROOT/source"
VENV="$ROOT/venv"
export DEBIAN_FRONTEND=noninteractive

apt-get update
apt-get install -y --no-install-recommends bubblewrap util-linux ca-certificates
PYTHON="$(which_python)"
if [ -z "$PYTHON" ]; then
    # Ubuntu 22.04 (Python 3.10): a supported Python from the deadsnakes archive.
    apt-get install -y --no-install-recommends software-properties-common gpg-agent
    add-apt-repository -y ppa:deadsnakes/ppa
    apt-get update
    apt-get install -y --no-install-recommends python3.13 python3.13-venv
    PYTHON="$(command -v python3.13)"
fi
# Debian and Ubuntu ship venv apart from Python: the package of the chosen version.
"$PYTHON" -m venv --help >/dev/null 2>&1 && "$PYTHON" -c 'import ensurepip' 2>/dev/null \
    || apt-get install -y --no-install-recommends "python3.$("$PYTHON" -c 'import sys; print(sys.version_info[1])')-venv"
echo "setup.sh: grading with $PYTHON ($("$PYTHON" --version))"

"$PYTHON" -m venv "$VENV"
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
# never the instructor-only part of the package or the private course (gradebook, source notebook).
chmod -R a+rX "$VENV" "$SOURCE/autograder"
chmod 755 "$ROOT" "$SOURCE"
chmod -R go-rwx "$SOURCE/course" $("$VENV/bin/python" -c "import autograder; print(*(f'$SOURCE/autograder/{p}' for p in autograder.INSTRUCTOR_ONLY))")

# matplotlib builds its font list once here instead of in every submission's kernel.
"$VENV/bin/python" -c "import matplotlib.pyplot, nbgrader, torch; print('torch', torch.__version__)"
"$VENV/bin/python" -m autograder.grading.gradescope doctor --root "$ROOT"
