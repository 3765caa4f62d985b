"""The commands' torch thread count: one by default, `--threads N` otherwise, a bad count
refused."""

from __future__ import annotations

import os

import pytest
import torch

from rlhf_helpers.runtime.threads import DEFAULT_THREADS, use_threads


@pytest.fixture
def threads_restored():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_use_threads_sets_torchs_count_and_defaults_to_one(threads_restored):
    assert DEFAULT_THREADS == 1
    assert use_threads(2) == 2 and torch.get_num_threads() == 2
    assert use_threads(None) == 1 and torch.get_num_threads() == 1


@pytest.mark.parametrize("bad", [0, -1, 1.5, "2", True])
def test_use_threads_refuses_what_is_not_a_whole_number_from_one(bad, threads_restored):
    before = torch.get_num_threads()
    with pytest.raises(ValueError, match=r"--threads must be a whole number >= 1, got"):
        use_threads(bad)
    assert torch.get_num_threads() == before


def test_both_commands_take_threads_and_refuse_zero_with_exit_2(tmp_path, monkeypatch, capsys):
    from rlhf_helpers.stages import reward, train_ppo

    monkeypatch.setenv("RLHF_RUNS_DIR", str(tmp_path / "runs"))
    assert train_ppo.parse_args(["--threads", "2"]).threads == 2
    assert train_ppo.parse_args([]).threads is None  # not given: DEFAULT_THREADS
    for main in (train_ppo.main,
                 lambda argv: reward.main(["--out", str(tmp_path / "reward"), *argv])):
        with pytest.raises(SystemExit) as stopped:
            main(["--threads", "0"])
        assert stopped.value.code == 2
        assert "--threads must be >= 1, got 0" in capsys.readouterr().err
    # nothing built or written
    assert not (tmp_path / "runs").exists() and not (tmp_path / "reward").exists()


def test_the_most_threads_is_the_cpus_this_process_may_use(threads_restored, monkeypatch):
    """One thread per CPU at most: a thread beyond them only waits for a core."""
    from rlhf_helpers.runtime import threads

    assert threads.max_threads() >= 1
    monkeypatch.setattr(threads, "max_threads", lambda: 4)
    assert threads.threads_problem(4) is None and use_threads(4) == 4
    assert threads.threads_problem(5).startswith(
        "--threads must be at most 4, the CPUs this process may use, got 5")
    before = torch.get_num_threads()
    with pytest.raises(ValueError, match="--threads must be at most 4"):
        use_threads(100000)
    assert torch.get_num_threads() == before


def test_both_commands_refuse_more_threads_than_cpus_in_one_line(tmp_path, monkeypatch, capsys):
    """Before: `--threads 100000` passed the flag's check and the process died in the OpenMP
    runtime (exit 139, a segmentation fault) once torch started its threads."""
    from rlhf_helpers.stages import reward, train_ppo

    def no_threads(count):  # what crashed the process: never reached now
        raise AssertionError(f"torch was handed {count} threads")

    monkeypatch.setattr(torch, "set_num_threads", no_threads)
    monkeypatch.setenv("RLHF_RUNS_DIR", str(tmp_path / "runs"))
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    assert train_ppo.parse_args(["--threads", str(cpus)]).threads == cpus
    for main in (train_ppo.main,
                 lambda argv: reward.main(["--out", str(tmp_path / "reward"), *argv])):
        for count in (str(cpus + 1), "100000"):
            with pytest.raises(SystemExit) as stopped:
                main(["--threads", count])
            assert stopped.value.code == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1, err  # one line, no usage
            assert f"--threads must be at most {cpus}" in err[0] and f"got {count}" in err[0]
    assert not (tmp_path / "runs").exists() and not (tmp_path / "reward").exists()
