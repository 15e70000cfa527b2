"""Average the weights of the last K checkpoints of a finished train.py run (the paper's checkpoint averaging).

    python scripts/average_checkpoints.py outputs/g2p --last 2      # writes outputs/g2p-avg2
    python scripts/train.py ... --average_last 2 --keep_last 2      # the same, at the end of a run, in its budget

The new folder is Hub-ready like the run's own (model, tokenizer, code, model card with the dev figures of the
average). `--help` lists the options; the logic lives in vaswani.training (cli.py, averaging.py).
"""

import sys

from vaswani.training.cli import average_main

if __name__ == "__main__":
    average_main(sys.argv[1:])
