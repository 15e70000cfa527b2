"""`python scripts/release_model.py RUN_DIR RELEASE_DIR`: the small Hub-ready folder of a finished run's model
(vaswani.training.release)."""

import sys

from vaswani.training.release import main as release_main

if __name__ == "__main__":
    sys.exit(release_main())
