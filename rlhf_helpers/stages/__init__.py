"""The pipeline, one module a stage: `sft` (the gpu profile's hub model fine-tuned once, cached) ->
`reward` (the reward adapter, trained once, cached; `reward_training` holds its training) ->
`train_ppo` (the command line: `python -m rlhf_helpers.stages.train_ppo`). With `compare`, the
layers that join the engine (`rlhf_helpers.ppo`) to the offline world (`rlhf_helpers.world`)."""
