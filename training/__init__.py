"""`vaswani.training`: the library the training scripts stand on, one topic per module.

data (CMUdict G2P + dev split, user data), batching (token-budget batch sampler, collator),
schedule (learning-rate schedule, optimizer), metrics (WER/PER, BLEU/chrF), checkpoints
(atomic save, newest valid), train_state (the checkpointed state as safetensors + JSON), ema and
averaging (weight averages), loop and cli (scripts/train.py), time_budget (durations). Import the module you need; this file
imports nothing so that `import vaswani.training` stays light.
"""
