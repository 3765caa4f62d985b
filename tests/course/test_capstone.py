"""Notebook 08's check (rlhf_helpers.course.capstone) on the toy world: the worked solution as a
plain loop (course.capstone_reference) matches the library's iteration using a small share of the
rounding budget, while a subtle bug exceeds it; each plausible mistake is named with its cause; each
mistake "break your iteration" injects gives the check's message for that cause; the stretch goal's
early stop is checked against the library run for the kept epochs; the runs leave the model and the
RNG as they were, and a pass belongs to the function objects that passed."""

from __future__ import annotations

import functools

import pytest
import torch
from toy_world import TOY_WORDS, toy_causal_lm, toy_tokenizer
from transformers import GPT2Config

from rlhf_helpers.course import capstone
from rlhf_helpers.course.capstone_breaks import BREAKS, break_iteration, check_message
from rlhf_helpers.course.capstone_reference import plain_iteration
from rlhf_helpers.course.capstone_stretch import kl_stop_case, kl_stop_difference, stop_rule
from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel
from rlhf_helpers.runtime.lora import LoRASpec
from rlhf_helpers.runtime.ppo_config import PPOConfig

#: every setting at a value of its own, as in the notebook's check
CONFIG = PPOConfig(rollout_batch_size=8, mini_batch_size=4, ppo_epochs=2, max_prompt_length=6,
                   max_new_tokens=8, temperature=0.7, kl_coef=0.15, gamma=0.95, lam=0.9,
                   clip_eps=0.25, value_clip=0.3, vf_coef=0.6,
                   max_grad_norm=1e6, lora=LoRASpec(r=4, alpha=8), progress_bar=False)
PROMPTS = [" ".join(TOY_WORDS[i : i + 3]) for i in range(8)]
SEEDS, LRS = (3, 4), (2.0, 0.05)


@pytest.fixture(scope="module")
def world():
    """A toy shared model whose policy adapter has moved away from the reference, and the library's
    two runs."""
    torch.set_num_threads(1)
    tok = toy_tokenizer()
    model = SharedLoRAModel(toy_causal_lm(tok, seed=0), pad_token_id=tok.pad_token_id,
                            eos_token_id=tok.eos_token_id, seed=0, lora=CONFIG.lora)
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for param in model.policy_parameters():
            param.add_(0.1 * torch.randn(param.shape, generator=g))
    free = capstone.run_iteration(
        capstone.library_iteration, model, tok, PROMPTS, CONFIG, SEEDS, LRS)
    clipped_config = CONFIG.replace(max_grad_norm=0.5
                                    * min(free.step_norms["policy"] + free.step_norms["value"]))
    clipped = capstone.run_iteration(capstone.library_iteration, model, tok, PROMPTS,
                                     clipped_config, SEEDS, LRS)
    return model, tok, {"free": (CONFIG, free), "clipped": (clipped_config, clipped)}


def run_plain(world, setting, mistake=None):
    model, tok, runs = world
    config, expected = runs[setting]
    got = capstone.run_iteration(functools.partial(plain_iteration, mistake=mistake), model, tok,
                                 PROMPTS, config, SEEDS, LRS)
    return got, expected, config, capstone.rounding_rtol(model, config)


@pytest.mark.parametrize("setting", ["free", "clipped"])
def test_a_plain_loop_matches_the_library_well_inside_the_rounding_budget(world, setting):
    got, expected, config, rtol = run_plain(world, setting)
    assert capstone.first_difference(got, expected, config, rtol) is None
    # a margin of 20 at least
    assert capstone.first_difference(got, expected, config, rtol / 20) is None
    assert len(expected.losses) == 4 and expected.experience["old_logprobs"].abs().sum() > 0


def test_an_update_left_out_is_named_even_for_a_matrix_that_barely_moves(world):
    """The weights' check is relative to each matrix's own change (plus the float32 spacing of its
    weights), so a learner's step that skips a matrix is caught even where that matrix moves 10^4
    times less than the head."""
    got, expected, config, rtol = run_plain(world, "free")
    sizes = [float(update.abs().max()) for update in expected.updates["value"]]
    smallest = min(range(len(sizes)), key=sizes.__getitem__)
    assert 0 < sizes[smallest] < 1e-3 * max(sizes)  # a LoRA A whose B started at 0
    got.updates["value"][smallest] = torch.zeros_like(got.updates["value"][smallest])
    problem = capstone.first_difference(got, expected, config, rtol)
    assert problem is not None and "the value adapter's weights after the update differ" in problem


