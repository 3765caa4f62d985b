"""Shared fixtures (seeded random batches of right-padded, variable-length sequences; the toy
trainer), the notebook runs' order, and the run-wide check that no test wrote into the checkout."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from run_folders import ROOT, changes, snapshot

#: The tests are grouped by layer, one folder each (tests/ppo/, ...). A test imports another's
#: module by name (test_site_browser takes test_widgets_browser's fixtures) from any folder.
TEST_FOLDERS = sorted(p for p in Path(__file__).resolve().parent.iterdir()
                      if p.is_dir() and any(p.glob("test_*.py")))
sys.path.extend(str(folder) for folder in TEST_FOLDERS if str(folder) not in sys.path)

# No test may reach the model hub (the gpu profile's weights "auto" would ask it): offline resolves
# to "gguf"
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# A contradicted teaching claim fails the notebook under the tests; in a learner's kernel it prints
# a note and the notebook goes on (rlhf_helpers.course.claims). Kernels inherit this environment.
os.environ.setdefault("RLHF_STRICT_CLAIMS", "1")

#: The checkout's files when the run started (`run_folders.snapshot`)
_CHECKOUT = pytest.StashKey[dict]()

# hypothesis keeps its folder (examples, constants) under build/, not in the checkout (Colab's stack
# lacks it)
try:
    from hypothesis.configuration import set_hypothesis_home_dir
except ImportError:
    pass
else:
    set_hypothesis_home_dir(ROOT / "build" / "hypothesis")


def right_padded_mask(lengths: torch.Tensor, T: int,
                      dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(B,) lengths -> (B, T) mask with ones on the first lengths[b] positions of row b."""
    return (torch.arange(T)[None, :] < lengths[:, None]).to(dtype)


def random_batch(
    B: int,
    T: int,
    seed: int = 0,
    min_len: int = 1,
    dtype: torch.dtype = torch.float64,
    pad_value: float = 0.0,
) -> dict[str, torch.Tensor]:
    """A seeded batch: lengths (B,) in [min_len, T], mask (B, T), and three (B, T) normal tensors
    `x`, `y`, `z` (for rewards, values, log-prob noise...), whose padded positions hold `pad_value`
    (use a large one to prove that padding is ignored)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(min_len, T + 1, (B,), generator=gen)  # (B,)
    mask = right_padded_mask(lengths, T, dtype)  # (B, T)
    out = {"lengths": lengths, "mask": mask}
    for name in ("x", "y", "z"):
        data = torch.randn(B, T, generator=gen, dtype=dtype)  # (B, T)
        out[name] = torch.where(mask.bool(), data, torch.full_like(data, pad_value))
    return out


@pytest.fixture(scope="session")
def make_batch() -> Callable[..., dict[str, torch.Tensor]]:
    """The `random_batch` factory (session-scoped, so hypothesis tests may use it too)."""
    return random_batch


@pytest.fixture(scope="session")
def make_mask() -> Callable[..., torch.Tensor]:
    """The `right_padded_mask` factory: (lengths (B,), T) -> (B, T) mask."""
    return right_padded_mask


@pytest.fixture
def one_torch_thread():
    """One torch thread for the test (tiny models thrash on a busy 2-core box), restored after."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


#: The toy trainer's settings: 8 prompts of 6 tokens, 8 new tokens, 2 epochs of 2 minibatches, LoRA
#: r 4.
TOY_TRAINER = dict(rollout_batch_size=8, mini_batch_size=4, ppo_epochs=2, max_prompt_length=6,
                   max_new_tokens=8, policy_lr=5e-2, value_lr=5e-2, progress_bar=False, seed=0)
#: Prompts of the toy world (its 12-word vocabulary).
TOY_PROMPTS = ["the movie was", "the film is", "the plot was", "the acting is",
               "the movie is great .",
               "the film was bad .", "the plot is fine", "the acting was good"]


#: PPOTrainer's replaceable maths (`ppo.pieces`): `toy_trainer` passes these to the trainer, not the
#: config.
PIECES = ("shape_rewards_fn", "advantage_fn", "policy_loss_fn", "value_loss_fn", "update_fn")


def toy_trainer(*, init_seed: int = 0, dtype: torch.dtype = torch.float32, prompts=TOY_PROMPTS,
                reward_fn="good_count",
                hidden_score_fn="good_count", ptx_texts=None, tokenizer=None, **config_overrides):
    """A PPOTrainer on the toy world (random 2-layer GPT-2, 12 words): the base in `dtype`, adapters
    and heads initialised from `init_seed`, LoRA r 4 / alpha 8, TOY_TRAINER's settings with
    `config_overrides` (a name in PIECES goes to the trainer). `reward_fn` / `hidden_score_fn`
    default to the toy world's `good_count`."""
    from toy_world import good_count, toy_causal_lm, toy_tokenizer

    from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel
    from rlhf_helpers.ppo.trainer import PPOTrainer
    from rlhf_helpers.runtime.lora import LoRASpec
    from rlhf_helpers.runtime.ppo_config import PPOConfig

    tok = tokenizer or toy_tokenizer()
    lora = LoRASpec(r=4, alpha=8)
    model = SharedLoRAModel(toy_causal_lm(tok, seed=0).to(dtype), pad_token_id=tok.pad_token_id,
                            eos_token_id=tok.eos_token_id, seed=init_seed, lora=lora)
    pieces = {name: config_overrides.pop(name) for name in PIECES if name in config_overrides}
    config = PPOConfig(**{**TOY_TRAINER, "lora": lora, **config_overrides})
    return PPOTrainer(config, model, tok, prompts, reward_fn=good_count if reward_fn == "good_count"
                      else reward_fn, hidden_score_fn=good_count if hidden_score_fn == "good_count"
                      else hidden_score_fn, ptx_texts=ptx_texts, **pieces)


