"""`python -m tuner.runners.vllm_gen --pool DIR`: see main.py."""

import sys

from tuner.runners.vllm_gen.main import main

sys.exit(main())