@pytest.mark.parametrize(("mistake", "setting", "named"), [
    ("kl_sign", "free", "the KL penalty has the wrong sign"),
    ("k3", "free", "your penalty is k3"),
    ("no_whitening", "free", "not whitened"),
    ("biased_variance", "free", "your variance divides by n"),
    ("ratio_ref", "free", "against the reference's log-probs"),
    ("update_temperature", "free", "your update's log-probs are at temperature 1"),
    ("detach", "free", "your norm is exactly half the library's: a .detach() on one branch"),
    ("no_zero_grad", "free", "larger: gradients left over from an earlier minibatch"),
    ("no_vf_coef", "free", "with weight 1: scale it by config.vf_coef"),
    ("vf_coef_0.5", "free", "with weight 0.5: scale it by config.vf_coef"),
    ("logged_vf_coef", "free", "your logged value loss is config.vf_coef (0.6) x L^V"),
    ("band_0.2", "free", "clip(rho, 1 - config.clip_eps, 1 + config.clip_eps)"),
    ("one_shuffle", "free", "fresh shuffle"),
    ("joint_clip", "clipped", "one clip over both adapters"),
])
def test_each_mistake_is_named_with_its_cause(world, mistake, setting, named):
    got, expected, config, rtol = run_plain(world, setting, mistake)
    problem = capstone.first_difference(got, expected, config, rtol)
    assert problem is not None and named in problem, problem


def test_the_worked_solution_uses_a_small_share_of_the_budget_and_a_biased_variance_exceeds_it(
        world):
    """The budget is a budget: the worked solution's largest difference is a few percent of it at
    most, while the subtlest real bug tried, a variance divided by n in the whitening, exceeds it
    several times over (it moves every advantage by a factor sqrt(n / (n - 1)), n the batch's
    real tokens)."""
    got, expected, config, rtol = run_plain(world, "free")
    assert capstone.budget_used(got, expected, config, rtol) < 0.05
    biased, *_ = run_plain(world, "free", "biased_variance")
    n = int(expected.mask.sum())
    assert capstone.budget_used(biased, expected, config, rtol) >= (
        (n / (n - 1)) ** 0.5 - 1) / rtol > 3


@pytest.mark.parametrize(("mistake", "said"), [
    ("no zero_grad", "larger: gradients left over from an earlier minibatch"),
    ("half the policy gradient", "your norm is exactly half the library's"),
    ("reference as old", "your old_logprobs are the reference's"),
    ("update at temperature 1", "your update's log-probs are at temperature 1"),
    ("vf_coef in the logged value loss", "your logged value loss is config.vf_coef"),
])
def test_each_injected_mistake_gets_the_checks_message_for_its_cause(world, mistake, said):
    model, tok, runs = world
    config, expected = runs["free"]
    message = check_message(break_iteration(plain_iteration, mistake), model, tok, PROMPTS, config,
                            SEEDS, LRS, expected, capstone.rounding_rtol(model, config))
    assert said in message, message
    # the working iteration, unbroken, passes; the model's methods are its own again
    assert check_message(plain_iteration, model, tok, PROMPTS, config, SEEDS, LRS, expected,
                         capstone.rounding_rtol(model, config)).startswith("no difference")
    assert "policy_logprobs" not in vars(model)
    assert set(BREAKS) >= {mistake}


def test_a_failing_iteration_gives_its_error_as_the_message(world):
    model, tok, runs = world
    config, expected = runs["free"]

    def raises(*_):
        raise RuntimeError("Trying to backward through the graph a second time")

    assert check_message(raises, model, tok, PROMPTS, config, SEEDS, LRS, expected, 1e-4) == (
        "RuntimeError: Trying to backward through the graph a second time")


@pytest.fixture(scope="module")
def kl_case(world):
    model, tok, _ = world
    return kl_stop_case(model, tok, PROMPTS, CONFIG.replace(ppo_epochs=3), SEEDS, LRS)


def test_the_early_stop_keeps_fewer_epochs_than_all_at_a_threshold_clear_of_both_sides(kl_case):
    ends = kl_case.end_kls
    assert kl_case.epochs_kept < kl_case.full_epochs == 3
    stop = kl_case.epochs_kept - 1
    assert ends[stop] > 1.2 * kl_case.stop_kl and max(ends[:stop]) < kl_case.stop_kl / 1.2
    assert len(kl_case.expected.losses) == 2 * kl_case.epochs_kept  # 8 rows, minibatches of 4


def test_the_stop_rule_stands_clear_of_every_value_and_falls_back_to_the_first_epoch():
    assert stop_rule([0.01, 0.09, 0.2]) == (1, pytest.approx(0.03))  # sqrt(0.01 x 0.09)
    assert stop_rule([0.01, 0.05, 0.06, 0.5]) == (1, pytest.approx((0.01 * 0.05) ** 0.5))
    assert stop_rule([0.05, 0.05, 0.06]) == (0, 0.025)  # no later epoch stands clear
    assert stop_rule([0.05, 0.09]) == (0, 0.025)  # the last epoch cannot be the one that stops
    with pytest.raises(ValueError, match="at least 2 epochs"):
        stop_rule([0.05])