@pytest.fixture
def make_trainer():
    """The toy-trainer factory (`toy_trainer`): one definition for every trainer test; a module
    narrows it by overriding this fixture with its own settings."""
    return toy_trainer


#: The notebook runs' order (fresh-clone CI, tiny profile, on the faster AMD machine: 05 ~200 s and
#: 07 ~215 s when they ran side by side, ~66 s of each in the reward model's training; 06 and 02
#: ~100 s; the others under 40 s). With `-n 2 --maxschedchunk 1` (Makefile) each worker takes the
#: next run when it finishes. 05 goes first and trains the shared reward cache; the other worker
#: meanwhile runs the three notebooks that need no reward model, so 07, 06 and 02 find it built
#: instead of waiting on its lock (or, without one, training it twice). 08 (the capstone, under a
#: minute) runs last: it reuses that reward cache too.
NOTEBOOK_ORDER = ("05_", "01_", "03_", "04_", "07_", "06_", "02_", "08_")
#: $RLHF_NOTEBOOK_ORDER=reversed runs them in the opposite order: the suite must pass in either.
ORDER_ENV = "RLHF_NOTEBOOK_ORDER"


#: 05 and 08 with every worked solution on the shipped profile (~3 min and ~30 s): among the shipped
#: runs, 05 right after the three that need no reward model, so that it finds the reward cache built
#: and still starts early (long ones first), 08 after 08's own shipped run
SHIPPED_WITH_SOLUTIONS = ("test_trains_with_every_worked_solution_as_shipped",
                          {"05_full_ppo": 3.5, "08_ppo_capstone": 7.5})


#: the tiny profile, smaller still: the in-process training command's set-up checks (`quick_cli`)
TINY_CLI = {"rollout_batch_size": 8, "mini_batch_size": 4, "max_new_tokens": 8, "ppo_epochs": 1,
            "n_eval_prompts": 8}


@pytest.fixture
def quick_cli(tmp_path, monkeypatch):
    """In-process `main()` of the training command with TINY_CLI settings and no reward-model
    training; the model build is made to fail loudly, so a check that comes too late (after the
    build) shows up as that failure instead of its own message. Returns the test's folder."""
    import json

    from rlhf_helpers.stages import train_ppo

    torch.set_num_threads(1)
    monkeypatch.setenv("RLHF_PROFILE_OVERRIDES", json.dumps(TINY_CLI))
    monkeypatch.setenv("RLHF_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setattr(train_ppo, "ensure_reward_model", lambda *args, **kwargs: None)

    def no_build(*args, **kwargs):
        raise AssertionError("the model was built before the set-up error was found")

    monkeypatch.setattr(train_ppo, "build_shared_model", no_build)
    return tmp_path


#: 05 under another rounding (~3.5 min): among the shipped runs, after 05 with its solutions
ROUNDING_GUARD_RUN = ("test_claims_hold_under_another_rounding", {"05_full_ppo": 3.6})


def _notebook_rank(item: pytest.Item) -> tuple[int, float]:
    """(0 for a run as shipped, 1 for a solutions run; the notebook's place in NOTEBOOK_ORDER)."""
    stem = item.name.partition("[")[2].rstrip("]")
    for name, places in (SHIPPED_WITH_SOLUTIONS, ROUNDING_GUARD_RUN):
        if getattr(item, "originalname", item.name) == name:
            return 0, places[stem]
    solutions = int("solutions" in item.name)
    place = next((i for i, prefix in enumerate(NOTEBOOK_ORDER) if stem.startswith(prefix)),
                 len(NOTEBOOK_ORDER))
    return solutions, place


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the notebook tests in NOTEBOOK_ORDER, shipped runs first (reversed with
    $RLHF_NOTEBOOK_ORDER=reversed); every other test keeps its order (and comes before them)."""
    notebook = [item for item in items if item.get_closest_marker("notebook")]
    if notebook:
        others = [item for item in items if not item.get_closest_marker("notebook")]
        ordered = sorted(notebook, key=_notebook_rank)
        items[:] = others + (ordered[::-1] if os.environ.get(ORDER_ENV) == "reversed" else ordered)


def pytest_sessionstart(session: pytest.Session) -> None:
    """Record the checkout's files (once per run: in the controller, not in xdist's workers)."""
    if not hasattr(session.config, "workerinput"):
        session.config.stash[_CHECKOUT] = snapshot(ROOT)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run if any test added, changed or removed a file of the checkout outside build/."""
    before = session.config.stash.get(_CHECKOUT, None)
    if before is None:
        return
    written = changes(before, snapshot(ROOT))
    # an interrupted or failed run keeps its own status
    if written and exitstatus == pytest.ExitCode.OK:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        lines = [f"tests wrote into the checkout (only build/ is theirs): {len(written)} "
                 "change(s)", *written[:20]]
        for line in lines:
            if reporter is not None:
                reporter.write_line(line, red=True)
            else:
                print(line)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
