"""Leaderboards as a pandas DataFrame: loading, filtering, ranking and rendering; the names of
the modules below, re-exported once.

```python
import tuner

df = tuner.load_leaderboard(["results/dense-h200-x2.csv", "results/moe-h200-x2.csv"])
ok = df[df.status == "ok"]
ok.groupby("train_parallel").tokens_per_s_per_gpu.max()
```

- `columns`: the columns' types, the ones `tune show` prints and adds, their headings.
- `loading`: ours (any schema version) and the published reference CSVs, as one typed frame.
- `ranking`: filters, the ratio to the best reference, the order.
- `rendering`: a text table (tuner.results's), CSV, JSON or Markdown.
"""

from tuner.leaderboard.columns import (
    DERIVED_COLUMNS,
    FLOAT_COLUMNS,
    INT_COLUMNS,
    PREDICTED_PRUNED,
    SHORT_NAMES,
    SHOW_COLUMNS,
    STATUS_ORDER,
    STRING_COLUMNS,
    column_name,
)
from tuner.leaderboard.loading import REFERENCE_FILES, PathLike, load_leaderboard, model_family
from tuner.leaderboard.ranking import (
    HIGHER_IS_BETTER,
    best_reference,
    default_sort,
    rank,
    same_setup,
    select,
    with_reference_ratio,
)
from tuner.leaderboard.rendering import FORMATS, render, resolve_columns

__all__ = [
    "DERIVED_COLUMNS",
    "FLOAT_COLUMNS",
    "FORMATS",
    "HIGHER_IS_BETTER",
    "INT_COLUMNS",
    "PREDICTED_PRUNED",
    "REFERENCE_FILES",
    "SHORT_NAMES",
    "SHOW_COLUMNS",
    "STATUS_ORDER",
    "STRING_COLUMNS",
    "PathLike",
    "best_reference",
    "same_setup",
    "column_name",
    "default_sort",
    "load_leaderboard",
    "model_family",
    "rank",
    "render",
    "resolve_columns",
    "select",
    "with_reference_ratio",
]
