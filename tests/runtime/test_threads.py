"""The commands' torch thread count: one by default, `--threads N` otherwise, a bad count
refused."""

from __future__ import annotations

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
