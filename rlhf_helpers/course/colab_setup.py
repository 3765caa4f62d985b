"""What the notebooks' Colab set-up cell does: clone the course and install it, keeping Colab's
packages.

The cell (`rlhf_helpers.course.notebook.colab_setup_source`, a Colab form of a few lines) clones the
course, puts the clone on sys.path and imports this module from it before anything is installed:
so it uses the standard library only. The tests call the same function with a local repository in
place of GitHub (tests/course/test_colab_stack.py).
"""

from __future__ import annotations


def install_course(repo_url, ref, clone_dir, upgrade=(), python=None):
    """Clone `repo_url` at branch or tag `ref` into `clone_dir` (unless there), pip-install it
    editable, and return {package: (version before, version after)} for every package that changed.

    Every package already installed is held at its version (a constraints file made from the whole
    `pip freeze`), except the names in `upgrade`, which the course's requirements cannot do with.
    `python` is the interpreter whose environment gets the course (default: this kernel's).
    """
    import os
    import re
    import subprocess
    import sys
    import tempfile

    python = python or sys.executable

    def key(name):  # PEP 503 normalised package name
        return re.sub(r"[-_.]+", "-", name).lower()

    def installed():  # normalised name -> version, from `pip freeze` (editable installs left out)
        frozen = subprocess.run([python, "-m", "pip", "freeze"], capture_output=True, text=True,
                                check=True).stdout
        pins = [re.match(r"^([A-Za-z0-9_.-]+)==(\S+)$", line) for line in frozen.splitlines()]
        return {key(pin[1]): pin[2] for pin in pins if pin}

    if not os.path.isdir(clone_dir):
        subprocess.run(["git", "clone", "--quiet", "--depth", "1", "--branch", ref, repo_url,
                        clone_dir], check=True)
    before = installed()
    movable = {key(name) for name in upgrade}
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as constraints:
        constraints.writelines(f"{name}=={version}\n" for name, version in before.items()
                               if name not in movable)
    # -q -q: errors only (no build-backend chatter); PIP_ROOT_USER_ACTION: no "running as root" note
    done = subprocess.run([python, "-m", "pip", "install", "-q", "-q", "-c", constraints.name,
                           "-e", clone_dir], env={**os.environ, "PIP_ROOT_USER_ACTION": "ignore"})
    os.unlink(constraints.name)
    if done.returncode != 0:
        raise RuntimeError(
            "pip could not install the course while holding the installed packages at "
            f"their versions (all but {sorted(movable)}); see pip's message above")
    after = installed()
    if clone_dir not in sys.path and python == sys.executable:
        sys.path.insert(0, clone_dir)  # this kernel started before the editable install existed
    return {name: (before.get(name), after.get(name))
            for name in sorted(before.keys() | after.keys()) if before.get(name) != after.get(name)}
