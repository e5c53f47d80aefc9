"""`python -m tuner ...` is `tune ...` (also `verl-tune`: Ray installs a `tune` command too)."""

from tuner.cli import main

raise SystemExit(main())
