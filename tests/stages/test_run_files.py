"""The files a training run writes into its folder (metrics.jsonl, run.json, curves.html,
diagnosis.json, latest) are never written through a link, and anything but a regular file at their
names stops the run with one line before any model is built; Ctrl-C while the command still imports
torch is one line too.

A run folder is a folder a person also uses: a symbolic or hard link there names a file of theirs
that the run must leave as it was.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from command_lines import torch_is_loading

from rlhf_helpers.ppo.metrics import append_jsonl, write_curves, write_replacing
from rlhf_helpers.stages import train_ppo
from rlhf_helpers.stages.run_files.run_folder import SetupError, check_run_files

pytestmark = pytest.mark.skipif(os.name == "nt", reason="links and signals are POSIX here")

REPO = Path(__file__).resolve().parents[2]
NOTES = "my notes: do not lose them\n"
PROG = "python -m rlhf_helpers.stages.train_ppo"
TINY = {"rollout_batch_size": 8, "mini_batch_size": 4, "max_new_tokens": 8, "ppo_epochs": 1,
        "n_eval_prompts": 8}
ROWS = [{"step": 1, "score": 0.5}, {"step": 2, "score": float("nan")}]


def users_file(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text(NOTES)
    return path


def symlink(path: Path, notes: Path) -> None:
    path.symlink_to(notes)


def hard_link(path: Path, notes: Path) -> None:
    os.link(notes, path)


def folder(path: Path, notes: Path) -> None:
    path.mkdir()
    (path / "keep.txt").write_text(NOTES)


BAD = {"symlink": (symlink, "a symbolic link"), "hard link": (hard_link, "a hard link"),
       "folder": (folder, "a folder")}


def untouched(path: Path, notes: Path, case: str) -> bool:
    """The user's file keeps its bytes, and what stood at `path` is still there."""
    kept = {
        "symlink": path.is_symlink,
        "hard link": lambda: os.stat(notes).st_nlink == 2,
        "folder": lambda: (path / "keep.txt").read_text() == NOTES,
    }[case]()
    return notes.read_text() == NOTES and kept


# ---------------------------------------------------------------- the check before the run
@pytest.mark.parametrize("case", sorted(BAD))
@pytest.mark.parametrize("name",
                         ["metrics.jsonl", "run.json", "curves.html", "diagnosis.json", "latest"])
def test_a_run_file_that_is_no_regular_file_of_one_name_is_refused_naming_it(tmp_path, name, case):
    notes, out = users_file(tmp_path), tmp_path / "run"
    out.mkdir()
    make, words = BAD[case]
    make(out / name, notes)
    with pytest.raises(SetupError) as refused:
        check_run_files(out,
                        ["run.json", "metrics.jsonl", "curves.html", "diagnosis.json", "latest"])
    message = str(refused.value)
    assert ("\n" not in message and str(out / name) in message
            and words in message.replace(str(tmp_path), ""))
    assert untouched(out / name, notes, case)


def test_absent_and_regular_run_files_pass(tmp_path):
    (tmp_path / "run.json").write_text("{}")
    check_run_files(tmp_path, ["run.json", "metrics.jsonl"])