def test_the_worked_early_stop_matches_the_library_run_for_the_kept_epochs(world, kl_case):
    model, tok, _ = world
    rtol = capstone.rounding_rtol(model, CONFIG)
    full = kl_case.config.replace(ppo_epochs=kl_case.full_epochs)
    got = capstone.run_iteration(functools.partial(plain_iteration, stop_kl=kl_case.stop_kl),
                                 model, tok, PROMPTS, full, SEEDS, LRS)
    assert kl_stop_difference(got, kl_case, rtol) is None


@pytest.mark.parametrize(("mistake", "named"), [
    (None, "you never stopped"),  # no stop_kl: every epoch
    ("stop_k1", "the approx-KL is k3"),  # k1 = mean(-log rho) stays below the threshold here
])
def test_each_early_stop_mistake_is_named(world, kl_case, mistake, named):
    model, tok, _ = world
    full = kl_case.config.replace(ppo_epochs=kl_case.full_epochs)
    stop = None if mistake is None else kl_case.stop_kl
    got = capstone.run_iteration(functools.partial(plain_iteration, mistake=mistake, stop_kl=stop),
                                 model, tok, PROMPTS, full, SEEDS, LRS)
    problem = kl_stop_difference(got, kl_case, capstone.rounding_rtol(model, CONFIG))
    assert problem is not None and named in problem, problem


def test_gradients_left_by_an_earlier_run_do_not_reach_the_next(world):
    """The library zeroes gradients after each step, a learner's loop before each backward pass:
    whatever ran before, every recorded run starts without gradients, so a check passes or fails
    the same in any run order."""
    model, tok, runs = world
    config, expected = runs["free"]
    for param in model.policy_parameters() + model.value_parameters():
        param.grad = torch.ones_like(param)
    again = capstone.run_iteration(capstone.library_iteration, model, tok, PROMPTS, config, SEEDS,
                                   LRS)
    assert torch.equal(again.losses, expected.losses)
    assert again.step_norms == expected.step_norms
    # the run was on a copy: the caller's model, gradients included, is as the caller left it
    assert all(torch.equal(param.grad, torch.ones_like(param))
               for param in model.policy_parameters())
    for param in model.policy_parameters() + model.value_parameters():
        param.grad = None


def test_run_iteration_leaves_the_weights_and_the_rng_as_they_were(world):
    model, tok, _ = world
    weights = [p.detach().clone() for p in model.policy_parameters() + model.value_parameters()]
    state = torch.random.get_rng_state()
    record = capstone.run_iteration(plain_iteration, model, tok, PROMPTS, CONFIG, SEEDS, LRS)
    assert torch.equal(torch.random.get_rng_state(), state)
    for param, weight in zip(model.policy_parameters() + model.value_parameters(),
                             weights, strict=True):
        assert torch.equal(param.detach(), weight)
    assert len(record.step_norms["policy"]) == len(record.step_norms["value"]) == 4
    assert any(bool(update.abs().sum() > 0) for update in record.updates["policy"])


def test_the_rounding_budget_counts_the_roundings_of_the_longest_path():
    tiny = GPT2Config(n_embd=128, n_layer=3, n_head=4, vocab_size=403)

    class Stub:
        lm = type("LM", (), {"config": tiny})()
        compute_dtype = torch.float32

    config = PPOConfig(max_prompt_length=16, max_new_tokens=40)
    # norms, qkv, score, softmax/values, proj, mlp
    per_layer = 2 * 128 + 128 + 128 // 4 + 2 * 56 + 128 + 128 + 4 * 128
    # 4547 roundings
    assert capstone.rounding_rtol(Stub(), config) == (3 * per_layer + 2 * 128 + 403) * 2.0**-24
    Stub.compute_dtype = torch.bfloat16
    # the course's 16-bit rule
    assert capstone.rounding_rtol(Stub(), config) >= 8 * torch.finfo(torch.bfloat16).eps


def test_a_pass_belongs_to_the_function_objects_that_passed():
    def f():
        return 1

    passed = capstone.PassedCode()
    assert not passed.holds_for(f=f)
    # the check's in-place guard wraps the learner's function
    passed.record(f=functools.wraps(f)(lambda: f()))
    assert passed.holds_for(f=f)

    def f():  # noqa: F811  # the same code, redefined: another function, not checked yet
        return 1

    assert not passed.holds_for(f=f)


def test_left_out_settings_names_what_the_notebooks_iteration_does_not_implement():
    assert capstone.left_out_settings(PPOConfig()) == []
    assert capstone.left_out_settings(PPOConfig(entropy_coef=0.01, kl_kind="k3")) == [
        "entropy_coef=0.01",
                                                                                     "kl_kind='k3'"]
