"""The function that passed its check is the function a notebook trains with (course.notebook's
record of passes)."""

from __future__ import annotations

from rlhf_helpers.course.notebook import (
    EXERCISE_FAILED,
    EXERCISE_PASSED,
    checked_function_is,
    exercise_check,
    exercise_outcome,
    learner_pieces,
    trust_learner_function,
)

#: a learner's notebook: the cell defining the function, and the cell holding its check
CELL = "def double(x):\n    return 2 * x\n"
CHECK = "def check_double():\n    assert double(3) == 6, 'double(3) must be 6'\n"


def notebook(tag: str) -> dict:
    """A fresh namespace holding CELL and CHECK, run as a kernel runs cells (one file name per
    cell)."""
    namespace: dict = {}
    exec(compile(CELL, f"<cell-{tag}-1>", "exec"), namespace)
    exec(compile(CHECK, f"<cell-{tag}-2>", "exec"), namespace)
    return namespace


def run_cell(namespace: dict, source: str, filename: str) -> None:
    exec(compile(source, filename, "exec"), namespace)


def test_a_pass_trusts_the_function_that_passed(capsys):
    name = "Exercise 1 (double)"
    ns = notebook("a")
    exercise_check(name, ns["check_double"])
    assert exercise_outcome(name) == EXERCISE_PASSED and checked_function_is(name, ns["double"])
    assert trust_learner_function(name, ns["double"]) == (True, "its check passed")
    capsys.readouterr()


def test_a_function_redefined_after_its_pass_is_not_trusted_until_checked_again(capsys):
    name = "Exercise 2 (double)"
    ns = notebook("b")
    exercise_check(name, ns["check_double"])
    run_cell(ns, "def double(x):\n    return x + x + 1\n", "<cell-b-3>")  # wrong, after the pass
    assert not checked_function_is(name, ns["double"])
    capsys.readouterr()
    trusted, why = trust_learner_function(name, ns["double"])  # checks it again, quietly
    assert not trusted and "redefined after its check" in why and "double(3) must be 6" in why
    assert capsys.readouterr().out == ""  # the check's own line is not printed
    assert exercise_outcome(name) == EXERCISE_FAILED


def test_the_same_cell_run_again_is_the_same_function():
    name = "Exercise 3 (double)"
    ns = notebook("c")
    exercise_check(name, ns["check_double"])
    first = ns["double"]
    run_cell(ns, CELL, "<cell-c-1>")  # the unchanged cell, run again: a new object with equal code
    assert ns["double"] is not first and checked_function_is(name, ns["double"])
    assert trust_learner_function(name, ns["double"]) == (True, "its check passed")


def test_a_redefinition_that_passes_its_check_again_is_trusted(capsys):
    name = "Exercise 4 (double)"
    ns = notebook("d")
    exercise_check(name, ns["check_double"])
    run_cell(ns, "def double(x):\n    return x + x\n", "<cell-d-3>")  # another correct version
    trusted, why = trust_learner_function(name, ns["double"])
    assert trusted and why == "it was redefined after its check; checked again now, it passes"
    assert checked_function_is(name, ns["double"])  # the new one is now the checked one
    assert trust_learner_function(name, ns["double"]) == (True, "its check passed")
    assert capsys.readouterr().out.startswith(EXERCISE_PASSED)  # only the first check printed


def test_a_failed_or_unchecked_exercise_is_not_trusted(capsys):
    ns = notebook("e")
    assert trust_learner_function("Exercise 5 (double)", ns["double"]) == (False,
                                                                           "its check has not run")
    run_cell(ns, "def double(x):\n    return x\n", "<cell-e-3>")
    exercise_check("Exercise 6 (double)", ns["check_double"])
    assert trust_learner_function("Exercise 6 (double)", ns["double"]) == (False,
                                                                           "its check failed")
    run_cell(ns, "def double(x):\n    raise NotImplementedError\n", "<cell-e-4>")
    exercise_check("Exercise 7 (double)", ns["check_double"])
    assert trust_learner_function("Exercise 7 (double)",
                                  ns["double"]) == (False, "its check is not done yet")
    capsys.readouterr()


def test_a_run_takes_the_trusted_pieces_by_name_and_says_whose_each_is(capsys):
    ns = notebook("f")
    exercise_check("Exercise 8 (double)", ns["check_double"])
    run_cell(ns, "def triple(x):\n    return 3 * x\n", "<cell-f-3>")  # defined, never checked
    exercises = {"double_fn": "Exercise 8 (double)", "triple_fn": "Exercise 9 (triple)",
                 "absent_fn": "Exercise 10 (absent)"}  # absent: a deep dive the learner skipped
    pieces, lines = learner_pieces(exercises, ns)
    assert pieces == {"double_fn": ns["double"]}
    assert lines == ["This run trains with your double, and with the library's triple, absent.",
                     "  triple: the library's, because its check has not run",
                     "  absent: the library's, because it is not defined"]
    pieces, lines = learner_pieces({"double_fn": "Exercise 8 (double)"}, ns,
                                   {"double_fn": "fp16 needs the library's"})
    assert (pieces == {} and lines
            == ["This run trains with your code in no piece yet, and with the library's double.",
                                      "  double: the library's, because fp16 needs the library's"])
    # redefined wrong after its pass
    run_cell(ns, "def double(x):\n    return x + x + 1\n", "<cell-f-4>")
    pieces, lines = learner_pieces({"double_fn": "Exercise 8 (double)"}, ns)
    assert pieces == {} and "redefined after its check" in lines[1]
    capsys.readouterr()


def test_same_function_sees_through_decorators_defaults_and_closures():
    """Equal code is not enough: two functions one decorator wrapped share the wrapper's code, a
    default or a closed-over value can differ while the code is equal."""
    from rlhf_helpers.course.exercises import same_function

    source = ("import functools, torch\n"
              "def scale_by(k):\n    def outer(f):\n        @functools.wraps(f)\n"
              "        def wrapper(*a):\n            return k * f(*a)\n        return wrapper\n    "
              "return outer\n@torch.no_grad()\ndef f(x):\n    return {body}\n"
              "def g(x, eps={eps}):\n    return x + eps\n"
              "@scale_by({k})\ndef h(x):\n    return x\n")
    one, same, other_body, other_default, other_closure = ({}, {}, {}, {}, {})
    for ns, body, eps, k in ((one, "x + 1", 0.2, 2), (same, "x + 1", 0.2, 2),
                             (other_body, "x - 1", 0.2, 2),
                             (other_default, "x + 1", 0.3, 2), (other_closure, "x + 1", 0.2, 3)):
        exec(compile(source.format(body=body, eps=eps, k=k), "<cell>", "exec"), ns)
    assert all(same_function(one[n], same[n]) for n in "fgh")  # the same cell run again
    # torch.no_grad's wrapper: same code, other function
    assert not same_function(one["f"], other_body["f"])
    assert not same_function(one["g"], other_default["g"])
    assert not same_function(one["h"], other_closure["h"])
