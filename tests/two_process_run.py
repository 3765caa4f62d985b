"""One process of a two-process training run for tests/ppo/test_train_reliability.py (not a
test file).

    accelerate launch --multi_gpu --num_processes 2 ... tests/two_process_run.py --profile tiny ...

Runs `python -m rlhf_helpers.stages.train_ppo`'s `main` with an untrained reward adapter (no
reward-model training), and, on the process whose rank is $NAN_RANK only, makes the reward-model
scores NaN at its $NAN_CALL-th reward pass (1-based); with $FAIL=error it raises a RuntimeError
there instead (a bug). Each process writes its pid to $RESULTS_DIR/pid-<rank> (so a hung run can
be ended) and {"rank", "exit", "num_processes"} to $RESULTS_DIR/rank-<rank>.json before it exits;
process 0 writes the sha256 of every file of each checkpoint it saves to
$RESULTS_DIR/saved-<step>.json.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from pathlib import Path


def main() -> int:
    import torch

    from rlhf_helpers.ppo import run_loop as run_loop_module
    from rlhf_helpers.ppo.model.shared_model import SharedLoRAModel
    from rlhf_helpers.stages import train_ppo as train

    torch.set_num_threads(1)
    rank = int(os.environ.get("RANK", "0"))
    results = Path(os.environ["RESULTS_DIR"])
    # the launcher puts workers in their own sessions
    (results / f"pid-{rank}").write_text(str(os.getpid()))
    train.ensure_reward_model = lambda *args, **kwargs: None
    real_scores, calls = SharedLoRAModel.reward_scores, []

    def scores_nan_on_one_rank(self, *args, **kwargs):
        calls.append(1)
        scores = real_scores(self, *args, **kwargs)
        bad = (rank == int(os.environ.get("NAN_RANK", "-1"))
               and len(calls) == int(os.environ["NAN_CALL"]))
        if bad and os.environ.get("FAIL") == "error":
            raise RuntimeError("a bug on this process")
        return scores * math.nan if bad else scores

    SharedLoRAModel.reward_scores = scores_nan_on_one_rank
    real_save = run_loop_module.save_checkpoint

    def save_and_hash(trainer, output_dir, *args, **kwargs):
        path = real_save(trainer, output_dir, *args, **kwargs)
        hashes = {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
                  for p in sorted(path.rglob("*")) if p.is_file()}
        (results / f"saved-{path.name}.json").write_text(json.dumps(hashes))
        return path

    run_loop_module.save_checkpoint = save_and_hash
    status = train.main(sys.argv[1:])
    run = json.loads((Path(train.parse_args(sys.argv[1:]).output_dir) / "run.json").read_text())
    (results / f"rank-{rank}.json").write_text(json.dumps(
        {"rank": rank, "exit": status, "num_processes": run["num_processes"]}))
    return status


if __name__ == "__main__":
    sys.exit(main())
