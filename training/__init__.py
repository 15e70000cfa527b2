"""`vaswani.training`: the library the commands (`vaswani-*`, scripts/) stand on, one topic per module.

data (CMUdict G2P + dev split, user data), batching (token-budget batch sampler, collator),
schedule (learning-rate schedule, optimizer), metrics (WER/PER, BLEU/chrF), checkpoints
(atomic save, newest valid), train_state (the checkpointed state as safetensors + JSON), ema and
averaging (weight averages), loop and cli (vaswani-train, vaswani-average), time_budget (durations); generation,
finetune, attention_plots and convert_marian hold their commands too. Import the module you need; this file
imports nothing so that `import vaswani.training` stays light.
"""