@pytest.fixture
def cli(tmp_path, monkeypatch):
    """In-process `main()` on tiny settings; building a model fails the test (the refusal must come
    first)."""
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", json.dumps(TINY))
    monkeypatch.setenv("RLHF_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setattr(train_ppo, "ensure_reward_model", lambda *args, **kwargs: None)
    monkeypatch.setattr(train_ppo, "build_shared_model", lambda *a,
                        **k: pytest.fail("built before the refusal"))
    return tmp_path


def refusal(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as refused:
        train_ppo.main(["--profile", "tiny", "--steps", "2", "--no-progress", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert refused.value.code == 2 and len(err) == 1, err
    return err[0]


@pytest.mark.parametrize(
    "name, case",
    [
        ("metrics.jsonl", "symlink"),
        ("metrics.jsonl", "folder"),
        ("run.json", "folder"),
        ("curves.html", "hard link"),
        ("diagnosis.json", "symlink"),
    ],
)
def test_the_training_command_refuses_such_a_file_in_one_line_with_exit_2(cli, capsys, name, case):
    """Before: the run wrote through the link (the user's file became the metrics), or ended with
    exit 1 and an IsADirectoryError traceback after the model was built."""
    notes, out = users_file(cli), cli / "ppo"
    out.mkdir()
    make, words = BAD[case]
    make(out / name, notes)
    line = refusal(["--output-dir", str(out)], capsys)
    assert line.startswith(f"{PROG}: error: {out / name} is {words}")
    assert untouched(out / name, notes, case)


def test_a_resumed_run_refuses_a_metrics_file_that_is_a_folder(cli, capsys):
    from rlhf_helpers.runtime.profiles import get_profile
    from rlhf_helpers.stages.resume import run_record

    out = cli / "ppo"
    (out / "step-000001").mkdir(parents=True)
    (out / "latest").write_text("step-000001\n")
    profile = get_profile("tiny")
    (out / "run.json").write_text(
        json.dumps(run_record(profile, profile.ppo, cli / "reward", 64, 1), default=str))
    (out / "metrics.jsonl").mkdir()
    line = refusal(["--resume", "--steps", "3", "--output-dir", str(out)], capsys)
    assert line.startswith(f"{PROG}: error: {out / 'metrics.jsonl'} is a folder")


RUN_NAMES = ["run.json", "metrics.jsonl", "curves.html", "diagnosis.json", "latest"]


@pytest.mark.parametrize("name", RUN_NAMES)
def test_a_new_run_refuses_a_folder_holding_an_earlier_runs_file(tmp_path, name):
    """Before: a run stopped before its first checkpoint (or a person's copy of its files) left
    run.json, metrics.jsonl...; a new run into that folder passed and overwrote them all, exit 0."""
    from rlhf_helpers.stages.train_setup import check_folder_holds

    out = tmp_path / "run"
    out.mkdir()
    (out / name).write_text(NOTES)
    with pytest.raises(SetupError) as refused:
        check_folder_holds(False, out)
    message = str(refused.value)
    assert ("\n" not in message and message.startswith(f"{out} already holds {name} ")
            and "choose another --output-dir, or remove those files" in message)
    assert (out / name).read_text() == NOTES
    # --resume with no checkpoint keeps its own line (a bare `latest` is judged by the resume)
    if name != "latest":
        with pytest.raises(SetupError, match=r"^--resume: no checkpoint found in "):
            check_folder_holds(True, out)


def test_a_new_run_names_every_run_file_it_finds_and_passes_an_empty_folder(tmp_path):
    from rlhf_helpers.stages.train_setup import check_folder_holds

    check_folder_holds(False, tmp_path)  # empty
    (tmp_path / "my-notes.txt").write_text(NOTES)  # not the run's
    check_folder_holds(False, tmp_path)
    for name in ("run.json", "metrics.jsonl", "curves.html"):
        (tmp_path / name).write_text(NOTES)
    with pytest.raises(SetupError, match="holds run.json, metrics.jsonl, curves.html "):
        check_folder_holds(False, tmp_path)


def test_the_training_command_refuses_an_earlier_runs_files_with_exit_2(cli, capsys):
    out = cli / "ppo"
    out.mkdir()
    for name in ("run.json", "metrics.jsonl", "curves.html"):
        (out / name).write_text(NOTES)
    line = refusal(["--output-dir", str(out)], capsys)
    assert line.startswith(f"{PROG}: error: {out} already holds run.json, metrics.jsonl, "
                           "curves.html ")
    assert all((out / name).read_text() == NOTES
               for name in ("run.json", "metrics.jsonl", "curves.html"))


@pytest.mark.parametrize("resume", [False, True])
def test_a_persons_step_folder_is_refused_by_name_before_any_model(tmp_path, resume):
    """Before: a new run passed a folder holding a person's step-000001/ (not a checkpoint), and
    its first save moved that folder aside and deleted it, exit 0."""
    from rlhf_helpers.stages.train_setup import check_folder_holds

    out = tmp_path / "run"
    (out / "step-000001").mkdir(parents=True)
    (out / "step-000001" / "x.txt").write_text(NOTES)
    (out / "notes.txt").write_text(NOTES)
    if resume:  # the checkpoint `latest` names is left to the resume's own check
        (out / "step-000002").mkdir()
        (out / "latest").write_text("step-000002\n")
    with pytest.raises(SetupError) as refused:
        check_folder_holds(resume, out)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(
        f"{out / 'step-000001'} is not a checkpoint of this run (a folder holding none of a "
        "checkpoint's files)")
    assert message.endswith("Move it away, or choose another output folder")
    assert (out / "step-000001" / "x.txt").read_text() == NOTES
    (out / "step-000001").rename(tmp_path / "moved-away")
    check_folder_holds(resume, out)  # what the message asks for: the folder passes


def test_the_training_command_refuses_a_persons_step_folder_with_exit_2(cli, capsys):
    out = cli / "ppo"
    (out / "step-000001").mkdir(parents=True)
    (out / "step-000001" / "x.txt").write_text(NOTES)
    line = refusal(["--output-dir", str(out)], capsys)
    assert line.startswith(f"{PROG}: error: {out / 'step-000001'} is not a checkpoint of this run")
    assert (out / "step-000001" / "x.txt").read_text() == NOTES


# ---------------------------------------------------------------- the writers themselves
@pytest.mark.parametrize("case", ["symlink", "hard link"])
def test_appending_metrics_never_writes_through_a_link(tmp_path, case):
    """A link made after the check (while the model is built): the append is refused, the file
    kept."""
    notes = users_file(tmp_path)
    BAD[case][0](tmp_path / "metrics.jsonl", notes)
    with pytest.raises(OSError, match="link"):
        append_jsonl(tmp_path / "metrics.jsonl", ROWS)
    assert untouched(tmp_path / "metrics.jsonl", notes, case)


@pytest.mark.parametrize("case", ["symlink", "hard link"])
def test_whole_files_replace_a_link_instead_of_writing_through_it(tmp_path, case):
    notes = users_file(tmp_path)
    for name, write in [
        ("metrics.jsonl", lambda p: append_jsonl(p, ROWS, mode="w")),
        ("run.json", lambda p: write_replacing(p, '{"profile": {}}\n')),
        ("curves.html", lambda p: write_curves(ROWS, p)),
    ]:
        BAD[case][0](tmp_path / name, notes)
        write(tmp_path / name)
        path = tmp_path / name
        assert (notes.read_text() == NOTES and not path.is_symlink()
                and os.stat(path).st_nlink == 1), name
    assert [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        {"step": 1, "score": 0.5},
        {"step": 2, "score": None},
    ]
    assert "plotly" in (tmp_path / "curves.html").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["curves.html", "metrics.jsonl",
                                                          "notes.txt", "run.json"]


def test_appending_keeps_what_is_there(tmp_path):
    path = tmp_path / "metrics.jsonl"
    append_jsonl(path, ROWS[:1], mode="w")
    append_jsonl(path, ROWS[1:])
    assert path.read_text() == '{"step": 1, "score": 0.5}\n{"step": 2, "score": null}\n'


# ---------------------------------------------------------------- Ctrl-C during the imports

@pytest.mark.skipif(not Path("/proc/self/maps").exists(),
                    reason="reads /proc to see torch being imported")
def test_ctrl_c_while_the_command_imports_torch_is_one_line_and_exit_130(tmp_path):
    """Before: a 33-line KeyboardInterrupt traceback out of `import torch`."""
    out = tmp_path / "run"
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               RLHF_RUNS_DIR=str(tmp_path / "runs"))
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rlhf_helpers.stages.train_ppo",
            "--profile",
            "tiny",
            "--no-progress",
            "--output-dir",
            str(out),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while (not torch_is_loading(process.pid) and process.poll() is None
           and time.monotonic() < deadline):
        time.sleep(0.005)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "Traceback" not in err and err.strip().splitlines() == [err.strip()], err
    assert err.strip().endswith("nothing was written") and not out.exists()
