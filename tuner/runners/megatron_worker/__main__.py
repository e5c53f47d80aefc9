"""`python -m tuner.runners.megatron_worker`: see main.py."""

import sys

from tuner.runners.megatron_worker.main import main

sys.exit(main())
