"""Train a vaswani model; with no arguments, the default grapheme-to-phoneme model on CMUdict.

    python scripts/train.py --time_budget 15m                       # one process (CPU or GPU)
    accelerate launch --multi_gpu --num_processes 4 scripts/train.py # data-parallel on 4 GPUs
    torchrun --nproc_per_node 2 scripts/train.py --cpu               # data-parallel on 2 CPU processes

`python scripts/train.py --help` lists the options; the logic lives in vaswani.training (cli.py, loop.py).
"""

import sys

from vaswani.training.cli import main

if __name__ == "__main__":
    main(sys.argv[1:])
